"""The anchor driver's tuning (benchmarks/anchor.py: grouping, batch size, steps fitted to a time budget from a timed
calibration, validation BLEU beside test BLEU) and the summary over seeds (benchmarks/summarize.py)."""

import json
import os

import pytest
from conftest import load_script
from transformers import AutoTokenizer

summarize = load_script("summarize", folder="benchmarks")
seeds = load_script("seeds", folder="benchmarks")


def write_result(folder, **result):
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(result))
    return str(folder)


def test_summary_gives_mean_and_sd_over_seeds_and_ranks_by_validation(tmp_path, capsys):
    folders = [
        write_result(tmp_path / "a1", recipe="a", seed=1, validation_bleu=30.0, test_bleu=31.0, train_minutes=2.0),
        write_result(tmp_path / "a2", recipe="a", seed=2, validation_bleu=34.0, test_bleu=33.0, train_minutes=4.0),
        write_result(tmp_path / "b1", recipe="b", seed=1, validation_bleu=33.0, test_bleu=40.0, train_minutes=2.0),
        str(tmp_path / "unfinished"),
    ]
    rows = summarize.main(folders)
    assert [row["recipe"] for row in rows] == ["b", "a"]  # by validation (33 > mean 32), whatever the test says
    a = rows[1]
    assert a["seeds"] == [1, 2] and a["validation"] == "32.00 ± 2.83" and a["test"] == "32.00 ± 1.41"
    assert a["train_minutes"] == 3.0 and rows[0]["validation"] == "33.00"
    out = capsys.readouterr().out
    assert "unfinished holds no result.json" in out and "| a | 1, 2 | 32.00 ± 2.83 | 32.00 ± 1.41 |" in out


def test_each_seed_reaches_the_driver_where_it_takes_it(tmp_path):
    out = str(tmp_path / "out")
    command, folder = seeds.seed_command(["anchor", "--data_dir", "d", "--output_dir", out, "--bf16"], 43)
    assert folder == str(tmp_path / "out" / "seed-43")
    assert command[2:] == ["anchor", "--data_dir", "d", "--output_dir", folder, "--bf16", "--seed", "43"]
    command, folder = seeds.seed_command(["recipe", "--output_dir", out, "--name", "r", "--", "--threads", "1"], 7)
    assert command[2:] == ["recipe", "--output_dir", folder, "--name", "r", "--", "--threads", "1", "--seed", "7"]
    command, folder = seeds.seed_command(["recipe", "--output_dir", out + "/"], 7)  # named after the folder, not seed-7
    assert command[2:] == ["recipe", "--output_dir", folder, "--name", "out", "--", "--seed", "7"]
    for bad, message in (
        (["compare", "--output_dir", out], "one of anchor, recipe"),
        (["anchor", "--output_dir", out, "--seed", "1"], "--seed is set by --seeds"),
        (["recipe", "--output_dir", out, "--", "--seed", "1"], "--seed is set by --seeds"),
        (["anchor", "--data_dir", "d"], "needs --output_dir"),
    ):
        with pytest.raises(SystemExit, match=message):
            seeds.seed_command(bad, 1)


STUB_DRIVER = """import json, os, sys
argv = sys.argv[2:]
out, seed = argv[argv.index("--output_dir") + 1], int(argv[argv.index("--seed") + 1])
if seed == 13:
    sys.exit("seed 13 fails")
os.makedirs(out)
name = argv[argv.index("--name") + 1] if "--name" in argv else sys.argv[1]
result = {"recipe": name, "seed": seed, "validation_bleu": float(seed), "test_bleu": seed + 1.0}
json.dump(dict(result, train_minutes=1.0), open(os.path.join(out, "result.json"), "w"))
"""


