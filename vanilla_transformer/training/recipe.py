"""The recipe: train, evaluate and save a translation model with the paper's recipe (Vaswani et al., 2017, §5), as
`scripts/train.py` runs it. `main(argv)` takes the script's command line (also from Python or a notebook:
`main(["--output_dir", "outputs/demo"])`) and returns the metrics; its argument dataclasses are `ModelArguments`,
`TrainingDataArguments` and `TranslationTrainingArguments` (training/arguments.py)."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field

import torch
import transformers
from datasets import DatasetDict
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoTokenizer, HfArgumentParser, set_seed

from .. import VanillaTransformerForConditionalGeneration
from ..hub.model_card import write_model_card
from .arguments import TranslationTrainingArguments, implied_defaults
from .checkpoints import check_checkpoint, last_complete_checkpoint, load_trained_model
from .cpu import busy_cpus, recorded_threads, set_cpu_threads
from .data import (
    MIN_ROWS_PER_WORKER,
    DataArguments,
    DataError,
    default_num_workers,
    select_samples,
    tokenize_splits,
)
from .device import DeviceDefaults, decide
from .preparation import DEFAULT_TIMEOUT, in_turn
from .presets import PRESETS, build_config, default_generation_config
from .sharding import check_parallelism_can_run, describe_parallelism
from .time_budget import cap_steps, describe_budget, describe_stop, steps_trained
from .tokenizer import check_tokenizer_matches_config, iterate_texts, train_tokenizer
from .trainer import build_trainer
from .workarounds import torch_cpu_bf16_flash_attention, torch_cpu_bf16_kernel_caches

logger = logging.getLogger("train")


@dataclass
class ModelArguments:
    """Which model to train: a fresh one (preset, JSON config, flags) or a saved one to continue."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "A saved model folder to continue training from, instead of a fresh model."}
    )
    preset: str | None = field(
        default=None,
        metadata={
            "help": "Fresh model and training defaults: "
            + "; ".join(f"{name}: {preset['description']}" for name, preset in PRESETS.items())
            + ". Default: small for the demo corpus, compact for your own data.",
            "choices": list(PRESETS),
        },
    )
    config_name: str | None = field(
        default=None, metadata={"help": "A VanillaTransformerConfig JSON file (or folder) for a fresh model."}
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Config fields to change, e.g. 'd_model=256,encoder_layers=3,dropout=0.2' (read by transformers' "
            "PreTrainedConfig.update_from_string: each value as the type of the field's current value)."
        },
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "A saved tokenizer (scripts/train_tokenizer.py). Default: the model's with --model_name_or_path, "
            "else one trained here on the training split and saved in --output_dir."
        },
    )
    vocab_size: int | None = field(
        default=None,
        metadata={"help": "Vocabulary size of the tokenizer trained here (default: the preset's)."},
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "The attention implementation to train and evaluate with (config._attn_implementation): eager, "
            "sdpa, or one registered with transformers' AttentionInterface. Default: transformers' (sdpa), but eager "
            "to train in bf16 on a CPU, where torch's SDPA kernel trains several times slower (docs/performance.md); "
            "evaluation after training then decodes with sdpa. Not saved with the model."
        },
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where `datasets` caches downloaded data."})


@dataclass
class TrainingDataArguments(DataArguments):
    """Which parallel data to train and evaluate on (none given = the built-in demo corpus), and how it is filtered."""

    max_source_length: int | None = field(
        default=None,
        metadata={
            "help": "Longest source in tokens (eos included): longer training pairs are dropped, longer validation and "
            "test sources truncated. Default: the preset's."
        },
    )
    max_target_length: int | None = field(
        default=None,
        metadata={
            "help": "Longest target in tokens (eos included): longer training pairs are dropped; validation and test "
            "sentences are scored whole. Default: the preset's."
        },
    )
    preprocessing_num_workers: int | None = field(
        default=None,
        metadata={
            "help": "Processes for tokenisation. Default: one per idle CPU, but one per "
            f"{MIN_ROWS_PER_WORKER:,} pairs at most (a single one for smaller data)."
        },
    )
    overwrite_cache: bool = field(
        default=False,
        metadata={
            "help": "Tokenise again instead of loading the tokenised splits that an earlier run with the same data, "
            "tokenizer, languages and length limits left in the datasets cache (several processes: the first one of "
            "each machine does)."
        },
    )
    preparation_timeout: int = field(
        default=DEFAULT_TIMEOUT,
        metadata={
            "help": "Several processes: seconds the others wait while process 0 trains the tokenizer and tokenises "
            "(then the first process of each other machine, in its datasets cache); --ddp_timeout covers the rest of "
            "the run (docs/training.md#several-machines-a-big-corpus)."
        },
    )


