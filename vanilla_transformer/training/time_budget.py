"""A budget of training time: train.py's ``--max_train_minutes``, fairseq's ``--stop-time-hours``.

``TimeBudgetCallback`` stops training once the run has trained for the budget. Training time is the wall-clock time
of the training loop, data loading included, *without* the evaluations and checkpoint saves made during training:
the clock runs from ``on_train_begin`` and is banked at every optimizer step's end, and the time from the last step's
end to the end of an evaluation (``on_evaluate``) or of a save (``on_save``) is dropped. The check comes at the end of
each step, so training stops at the end of the step that spends the budget.

Schedules that need the total number of steps (``linear``, ``cosine``) decay over the budget instead:
``budget_lr_lambda`` multiplies the warmup by ``decay(progress)``, where progress is the larger of the step progress
(after warmup, as transformers counts it) and the spent fraction of the budget, read from the callback's clock. Without
a real step limit (``max_steps`` set to a huge cap) the budget alone drives the decay; when the step limit comes first,
the schedule is transformers' own. Schedules that need no total (``inverse_sqrt``, ``constant``,
``constant_with_warmup``) are left as they are.

The spent time is saved with every checkpoint (an ``ExportableState``: ``trainer_state.json``'s
``stateful_callbacks``) and read back when training resumes, so that a resumed run trains only for what is left.
With several processes every rank takes the largest clock of all ranks at each step's end (one tiny all-reduce), so
that all ranks use the same learning rate and stop at the same step.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable

import torch
from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState, ProgressCallback
from transformers.trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType

logger = logging.getLogger(__name__)

# schedules whose factor does not depend on the total number of steps: a time budget leaves them as they are
SCHEDULES_WITHOUT_TOTAL = ("inverse_sqrt", "constant", "constant_with_warmup")
# schedules that decay over the budget: decay(progress, **lr_scheduler_kwargs), progress in [0, 1]
BUDGET_DECAYS: dict[str, Callable[..., float]] = {
    "linear": lambda progress: 1.0 - progress,
    "cosine": lambda progress, num_cycles=0.5: max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))),
}
BUDGET_KWARGS = {"linear": set(), "cosine": {"num_cycles"}}
# max_steps when the budget alone ends training (train.py sets it when neither --max_steps nor --num_train_epochs is
# given): a cap no run reaches, so that the data is repeated for as many epochs as the budget allows
UNLIMITED_STEPS = 1_000_000_000


def format_duration(seconds: float) -> str:
    """`12.5 min`, or `42.0 s` under a minute."""
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


def check_minutes(minutes: float | None) -> None:
    """Raise a one-line ValueError unless `minutes` is None or a positive, finite number."""
    if minutes is None:
        return
    if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not 0 < minutes < math.inf:
        raise ValueError(f"--max_train_minutes {minutes!r} is invalid; it must be a positive number of minutes.")


def check_scheduler(scheduler_type: str | SchedulerType, scheduler_kwargs: dict | None = None) -> None:
    """Raise a one-line ValueError unless the learning-rate schedule works with a time budget."""
    name = SchedulerType(scheduler_type).value
    if name in SCHEDULES_WITHOUT_TOTAL:
        return
    if name not in BUDGET_DECAYS:
        raise ValueError(
            f"--lr_scheduler_type {name} cannot be combined with --max_train_minutes; supported: "
            f"{', '.join(BUDGET_DECAYS)} (decay over the budget), {', '.join(SCHEDULES_WITHOUT_TOTAL)} (need no total)."
        )
    unknown = sorted(set(scheduler_kwargs or {}) - BUDGET_KWARGS[name])
    if unknown:
        allowed = ", ".join(sorted(BUDGET_KWARGS[name])) or "none"
        raise ValueError(
            f"--lr_scheduler_kwargs {unknown[0]!r} is not supported by {name} with --max_train_minutes; "
            f"allowed: {allowed}."
        )


def budget_lr_lambda(
    scheduler_type: str | SchedulerType,
    num_warmup_steps: int,
    max_steps: int,
    elapsed_seconds: Callable[[], float],
    budget_seconds: float,
    scheduler_kwargs: dict | None = None,
) -> Callable[[int], float]:
    """The learning-rate factor of a `linear` or `cosine` schedule that ends with the time budget or at `max_steps`,
    whichever comes first: ``warmup(step) * decay(max(step progress after warmup, elapsed / budget))``."""
    check_scheduler(scheduler_type, scheduler_kwargs)
    name = SchedulerType(scheduler_type).value
    if name not in BUDGET_DECAYS:
        raise ValueError(f"--lr_scheduler_type {name} needs no total number of steps; use transformers' schedule.")
    decay, kwargs = BUDGET_DECAYS[name], dict(scheduler_kwargs or {})

    def factor(step: int) -> float:
        warmup = min(1.0, step / num_warmup_steps) if num_warmup_steps > 0 else 1.0
        by_steps = max(0, step - num_warmup_steps) / max(1, max_steps - num_warmup_steps)
        progress = min(1.0, max(by_steps, elapsed_seconds() / budget_seconds))
        return warmup * max(0.0, decay(progress, **kwargs))

    return factor


class TimeBudgetCallback(TrainerCallback, ExportableState):
    """Stops training after `minutes` of training time (see the module's docstring for what counts); its clock,
    `elapsed_seconds`, drives a budget-aware schedule (`make_scheduler`) and is saved with every checkpoint."""

    def __init__(self, minutes: float):
        check_minutes(minutes)
        self.minutes = minutes
        self.elapsed_seconds = 0.0  # training time so far, banked at each step's end, the same on every rank
        self.stopped_at_step: int | None = None  # the step at which the budget stopped training, if it did
        self.timer: Callable[[], float] = time.perf_counter  # seconds; tests replace it with a fake clock
        self._mark: float | None = None  # timer() when the time not yet banked began

    @property
    def budget_seconds(self) -> float:
        return 60.0 * self.minutes

    def state(self) -> dict:
        return {"args": {"minutes": self.minutes}, "attributes": {"elapsed_seconds": self.elapsed_seconds}}

    def make_scheduler(
        self, optimizer: torch.optim.Optimizer, args, num_training_steps: int
    ) -> torch.optim.lr_scheduler.LambdaLR | None:
        """A schedule that decays over the budget for `linear` and `cosine`; None for the schedules that need no
        total (the Trainer's own is then right)."""
        check_scheduler(args.lr_scheduler_type, args.lr_scheduler_kwargs)
        if SchedulerType(args.lr_scheduler_type).value in SCHEDULES_WITHOUT_TOTAL:
            return None
        factor = budget_lr_lambda(
            args.lr_scheduler_type,
            args.get_warmup_steps(num_training_steps),
            num_training_steps,
            lambda: self.elapsed_seconds,
            self.budget_seconds,
            args.lr_scheduler_kwargs,
        )
        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def _lap(self) -> float:
        """Seconds since the last mark; moves the mark to now."""
        now = self.timer()
        seconds = 0.0 if self._mark is None else now - self._mark
        self._mark = now
        return seconds

    def on_train_begin(self, args, state, control, **kwargs):
        self.stopped_at_step = None
        saved = state.stateful_callbacks.get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        resumed = state.global_step > 0 and saved is not None
        self.elapsed_seconds = float(saved["attributes"]["elapsed_seconds"]) if resumed else 0.0
        # a checkpoint saved without a budget has no entry, which the Trainer's next save would look up
        state.stateful_callbacks[type(self).__name__] = self.state()
        if resumed and state.is_world_process_zero:
            logger.info(
                "time budget: %s of %s already spent at step %d (from the checkpoint); training for the rest",
                format_duration(self.elapsed_seconds),
                format_duration(self.budget_seconds),
                state.global_step,
            )
        self._mark = self.timer()
        if resumed and self.elapsed_seconds >= self.budget_seconds:
            self.stopped_at_step = state.global_step
            control.should_training_stop = True  # resumed from the run's last checkpoint: nothing left to train
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self.elapsed_seconds += self._lap()
        if args.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            clock = torch.tensor([self.elapsed_seconds], dtype=torch.float64, device=args.device)
            torch.distributed.all_reduce(clock, op=torch.distributed.ReduceOp.MAX)
            self.elapsed_seconds = clock.item()
        if self.elapsed_seconds >= self.budget_seconds and not control.should_training_stop:
            # end as at max_steps (DefaultFlowCallback): a last evaluation and checkpoint for step-based strategies
            self.stopped_at_step = state.global_step
            control.should_training_stop = True
            if args.eval_strategy == IntervalStrategy.STEPS and state.global_step % state.eval_steps != 0:
                control.should_evaluate = True
            if args.save_strategy == SaveStrategy.STEPS:
                control.should_save = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        # the run's own trainer_state.json (Trainer.save_state) then holds the total, as checkpoints do
        state.stateful_callbacks[type(self).__name__] = self.state()

    def on_evaluate(self, args, state, control, **kwargs):
        self._lap()  # evaluation is not training time

    def on_save(self, args, state, control, **kwargs):
        self._lap()  # nor is writing a checkpoint

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            logger.info(
                "time budget: %s of %s (%.0f%%) spent at step %d",
                format_duration(self.elapsed_seconds),
                format_duration(self.budget_seconds),
                100 * self.elapsed_seconds / self.budget_seconds,
                state.global_step,
            )


class BudgetProgressCallback(ProgressCallback):
    """The Trainer's progress bar, counting minutes of the budget instead of steps (their number is not known ahead
    when the budget alone ends training)."""

    def __init__(self, budget: TimeBudgetCallback):
        super().__init__()
        self.budget = budget

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar = tqdm(
                total=round(self.budget.minutes, 2),
                unit="min",
                dynamic_ncols=True,
                bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} min{postfix}",
            )
        self.current_step = 0

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar.n = round(min(self.budget.elapsed_seconds / 60, self.budget.minutes), 2)
            self.training_bar.set_postfix_str(f"step {state.global_step}", refresh=True)


def find_time_budget(callbacks: Iterable) -> TimeBudgetCallback | None:
    """The TimeBudgetCallback among a trainer's callbacks (`trainer.callback_handler.callbacks`), if any."""
    return next((callback for callback in callbacks if isinstance(callback, TimeBudgetCallback)), None)


__all__ = [
    "BUDGET_DECAYS",
    "BudgetProgressCallback",
    "SCHEDULES_WITHOUT_TOTAL",
    "UNLIMITED_STEPS",
    "TimeBudgetCallback",
    "budget_lr_lambda",
    "check_minutes",
    "check_scheduler",
    "find_time_budget",
    "format_duration",
]