def test_seeds_run_unattended_two_at_a_time_and_are_summarized(tmp_path, monkeypatch, capsys):
    stub = tmp_path / "run.py"
    stub.write_text(STUB_DRIVER)
    monkeypatch.setattr(seeds, "RUN", str(stub))
    out = tmp_path / "out"
    parallel = str(min(2, len(os.sched_getaffinity(0))))  # two at a time where there are two cores
    rows = seeds.main(["--seeds", "10", "12", "14", "--parallel", parallel, "--", "recipe", "--output_dir", str(out)])
    assert (
        rows[0]["seeds"] == [10, 12, 14]
        and rows[0]["validation"] == "12.00 ± 2.00"
        and rows[0]["test"] == "13.00 ± 2.00"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [10, 12, 14] and summary["rows"][0]["test_bleu"] == [11.0, 13.0, 15.0]
    assert "| out | 10, 12, 14 | 12.00 ± 2.00 |" in capsys.readouterr().out  # one row: recipe.py's --name
    with pytest.raises(SystemExit, match="1 of 2 runs failed"):
        seeds.main(["--seeds", "13", "16", "--", "anchor", "--output_dir", str(tmp_path / "failing")])
    assert "seed 13 fails" in (tmp_path / "failing" / "seed-13.log").read_text()
    assert (tmp_path / "failing" / "seed-16" / "result.json").is_file()  # the others still ran
    with pytest.raises(SystemExit):
        seeds.main(["--seeds", "1", "1", "--", "anchor", "--output_dir", str(out)])


@pytest.fixture
def corpus(tmp_path):
    from vanilla_transformer.training.data import demo_corpus

    splits = demo_corpus(max_number=400, validation_size=12, test_size=12)
    folder = tmp_path / "data"
    folder.mkdir()
    for split, rows in splits.items():
        with open(folder / f"{split}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps({"translation": {"en": row["translation"]["en"], "fr": row["translation"]["de"]}}))
                f.write("\n")
    return folder


@pytest.mark.slow
def test_anchor_fits_its_steps_to_the_budget_with_grouping_and_reports_validation_bleu(tmp_path, corpus, one_thread):
    anchor = load_script("anchor", folder="benchmarks")
    args = ["--data_dir", str(corpus), "--output_dir", str(tmp_path / "run"), "--group_by_length"]
    args += ["--batch_size", "8", "--learning_rate", "2e-3", "--seed", "3", "--num_beams", "1"]
    result = anchor.main([*args, "--max_train_minutes", "0.05", "--calibration_steps", "14"])
    assert result["recipe"] == "anchor-marian-grouped-bs8-lr0.002" and result["seed"] == 3
    assert result["train_sampling_strategy"] == "group_by_length"
    per_step = result["seconds_per_step_calibrated"]
    assert result["steps"] == max(1, round(0.05 * 60 / per_step))  # the budget's steps, from the calibration
    assert 0 <= result["validation_bleu"] <= 100 and 0 <= result["test_bleu"] <= 100
    lines = (tmp_path / "run" / "test_predictions.txt").read_text().splitlines()
    assert len(lines) == 12  # one per test line
    with pytest.raises(SystemExit):
        anchor.main([*args, "--max_train_minutes", "0.05", "--calibration_steps", "11"])


def test_anchor_dropout_is_the_recipes_not_the_presets(monkeypatch, tmp_path):
    """Both models get --dropout (OPUS-MT's 0.1 by default), whatever train.py's preset uses."""
    anchor = load_script("anchor", folder="benchmarks")
    assert "dropout" not in anchor.SIZE
    for kind in ("marian", "vanilla"):
        assert anchor.build_model(kind, 300).config.dropout == 0.1
        model = anchor.build_model(kind, 300, dropout=0.0)
        assert model.config.dropout == 0.0 and model.config.d_model == anchor.SIZE["d_model"]
    with pytest.raises(SystemExit):
        anchor.main(["--data_dir", str(tmp_path), "--output_dir", str(tmp_path / "run"), "--dropout", "1"])


@pytest.mark.slow
def test_anchor_trains_in_bf16_on_the_cpu_when_asked(tmp_path, corpus, one_thread):
    """--bf16: the anchor's Trainer runs bf16 autocast on the CPU (as ours does on a CPU that multiplies bf16 in
    hardware), and the result says so."""
    anchor = load_script("anchor", folder="benchmarks")
    args = ["--data_dir", str(corpus), "--output_dir", str(tmp_path / "run"), "--max_steps", "3", "--num_beams", "1"]
    result = anchor.main([*args, "--bf16", "--dropout", "0"])
    assert result["bf16"] is True and result["recipe"] == "anchor-marian-bs16-lr0.001-dropout0-bf16"
    assert result["steps"] == 3 and 0 <= result["test_bleu"] <= 100


@pytest.mark.slow
def test_anchor_vocab_size_sizes_the_tokenizer(tmp_path, corpus, one_thread):
    """--vocab_size: the joint BPE the anchor trains (8k unless given; the model is built from its length) has at most
    that many entries, and the recipe's name and result say how many."""
    anchor = load_script("anchor", folder="benchmarks")
    args = ["--data_dir", str(corpus), "--max_steps", "1", "--num_beams", "1", "--dropout", "0"]
    sizes = {}
    for vocab_size in (300, 280):
        result = anchor.main([*args, "--output_dir", str(tmp_path / str(vocab_size)), "--vocab_size", str(vocab_size)])
        assert result["recipe"] == f"anchor-marian-bs16-lr0.001-dropout0-vocab{vocab_size}"
        tokenizer = AutoTokenizer.from_pretrained(tmp_path / str(vocab_size))
        assert result["vocab_size"] == len(tokenizer) <= vocab_size
        sizes[vocab_size] = len(tokenizer)
    assert sizes[300] > sizes[280]