def given_flags(argv: list[str]) -> set[str]:
    """The dataclass field names given on the command line."""
    return {arg[2:].split("=", 1)[0].replace("-", "_") for arg in argv if arg.startswith("--")}


def parse_arguments(
    argv: list[str],
) -> tuple[ModelArguments, TrainingDataArguments, TranslationTrainingArguments, bool]:
    """Parse with the preset's training defaults in place; returns the three dataclasses and whether the do_* flags
    were chosen automatically (all three, for the splits that exist)."""
    parser = HfArgumentParser((ModelArguments, TrainingDataArguments, TranslationTrainingArguments))
    from_json = len(argv) == 1 and argv[0].endswith(".json")
    if from_json:
        with open(argv[0]) as f:
            values = json.load(f)
        given = set(values)
    else:
        given = given_flags(argv)
    if {"help", "h"} & given or "-h" in argv:
        parser.parse_args_into_dataclasses(argv)  # prints the help and exits

    # first pass: the model and data arguments decide the preset, whose defaults the full parse then uses
    pre_parser = HfArgumentParser((ModelArguments, TrainingDataArguments), add_help=False)
    if from_json:
        model_args, data_args = pre_parser.parse_dict(values, allow_extra_keys=True)
    else:
        model_args, data_args, _ = pre_parser.parse_args_into_dataclasses(argv, return_remaining_strings=True)
    preset = model_args.preset or ("compact" if data_args.has_own_data() else "small")
    # the device's defaults (training/device.py): bf16, TF32 and a token batch on a GPU; bf16 on a CPU alone that
    # multiplies it in hardware, where the preset asks for it (a flag given always wins)
    defaults = decide("cpu" if "use_cpu" in given else None).training_defaults(preset, given)
    auto_do = not {"do_train", "do_eval", "do_predict"} & given
    if auto_do:
        defaults.update(do_train=True, do_eval=True, do_predict=True)
    if not torch.accelerator.is_available():
        defaults["dataloader_pin_memory"] = False  # pinned memory only helps copies to an accelerator
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # `accelerate launch --multi_gpu` without GPUs: told to use the CPU, the processes join a gloo group;
            # else Accelerate finds no GPU backend and each trains alone, on all the data
            defaults["use_cpu"] = True

    # what the given flags imply (--save_steps: save by steps; --bf16 without an accelerator: on the CPU) wins over
    # the preset; read from the values as parsed, before TrainingArguments checks them
    parser.set_defaults(**defaults)
    parsed = vars(parser.parse_known_args([] if from_json else argv)[0]) | (values if from_json else {})
    defaults.update(implied_defaults(given, parsed, accelerator_available=torch.accelerator.is_available()))

    if from_json:
        model_args, data_args, training_args = parser.parse_dict({**defaults, **values})
    else:
        parser.set_defaults(**defaults)
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(argv)
    model_args.preset = preset
    cap_steps(training_args, given)  # the time budget alone ends training: its step cap
    data_args.max_source_length = data_args.max_source_length or PRESETS[preset]["max_length"]
    data_args.max_target_length = data_args.max_target_length or PRESETS[preset]["max_length"]
    return model_args, data_args, training_args, auto_do


