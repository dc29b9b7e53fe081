"""Training end to end: presets and the paper's recipe, train.py, translate.py, average_checkpoints.py,
resuming, data parallel training with Accelerate, and one-line errors before any training."""

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import sacrebleu
import torch
from conftest import ROOT, TINY_OVERRIDES, free_port, load_script, run_script, script_env, tiny_model
from datasets import DatasetDict
from huggingface_hub.errors import StrictDataclassError
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    TrainingArguments,
)
from transformers.testing_utils import CaptureLogger
from transformers.trainer_utils import sort_checkpoints
from transformers.utils import logging as transformers_logging

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.inference.score import score
from vanilla_transformer.inference.translate import translate
from vanilla_transformer.training import device as device_defaults
from vanilla_transformer.training import recipe
from vanilla_transformer.training.arguments import TranslationTrainingArguments, implied_defaults
from vanilla_transformer.training.checkpoints import load_weights, save_averaged_model
from vanilla_transformer.training.data import demo_corpus, tokenize_splits
from vanilla_transformer.training.presets import PRESETS, build_config, default_generation_config
from vanilla_transformer.training.tokenizer import iterate_texts, train_tokenizer
from vanilla_transformer.training.trainer import build_trainer

TINY_MODEL = [
    "--config_overrides",
    TINY_OVERRIDES,
    "--max_source_length",
    "32",
    "--max_target_length",
    "32",
    "--generation_max_length",
    "10",
    "--disable_tqdm",
    "true",
    "--report_to",
    "none",
]


@pytest.fixture(scope="module")
def demo_tokenizer(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("demo-tokenizer"))
    train_tokenizer(iterate_texts(demo_corpus()["train"], "de", "en"), vocab_size=400).save_pretrained(path)
    return path


# --------------------------------------------------------------------------------------------------------------------
# Presets, arguments and the paper's recipe
# --------------------------------------------------------------------------------------------------------------------


def test_presets():
    compact = build_config("compact", vocab_size=8000)
    assert (compact.d_model, compact.encoder_layers, compact.decoder_layers) == (256, 3, 3)
    assert (compact.encoder_attention_heads, compact.encoder_ffn_dim, compact.init_scheme) == (4, 1024, "normal")
    assert compact.dropout == 0.0  # runs of minutes on a CPU underfit (docs/results.md); base and big keep the paper's
    assert build_config("compact", overrides="dropout=0.1").dropout == 0.1  # a flag the user gives takes effect
    assert PRESETS["compact"]["vocab_size"] == 8000
    base, big = build_config("base", vocab_size=37000), build_config("big", vocab_size=37000)
    paper_base = VanillaTransformerConfig(vocab_size=37000).to_dict()
    assert {k: v for k, v in base.to_dict().items() if k != "transformers_version"} == {
        k: v for k, v in paper_base.items() if k != "transformers_version"
    }
    assert (base.d_model, base.encoder_layers, base.encoder_attention_heads, base.encoder_ffn_dim) == (512, 6, 8, 2048)
    assert (big.d_model, big.decoder_layers, big.decoder_attention_heads, big.decoder_ffn_dim) == (1024, 6, 16, 4096)
    assert (base.dropout, big.dropout) == (0.1, 0.3)
    small = build_config("small", vocab_size=400, overrides="d_model=64,dropout=0.2")
    assert (small.vocab_size, small.decoder_vocab_size, small.d_model, small.dropout) == (400, 400, 64, 0.2)
    # the peak learning rate of each preset is the paper's d_model^-0.5 * warmup^-0.5
    for name, config in (("base", base), ("big", big)):
        training = PRESETS[name]["training"]
        assert training["learning_rate"] == pytest.approx(
            config.d_model**-0.5 * training["warmup_steps"] ** -0.5, rel=0.02
        )
    with pytest.raises(ValueError, match="--preset 'huge' is unknown"):
        build_config("huge")


def test_config_overrides_are_read_by_update_from_string_and_checked():
    """--config_overrides goes through transformers' PreTrainedConfig.update_from_string (as run_translation.py's);
    every value is read as the type of the field's current value, and the config's checks run once more."""
    overrides = "d_model=64, dropout=0.2,position_embedding_type=learned,normalize_before=true,hidden_size=96,"
    config = build_config("small", vocab_size=400, overrides=overrides)
    assert (config.d_model, config.dropout, config.position_embedding_type) == (96, 0.2, "learned")
    assert config.normalize_before is True and type(config.dropout) is float
    separate = build_config(
        "small", vocab_size=400, overrides="share_encoder_decoder_embeddings=false,decoder_vocab_size=300"
    )
    assert (separate.vocab_size, separate.decoder_vocab_size) == (400, 300)
    for overrides, error, message in [
        ("heads=4", ValueError, "--config_overrides: 'heads=4': key heads isn't in the original config dict"),
        ("d_model", ValueError, "--config_overrides: 'd_model' is not of the form key=value"),
        ("d_model=big", ValueError, "'d_model=big': invalid literal for int()"),
        ("normalize_before=maybe", ValueError, "can't derive true or false from maybe (key normalize_before)"),
        ("position_embedding_type=rotary", StrictDataclassError, "'position_embedding_type' expected one of"),
        ("d_model=30", StrictDataclassError, "`encoder_attention_heads`=4 is invalid; d_model=30 must be divisible"),
        ("dropout=1.5", StrictDataclassError, "`dropout`=1.5 is invalid; it must be a probability in [0, 1)"),
        ("decoder_vocab_size=300", StrictDataclassError, "it must equal vocab_size=400"),
    ]:
        with pytest.raises(error, match=re.escape(message)):
            build_config("small", vocab_size=400, overrides=overrides)


