"""The real-data benchmark's tools: the .mo corpus builder (on catalogs the test writes) and the paired bootstrap."""

import json
import struct
from pathlib import Path

import pytest
import sacrebleu
from conftest import load_script

from vanilla_transformer.training import recipe


def write_mo(path: Path, messages: dict[str, str]) -> None:
    """A GNU .mo file (little-endian, revision 0, no hash table) holding `messages`, sorted by msgid as msgfmt does."""
    ids = sorted(messages)
    id_bytes = [m.encode() for m in ids]
    str_bytes = [messages[m].encode() for m in ids]
    count = len(ids)
    ids_at = 28
    strs_at = ids_at + 8 * count
    data_at = strs_at + 8 * count
    tables, blob = [b"", b""], b""
    for which, strings in enumerate((id_bytes, str_bytes)):
        for s in strings:
            tables[which] += struct.pack("<2I", len(s), data_at + len(blob))
            blob += s + b"\x00"
    header = struct.pack("<7I", 0x950412DE, 0, count, ids_at, strs_at, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + tables[0] + tables[1] + blob)


@pytest.fixture
def corpus_module():
    return load_script("build_mo_corpus", folder="benchmarks")


def test_read_mo_round_trips_messages_plurals_and_contexts(tmp_path, corpus_module):
    path = tmp_path / "x.mo"
    write_mo(
        path,
        {
            "": "Content-Type: text/plain; charset=UTF-8\n",
            "Open file": "Ouvrir le fichier",
            "menu\x04Quit": "Quitter",
            "%d file\x00%d files": "%d fichier\x00%d fichiers",
        },
    )
    pairs = dict(corpus_module.read_mo(str(path)))
    assert pairs["Open file"] == "Ouvrir le fichier"
    assert pairs["Quit"] == "Quitter"  # the context is dropped
    assert pairs["%d file"] == "%d fichier"  # plurals give their singular forms
    assert pairs[""].startswith("Content-Type")  # the header is read; collect_pairs drops it


def test_read_mo_rejects_a_file_that_is_not_a_catalog(tmp_path, corpus_module):
    path = tmp_path / "bad.mo"
    path.write_bytes(b"not a catalog at all, just bytes")
    with pytest.raises(ValueError, match="not a .mo file"):
        list(corpus_module.read_mo(str(path)))


