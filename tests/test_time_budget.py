"""--max_train_minutes: training stops after a budget of training time, linear and cosine schedules decay over the
budget, the time spent survives a resume, and bad values are refused in one line."""

import contextlib
import io
import json
import math

import pytest
from conftest import TINY_OVERRIDES, tiny_model, word_tokenizer
from transformers import TrainerControl, TrainerState
from transformers.optimization import (
    _get_cosine_schedule_with_warmup_lr_lambda,
    _get_linear_schedule_with_warmup_lr_lambda,
)

from vanilla_transformer.training import recipe
from vanilla_transformer.training.arguments import TranslationTrainingArguments
from vanilla_transformer.training.time_budget import (
    UNLIMITED_STEPS,
    TimeBudgetCallback,
    budget_lr_lambda,
    find_time_budget,
)
from vanilla_transformer.training.trainer import build_trainer

BUDGET_MINUTES = 0.05  # 3 s
TINY_RUN = [
    *("--max_train_samples", "64", "--max_eval_samples", "8", "--max_predict_samples", "8"),
    *("--per_device_train_batch_size", "16", "--vocab_size", "300", "--seed", "3", "--logging_steps", "50"),
    *("--config_overrides", TINY_OVERRIDES),
    *("--max_source_length", "32", "--max_target_length", "32", "--generation_max_length", "10"),
    *("--disable_tqdm", "true", "--report_to", "none", "--dataloader_num_workers", "0", "--use_cpu"),
]