def test_preset_defaults_yield_to_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(device_defaults, "native_bf16_matmul", lambda: None)  # the float32 defaults, on any CPU
    out = ["--output_dir", str(tmp_path)]
    model_args, data_args, args, auto_do = recipe.parse_arguments(out)
    assert model_args.preset == "small" and auto_do and args.do_train and args.do_eval and args.do_predict
    assert (args.learning_rate, args.warmup_steps) == (PRESETS["small"]["training"]["learning_rate"], 200)
    assert data_args.max_source_length == PRESETS["small"]["max_length"]

    own_data = out + ["--train_file", "x.jsonl", "--source_lang", "de", "--target_lang", "en", "--do_train"]
    model_args, data_args, args, auto_do = recipe.parse_arguments(own_data)
    assert model_args.preset == "compact" and not auto_do and not args.do_eval
    assert (args.learning_rate, args.warmup_steps, data_args.max_source_length) == (1e-3, 200, 256)
    assert (args.lr_scheduler_type, args.max_tokens_per_batch) == ("linear", 512)
    # the budget alone ends training: no epoch limit, and the linear decay follows the clock
    _, _, args, _ = recipe.parse_arguments(own_data + ["--max_train_minutes", "15"])
    assert args.max_train_minutes == 15 and args.max_steps > 10**8
    _, _, args, _ = recipe.parse_arguments(own_data + ["--max_tokens_per_batch", "300", "--preset", "base"])
    assert (args.max_tokens_per_batch, args.learning_rate, args.lr_scheduler_type) == (300, 7e-4, "inverse_sqrt")

    _, _, args, _ = recipe.parse_arguments(out + ["--learning_rate", "1e-4", "--preset", "big"])
    assert (args.learning_rate, args.warmup_steps) == (1e-4, 4000)


def test_a_step_count_given_means_its_strategy_by_steps(tmp_path):
    """The `small` preset saves every epoch; --save_steps alone must not be ignored (nor --eval_steps alone)."""
    out = ["--output_dir", str(tmp_path)]
    _, _, args, _ = recipe.parse_arguments(out)
    assert (args.save_strategy, args.eval_strategy) == ("epoch", "no")
    _, _, args, _ = recipe.parse_arguments(out + ["--save_steps", "20"])
    assert (args.save_strategy, args.save_steps) == ("steps", 20)
    _, _, args, _ = recipe.parse_arguments(out + ["--save_steps=20", "--save_strategy", "epoch"])
    assert args.save_strategy == "epoch"
    _, _, args, _ = recipe.parse_arguments(out + ["--eval_steps", "30"])
    assert (args.eval_strategy, args.eval_steps, args.save_strategy) == ("steps", 30, "epoch")
    _, _, args, _ = recipe.parse_arguments(out + ["--eval_steps", "30", "--eval_strategy", "epoch"])
    assert args.eval_strategy == "epoch"
    (tmp_path / "args.json").write_text(json.dumps({"output_dir": str(tmp_path), "save_steps": 20}))
    _, _, args, _ = recipe.parse_arguments([str(tmp_path / "args.json")])
    assert (args.save_strategy, args.save_steps) == ("steps", 20)

    # keeping the best model: saving follows the evaluations unless a saving flag is given (the compact preset's
    # save_steps 1000 is no multiple of 300, the small preset's save_strategy epoch no match for steps)
    own_data = out + ["--train_file", "x.jsonl", "--source_lang", "de", "--target_lang", "en"]
    for argv in (out, own_data):
        _, _, args, _ = recipe.parse_arguments(argv + ["--load_best_model_at_end", "--eval_steps", "300"])
        assert (args.eval_strategy, args.save_strategy) == ("steps", "steps")
        assert (args.eval_steps, args.save_steps) == (300, 300)
    _, _, args, _ = recipe.parse_arguments(out + ["--load_best_model_at_end", "--eval_strategy", "epoch"])
    assert args.save_strategy == "epoch"
    values = {"output_dir": str(tmp_path), "train_file": "x.jsonl", "source_lang": "de", "target_lang": "en"}
    (tmp_path / "args.json").write_text(json.dumps(values | {"load_best_model_at_end": True, "eval_strategy": "steps"}))
    _, _, args, _ = recipe.parse_arguments([str(tmp_path / "args.json")])
    assert (args.save_strategy, args.save_steps, args.eval_steps) == ("steps", 500, 500)  # every logging_steps
    with pytest.raises(ValueError, match="multiple of the evaluation steps"):
        recipe.parse_arguments(out + ["--load_best_model_at_end", "--eval_steps", "300", "--save_steps", "1000"])


def test_no_pinned_memory_without_an_accelerator(tmp_path, monkeypatch):
    """On a CPU-only machine the Trainer would warn about pin_memory at every run; a given flag still wins."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    _, _, args, _ = recipe.parse_arguments(["--output_dir", str(tmp_path)])
    assert args.dataloader_pin_memory is False
    _, _, args, _ = recipe.parse_arguments(["--output_dir", str(tmp_path), "--dataloader_pin_memory", "true"])
    assert args.dataloader_pin_memory is True
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    _, _, args, _ = recipe.parse_arguments(["--output_dir", str(tmp_path)])
    assert args.dataloader_pin_memory is True

    (tmp_path / "args.json").write_text(json.dumps({"output_dir": str(tmp_path), "warmup_steps": 7}))
    model_args, _, args, _ = recipe.parse_arguments([str(tmp_path / "args.json")])
    assert (model_args.preset, args.warmup_steps, args.learning_rate) == (
        "small",
        7,
        PRESETS["small"]["training"]["learning_rate"],
    )


def test_bf16_without_an_accelerator_runs_on_the_cpu(tmp_path, monkeypatch):
    """transformers refuses --bf16 without a bf16 GPU unless --use_cpu is given; train.py knows there is none."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    out = ["--output_dir", str(tmp_path)]
    for flag in ("--bf16", "--bf16_full_eval"):
        _, _, args, _ = recipe.parse_arguments(out + [flag, "true"])
        assert getattr(args, flag[2:]) is True and args.use_cpu is True
    _, _, args, _ = recipe.parse_arguments(out)
    assert args.use_cpu is False
    if not torch.cuda.is_available():  # a flag given wins: then transformers' own check stands
        with pytest.raises(ValueError, match="bf16"):
            recipe.parse_arguments(out + ["--bf16", "true", "--use_cpu", "false"])
    assert "use_cpu" not in implied_defaults({"bf16"}, {"bf16": True}, accelerator_available=True)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the limit is that of a machine without accelerators")
