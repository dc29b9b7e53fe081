"""Workaround for torch 2.13: a gloo process group can deadlock or abort its process when it is torn down.

Written for torch 2.13.0, transformers 5.24.0 and Accelerate 1.16.0 (installed).

A gloo group's worker threads (``pt_gloo_runloop``) run its collectives. A worker that has finished one still has to
let go of it; when the collective holds the last reference to a tensor that Python made (``Trainer.store_flos``
gathers into such a list at the end of training), that needs the GIL. ``ProcessGroupGloo``'s destructor joins the
workers, and gloo has no ``shutdown()`` for ``destroy_process_group`` to call, so the workers live as long as the
group. Seen with two CPU processes:

- with no ``destroy_process_group``, the group is left to the interpreter's exit. A worker still letting go of a
  collective then is ended by it: ``terminate called without an active exception``, SIGABRT, after the model was
  saved (once in a CI run, FSDP2);
- with transformers' ``Trainer.end()`` (``destroy_process_group``), DDP's ``Reducer`` still holds the group. The
  Reducer is C++, freed with the GIL held, so when the DDP model is freed the group goes with it: its destructor
  waits for a worker that waits for the GIL, a deadlock (two "machines", DDP: 2 runs of 2).

``before_leaving`` does two things before ``Trainer.end()`` (``TranslationTrainer.end``):

- every process waits for the others (a barrier). The barrier carries no tensor, and it starts only once the
  collectives before it are done, so the workers let go of those while this process waits without the GIL;
- it drops the trainer's and Accelerate's references to the DDP model, so that the Reducer goes while the group is
  still registered. The group's last reference is then Python's, which releases the GIL while the group is destroyed.

Under FSDP2, DTensor's sharding caches (module-level) keep the meshes, and with them the group, until the interpreter
exits: there only the barrier helps.

It can go when destroying a gloo group stops its workers whatever else holds it:
tests/test_workarounds.py's ``test_torch_gloo_workers_still_outlive_destroy_process_group_under_ddp`` then fails.
tests/test_distributed.py checks that every process has left its group when ``train.py`` returns, and under DDP that
no gloo worker is left.
"""

from __future__ import annotations

import torch
from transformers import Trainer


def before_leaving(trainer: Trainer) -> None:
    """Wait for every process, then drop the references to the model wrapped for DDP (``trainer.model_wrapped`` and
    Accelerate's list of prepared models) and collect garbage: its C++ Reducer goes now, while the process group is
    still registered. The trainer keeps ``trainer.model``, the unwrapped model."""
    trainer.accelerator.wait_for_everyone()  # nothing with one process
    if isinstance(trainer.model_wrapped, torch.nn.parallel.DistributedDataParallel):
        trainer.model_wrapped = trainer.model
    trainer.accelerator.free_memory()  # its prepared models, optimizers and data loaders; then gc.collect()
