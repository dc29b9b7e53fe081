"""The end-to-end benchmark's sides (benchmarks/end_to_end.py): Marian with and without transformers' stock
length grouping, train.py with sentence batches and with its token batches, Marian under train.py, and the
tokens-per-second figures."""

import json
import os

import pytest
from conftest import load_script
from transformers import HfArgumentParser, Seq2SeqTrainingArguments

from vanilla_transformer.training import recipe

end_to_end = load_script("end_to_end", folder="benchmarks")


def test_each_side_asks_for_its_batching(tmp_path):
    args = end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--run_translation", __file__])
    assert args.sides == list(end_to_end.DEFAULT_SIDES)
    parsed = recipe.parse_arguments(end_to_end.ours_command(args, str(tmp_path / "run"))[2:])[2]
    assert parsed.max_tokens_per_batch is None
    assert parsed.include_num_input_tokens_seen == "non_padding"  # every side counts what it trained on
    command = end_to_end.ours_command(args, str(tmp_path / "run"), token_batches=True)
    assert recipe.parse_arguments(command[2:])[2].max_tokens_per_batch == 512  # train.py's compact default
    tokens = end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--max_tokens_per_batch", "300"])
    command = end_to_end.ours_command(tokens, str(tmp_path / "run"), token_batches=True)
    assert recipe.parse_arguments(command[2:])[2].max_tokens_per_batch == 300
    for grouped, strategy in ((False, "random"), (True, "group_by_length")):
        command = end_to_end.run_translation_command(args, str(tmp_path / "run"), group_by_length=grouped)
        parsed = HfArgumentParser(Seq2SeqTrainingArguments).parse_args_into_dataclasses(
            command[2:], return_remaining_strings=True
        )[0]
        assert parsed.train_sampling_strategy == strategy
    command = end_to_end.ours_command(args, str(tmp_path / "run"), grouped=True)
    parsed = recipe.parse_arguments(command[2:])[2]  # vanilla-grouped: Trainer's stock sampler, as marian-grouped
    assert parsed.train_sampling_strategy == "group_by_length" and parsed.max_tokens_per_batch is None
    assert parsed.bf16 is False  # float32 on both sides unless --bf16, whatever the CPU
    assert recipe.parse_arguments(command[2:])[0].attn_implementation is None  # train.py's choice
    command = end_to_end.ours_command(args, str(tmp_path / "run"), grouped=True, attn_implementation="sdpa")
    model_args, _, parsed, _ = recipe.parse_arguments(command[2:])  # vanilla-grouped-sdpa
    assert model_args.attn_implementation == "sdpa" and parsed.train_sampling_strategy == "group_by_length"
    half = end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--run_translation", __file__, "--bf16"])
    assert recipe.parse_arguments(end_to_end.ours_command(half, str(tmp_path / "run"))[2:])[2].bf16 is True
    command = end_to_end.run_translation_command(half, str(tmp_path / "run"), group_by_length=True)
    parsed = HfArgumentParser(Seq2SeqTrainingArguments).parse_args_into_dataclasses(
        command[2:], return_remaining_strings=True
    )[0]
    assert parsed.bf16 is True and parsed.use_cpu is True
    chosen = end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--sides", "marian-grouped, vanilla"])
    assert chosen.sides == ["marian-grouped", "vanilla"]
    with pytest.raises(SystemExit):
        end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--sides", "marian,ours"])
    eager = ["--data_dir", str(tmp_path), "--sides", "marian-grouped-eager,vanilla-grouped-sdpa"]
    assert end_to_end.parse_arguments(eager).sides == ["marian-grouped-eager", "vanilla-grouped-sdpa"]
    with pytest.raises(SystemExit):  # run_translation.py has no flag for it
        end_to_end.parse_arguments([*eager, "--run_translation", __file__])


def test_tokens_per_second_counts_the_targets_as_trained(tmp_path):
    from vanilla_transformer.training.tokenizer import train_tokenizer

    pairs = [{"en": f"number {i}", "fr": "nombre " + " ".join(["un"] * (i % 7))} for i in range(30)]
    args = end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--output_dir", str(tmp_path / "out")])
    tokenizer = train_tokenizer((t for p in pairs for t in p.values()), vocab_size=300)
    tokenizer.save_pretrained(tmp_path / "out" / "tokenizer")
    expected = sum(len(tokenizer(text_target=p["fr"])["input_ids"]) for p in pairs) / len(pairs)
    assert end_to_end.mean_target_tokens(args, json.loads(json.dumps(pairs))) == pytest.approx(expected)
    assert expected > 2  # eos included, and targets of several tokens