def resolve_checkpoint(training_args: TranslationTrainingArguments) -> str | None:
    """--resume_from_checkpoint: a checkpoint folder, or 'last' / 'true' for the newest one in --output_dir."""
    value = training_args.resume_from_checkpoint
    if value is None or str(value).lower() in ("false", "none", ""):
        return None
    if str(value).lower() in ("last", "true"):
        # the newest checkpoint written completely: a run killed while saving leaves a partial folder behind
        last = last_complete_checkpoint(training_args.output_dir)
        if last is None:
            raise DataError(
                f"--resume_from_checkpoint {value}: no checkpoint-* folder in {training_args.output_dir!r}."
            )
        return last
    if not os.path.isdir(value):
        raise DataError(f"--resume_from_checkpoint {value!r} is not a folder.")
    check_checkpoint(value)
    return value


def load_tokenizer(model_args, raw, source_lang, target_lang, training_args, checkpoint, timeout=DEFAULT_TIMEOUT):
    """The tokenizer: given, the model's, the checkpoint's, or trained here on the training split (by process 0,
    which saves it in --output_dir, where the others wait up to `timeout` seconds to load it)."""
    for flag, path in (
        ("--tokenizer_name", model_args.tokenizer_name),
        ("--model_name_or_path", model_args.model_name_or_path),
        ("--resume_from_checkpoint", checkpoint),
    ):
        if path is not None:
            if not os.path.exists(path):
                raise DataError(f"{flag} {path!r} does not exist.")
            if flag != "--resume_from_checkpoint" or os.path.isfile(os.path.join(path, "tokenizer.json")):
                try:
                    return AutoTokenizer.from_pretrained(path, cache_dir=model_args.cache_dir), path
                except (OSError, ValueError) as error:
                    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                    raise DataError(f"{flag} {path!r}: no tokenizer could be loaded ({reason}).") from error
    if "train" not in raw:
        raise DataError("a tokenizer is needed: pass --tokenizer_name, --model_name_or_path or training data.")
    vocab_size = model_args.vocab_size or PRESETS[model_args.preset]["vocab_size"]
    # one process trains and saves it, the others load it, so that every rank has the same vocabulary
    what = f"training the tokenizer on {len(raw['train']):,} pairs"
    with in_turn(training_args, what, timeout) as turn:
        if turn == 0:
            tokenizer = train_tokenizer(iterate_texts(raw["train"], source_lang, target_lang), vocab_size=vocab_size)
            tokenizer.save_pretrained(training_args.output_dir)
        else:
            try:
                tokenizer = AutoTokenizer.from_pretrained(training_args.output_dir)
            except (OSError, ValueError) as error:
                raise DataError(
                    f"process {training_args.process_index} found no tokenizer in --output_dir "
                    f"{training_args.output_dir!r}, where process 0 saved the one it trained: on several machines "
                    "--output_dir must be shared, or train it once (scripts/train_tokenizer.py) and pass "
                    "--tokenizer_name."
                ) from error
    return tokenizer, f"a {len(tokenizer)}-token BPE tokenizer trained on the training split"


def build_model(model_args, tokenizer, tokenizer_source):
    if model_args.model_name_or_path is not None:
        if model_args.config_name or model_args.config_overrides:
            raise DataError("--config_name/--config_overrides make a fresh model; drop them with --model_name_or_path.")
        model = load_trained_model(model_args.model_name_or_path, cache_dir=model_args.cache_dir)
    else:
        config = build_config(
            preset=model_args.preset,
            config_name=model_args.config_name,
            overrides=model_args.config_overrides,
            vocab_size=len(tokenizer),
        )
        model = VanillaTransformerForConditionalGeneration(config)
    check_tokenizer_matches_config(tokenizer, model.config, tokenizer_source)
    return model


def describe_precision(training_args: TranslationTrainingArguments, device: DeviceDefaults | None = None) -> str:
    """The training precision in a few words (``DeviceDefaults.describe_precision``; `device`: the run's device
    defaults, by default decided for the training arguments' device)."""
    return (device or decide(training_args.device.type)).describe_precision(training_args)