def test_a_launched_process_without_accelerators_is_told_to_use_the_cpu(monkeypatch):
    """Accelerate gives a process of a 2-process launch without accelerators no backend (DistributedType.NO: each
    process would train alone, on all the data) unless it is told to use the CPU (then gloo, MULTI_CPU): so the
    recipe's default is --use_cpu there. (`_prepare_backend` decides it without starting a group, which would wait
    for the other process; tests/test_training.py's two-process launch checks the group end to end.)"""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port())), ("RANK", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORLD_SIZE", "2")
    state = SimpleNamespace()  # _prepare_backend reads nothing of its state
    assert PartialState._prepare_backend(state, cpu=False) == (None, DistributedType.NO)
    assert PartialState._prepare_backend(state, cpu=True) == ("gloo", DistributedType.MULTI_CPU)
    assert "PartialState(**accelerator_state_kwargs)" in inspect.getsource(TrainingArguments._setup_devices.func)
    assert 'accelerator_state_kwargs["cpu"] = True' in inspect.getsource(TrainingArguments._setup_devices.func)


def test_compact_trains_in_bf16_alone_on_a_cpu_that_multiplies_bf16(tmp_path, monkeypatch):
    """The compact preset (your own data) turns bf16 autocast on where the CPU multiplies bf16 in hardware, train.py
    runs as one process and there is no accelerator, with the batch and learning rate measured for it; a --bf16, --fp16
    or --use_cpu flag given wins (and keeps the preset's plain batch and learning rate); other presets, several
    processes (which are told to use the CPU) and CPUs without the feature keep float32."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(device_defaults, "native_bf16_matmul", lambda: "amx_bf16")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    own_data = ["--output_dir", str(tmp_path), "--train_file", str(tmp_path / "train.jsonl")]

    def precision(argv: list[str]) -> tuple[bool, bool]:
        _, _, args, _ = recipe.parse_arguments(argv)
        return args.bf16, args.use_cpu

    assert precision(own_data) == (True, True)
    assert recipe.describe_precision(recipe.parse_arguments(own_data)[2]).startswith(
        "bf16 autocast (this CPU multiplies bf16 in hardware (amx_bf16); --bf16 false"
    )
    assert precision(own_data + ["--bf16", "false"]) == (False, False)
    assert precision(own_data + ["--use_cpu", "true"]) == (False, True)
    assert precision(own_data + ["--preset", "base"]) == (False, False)

    def batch(argv: list[str]) -> tuple[int, float]:
        _, _, args, _ = recipe.parse_arguments(argv)
        return args.max_tokens_per_batch, args.learning_rate

    plain_batch = (
        PRESETS["compact"]["training"]["max_tokens_per_batch"],
        PRESETS["compact"]["training"]["learning_rate"],
    )
    assert batch(own_data) == (1024, 1.5e-3) != plain_batch
    assert batch(own_data + ["--max_tokens_per_batch", "768"]) == (768, 1.5e-3)
    assert batch(own_data + ["--learning_rate", "1e-3"]) == (1024, 1e-3)
    assert batch(own_data + ["--bf16", "false"]) == batch(own_data + ["--use_cpu", "true"]) == plain_batch
    assert batch(own_data + ["--bf16", "true"]) == plain_batch  # a precision flag given: the preset's plain defaults
    assert precision(["--output_dir", str(tmp_path)]) == (False, False)  # the demo's small preset
    (tmp_path / "args.json").write_text(json.dumps({"output_dir": str(tmp_path), "train_file": "t.jsonl"}))
    assert precision([str(tmp_path / "args.json")]) == (True, True)
    (tmp_path / "args.json").write_text(json.dumps({"output_dir": str(tmp_path), "train_file": "t.jsonl", "bf16": 0}))
    assert precision([str(tmp_path / "args.json")]) == (False, False)
    monkeypatch.setattr(device_defaults, "native_bf16_matmul", lambda: "avx512_bf16")  # without AMX: the same recipe
    assert precision(own_data) == (True, True) and batch(own_data) == (1024, 1.5e-3)
    monkeypatch.setenv("WORLD_SIZE", "2")
    # a launched process: its arguments would join the other processes' group; here they only say what they ask for
    monkeypatch.setattr(TranslationTrainingArguments, "_setup_devices", property(lambda self: torch.device("cpu")))
    assert precision(own_data) == (False, True)  # float32, on the CPU: --use_cpu makes the processes one gloo group
    assert batch(own_data) == plain_batch
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(device_defaults, "native_bf16_matmul", lambda: None)
    assert precision(own_data) == (False, False)
    assert batch(own_data) == plain_batch
    assert recipe.describe_precision(recipe.parse_arguments(own_data)[2]) == "float32"


def test_native_bf16_is_read_from_pytorchs_cpu_capabilities(monkeypatch):
    from vanilla_transformer.training import cpu

    for capabilities, expected in (
        ({"avx512_bf16": True, "amx_bf16": False}, "avx512_bf16"),
        ({"avx512_bf16": True, "amx_bf16": True}, "amx_bf16"),
        ({"avx512_bf16": False, "avx2": True}, None),
        ({"neon": True, "bf16": True}, None),  # ARM: not measured
    ):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda capabilities=capabilities: capabilities)
        assert cpu.native_bf16_matmul() == expected
    monkeypatch.delattr(torch.cpu, "get_capabilities")  # a PyTorch that cannot tell
    assert cpu.native_bf16_matmul() is None


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as info:
        recipe.main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for dataclass in (recipe.ModelArguments, recipe.TrainingDataArguments):
        for f in dataclasses.fields(dataclass):
            assert f.metadata.get("help"), f"--{f.name} has no help"
            assert f"--{f.name}" in text
    for f in dataclasses.fields(Seq2SeqTrainingArguments):
        if f.init and not f.name.startswith("_"):
            assert f"--{f.name}" in text, f"--{f.name} is missing from train.py --help"


def test_the_trainer_follows_the_papers_recipe(tmp_path, demo_tokenizer):
    _, _, args, _ = recipe.parse_arguments(["--output_dir", str(tmp_path), "--preset", "base"])
    tokenizer = AutoTokenizer.from_pretrained(demo_tokenizer)
    trainer = build_trainer(tiny_model(vocab_size=len(tokenizer)), args, tokenizer)
    trainer.create_optimizer_and_scheduler(num_training_steps=100_000)
    group = trainer.optimizer.param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.9, 0.98), 1e-9, 0.0)
    assert args.label_smoothing_factor == 0.1 and trainer.model_computes_loss  # ε_ls, applied by the model (§5.4)
    assert args.generation_num_beams == 4 and args.predict_with_generate
    # stop beam search when no running beam can win, not at the first 4 finished hypotheses (short, broken ones)
    generation = default_generation_config(trainer.model.config)
    assert (generation.num_beams, generation.early_stopping) == (4, False)
    # lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), §5.3, with d_model = 512 and warmup = 4000
    scheduler, warmup = trainer.lr_scheduler, 4000
    for step in (1, 100, 2000, 4000, 8000, 64000):
        factor = scheduler.lr_lambdas[0](step)
        assert args.learning_rate * factor == pytest.approx(512**-0.5 * min(step**-0.5, step * warmup**-1.5), rel=0.01)
    assert scheduler.lr_lambdas[0](16000) == pytest.approx(0.5)  # inverse square root: 4x the steps, half the rate


# --------------------------------------------------------------------------------------------------------------------
# train.py -> translate.py -> average_checkpoints.py
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_train_translate_average_end_to_end(tmp_path):
    out = tmp_path / "run"
    args = ["--output_dir", str(out), "--max_train_samples", "64", "--max_eval_samples", "8"]
    args += ["--max_predict_samples", "8", "--per_device_train_batch_size", "16", "--num_train_epochs", "2"]
    args += ["--save_strategy", "steps", "--save_steps", "4", "--vocab_size", "300", *TINY_MODEL]
    result = run_script("train", args, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train: kept 64 of 64 pairs; dropped 0" in result.stdout
    assert "precision: float32; attention: sdpa;" in result.stdout  # transformers' default

    results = json.loads((out / "all_results.json").read_text())
    for key in ("train_loss", "eval_bleu", "eval_chrf", "eval_exact_match", "predict_bleu", "predict_chrf"):
        assert isinstance(results[key], float), key
    assert results["train_samples"] == 64 and results["predict_samples"] == 8
    for split in ("train", "eval", "predict"):
        assert (out / f"{split}_results.json").is_file()
    assert len((out / "generated_predictions.txt").read_text().splitlines()) == 8
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["decoder_start_token_id"], generation["eos_token_id"]) == (4, 1, 2)
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, len(tokenizer)) == (0, 1, 2, 300)
    model = AutoModelForSeq2SeqLM.from_pretrained(str(out))
    assert model.config.d_model == 32 and model.config.vocab_size == 300
    assert [os.path.basename(p) for p in sort_checkpoints(str(out))] == ["checkpoint-4", "checkpoint-8"]

    # translate.py: stdin in, translations out in input order, scores on stderr
    sources = ["dreihundertzweiundvierzig", "eins", "neuntausendneunhundertneunundneunzig", "", "siebzehn"]
    references = tmp_path / "refs.en"
    references.write_text("three hundred forty-two\none\nnine thousand nine hundred ninety-nine\n\nseventeen\n")
    translated = run_script(
        "translate",
        ["--model_dir", str(out), "--references", str(references), "--batch_size", "2", "--max_new_tokens", "8"],
        tmp_path,
        input="\n".join(sources) + "\n",
    )
    assert translated.returncode == 0, translated.stderr[-3000:]
    lines = translated.stdout.splitlines()
    assert len(lines) == len(sources) and lines[3] == ""
    expected = translate(model, tokenizer, sources, batch_size=1, max_new_tokens=8)
    assert lines == expected
    assert "sacreBLEU" in translated.stderr and "chrF" in translated.stderr

    # average_checkpoints.py: the last 2 checkpoints, exactly
    averaged_dir = tmp_path / "avg"
    averaged = run_script(
        "average_checkpoints",
        ["--checkpoint_dir", str(out), "--num_checkpoints", "2", "--output_dir", str(averaged_dir)],
        tmp_path,
    )
    assert averaged.returncode == 0, averaged.stderr[-3000:]
    first, second = (load_file(str(out / f"checkpoint-{step}" / "model.safetensors")) for step in (4, 8))
    average = AutoModelForSeq2SeqLM.from_pretrained(str(averaged_dir)).state_dict()
    assert any(not torch.equal(first[name], second[name]) for name in first)
    for name in first:
        expected = ((first[name].double() + second[name].double()) / 2).to(first[name].dtype)
        assert torch.equal(average[name], expected), name
    assert AutoTokenizer.from_pretrained(str(averaged_dir)).get_vocab() == tokenizer.get_vocab()


def test_translate_py_reads_one_sentence_per_line_whatever_a_sentence_holds(tmp_path):
    """--input_file, --references and stdin split at line ends only: a form feed, U+2028 or NEL inside a sentence
    (str.splitlines would split there) keeps the translations in line with the references."""
    from vanilla_transformer.inference.loading import read_lines, split_lines

    path = tmp_path / "src.txt"
    path.write_bytes("a\x0cb\nc\u2028d\r\n\ne\x85f".encode())
    assert read_lines("--input_file", str(path)) == ["a\x0cb", "c\u2028d", "", "e\x85f"]
    assert split_lines("x\ny\n") == ["x", "y"] and split_lines("") == [] and split_lines("\n") == [""]


def test_bf16_on_a_cpu_trains_with_eager_attention_unless_one_is_given(tmp_path, capsys):
    """workarounds.torch_cpu_bf16_flash_attention: `--bf16` on a CPU trains with the eager attention, the saved model
    loads with transformers' default (the choice is not saved), and an unknown --attn_implementation is refused in one
    line before training."""
    out = tmp_path / "run"
    args = ["--output_dir", str(out), "--max_train_samples", "32", "--do_train", "--max_steps", "2", "--threads", "1"]
    args += ["--per_device_train_batch_size", "16", "--vocab_size", "300", "--save_strategy", "no", "--bf16", "true"]
    recipe.main([*args, *TINY_MODEL])
    stdout = capsys.readouterr().out
    # trained only: nothing is decoded afterwards, so no decoding attention is announced
    assert "precision: bf16 autocast" in stdout and "; attention: eager;" in stdout
    assert "attn" not in (out / "config.json").read_text()
    assert AutoModelForSeq2SeqLM.from_pretrained(str(out)).config._attn_implementation == "sdpa"

    expect_exit([*args, "--attn_implementation", "nonsense", *TINY_MODEL], 'attn_implementation="nonsense"')
    assert "'loss'" not in capsys.readouterr().out


class AttentionSeen(TrainerCallback):
    """Records the model's attention implementation in training steps and in evaluation or prediction batches."""

    def __init__(self) -> None:
        self.training, self.decoding = set(), set()

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.training.add(model.config._attn_implementation)

    def on_prediction_step(self, args, state, control, model=None, **kwargs):
        self.decoding.add(model.config._attn_implementation)


def test_bf16_on_a_cpu_decodes_with_the_default_attention_once_training_is_over(tmp_path, capsys):
    """workarounds.torch_cpu_bf16_flash_attention: the eager attention is for training's backward pass; the
    evaluation and prediction after it decode with transformers' default (sdpa). A given --attn_implementation is used
    for both."""
    argv = ["--output_dir", str(tmp_path / "run"), "--do_train", "--do_eval", "--do_predict", "--max_steps", "2"]
    argv += ["--max_train_samples", "16", "--max_eval_samples", "4", "--max_predict_samples", "4"]
    argv += ["--per_device_train_batch_size", "8", "--vocab_size", "300", "--save_strategy", "no", "--bf16", "true"]
    argv += ["--config_overrides", TINY_OVERRIDES, "--disable_tqdm", "true", "--report_to", "none", "--use_cpu"]
    argv += ["--generation_max_length", "8", "--threads", "1"]
    chosen, given = AttentionSeen(), AttentionSeen()
    recipe.main(argv, callbacks=[chosen])
    assert chosen.training == {"eager"} and chosen.decoding == {"sdpa"}
    assert "; attention: eager (decoding: sdpa);" in capsys.readouterr().out
    recipe.main([*argv, "--attn_implementation", "eager"], callbacks=[given])
    assert given.training == given.decoding == {"eager"}
    assert "; attention: eager;" in capsys.readouterr().out


def test_evaluation_during_training_picks_the_best_model_by_bleu(tmp_path, demo_tokenizer):
    """--eval_strategy steps with --load_best_model_at_end --metric_for_best_model bleu: every evaluation during
    training translates and scores the validation split (its BLEU in the log and in the callbacks' metrics), and the
    model kept is the checkpoint of the best BLEU."""
    out = tmp_path / "run"
    seen = []

    class Watch(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            seen.append(metrics)

    argv = ["--output_dir", str(out), "--tokenizer_name", demo_tokenizer, "--do_train", "--max_steps", "6"]
    argv += ["--max_train_samples", "64", "--max_eval_samples", "6", "--per_device_train_batch_size", "16"]
    argv += ["--eval_strategy", "steps", "--eval_steps", "2", "--load_best_model_at_end", "--threads", "1"]
    argv += ["--metric_for_best_model", "bleu", "--learning_rate", "1e-2", "--warmup_steps", "1", *TINY_MODEL]
    recipe.main(argv, callbacks=[Watch()])
    state = json.loads((out / "trainer_state.json").read_text())
    bleus = {entry["step"]: entry["eval_bleu"] for entry in state["log_history"] if "eval_bleu" in entry}
    assert sorted(bleus) == [2, 4, 6] and [m["eval_bleu"] for m in seen[:3]] == list(bleus.values())
    best = max(bleus.values())
    assert state["best_metric"] == best
    assert seen[3]["eval_bleu"] == best  # the evaluation after training (--eval_strategy implies --do_eval) scores it
    assert state["best_model_checkpoint"].endswith(f"checkpoint-{min(s for s, b in bleus.items() if b == best)}")


def test_train_with_token_based_batches(tmp_path, capsys):
    """--max_tokens_per_batch swaps sentence batches for token-bounded ones (tests/test_batching.py covers the
    sampler); 64 short pairs in batches of at most 48 padded tokens per side need more than 64/16 = 4 steps."""
    out = tmp_path / "run"
    args = ["--output_dir", str(out), "--max_train_samples", "64", "--do_train", "--num_train_epochs", "1"]
    args += ["--max_tokens_per_batch", "48", "--per_device_train_batch_size", "16", "--vocab_size", "300"]
    recipe.main([*args, "--save_strategy", "no", "--threads", "1", *TINY_MODEL])
    assert "global batch <= 48 padded tokens per side per device" in capsys.readouterr().out
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] > 4


def test_average_picks_the_last_checkpoints_by_step_and_is_exact(tmp_path):
    model = tiny_model()
    # checkpoint-N holds every weight = value; sorted as text, checkpoint-100 would come before checkpoint-20
    for step, value in ((10, 1.0), (20, 2.0), (50, 3.0), (100, 4.0), (200, 8.0)):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(value)
        model.save_pretrained(str(tmp_path / f"checkpoint-{step}"), max_shard_size="50KB" if step == 100 else "1GB")
    assert len(list((tmp_path / "checkpoint-100").glob("model-*-of-*.safetensors"))) > 1  # a sharded one is averaged
    assert load_weights(str(tmp_path / "checkpoint-100")).keys() == load_weights(str(tmp_path / "checkpoint-50")).keys()
    (tmp_path / "checkpoint-best").mkdir()  # no step: not a checkpoint
    (tmp_path / "checkpoint-400").write_text("")  # nor is a file
    # average_checkpoints.py picks the last 3 by step (transformers' sort_checkpoints, as the Trainer's rotation)
    load_script("average_checkpoints").main(
        ["--checkpoint_dir", str(tmp_path), "--num_checkpoints", "3", "--output_dir", str(tmp_path / "avg")]
    )
    averaged = save_averaged_model(
        [str(tmp_path / f"checkpoint-{step}") for step in (50, 100, 200)], str(tmp_path / "direct")
    )
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(str(tmp_path / "avg"))
    for parameters in (averaged.parameters(), reloaded.parameters()):
        for parameter in parameters:
            assert torch.all(parameter == 5.0)  # (3 + 4 + 8) / 3


class EchoModel(torch.nn.Module):
    """Generates its input back, so that translate()'s batching and ordering are checked exactly."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.generation_config = GenerationConfig()
        self.calls = []

    def generate(self, input_ids, attention_mask, max_new_tokens, **kwargs):
        self.calls.append((input_ids.shape, max_new_tokens))
        return input_ids


def test_translate_batches_by_length_and_keeps_input_order(capsys):
    tokenizer = train_tokenizer(["a b c d e f g h i j k l m n o p"] * 3, vocab_size=300)
    sentences = [" ".join("abcdefghijklmnop"[: 1 + (7 * i) % 16]) for i in range(40)] + ["", "   "]
    model = EchoModel()
    assert translate(model, tokenizer, sentences, batch_size=8) == [s.strip() for s in sentences]
    assert len(model.calls) == 5  # 40 non-empty sentences, 8 per batch
    widths = [shape[1] for shape, _ in model.calls]
    assert widths == sorted(widths)  # batches of increasing length: little padding
    assert all(limit == shape[1] + 50 for shape, limit in model.calls)  # §6.1: input length + 50
    assert "40/40" in capsys.readouterr().err  # the progress bar


# --------------------------------------------------------------------------------------------------------------------
# Evaluation: every line of the file, in length-sorted batches
# --------------------------------------------------------------------------------------------------------------------


def test_evaluation_translates_like_translate_py_and_scores_the_sentences(tmp_path, demo_tokenizer, one_thread):
    """Evaluation goes translate.py's way: the split's source ids in length-sorted batches (shortest first), the
    translations in row order, scored against the split's target sentences as written; the loss from the Trainer's
    own loop."""
    tokenizer = AutoTokenizer.from_pretrained(demo_tokenizer)
    raw = DatasetDict({"test": demo_corpus()["test"].select(range(16))})
    test = tokenize_splits(raw, tokenizer, "de", "en", 32, 32, print_fn=None)["test"]
    argv = ["--output_dir", str(tmp_path), "--per_device_eval_batch_size", "3", "--report_to", "none"]
    _, _, args, _ = recipe.parse_arguments([*argv, "--generation_max_length", "8"])
    model = tiny_model(vocab_size=len(tokenizer))
    batches = []

    def echo(input_ids, attention_mask, **kwargs):  # "translates" each source into itself: the order shows
        batches.append(attention_mask.sum(1).tolist())
        return input_ids

    model.generate = echo
    output = build_trainer(model, args, tokenizer, languages=("de", "en")).predict(test)
    lengths = [len(ids) for ids in test["input_ids"]]
    assert [length for batch in batches for length in batch] == sorted(lengths)
    assert max(len(batch) for batch in batches) == 3
    sources = [pair["de"] for pair in raw["test"]["translation"]]
    references = [pair["en"] for pair in raw["test"]["translation"]]
    assert output.predictions == sources  # in row order
    scores = score(sources, references)
    assert {name: output.metrics[f"test_{name}"] for name in scores} == scores
    assert output.metrics["test_gen_len"] == round(sum(lengths) / len(lengths), 4)  # each source, its eos included
    assert output.metrics["test_loss"] > 0


# train.py with a model that "translates" each source into itself (tokenised, so truncated where it is too long), in
# each process of a launch
ECHO_LAUNCHER = """
import runpy, sys
from vanilla_transformer import VanillaTransformerForConditionalGeneration

VanillaTransformerForConditionalGeneration.generate = lambda self, input_ids, attention_mask, **kwargs: input_ids
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.distributed)])
def test_the_whole_test_file_is_translated_and_scored(tmp_path, demo_tokenizer, processes, monkeypatch, capsys):
    """train.py --do_predict on a test file with a line longer than the model's 16 learned positions (and than
    --max_source_length), an empty source and sentences of mixed length: every line gets its prediction, in the
    file's order, and the reported BLEU and chrF are sacreBLEU's over the whole file against its references as
    written, with one process or two (whose last batches accelerate evens out with repeated rows). Each source is its
    own reference and the model echoes it: a line out of place, missing, repeated or scored against a cut reference
    would change the scores."""
    tokenizer = AutoTokenizer.from_pretrained(demo_tokenizer)
    sentences = [pair["en"] for pair in demo_corpus()["test"].select(range(12))["translation"]]
    sentences.insert(5, " ".join(sentences))  # more than 16 tokens
    pairs = [{"de": sentence, "en": sentence} for sentence in sentences]
    pairs.insert(9, {"de": "", "en": "one"})
    test_file = tmp_path / "test.jsonl"
    test_file.write_text("".join(json.dumps({"translation": p}, ensure_ascii=False) + "\n" for p in pairs))
    model_dir, out = tmp_path / "model", tmp_path / "evaluated"  # results in a folder of their own, no card there
    model = tiny_model(vocab_size=len(tokenizer), position_embedding_type="learned", max_position_embeddings=16)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    args = ["--model_name_or_path", str(model_dir), "--output_dir", str(out), "--do_predict"]
    args += ["--test_file", str(test_file), "--source_lang", "de", "--target_lang", "en"]
    args += ["--per_device_eval_batch_size", "2", *TINY_MODEL[2:]]  # the model's size is its own
    if processes == 1:  # in this process, the echo patched in as the launcher does
        echo = lambda self, input_ids, **kwargs: input_ids  # noqa: E731
        monkeypatch.setattr(VanillaTransformerForConditionalGeneration, "generate", echo)
        recipe.main([*args, "--threads", "1"])
        stdout = capsys.readouterr().out
    else:
        launcher = tmp_path / "echo.py"
        launcher.write_text(ECHO_LAUNCHER)
        command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
        command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        command += ["--main_process_port", str(free_port()), str(launcher), str(ROOT / "scripts" / "train.py"), *args]
        result = subprocess.run(command, capture_output=True, text=True, env=script_env(tmp_path), timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        stdout = result.stdout
    assert f"test: 1 of {len(pairs)} sources longer than 16 tokens were truncated to 16" in stdout
    assert "no model card" in stdout and not (out / "README.md").exists()

    results = json.loads((out / "all_results.json").read_text())
    predictions = (out / "generated_predictions.txt").read_text().splitlines()
    references = [pair["en"] for pair in pairs]
    assert len(predictions) == len(pairs) == results["predict_samples"]
    assert predictions[9] == "" and predictions[5] != references[5] and references[5].startswith(predictions[5])
    assert [p for i, p in enumerate(predictions) if i not in (5, 9)] == [
        r for i, r in enumerate(references) if i not in (5, 9)
    ]
    assert results["predict_bleu"] == round(sacrebleu.corpus_bleu(predictions, [references]).score, 4)
    assert results["predict_chrf"] == round(sacrebleu.corpus_chrf(predictions, [references]).score, 4)
    assert 50 < results["predict_bleu"] < 100


# --------------------------------------------------------------------------------------------------------------------
# Resuming, and data parallel training
# --------------------------------------------------------------------------------------------------------------------


class Interrupted(Exception):
    pass


class StopAfterSave(TrainerCallback):
    """Kills the run right after checkpoint `step` is written."""

    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Interrupted


def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path, demo_tokenizer):
    def args(output_dir):
        return [
            *("--output_dir", str(output_dir), "--tokenizer_name", demo_tokenizer, "--do_train", "--seed", "7"),
            *("--max_train_samples", "24", "--per_device_train_batch_size", "4", "--max_steps", "10"),
            *("--save_strategy", "steps", "--save_steps", "4", "--warmup_steps", "3", "--learning_rate", "1e-2"),
            *("--threads", "1"),  # bit-identical floats need the same thread count in every run
            *TINY_MODEL,
        ]

    recipe.main(args(tmp_path / "straight"))
    with pytest.raises(Interrupted):  # 6 steps an epoch: stopped in the middle of the second epoch, dropout on
        recipe.main(args(tmp_path / "stopped"), callbacks=[StopAfterSave(8)])
    assert not (tmp_path / "stopped" / "model.safetensors").exists()
    recipe.main(args(tmp_path / "stopped") + ["--resume_from_checkpoint", "last"])

    straight = load_file(str(tmp_path / "straight" / "model.safetensors"))
    resumed = load_file(str(tmp_path / "stopped" / "model.safetensors"))
    at_8 = load_file(str(tmp_path / "stopped" / "checkpoint-8" / "model.safetensors"))
    assert straight.keys() == resumed.keys()
    assert any(not torch.equal(at_8[name], resumed[name]) for name in resumed)  # steps 9-10 did train
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name


