"""A budget of training time: train.py's ``--max_train_minutes``, fairseq's ``--stop-time-hours``. Everything of it
is here: its argument (``TimeBudgetArguments``), the clock that stops training (``TimeBudgetCallback``), the schedule
that decays over it (``budget_lr_lambda``, installed by ``BudgetSchedule``), the step cap when it alone ends training
(``cap_steps``), and what the run says of it (``BudgetProgressCallback``, ``describe_budget``, ``describe_stop``).

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
from dataclasses import dataclass, field

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


@dataclass
class TimeBudgetArguments:
    """The budget's training argument, for a `TrainingArguments` subclass (list it before the transformers class)."""

    max_train_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Stop training after this many minutes of training time (fairseq's --stop-time-hours), counting "
            "the training steps and their data loading but not evaluation or checkpoint saving during training; "
            "the time spent is saved with each checkpoint, so a resumed run trains only for the rest. With neither "
            "--max_steps nor --num_train_epochs given, the budget alone ends training; otherwise whichever limit "
            "comes first. linear and cosine schedules decay over the budget; inverse_sqrt, constant and "
            "constant_with_warmup are unchanged; other schedules are refused."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        check_minutes(self.max_train_minutes)
        if self.max_train_minutes is not None:
            check_scheduler(self.lr_scheduler_type, self.lr_scheduler_kwargs)


def cap_steps(training_args, given: set[str]) -> None:
    """With a budget and neither --max_steps nor --num_train_epochs among the `given` flags, the budget alone ends
    training: the data repeats for as many epochs as fit (the preset's epochs do not stop it) under a step cap no run
    reaches (`UNLIMITED_STEPS`). Fractions of the total number of steps then mean nothing: refused, in one line."""
    if training_args.max_train_minutes is None or {"max_steps", "num_train_epochs"} & given:
        return
    for name in ("warmup_steps", "logging_steps", "eval_steps", "save_steps"):
        value = getattr(training_args, name)
        if value is not None and 0 < value < 1:
            raise ValueError(
                f"--{name} {value:g} is a fraction of the training steps, unknown with --max_train_minutes alone; "
                "give it in steps, or also give --max_steps or --num_train_epochs."
            )
    training_args.max_steps = UNLIMITED_STEPS


def add_time_budget(trainer) -> TimeBudgetCallback | None:
    """Give a trainer whose arguments set ``max_train_minutes`` its `TimeBudgetCallback`, and a progress bar that
    counts minutes of the budget rather than steps; returns the callback (None without a budget)."""
    minutes = getattr(trainer.args, "max_train_minutes", None)
    if minutes is None:
        return None
    budget = TimeBudgetCallback(minutes)
    trainer.add_callback(budget)
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(BudgetProgressCallback(budget))
    return budget


class BudgetSchedule:
    """Mixin for a Trainer subclass (listed before it): with a `TimeBudgetCallback` among the callbacks, linear and
    cosine schedules decay over the budget (`TimeBudgetCallback.make_scheduler`); other schedules, a scheduler given
    to the Trainer, or no budget leave the Trainer's own."""

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        given = self.lr_scheduler is not None
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        budget = find_time_budget(self.callback_handler.callbacks)
        if not given and budget is not None:
            # the budget's LambdaLR starts from the learning rates the Trainer's left as initial ones
            made = budget.make_scheduler(optimizer or self.optimizer, self.args, num_training_steps)
            self.lr_scheduler = made or scheduler
        return self.lr_scheduler


def describe_budget(training_args) -> str | None:
    """The start-up line about the budget of a run that trains with one; None otherwise."""
    if not training_args.do_train or training_args.max_train_minutes is None:
        return None
    alone = training_args.max_steps == UNLIMITED_STEPS
    return (
        f"time budget: training stops after {training_args.max_train_minutes:g} min of training "
        "(evaluation and checkpoint saving not counted)"
        + ("; epochs repeat until then" if alone else ", or at the step or epoch limit if that comes first")
    )


def describe_stop(trainer) -> str | None:
    """The line saying that the budget stopped training, and when; None when it did not."""
    budget = find_time_budget(trainer.callback_handler.callbacks)
    if budget is None or budget.stopped_at_step is None:
        return None
    return (
        f"stopped after {format_duration(budget.elapsed_seconds)} of training "
        f"(--max_train_minutes {budget.minutes:g}) at step {budget.stopped_at_step}"
    )


def steps_trained(training_args, global_step: int):
    """The training arguments to report (the model card's): under the budget's step cap, the steps trained."""
    if training_args.max_steps != UNLIMITED_STEPS:
        return training_args
    return dict(training_args.to_dict(), max_steps=global_step)


__all__ = [
    "BUDGET_DECAYS",
    "BudgetProgressCallback",
    "BudgetSchedule",
    "SCHEDULES_WITHOUT_TOTAL",
    "UNLIMITED_STEPS",
    "TimeBudgetArguments",
    "TimeBudgetCallback",
    "add_time_budget",
    "budget_lr_lambda",
    "cap_steps",
    "check_minutes",
    "check_scheduler",
    "describe_budget",
    "describe_stop",
    "find_time_budget",
    "format_duration",
    "steps_trained",
]