def print_summary(metrics: dict, output_dir: str) -> None:
    width = max(map(len, metrics), default=10)
    print(f"\n{'metric':<{width}}  value")
    print(f"{'-' * width}  {'-' * 12}")
    for name in sorted(metrics):
        value = metrics[name]
        print(f"{name:<{width}}  {value:.4f}" if isinstance(value, float) else f"{name:<{width}}  {value}")
    print(f"\nsaved model, tokenizer, generation_config.json and all_results.json in {output_dir}")


def one_line(error: BaseException, whole: bool = False) -> str:
    """An error's message on one line: its first line, or (`whole`) all its lines joined."""
    text = str(error).strip()
    return " ".join(text.split()) if whole else (text.splitlines() or [type(error).__name__])[0]


def load_splits(
    data_args: TrainingDataArguments, training_args: TranslationTrainingArguments, auto_do: bool, cache_dir=None
) -> tuple[DatasetDict, str, str]:
    """The splits the run reads, cut to the --max_*_samples: with `auto_do` (no --do_* flag given) the do_* flags
    follow the splits that exist; a split that nobody reads is neither tokenised nor kept."""
    raw, source_lang, target_lang = data_args.load(cache_dir=cache_dir)
    for flag, split in (("--do_train", "train"), ("--do_eval", "validation"), ("--do_predict", "test")):
        if getattr(training_args, flag[2:]) and split not in raw:
            if not auto_do:
                raise DataError(f"{flag} needs a {split} split, and the data has only {list(raw)}.")
            setattr(training_args, flag[2:], False)
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise DataError("nothing to do: give data with a train, validation or test split.")
    needed = {
        "train": training_args.do_train,
        "validation": training_args.do_eval or training_args.eval_strategy != "no",
        "test": training_args.do_predict,
    }
    raw = DatasetDict({split: dataset for split, dataset in raw.items() if needed[split]})
    return select_samples(raw, data_args.max_samples()), source_lang, target_lang


def choose_attention(model, model_args: ModelArguments, training_args: TranslationTrainingArguments) -> str:
    """Set the attention to train with and return the one to decode with: a given --attn_implementation serves
    both; else `workarounds.torch_cpu_bf16_flash_attention` may pick one for training only."""
    decoding = model_args.attn_implementation or model.config._attn_implementation
    training = decoding
    if training_args.do_train:
        training = torch_cpu_bf16_flash_attention.attention_for_training(model_args.attn_implementation, training_args)
        training = training or decoding
    if training != model.config._attn_implementation:
        model.set_attn_implementation(training)  # a ValueError for an implementation transformers does not know
    return decoding


def set_generation_defaults(model, model_args, data_args, training_args) -> None:
    """Beam search as in the paper for a fresh model (or a checkpoint that decodes greedily); the longest output is
    --generation_max_length, by default the longest target + 1, unless a checkpoint's max_new_tokens decides."""
    given = training_args.generation_max_length
    training_args.generation_max_length = given or data_args.max_target_length + 1
    if model_args.model_name_or_path is None or model.generation_config.num_beams == 1:
        model.generation_config = default_generation_config(
            model.config,
            num_beams=training_args.generation_num_beams or 4,
            max_length=training_args.generation_max_length,
        )
    elif given is None and model.generation_config.max_new_tokens is not None:
        training_args.generation_max_length = None  # the checkpoint's max_new_tokens decides, unless the flag is given


def describe_run(
    model, model_args, training_args, source_lang, target_lang, tokenizer_source, threads, device=None
) -> str:
    """The start-up line: the model, languages, tokenizer, global batch, threads, precision, attention, parallelism;
    on an accelerator, its name. `device`: the run's `DeviceDefaults` (default: decided for the arguments' device)."""
    device = device or decide(training_args.device.type)
    parameters = sum(p.numel() for p in model.parameters())
    per_device, accumulation = training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps
    scale = f"x {training_args.world_size} processes x {accumulation} accumulation steps"
    if training_args.max_tokens_per_batch:
        batch = f"<= {training_args.max_tokens_per_batch} padded tokens per side per device {scale}"
    else:
        batch = f"{per_device} pairs per device {scale} = {per_device * training_args.world_size * accumulation} pairs"
    return (
        f"model: {parameters / 1e6:.2f}M parameters ({model_args.model_name_or_path or model_args.preset}); "
        f"{source_lang}->{target_lang}; tokenizer: {tokenizer_source}; global batch {batch}; "
        f"CPU threads {threads}; "
        + (f"device: {device.name}; " if device.device != "cpu" else "")
        + f"precision: {describe_precision(training_args, device)}; attention: {model.config._attn_implementation}"
    )