@pytest.mark.slow
def test_train_py_counts_the_source_tokens_it_trained_on(tmp_path):
    """vanilla-token-batches' figure: train.py, given its arguments the way the driver gives them, logs the
    non-padding source tokens it trained on, and the driver reads them back: over one epoch, every pair's source."""
    import subprocess

    from vanilla_transformer.training.tokenizer import train_tokenizer

    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    pairs = [{"en": " ".join(["word"] * (1 + i % 9)), "fr": " ".join(["mot"] * (1 + i % 5))} for i in range(60)]
    (data / "train.jsonl").write_text("".join(json.dumps({"translation": p}) + "\n" for p in pairs))
    args = end_to_end.parse_arguments(
        ["--data_dir", str(data), "--output_dir", str(out), "--size", "tiny", "--max_tokens_per_batch", "40"]
    )
    tokenizer = train_tokenizer((t for p in pairs for t in p.values()), vocab_size=300)
    tokenizer.save_pretrained(out / "tokenizer")
    run_dir = str(out / "run")
    command = end_to_end.ours_command(args, run_dir, token_batches=True)
    with open(command[2]) as f:
        values = json.load(f)
    del values["max_steps"]  # one epoch instead, so that the count is known
    values.update(num_train_epochs=1, logging_steps=1)
    with open(command[2], "w") as f:
        json.dump(values, f)
    subprocess.run(command, check=True, capture_output=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=300)
    expected = sum(len(ids) for ids in tokenizer([p["en"] for p in pairs])["input_ids"])
    assert end_to_end.source_tokens_seen(run_dir) == expected
    assert expected == pytest.approx(len(pairs) * end_to_end.mean_target_tokens(args, pairs, side="source"))
    assert end_to_end.source_tokens_seen(str(tmp_path)) is None  # no trainer state: nothing counted


def test_dropout_reaches_both_sides_and_is_checked(tmp_path):
    """--dropout sets every side's P_drop: 0.1 by default (Marian's stock value), 0 for the strongest anchor's tuned
    value and train.py's compact default; outside [0, 1) it is refused."""

    class Tokenizer(list):
        pad_token_id, eos_token_id = 0, 2

    for given, expected in ((None, 0.1), ("0", 0.0)):
        flags = [] if given is None else ["--dropout", given]
        args = end_to_end.parse_arguments(["--data_dir", str(tmp_path), *flags])
        assert end_to_end.marian_config(args, Tokenizer(range(300))).dropout == expected
        overrides = recipe.parse_arguments(end_to_end.ours_command(args, str(tmp_path / "run"))[2:])[0].config_overrides
        assert f"dropout={expected}," in overrides
    with pytest.raises(SystemExit):
        end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--dropout", "1.5"])


@pytest.mark.slow
def test_marian_under_the_projects_trainer_is_a_side_of_its_own(tmp_path):
    """marian-token-batches: MarianMTModel trained by train.py with vanilla-token-batches' arguments, so that the two
    differ in the model only; both count the source tokens they trained on, and result.json says what made it."""
    import subprocess
    import sys

    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    pairs = [{"en": " ".join(["word"] * (1 + i % 9)), "fr": " ".join(["mot"] * (1 + i % 5))} for i in range(60)]
    (data / "train.jsonl").write_text("".join(json.dumps({"translation": p}) + "\n" for p in pairs))
    sides = "marian-token-batches,vanilla-token-batches"
    command = [sys.executable, str(end_to_end.__file__), "--data_dir", str(data), "--output_dir", str(out)]
    command += ["--size", "tiny", "--vocab_size", "300", "--max_steps", "3", "--pairs", "1", "--sides", sides]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert "vanilla-token-batches/marian-token-batches" in result["ratios"]
    marian, ours = (out / f"{side}-0" for side in sides.split(","))
    assert json.loads((marian / "config.json").read_text())["model_type"] == "marian"
    assert json.loads((ours / "config.json").read_text())["model_type"] == "vanilla_transformer"
    arguments = [json.loads((run / "args.json").read_text()) for run in (marian, ours)]
    assert arguments[0] == {**arguments[1], "output_dir": str(marian)}  # the same trainer, batches and recipe
    assert arguments[0]["max_tokens_per_batch"] == 512
    assert all(run["source_tokens_counted"] for side in result["runs"].values() for run in side)
    assert result["provenance"]["command"].endswith(f"--sides {sides}")
    assert result["provenance"]["cpu"] and result["provenance"]["utc"].startswith("20")