def test_builder_cleans_deduplicates_and_splits_by_normalised_source(tmp_path, corpus_module):
    messages = {
        "": "header",
        "_Open File": "_Ouvrir le fichier",  # accelerator removed
        "Open file…": "Ouvrir un fichier…",  # normalises like "Open File": must share its split
        "Same": "Same",  # identical pair: dropped
        "Empty": "",  # untranslated: dropped
        "%s: %s": "%s : %s",  # nothing but format specifiers: dropped
        "%-10s {name}": "%-10s {nom}",
        "x" * 300: "y" * 300,  # too long: dropped
        **{f"Message number {i}": f"Message numéro {i}" for i in range(30)},  # all normalise alike
        **{f"Word{chr(97 + i)}{chr(97 + j)}": f"Mot{chr(97 + i)}{chr(97 + j)}" for i in range(6) for j in range(6)},
    }
    write_mo(tmp_path / "locale" / "fr" / "LC_MESSAGES" / "a.mo", messages)
    write_mo(tmp_path / "locale" / "fr" / "LC_MESSAGES" / "b.mo", {"Open File": "Ouvrir"})  # duplicate source
    write_mo(tmp_path / "locale" / "de" / "LC_MESSAGES" / "a.mo", {"Open File": "Datei öffnen"})  # never read
    out = tmp_path / "corpus"
    argv = ["--output_dir", str(out), "--roots", str(tmp_path / "locale"), "--test_size", "5", "--validation_size", "5"]
    counts = corpus_module.main(argv)

    splits = {}
    for name in ("train", "validation", "test"):
        lines = (out / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
        splits[name] = [json.loads(line)["translation"] for line in lines]
        assert counts[name] == len(lines)
    pairs = [pair for split in splits.values() for pair in split]
    sources = [pair["en"] for pair in pairs]
    assert len(sources) == len(set(sources)) == 2 + 30 + 36  # each English sentence once
    assert {"en": "Open File", "fr": "Ouvrir le fichier"} in pairs  # first catalog wins, accelerators removed
    assert not any(pair["en"] in ("Same", "Empty", "%s: %s") or len(pair["en"]) > 200 for pair in pairs)
    assert all("Datei" not in pair["fr"] for pair in pairs)  # the German catalog was not read
    # near-duplicates share a split: every "Message number N" is in one split, and so are both "open file" entries
    for group in ("Message number", "Open"):
        assert len({name for name, split in splits.items() for p in split if p["en"].startswith(group)}) == 1
    assert 5 <= counts["test"] and 5 <= counts["validation"] and counts["train"] > 0
    # deterministic: the same files give the same corpus
    assert corpus_module.main(argv) == counts
    assert [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()] == [
        {"translation": pair} for pair in splits["test"]
    ]


def test_builder_refuses_the_reserved_german_catalogs(tmp_path, corpus_module):
    with pytest.raises(SystemExit):
        corpus_module.main(["--output_dir", str(tmp_path), "--language", "de"])


def test_compare_reports_whose_bleu_is_whose_and_the_gain_of_the_system(tmp_path, capsys):
    """compare.py's own part around sacreBLEU's paired bootstrap (whose statistics are sacreBLEU's, not tested here):
    each system's corpus BLEU under its name, the gain as system minus baseline, the intervals and p-value passed on,
    the files read one sentence per line, the printed line, and lists of unequal length refused."""
    from sacrebleu.metrics import BLEU

    compare = load_script("compare", folder="benchmarks")
    references = [f"the cat number {i} sat on the mat" for i in range(20)]
    baseline = [f"a cat {i} sat on the mat" if i % 2 else f"the cat number {i} sat" for i in range(20)]
    system = references[:10] + baseline[10:]  # right on half the sentences: better than the baseline
    result = compare.paired_bootstrap(references, baseline, system, n_samples=50)
    assert result["baseline_bleu"] == pytest.approx(BLEU().corpus_score(baseline, [references]).score)
    assert result["system_bleu"] == pytest.approx(BLEU().corpus_score(system, [references]).score)
    assert result["delta"] == pytest.approx(result["system_bleu"] - result["baseline_bleu"]) and result["delta"] > 0
    assert result["baseline_ci"] > 0 and result["system_ci"] > 0
    assert result["p_value"] < 0.05  # the system's p-value: a gain on half the sentences is no chance
    swapped = compare.paired_bootstrap(references, system, baseline, n_samples=50)
    assert (swapped["baseline_bleu"], swapped["system_bleu"]) == (result["system_bleu"], result["baseline_bleu"])
    assert (swapped["baseline_ci"], swapped["system_ci"]) == pytest.approx((result["system_ci"], result["baseline_ci"]))
    assert swapped["delta"] == pytest.approx(-result["delta"])

    for name, lines in (("references", references), ("baseline", baseline), ("system", system)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = [f"--{name}={tmp_path / name}" for name in ("references", "baseline", "system")] + ["--n_samples", "50"]
    assert compare.main(argv) == result
    line = capsys.readouterr().out
    assert line.startswith(f"baseline BLEU {result['baseline_bleu']:.2f} ± {result['baseline_ci']:.2f}, system BLEU ")
    assert line.endswith(f"delta +{result['delta']:.2f} (paired bootstrap p = {result['p_value']:.4f})\n")
    with pytest.raises(ValueError, match="same number of lines"):
        compare.paired_bootstrap(references, baseline[:-1], references)


def test_end_to_end_driver_gives_train_py_the_marian_side_settings(tmp_path):
    """The end-to-end benchmark's command for train.py parses, and asks for what the Marian side does."""
    end_to_end = load_script("end_to_end", folder="benchmarks")
    args = end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--max_steps", "7", "--batch_size", "5"])
    command = end_to_end.ours_command(args, str(tmp_path / "run"))
    model_args, _, training_args, _ = recipe.parse_arguments(command[2:])
    assert (training_args.max_steps, training_args.per_device_train_batch_size) == (7, 5)
    assert (training_args.label_smoothing_factor, training_args.learning_rate) == (0.1, args.learning_rate)
    assert training_args.max_tokens_per_batch is None and training_args.threads == 1
    assert (training_args.do_train, training_args.do_eval, training_args.eval_strategy) == (True, False, "no")
    assert "d_model=256" in model_args.config_overrides and model_args.tokenizer_name.endswith("tokenizer")
    with pytest.raises(SystemExit):
        end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--pairs", "0"])


RUN_TRANSLATION_STUB = """
import json, os, sys
from transformers import HfArgumentParser, Seq2SeqTrainingArguments

# what the real script needs from its working directory: evaluate.load("sacrebleu") finds the module here, offline
import evaluate
assert os.path.isfile(os.path.join("sacrebleu", "sacrebleu.py")), os.getcwd()
metric = evaluate.load("sacrebleu")
bleu = metric.compute(predictions=["the cat sat on a mat"], references=[["the cat sat on the mat"]])["score"]
(training_args, rest) = HfArgumentParser(Seq2SeqTrainingArguments).parse_args_into_dataclasses(
    sys.argv[1:], return_remaining_strings=True
)
os.makedirs(training_args.output_dir)
results = {"train_samples_per_second": 12.5, "train_runtime": 3.0, "rest": rest, "steps": training_args.max_steps}
results["bleu"] = bleu
with open(os.path.join(training_args.output_dir, "all_results.json"), "w") as f:
    json.dump(results, f)
"""


@pytest.mark.slow
def test_end_to_end_driver_runs_the_official_script_from_a_folder_with_the_metric(tmp_path):
    """With --run_translation, the Marian side is that script, unmodified: given a saved random Marian and the
    tokenizer, a .json training file, Trainer flags that transformers parses, and the sacrebleu module beside it.
    (A stand-in script here: transformers 5's run_translation.py is not available offline.)"""
    from transformers import AutoTokenizer, MarianMTModel

    from vanilla_transformer.training.tokenizer import train_tokenizer

    end_to_end = load_script("end_to_end", folder="benchmarks")
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    pairs = [{"translation": {"en": f"number {i}", "fr": f"nombre {i}"}} for i in range(40)]
    (data / "train.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    stub = tmp_path / "run_translation.py"
    stub.write_text(RUN_TRANSLATION_STUB)
    argv = ["--data_dir", str(data), "--output_dir", str(out), "--size", "tiny", "--max_steps", "7"]
    args = end_to_end.parse_arguments([*argv, "--run_translation", str(stub)])
    texts = [text for pair in pairs for text in pair["translation"].values()]
    train_tokenizer(texts, vocab_size=300).save_pretrained(out / "tokenizer")
    workdir = end_to_end.prepare_run_translation(args)
    run_dir = out / "marian-0"
    run_dir.mkdir()
    # what `run` would read if it ignored the results folder it is given
    (run_dir / "all_results.json").write_text(json.dumps({"train_samples_per_second": 1.0, "train_runtime": 1.0}))
    result = end_to_end.run(
        end_to_end.run_translation_command(args, str(run_dir)), str(run_dir), str(run_dir / "output"), cwd=workdir
    )
    # the Trainer's figures from the results folder, and the peak memory of a process that imported torch, in MiB
    assert (result["train_samples_per_second"], result["train_runtime"]) == (12.5, 3.0)
    assert result["source_tokens_seen"] is None  # its command line cannot ask for the count
    assert 100 < result["peak_rss_mib"] < 10_000 and result["wall_s"] > 0
    with open(run_dir / "output" / "all_results.json") as f:
        written = json.load(f)
    assert written["steps"] == 7 and written["rest"][:2] == ["--model_name_or_path", str(out / "marian-init")]
    # the metric the script loads is benchmarks/metrics/sacrebleu.py, and it scores as the sacrebleu package
    assert written["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(["the cat sat on a mat"], [["the cat sat on the mat"]]).score
    )
    assert {"--train_file", "--source_lang", "--target_lang", "--max_source_length"} <= set(written["rest"])
    model = MarianMTModel.from_pretrained(out / "marian-init")
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(out / "marian-init"))
    assert (out / "train.json").read_text() == (data / "train.jsonl").read_text()
    with pytest.raises(SystemExit):
        end_to_end.parse_arguments([*argv, "--run_translation", str(tmp_path / "missing.py")])