def run(
    model_args: ModelArguments,
    data_args: TrainingDataArguments,
    training_args: TranslationTrainingArguments,
    *,
    auto_do: bool = False,
    callbacks=None,
    model_builder=None,
) -> dict:
    """The recipe, from the arguments (as `parse_arguments` gives them) to the saved model: read the data, the
    tokenizer and the model, tokenise, train, evaluate and predict (translating as translate.py does), save the model
    with its card; returns the metrics. Everything that can be wrong with the arguments or the data raises a
    one-line `DataError` before any training. `callbacks`: extra TrainerCallbacks (tests watch the run with them);
    `model_builder`: replaces `build_model` (benchmarks/marian_train.py trains transformers' Marian this way)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    is_main = training_args.process_index == 0
    set_seed(training_args.seed)
    try:
        check_parallelism_can_run(training_args)  # before the data: sharding these processes cannot run, in one line
        checkpoint = resolve_checkpoint(training_args)
        # a resumed run keeps the thread count of the run it continues (recorded in the checkpoint): the same sums
        threads = set_cpu_threads(training_args.threads, recorded_threads(checkpoint))
        # before the first bf16 product on a CPU: oneDNN's kernel caches would otherwise keep ~0.7 MiB per shape
        torch_cpu_bf16_kernel_caches.limit_kernel_caches(training_args)
        raw, source_lang, target_lang = load_splits(data_args, training_args, auto_do, model_args.cache_dir)
        if not training_args.do_train and model_args.model_name_or_path is None:
            raise DataError("evaluating without training needs a trained model: pass --model_name_or_path.")
        tokenizer, tokenizer_source = load_tokenizer(
            model_args, raw, source_lang, target_lang, training_args, checkpoint, data_args.preparation_timeout
        )
        model = (model_builder or build_model)(model_args, tokenizer, tokenizer_source)
        learned = getattr(model.config, "position_embedding_type", None) == "learned"
        what = f"tokenising {sum(map(len, raw.values())):,} pairs"
        with in_turn(training_args, what, data_args.preparation_timeout) as turn:
            tokenized = tokenize_splits(
                raw,
                tokenizer,
                source_lang,
                target_lang,
                data_args.max_source_length,
                data_args.max_target_length,
                num_proc=data_args.preprocessing_num_workers
                or default_num_workers(max(map(len, raw.values())), busy_cpus),
                # the last turn loads what its machine's first process left in the cache
                load_from_cache_file=not data_args.overwrite_cache or turn == 2,
                print_fn=print if is_main else None,
                max_positions=model.config.max_position_embeddings if learned else None,
            )
        decoding_attention = choose_attention(model, model_args, training_args)
    except StrictDataclassError as error:  # a config value that @strict refuses: the field and why, on one line
        raise DataError(one_line(error, whole=True)) from error
    except (ValueError, OSError) as error:  # DataError included
        raise DataError(one_line(error)) from error
    set_generation_defaults(model, model_args, data_args, training_args)
    try:
        trainer = build_trainer(
            model,
            training_args,
            tokenizer,
            train_dataset=tokenized.get("train") if training_args.do_train else None,
            eval_dataset=tokenized.get("validation"),
            callbacks=callbacks,
            languages=(source_lang, target_lang),
        )
    except ValueError as error:  # e.g. a parallelism the launch asked for that cannot run here
        raise DataError(one_line(error, whole=True)) from error

    if is_main:
        decodes_after = training_args.do_eval or training_args.do_predict  # with the decoding attention
        trained_with = model.config._attn_implementation
        print(
            describe_run(model, model_args, training_args, source_lang, target_lang, tokenizer_source, threads)
            + (f" (decoding: {decoding_attention})" if decodes_after and decoding_attention != trained_with else "")
            + f"; parallelism: {describe_parallelism(trainer.accelerator)}"
        )
        if describe_budget(training_args):
            print(describe_budget(training_args))

    metrics: dict = {}
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=checkpoint)
        if is_main and describe_stop(trainer):
            print(f"train.py: {describe_stop(trainer)}")
        trainer.save_model()  # model, tokenizer and generation_config.json
        metrics.update(report(trainer, "train", dict(result.metrics, train_samples=len(tokenized["train"]))))
        trainer.save_state()
    if decoding_attention != model.config._attn_implementation:
        model.set_attn_implementation(decoding_attention)  # the training attention was for the backward pass
    if training_args.do_eval:
        evaluated = trainer.evaluate(metric_key_prefix="eval")
        metrics.update(report(trainer, "eval", dict(evaluated, eval_samples=len(tokenized["validation"]))))
    if training_args.do_predict:
        prediction = trainer.predict(tokenized["test"], metric_key_prefix="predict")
        metrics.update(report(trainer, "predict", dict(prediction.metrics, predict_samples=len(tokenized["test"]))))
        if trainer.is_world_process_zero():
            # one line per test pair, in the file's order (a generated line break would split a line)
            lines = [" ".join(translation.split()) for translation in prediction.predictions]
            with open(os.path.join(training_args.output_dir, "generated_predictions.txt"), "w") as f:
                f.write("\n".join(lines) + "\n")

    if trainer.is_world_process_zero():
        write_card(trainer, metrics, data_args, source_lang, target_lang)
    # Every process leaves its process group before it exits (transformers' `Trainer.end`): left to the interpreter's
    # exit, a gloo group can abort the process after its work is saved (`workarounds.torch_gloo_group_teardown`).
    # Only on success: a process that failed leaves the group as it is (destroying it while the others still wait in
    # a collective can hang them).
    trainer.end()
    return metrics


def report(trainer, split: str, metrics: dict) -> dict:
    """Log and save a split's metrics as transformers' example scripts do; returns them."""
    trainer.log_metrics(split, metrics)
    trainer.save_metrics(split, metrics)
    return metrics


def write_card(trainer, metrics: dict, data_args, source_lang: str, target_lang: str) -> None:
    """The model card of the saved model (hub.model_card), and the summary of the metrics; a run that saved no model
    says so instead."""
    args = trainer.args
    if not os.path.isfile(os.path.join(args.output_dir, "config.json")):
        print(f"train.py: no model card: {args.output_dir} holds no saved model (nothing was trained here)")
        return
    demo = "the built-in German->English number-words demo corpus" if not data_args.has_own_data() else None
    write_model_card(
        args.output_dir,
        metrics=metrics,
        training_args=steps_trained(args, trainer.state.global_step),
        dataset_name=data_args.dataset_name or data_args.train_file or demo,
        source_lang=source_lang,
        target_lang=target_lang,
    )
    print_summary(metrics, args.output_dir)


def main(argv: list[str] | None = None, callbacks=None, model_builder=None) -> dict:
    """scripts/train.py: parse `argv` (default: the command line), `run` the recipe, return its metrics; a bad
    argument or bad data ends it with one line, `train.py: error: ...`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        model_args, data_args, training_args, auto_do = parse_arguments(argv)
    except ValueError as error:  # a value the training arguments refuse, e.g. --max_train_minutes 0
        raise SystemExit(f"train.py: error: {one_line(error, whole=True)}") from None
    try:
        return run(
            model_args, data_args, training_args, auto_do=auto_do, callbacks=callbacks, model_builder=model_builder
        )
    except DataError as error:
        raise SystemExit(f"train.py: error: {error}") from None
