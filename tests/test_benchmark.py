"""The benchmark (benchmarks/speed.py, run by benchmarks/model_speed.py) runs end to end at a tiny size and its FLOP
formula counts what the models really multiply.

No timing is asserted here: speed figures live in docs/performance.md.
"""

import json
import math

import pytest
import torch
from conftest import ROOT, load_script
from torch.utils.flop_counter import FlopCounterMode

speed = load_script("speed", folder="benchmarks")

TINY = ["--sizes", "tiny", "--pairs", "1", "--warmup", "0", "--memory_rounds", "1", "--memory_steps", "1"]
TINY += ["--train_batch_size", "2", "--train_src_len", "6", "--train_tgt_len", "5"]
TINY += ["--gen_batch_size", "2", "--gen_src_len", "5", "--new_tokens", "3", "--num_beams", "2", "--gemm_size", "64"]


@pytest.mark.parametrize("name", speed.MODELS)
def test_training_flop_formula_matches_the_counted_matmuls(name):
    # eager attention runs on plain matmuls, which FlopCounterMode counts (it has no rule for the CPU sdpa kernel)
    settings = speed.BenchmarkSettings(
        sizes=["tiny"], attn_implementation="eager", train_batch_size=3, train_src_len=7, train_tgt_len=5
    )
    model = speed.build_model(name, "tiny", settings).train()
    batch = speed.training_batch("tiny", settings)
    with FlopCounterMode(display=False) as counter:
        model(**batch).loss.backward()
    assert counter.get_total_flops() == speed.training_flops("tiny", 3, 7, 5)


def test_tiny_run_prints_a_table_and_writes_json(tmp_path, capsys):
    output_file = tmp_path / "bench.json"
    rows = ["train", "train_ls", "greedy", "beam", "train_bf16"]
    load_script("model_speed", folder="benchmarks").main([*TINY, "--rows", *rows, "--output_file", str(output_file)])

    results = json.loads(output_file.read_text())
    assert [entry["row"] for entry in results["rows"]] == rows
    for entry in results["rows"]:
        for key in ("vanilla", "marian", "ratio"):
            assert math.isfinite(entry[key]) and entry[key] > 0, (entry["row"], key)
    for train in results["rows"][:2]:
        assert 0 < train["vanilla_mfu"] < 1 and 0 < train["marian_mfu"] < 1
    assert set(results["matmul_peak_flops"]) == {"fp32", "bf16"}

    table = capsys.readouterr().out
    for label in ("train step", "label smoothing 0.1", "greedy generate", "beam-2 generate", "bf16 autocast", "MFU"):
        assert label in table


@pytest.mark.parametrize("name, label_smoothing", [("vanilla", 0.0), ("marian", 0.1)])
@pytest.mark.slow
def test_memory_subprocess_reports_the_peak_of_its_training_steps(name, label_smoothing):
    settings = speed.BenchmarkSettings(
        sizes=["tiny"], memory_steps=1, train_batch_size=2, train_src_len=6, train_tgt_len=5
    )
    run = speed.measure_memory("tiny", name, settings, label_smoothing)
    assert run["method"] == "VmHWM after reset"  # Linux: the high-water mark is reset once the model is built
    assert run["peak_mib"] > run["baseline_mib"] > 0  # a training step allocates gradients and optimizer state


def test_memory_row_takes_medians_and_the_median_of_per_round_ratios(monkeypatch):
    peaks = {"vanilla": iter([110.0, 130.0, 150.0]), "marian": iter([200.0, 120.0, 300.0])}

    def fake_measure(size, name, settings, label_smoothing):
        peak = next(peaks[name])
        return {"model": name, "method": "fake", "peak_mib": peak, "baseline_mib": 100.0, "increase_mib": peak - 100}

    monkeypatch.setattr(speed, "measure_memory", fake_measure)
    row = speed.memory_row("tiny", speed.BenchmarkSettings(memory_rounds=3))
    assert (row["vanilla"], row["marian"]) == (30.0, 100.0)  # medians of the increases 10/30/50 and 100/20/200
    assert row["ratio"] == 0.25  # median of 10/100, 30/20, 50/200: not the ratio of the medians (0.3)
    assert row["higher_is_better"] is False and row["peak_ratio"] == 0.55  # median of 110/200, 130/120, 150/300


def test_generation_rows_produce_exactly_the_asked_tokens():
    settings = speed.BenchmarkSettings(sizes=["tiny"], gen_batch_size=2, gen_src_len=4, new_tokens=6)
    inputs = speed.generation_inputs("tiny", settings)
    for name in speed.MODELS:
        model = speed.build_model(name, "tiny", settings).eval()
        for beams in (1, 3):
            tokens = speed.generation_call(model, inputs, settings, num_beams=beams)()
            assert tokens.shape == (2, 1 + 6), (name, beams)  # the start token, then exactly new_tokens


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [("--sizes", "huge", "--sizes: 'huge'"), ("--rows", "speed", "--rows: 'speed'"), ("--dtype", "fp8", "--dtype")],
)
def test_bad_arguments_name_the_flag(flag, value, message):
    with pytest.raises(ValueError, match=message):
        load_script("model_speed", folder="benchmarks").main([flag, value])


def test_bf16_autocast_training_step_is_finite_on_cpu():
    settings = speed.BenchmarkSettings(sizes=["tiny"], train_batch_size=2, train_src_len=4, train_tgt_len=4)
    model = speed.build_model("vanilla", "tiny", settings).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = speed.training_step(model, optimizer, speed.training_batch("tiny", settings), settings, dtype="bf16")()
    assert torch.isfinite(loss)
    assert all(parameter.dtype == torch.float32 for parameter in model.parameters())  # autocast keeps fp32 weights


def test_the_entry_point_lists_every_benchmark_and_runs_each_by_name(capsys):
    run = load_script("run", folder="benchmarks")
    drivers = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if "\ndef main(" in p.read_text()} - {"run"}
    assert set(run.BENCHMARKS) == drivers  # a new driver must be listed
    for name in run.BENCHMARKS:
        with pytest.raises(SystemExit) as exit_info:
            run.main([name, "--help"])  # each module's own parser answers
        assert exit_info.value.code == 0
        assert "usage:" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown benchmark 'nope'; one of: model_speed"):
        run.main(["nope"])