# --------------------------------------------------------------------------------------------------------------------
# Bad input: one line, before any training
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_wrong_path_is_one_line_before_training(tmp_path):
    missing = str(tmp_path / "missing.jsonl")
    result = run_script(
        "train", ["--train_file", missing, "--source_lang", "de", "--target_lang", "en", "--output_dir", "x"], tmp_path
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == f"train.py: error: --train_file '{missing}' does not exist."
    assert "Traceback" not in result.stderr and "model:" not in result.stdout


def expect_exit(args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as info:
        recipe.main(args)
    text = str(info.value.code)
    assert text.startswith("train.py: error: ") and "\n" not in text
    assert message in text, text


def test_bad_data_and_tokenizers_are_refused_before_training(tmp_path, demo_tokenizer):
    out = ["--output_dir", str(tmp_path / "out"), "--source_lang", "de", "--target_lang", "en"]
    (tmp_path / "empty.jsonl").write_text("")
    expect_exit(out + ["--train_file", str(tmp_path / "empty.jsonl")], "empty.jsonl' is empty.")

    fr_en = tmp_path / "fr-en.jsonl"
    fr_en.write_text(json.dumps({"translation": {"fr": "oui", "en": "yes"}}) + "\n")
    expect_exit(out + ["--train_file", str(fr_en)], "has no 'de' sentences (--source_lang de); it offers ['en', 'fr']")
    de_en = tmp_path / "de-en.jsonl"
    de_en.write_text(json.dumps({"translation": {"de": "ja", "en": "yes"}}) + "\n")
    expect_exit(out + ["--validation_file", str(de_en), "--do_train"], "--do_train needs a train split")

    # a tokenizer whose special tokens sit at other ids than the model's
    backend = Tokenizer(models.WordLevel({"<unk>": 0, "<pad>": 1, "<s>": 2, "</s>": 3, "ja": 4}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    odd = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    odd.save_pretrained(str(tmp_path / "odd"))
    expect_exit(
        ["--output_dir", str(tmp_path / "out"), "--tokenizer_name", str(tmp_path / "odd")],
        "has pad_token_id=1 but the model config has pad_token_id=0",
    )
    expect_exit(["--output_dir", str(tmp_path / "out"), "--tokenizer_name", str(tmp_path / "nope")], "does not exist")
    expect_exit(
        [
            "--output_dir",
            str(tmp_path / "out"),
            "--tokenizer_name",
            demo_tokenizer,
            "--config_overrides",
            "d_model=30,x",
        ],
        "'x' is not of the form key=value",
    )
    tokenizer_and_overrides = ["--output_dir", str(tmp_path / "out"), "--tokenizer_name", demo_tokenizer]
    expect_exit([*tokenizer_and_overrides, "--config_overrides", "heads=4"], "key heads isn't in the original config")
    expect_exit([*tokenizer_and_overrides, "--config_overrides", "dropout=1.5"], "`dropout`=1.5 is invalid")
    assert not (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize("generation_max_length", [None, 12])
def test_a_checkpoints_max_new_tokens_yields_to_generation_max_length(
    tmp_path, demo_tokenizer, monkeypatch, generation_max_length
):
    """generate() prefers a generation config's max_new_tokens to any max_length, so a checkpoint whose generation
    config sets one (kept by train.py when it asks for beams) would decode past or short of --generation_max_length.
    Given, the flag takes effect; not given, the checkpoint's max_new_tokens stands (train.py's default length, the
    longest target + 1, does not replace it)."""
    tokenizer = AutoTokenizer.from_pretrained(demo_tokenizer)
    model = tiny_model(vocab_size=len(tokenizer))
    model.generation_config.num_beams = 2
    model.generation_config.max_new_tokens = 3
    model.generation_config.eos_token_id = None  # never finishes early: every batch runs to its limit
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(str(checkpoint))
    tokenizer.save_pretrained(str(checkpoint))
    generate, lengths = VanillaTransformerForConditionalGeneration.generate, []

    def record(self, *args, **kwargs):
        output = generate(self, *args, **kwargs)
        lengths.append(output.shape[1])
        return output

    monkeypatch.setattr(VanillaTransformerForConditionalGeneration, "generate", record)
    argv = ["--output_dir", str(tmp_path / "out"), "--model_name_or_path", str(checkpoint), "--do_predict"]
    argv += ["--max_predict_samples", "6", "--per_device_eval_batch_size", "3", "--threads", "1"]
    argv += ["--disable_tqdm", "true", "--report_to", "none"]
    given = [] if generation_max_length is None else ["--generation_max_length", str(generation_max_length)]
    recipe.main([*argv, *given])
    # the decoder start token + 3 new tokens, or the flag's length
    assert lengths == [1 + 3 if generation_max_length is None else generation_max_length] * 2


@pytest.mark.parametrize("generation_max_length", [None, 12])
def test_evaluation_generates_at_most_the_input_length_plus_50_tokens(
    tmp_path, demo_tokenizer, one_thread, generation_max_length
):
    """§6.1's output limit per batch, as translate.py decodes (the same function); a --generation_max_length given
    caps it. The
    limit reaches generate() without its warning that max_new_tokens and the generation config's max_length were both
    set (once per batch, in every evaluation of train.py before)."""
    tokenizer = AutoTokenizer.from_pretrained(demo_tokenizer)
    raw = DatasetDict({"test": demo_corpus()["test"].select(range(6))})
    test = tokenize_splits(raw, tokenizer, "de", "en", 32, 32, print_fn=None)["test"]
    argv = ["--output_dir", str(tmp_path), "--per_device_eval_batch_size", "3", "--report_to", "none"]
    given = [] if generation_max_length is None else ["--generation_max_length", str(generation_max_length)]
    _, _, args, _ = recipe.parse_arguments([*argv, *given])
    model = tiny_model(vocab_size=len(tokenizer))
    model.generation_config.max_length = 257  # what train.py sets by default (max_target_length + 1)
    model.generation_config.eos_token_id = None  # never finishes early: every batch runs to its limit
    generate, calls = model.generate, []

    def record(input_ids, **kwargs):
        output = generate(input_ids=input_ids, **kwargs)
        calls.append((input_ids.shape[1], kwargs.get("max_new_tokens"), kwargs.get("max_length"), output.shape[1]))
        return output

    model.generate = record
    with CaptureLogger(transformers_logging.get_logger("transformers.generation.utils")) as captured:
        build_trainer(model, args, tokenizer, languages=("de", "en")).predict(test, num_beams=1)
    assert "seem to have been set" not in captured.out
    assert len(calls) == 2
    for source_length, max_new_tokens, max_length, output_length in calls:
        if generation_max_length is None:  # as translate.py: at most input length + 50 new tokens
            assert max_new_tokens == source_length + 50 and max_length is None
            assert output_length == 1 + max_new_tokens  # the decoder start token
        else:  # the decoder start token + at most input length + 50 new tokens, within the flag's length
            assert max_length == min(source_length + 51, generation_max_length) and max_new_tokens is None
            assert output_length == max_length
