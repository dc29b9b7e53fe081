"""Workaround for transformers 5.24: a run resumed from its final checkpoint trains one step more.

Written for transformers 5.24.0 (installed).

The limit: `Trainer._inner_training_loop` enters its epoch loop, and `_run_epoch` its step loop, before it checks
`max_steps` or a stop; resumed from a run's final checkpoint (global step = max_steps, not at an epoch's end, or a
spent time budget), the Trainer trains one step more than the run it continues, which moved the demo's weights by up
to 1e-3 (tests/test_resume_kill.py fails without the workaround).

The workaround (`stop_if_finished`, called first in `overrides.TrainerOverrides._run_epoch`): a run that is finished
trains nothing and stops.

It can go when a plain Trainer resumed from its final checkpoint trains no step: tests/test_workarounds.py's
`test_transformers_still_trains_past_the_end_of_a_resumed_run` then fails. It must change when `_run_epoch` is renamed
(`test_the_trainer_methods_the_workarounds_override_still_exist`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import Trainer


def stop_if_finished(trainer: Trainer) -> bool:
    """True, with the Trainer told to stop, when its run has reached `max_steps` or was already told to stop (a time
    budget spent): then `_run_epoch` must train nothing."""
    if trainer.state.global_step >= trainer.state.max_steps or trainer.control.should_training_stop:
        trainer.control.should_training_stop = True
        return True
    return False