def run_train(argv: list[str]) -> str:
    """train.py's main() in this process; returns what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        recipe.main(argv)
    return printed.getvalue()


def budget_state(folder) -> tuple[dict, float]:
    """A run's or checkpoint's trainer_state.json, and the training time it says was spent."""
    state = json.loads((folder / "trainer_state.json").read_text())
    return state, state["stateful_callbacks"]["TimeBudgetCallback"]["attributes"]["elapsed_seconds"]


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --------------------------------------------------------------------------------------------------------------------
# train.py end to end
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory):
    """train.py with the budget alone (no --max_steps/--num_train_epochs): trains, evaluates, predicts, saves; the
    only checkpoint is the one written when the budget stops training."""
    out = tmp_path_factory.mktemp("budget") / "run"
    argv = ["--output_dir", str(out), "--max_train_minutes", str(BUDGET_MINUTES), *TINY_RUN]
    argv += ["--save_strategy", "steps", "--save_steps", "1000000", "--lr_scheduler_type", "linear"]
    # a log at every step, so that the last logged learning rate is the stopping step's on any machine speed
    argv += ["--warmup_steps", "5", "--logging_steps", "1"]
    return out, argv, run_train(argv)


def test_the_budget_alone_stops_training_on_time_then_evaluates_predicts_and_saves(budget_run):
    out, _, printed = budget_run
    results = json.loads((out / "all_results.json").read_text())
    budget = 60 * BUDGET_MINUTES
    # training time (what the budget counts) is part of the runtime; the rest is the last step and the final save
    assert budget <= results["train_runtime"] <= budget + 2.0, results["train_runtime"]
    state, elapsed = budget_state(out)
    assert state["global_step"] > 0
    assert budget <= elapsed <= results["train_runtime"]
    # the budget stopped it, not the preset's 15 epochs: max_steps is only a cap
    assert state["max_steps"] == UNLIMITED_STEPS
    assert "time budget: training stops after 0.05 min of training" in printed
    assert f"train.py: stopped after 3.0 s of training (--max_train_minutes 0.05) at step {state['global_step']}" in (
        printed
    )
    # the linear schedule has decayed to (nearly) nothing by the end of the budget
    last_rate = [entry["learning_rate"] for entry in state["log_history"] if "learning_rate" in entry][-1]
    assert last_rate < 0.25 * 1e-3  # the small preset's peak is 1e-3
    for key in ("train_loss", "eval_bleu", "eval_loss", "predict_bleu", "predict_loss"):
        assert key in results, key
    assert (out / "model.safetensors").is_file() and (out / "generated_predictions.txt").is_file()
    assert (out / "README.md").is_file()
    assert f"| max steps | `{state['global_step']}` |" in (out / "README.md").read_text()  # the steps trained
    assert [p.name for p in out.glob("checkpoint-*")] == [f"checkpoint-{state['global_step']}"]
    assert budget_state(out / f"checkpoint-{state['global_step']}")[1] == elapsed


def test_a_resumed_run_trains_only_for_what_is_left_of_the_budget(budget_run):
    """The checkpoint written at the stop holds the spent time; resumed with the same budget, nothing is left: the
    run trains no step at all, and evaluates and saves (a run that forgot the time would train for another 3 s)."""
    out, argv, _ = budget_run
    checkpoint = next(out.glob("checkpoint-*"))
    state, elapsed = budget_state(checkpoint)
    assert elapsed >= 60 * BUDGET_MINUTES
    printed = run_train([*argv, "--do_train", "--resume_from_checkpoint", str(checkpoint)])
    resumed, _ = budget_state(out)
    assert resumed["global_step"] == state["global_step"]
    assert f"at step {state['global_step']}" in printed
    assert json.loads((out / "train_results.json").read_text())["train_runtime"] < 60 * BUDGET_MINUTES


def test_steps_and_epochs_given_with_a_budget_still_count(tmp_path):
    out = ["--output_dir", str(tmp_path)]
    _, _, args, _ = recipe.parse_arguments(out + ["--max_train_minutes", "2"])
    assert (args.max_train_minutes, args.max_steps) == (2.0, UNLIMITED_STEPS)
    _, _, args, _ = recipe.parse_arguments(out + ["--max_train_minutes", "2", "--num_train_epochs", "3"])
    assert (args.max_steps, args.num_train_epochs) == (-1, 3)
    _, _, args, _ = recipe.parse_arguments(out + ["--max_train_minutes", "2", "--max-steps", "7"])
    assert args.max_steps == 7
    (tmp_path / "args.json").write_text(json.dumps({"output_dir": str(tmp_path), "max_train_minutes": 2}))
    _, _, args, _ = recipe.parse_arguments([str(tmp_path / "args.json")])
    assert args.max_steps == UNLIMITED_STEPS
    _, _, args, _ = recipe.parse_arguments(out)  # no budget: nothing changes
    assert (args.max_train_minutes, args.max_steps, args.num_train_epochs) == (None, -1, 15)


# --------------------------------------------------------------------------------------------------------------------
# The schedule
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler_type", ["linear", "cosine"])
def test_the_schedule_decays_over_the_budget(scheduler_type):
    clock = {"seconds": 0.0}
    factor = budget_lr_lambda(scheduler_type, 10, UNLIMITED_STEPS, lambda: clock["seconds"], 600.0)
    assert [factor(step) for step in (0, 5, 10)] == [0.0, 0.5, 1.0]  # warmup, in steps
    clock["seconds"] = 300.0  # half the budget: half the peak, for linear and for cosine
    assert factor(1000) == pytest.approx(0.5)
    clock["seconds"] = 150.0
    assert factor(500) == pytest.approx(0.75 if scheduler_type == "linear" else 0.5 * (1 + 2**-0.5))
    clock["seconds"] = 597.0  # ~0 just before the end of the budget, 0 at the end and after
    assert 0.0 < factor(2000) < 0.01
    for seconds in (600.0, 900.0):
        clock["seconds"] = seconds
        assert factor(2000) == 0.0


@pytest.mark.parametrize("scheduler_type", ["linear", "cosine"])
def test_with_a_step_limit_that_comes_first_the_schedule_is_transformers_own(scheduler_type):
    seconds = {"value": 0.0}
    factor = budget_lr_lambda(scheduler_type, 10, 200, lambda: seconds["value"], 600.0)
    if scheduler_type == "linear":
        expected = lambda step: _get_linear_schedule_with_warmup_lr_lambda(  # noqa: E731
            step, num_warmup_steps=10, num_training_steps=200
        )
    else:
        expected = lambda step: _get_cosine_schedule_with_warmup_lr_lambda(  # noqa: E731
            step, num_warmup_steps=10, num_training_steps=200, num_cycles=0.5
        )
    for step in (0, 3, 10, 11, 50, 105, 199, 200):
        assert factor(step) == pytest.approx(expected(step), abs=1e-12), step
    seconds["value"] = 540.0  # 90% of the budget spent at step 105 (half the steps): time wins
    assert factor(105) == pytest.approx(0.1 if scheduler_type == "linear" else 0.5 * (1 + math.cos(0.9 * math.pi)))


def make_trainer(tmp_path, **arguments):
    args = TranslationTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, **arguments)
    tokenizer = word_tokenizer(["eins", "zwei"])
    trainer = build_trainer(tiny_model(vocab_size=len(tokenizer)), args, tokenizer)
    trainer.create_optimizer_and_scheduler(num_training_steps=UNLIMITED_STEPS)
    return trainer


def test_the_trainer_uses_the_budget_schedule_only_where_it_needs_one(tmp_path):
    plain = make_trainer(tmp_path, warmup_steps=100)
    budget = make_trainer(tmp_path, warmup_steps=100, max_train_minutes=1.0)
    assert find_time_budget(plain.callback_handler.callbacks) is None
    callback = find_time_budget(budget.callback_handler.callbacks)
    callback.elapsed_seconds = 45.0  # inverse_sqrt (the default) needs no total: the budget leaves it alone
    for step in (1, 50, 100, 400, 10_000):
        assert budget.lr_scheduler.lr_lambdas[0](step) == plain.lr_scheduler.lr_lambdas[0](step)
    assert budget.lr_scheduler.lr_lambdas[0](400) == pytest.approx(0.5)

    linear = make_trainer(tmp_path, warmup_steps=100, max_train_minutes=1.0, lr_scheduler_type="linear")
    callback = find_time_budget(linear.callback_handler.callbacks)
    factor = linear.lr_scheduler.lr_lambdas[0]
    assert (factor(50), factor(5000)) == (0.5, pytest.approx(1.0, abs=1e-5))  # the step cap is far away
    callback.elapsed_seconds = 30.0  # the trainer's schedule reads the callback's clock
    assert factor(5000) == pytest.approx(0.5)
    callback.elapsed_seconds = 60.0
    assert factor(5000) == 0.0


def test_an_unsupported_schedule_is_refused_clearly(tmp_path):
    message = r"--lr_scheduler_type polynomial cannot be combined with --max_train_minutes; supported: linear, cosine"
    with pytest.raises(ValueError, match=message):
        TranslationTrainingArguments(output_dir=str(tmp_path), max_train_minutes=5, lr_scheduler_type="polynomial")
    with pytest.raises(ValueError, match=message):
        budget_lr_lambda("polynomial", 10, 100, lambda: 0.0, 60.0)
    TranslationTrainingArguments(output_dir=str(tmp_path), lr_scheduler_type="polynomial")  # fine without a budget
    with pytest.raises(SystemExit) as info:
        recipe.main(["--output_dir", str(tmp_path), "--max_train_minutes", "5", "--lr_scheduler_type", "polynomial"])
    assert str(info.value.code).startswith("train.py: error: --lr_scheduler_type polynomial cannot be combined")


# --------------------------------------------------------------------------------------------------------------------
# The clock: what counts, stopping, resuming
# --------------------------------------------------------------------------------------------------------------------


def test_the_spent_time_is_saved_with_a_checkpoint_and_restored_on_resume(tmp_path):
    args = TranslationTrainingArguments(
        output_dir=str(tmp_path), max_train_minutes=1, save_strategy="steps", save_steps=10, report_to="none"
    )
    clock = FakeClock()
    first = TimeBudgetCallback(1)
    first.timer = clock
    state, control = TrainerState(stateful_callbacks=[first]), TrainerControl()
    first.on_train_begin(args, state, control)
    for _ in range(40):  # 40 steps of 1 s, with an evaluation of 100 s after step 20 that does not count
        clock.now += 1.0
        state.global_step += 1
        first.on_step_end(args, state, control)
        if state.global_step == 20:
            clock.now += 100.0
            first.on_evaluate(args, state, control)
    assert first.elapsed_seconds == 40.0 and not control.should_training_stop
    # what Trainer._save_checkpoint does with an ExportableState
    state.stateful_callbacks["TimeBudgetCallback"] = first.state()
    state.save_to_json(str(tmp_path / "trainer_state.json"))

    clock.now += 3600.0  # the machine was down for an hour: not training time either
    resumed = TimeBudgetCallback(1)
    resumed.timer = clock
    state, control = TrainerState.load_from_json(str(tmp_path / "trainer_state.json")), TrainerControl()
    resumed.on_train_begin(args, state, control)
    assert resumed.elapsed_seconds == 40.0
    while not control.should_training_stop:
        clock.now += 1.0
        state.global_step += 1
        control = resumed.on_step_end(args, state, control)
    assert (state.global_step, resumed.stopped_at_step, resumed.elapsed_seconds) == (60, 60, 60.0)
    assert control.should_save  # as at max_steps: a last checkpoint for a step-based save strategy
    resumed.on_train_end(args, state, control)  # the run's own trainer_state.json gets the total too
    assert state.stateful_callbacks["TimeBudgetCallback"]["attributes"]["elapsed_seconds"] == 60.0

    fresh = TimeBudgetCallback(1)  # a new run (step 0) starts from nothing, whatever the state holds
    fresh.on_train_begin(args, TrainerState(stateful_callbacks=[resumed]), TrainerControl())
    assert fresh.elapsed_seconds == 0.0


@pytest.mark.parametrize("value", ["0", "-2", "nan"])
def test_a_bad_budget_is_one_line(tmp_path, value):
    with pytest.raises(SystemExit) as info:
        recipe.main(["--output_dir", str(tmp_path), "--max_train_minutes", value])
    text = str(info.value.code)
    assert text.startswith("train.py: error: --max_train_minutes ") and "\n" not in text
    assert text.endswith("is invalid; it must be a positive number of minutes."), text
    with pytest.raises(ValueError, match="it must be a positive number of minutes"):
        TimeBudgetCallback(float(value))


def test_a_fraction_of_unknown_total_steps_is_refused(tmp_path):
    with pytest.raises(SystemExit) as info:
        recipe.main(["--output_dir", str(tmp_path), "--max_train_minutes", "5", "--warmup_steps", "0.1"])
    assert str(info.value.code) == (
        "train.py: error: --warmup_steps 0.1 is a fraction of the training steps, unknown with --max_train_minutes "
        "alone; give it in steps, or also give --max_steps or --num_train_epochs."
    )
