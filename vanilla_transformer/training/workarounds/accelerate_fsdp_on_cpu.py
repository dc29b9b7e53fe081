"""Workaround for Accelerate: FSDP is turned on only for accelerator devices, not for CPU processes.

Written for Accelerate 1.15; checked with 1.16.0.

The limit: `accelerate launch --use_fsdp` (or transformers' `--fsdp` flags) on a machine without an accelerator
starts processes that join a gloo group, but `AcceleratorState` turns FSDP on only for the MULTI_GPU-like distributed
types: the state stays MULTI_CPU (plain data parallelism), the FSDP plugin is dropped, and the run trains and saves
without any sign that the sharding flags were ignored. PyTorch's FSDP2 (`fully_shard`) itself runs on CPU tensors
over gloo.

The workaround (`enable_fsdp_on_cpu`, through `enable_in_trainer` in `TranslationTrainer
.create_accelerator_and_postprocess`): put the plugin back into the Accelerate state, as Accelerate does on GPUs,
including its private `PartialState._shared_state["distributed_type"]`, which every later `AcceleratorState()` copies
over its own; then tell the Trainer (`is_fsdp_enabled`) and make the check transformers makes when Accelerate keeps
the plugin itself. Accelerate's and the Trainer's usual FSDP2 paths apply from there.

It can go when Accelerate keeps FSDP on CPU processes: tests/test_workarounds.py's
`test_accelerate_still_drops_fsdp_on_cpu_processes` then fails. It must change when
`test_the_fsdp_type_holds_only_through_accelerates_shared_state` fails (the private state it writes changed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformers import TrainingArguments

from ..sharding import check_parallelism_can_run, requested_fsdp_version

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import Trainer


def enable_fsdp_on_cpu(accelerator: Accelerator, args: TrainingArguments) -> bool:
    """Turn FSDP2 on for CPU processes in a gloo group when the launch asked for it and Accelerate dropped it (see
    the module's docstring); refuse what cannot run there (`sharding.check_parallelism_can_run`). Returns True when
    it did."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU or requested_fsdp_version(args) is None:
        return False
    check_parallelism_can_run(args)
    plugin_args = getattr(args, "fsdp_plugin_args", None)
    plugin = FullyShardedDataParallelPlugin(**(plugin_args or {}))  # else from the FSDP_* environment
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    # as Accelerate does on GPUs: every later AcceleratorState() copies the process state's type over its own
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return True


def enable_in_trainer(trainer: Trainer) -> bool:
    """`enable_fsdp_on_cpu` for a Trainer whose accelerator is set up, and what transformers does after it when
    Accelerate keeps the plugin itself: `is_fsdp_enabled`, and refusing FSDP's and the Trainer's activation
    checkpointing together. Returns True when it turned FSDP on."""
    if not enable_fsdp_on_cpu(trainer.accelerator, trainer.args):
        return False
    trainer.is_fsdp_enabled = True
    # the check transformers makes when Accelerate keeps the plugin itself
    if trainer.accelerator.state.fsdp_plugin.activation_checkpointing and trainer.args.activation_checkpointing:
        raise ValueError(
            "FSDP's activation checkpointing (fsdp_activation_checkpointing) and --gradient_checkpointing "
            "(--activation_checkpointing) both checkpoint the layers; choose one."
        )
    return True
