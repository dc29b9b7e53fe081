"""Data for translation: the demo corpus, loading JSON lines / TSV / datasets, validation, tokenisation."""

import inspect
import json
import os
import re

import datasets
import pytest
from datasets import Dataset, DatasetDict
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from vanilla_transformer.training import data
from vanilla_transformer.training.data import (
    DataError,
    default_num_workers,
    demo_corpus,
    english_number,
    german_number,
    load_raw_datasets,
    sentence_pairs,
    tokenize_splits,
)
from vanilla_transformer.training.tokenizer import train_tokenizer

NUMBERS = {
    1: ("eins", "one"),
    7: ("sieben", "seven"),
    16: ("sechzehn", "sixteen"),
    17: ("siebzehn", "seventeen"),
    21: ("einundzwanzig", "twenty-one"),
    30: ("dreißig", "thirty"),
    70: ("siebzig", "seventy"),
    100: ("einhundert", "one hundred"),
    101: ("einhunderteins", "one hundred one"),
    342: ("dreihundertzweiundvierzig", "three hundred forty-two"),
    1000: ("eintausend", "one thousand"),
    1001: ("eintausendeins", "one thousand one"),
    7070: ("siebentausendsiebzig", "seven thousand seventy"),
    9999: ("neuntausendneunhundertneunundneunzig", "nine thousand nine hundred ninety-nine"),
    21000: ("einundzwanzigtausend", "twenty-one thousand"),
    101001: ("einhunderteintausendeins", "one hundred one thousand one"),
}


@pytest.mark.parametrize("n", sorted(NUMBERS))
def test_number_words(n):
    assert (german_number(n), english_number(n)) == NUMBERS[n]


@pytest.mark.parametrize("n", [0, -3, 1_000_000])
def test_number_words_reject_out_of_range(n):
    with pytest.raises(ValueError, match="out of range"):
        german_number(n)
    with pytest.raises(ValueError, match="out of range"):
        english_number(n)


def test_demo_corpus_is_deterministic_with_fixed_disjoint_splits():
    first, second = demo_corpus(), demo_corpus()
    assert {s: len(first[s]) for s in first} == {"train": 8999, "validation": 500, "test": 500}
    for split in first:
        assert first[split]["translation"] == second[split]["translation"]
    sources = {split: {row["de"] for row in first[split]["translation"]} for split in first}
    assert not sources["train"] & sources["test"]
    assert not sources["train"] & sources["validation"]
    assert not sources["validation"] & sources["test"]
    assert set().union(*sources.values()) == {german_number(n) for n in range(1, 10000)}
    # every pair is a number and its translation
    number_of = {german_number(n): n for n in range(1, 10000)}
    for split in first:
        for row in first[split]["translation"]:
            assert row["en"] == english_number(number_of[row["de"]])
    # targets of several words, so that corpus BLEU (up to 4-grams) is meaningful
    words = [len(row["en"].split()) for row in first["test"]["translation"]]
    assert sum(words) / len(words) > 4 and sum(w >= 4 for w in words) / len(words) > 0.8


def test_default_data_is_the_demo_corpus():
    raw, source_lang, target_lang = load_raw_datasets(source_lang=None, target_lang=None)
    assert (source_lang, target_lang) == ("de", "en")
    assert set(raw) == {"train", "validation", "test"}


def write_jsonl(path, pairs):
    path.write_text("".join(json.dumps({"translation": pair}, ensure_ascii=False) + "\n" for pair in pairs))
    return str(path)


def test_loads_json_lines_and_tsv(tmp_path):
    train = write_jsonl(
        tmp_path / "train.jsonl", [{"de": "Grüße aus Köln", "en": "greetings from Cologne"}, {"de": "ja", "en": "yes"}]
    )
    # quotes, "NA" and numbers must come through as the text they are
    (tmp_path / "test.tsv").write_text('en\tde\n"quoted" words\t„zitierte“ Wörter\nNA\tNA\n42\t42\n')
    raw, source_lang, target_lang = load_raw_datasets(
        source_lang="de", target_lang="en", train_file=train, test_file=str(tmp_path / "test.tsv")
    )
    assert raw["train"][0]["translation"] == {"de": "Grüße aus Köln", "en": "greetings from Cologne"}
    assert [pair["de"] for pair in raw["test"]["translation"]] == ["„zitierte“ Wörter", "NA", "42"]
    assert [pair["en"] for pair in raw["test"]["translation"]] == ['"quoted" words', "NA", "42"]


def test_loads_a_saved_dataset_dict(tmp_path):
    pairs = [{"fr": "bonjour", "en": "hello"}, {"fr": "merci", "en": "thanks"}]
    DatasetDict({"train": Dataset.from_dict({"translation": pairs})}).save_to_disk(str(tmp_path / "ds"))
    raw, *_ = load_raw_datasets(source_lang="fr", target_lang="en", dataset_name=str(tmp_path / "ds"))
    assert raw["train"]["translation"] == pairs


def check_one_line_error(match: str, **kwargs) -> str:
    with pytest.raises(DataError, match=match) as info:
        load_raw_datasets(**kwargs)
    message = str(info.value)
    assert "\n" not in message and len(message) < 300
    return message


def test_errors_name_what_is_wrong(tmp_path):
    missing = str(tmp_path / "missing.jsonl")
    message = check_one_line_error("does not exist", source_lang="de", target_lang="en", train_file=missing)
    assert "--train_file" in message and missing in message

    (tmp_path / "empty.jsonl").write_text("\n  \n")
    message = check_one_line_error(
        "is empty", source_lang="de", target_lang="en", validation_file=str(tmp_path / "empty.jsonl")
    )
    assert "--validation_file" in message

    fr_en = write_jsonl(tmp_path / "fr-en.jsonl", [{"fr": "oui", "en": "yes"}])
    message = check_one_line_error("no 'de' sentences", source_lang="de", target_lang="en", train_file=fr_en)
    assert "fr-en.jsonl" in message and "['en', 'fr']" in message

    (tmp_path / "pairs.tsv").write_text("fr\ten\noui\tyes\n")
    check_one_line_error("no 'de' sentences", source_lang="de", target_lang="en", test_file=str(tmp_path / "pairs.tsv"))

    (tmp_path / "noheader.tsv").write_text("oui\n")
    check_one_line_error(
        "first line must name", source_lang="fr", target_lang="en", train_file=str(tmp_path / "noheader.tsv")
    )

    (tmp_path / "pairs.csv").write_text("fr,en\noui,yes\n")
    check_one_line_error(
        "unknown extension", source_lang="fr", target_lang="en", train_file=str(tmp_path / "pairs.csv")
    )

    DatasetDict({"train": Dataset.from_dict({"translation": [{"fr": "oui", "en": "yes"}]})}).save_to_disk(
        str(tmp_path / "ds")
    )
    message = check_one_line_error(
        "no 'de' sentences", source_lang="de", target_lang="en", dataset_name=str(tmp_path / "ds")
    )
    assert "--dataset_name" in message and "'train'" in message

    check_one_line_error("are required", source_lang=None, target_lang="en", train_file=fr_en)
    check_one_line_error("not both", source_lang="fr", target_lang="en", train_file=fr_en, dataset_name="wmt16")
    check_one_line_error(
        "could not be loaded", source_lang="de", target_lang="en", dataset_name=str(tmp_path / "no-such-dataset")
    )


def test_long_pairs_are_dropped_and_counted_never_truncated(capsys):
    raw = DatasetDict(
        {
            "train": Dataset.from_dict(
                {
                    "translation": [
                        {"de": "eins", "en": "one"},
                        {"de": "zwei", "en": "two"},
                        {"de": "eins " * 20, "en": "one"},  # source too long
                        {"de": "drei", "en": "three " * 20},  # target too long
                    ]
                }
            )
        }
    )
    tokenizer = train_tokenizer(["eins zwei drei", "one two three"] * 5, vocab_size=300)
    tokenized = tokenize_splits(raw, tokenizer, "de", "en", max_source_length=8, max_target_length=8)
    assert "train: kept 2 of 4 pairs; dropped 2 longer than" in capsys.readouterr().out
    assert len(tokenized["train"]) == 2
    for row, (source, target) in zip(tokenized["train"], [("eins", "one"), ("zwei", "two")]):
        assert row["input_ids"] == tokenizer(source)["input_ids"]
        assert row["labels"] == tokenizer(target)["input_ids"]  # whole, eos included
        assert row["labels"][-1] == tokenizer.eos_token_id

    with pytest.raises(DataError, match="every pair is longer"):
        tokenize_splits(raw, tokenizer, "de", "en", max_source_length=1, max_target_length=1, print_fn=None)


def test_evaluation_splits_keep_every_pair_truncate_long_sources_and_keep_whole_references(capsys):
    pairs = [
        {"de": "eins", "en": "one"},
        {"de": "eins " * 20, "en": "one " * 20},  # source and target too long
        {"de": "drei", "en": "three " * 20},  # target too long
        {"de": "", "en": "two"},  # an empty source is a line of the file too
    ]
    raw = DatasetDict({split: Dataset.from_dict({"translation": pairs}) for split in ("train", "validation", "test")})
    tokenizer = train_tokenizer(["eins zwei drei", "one two three"] * 5, vocab_size=300)
    eos = tokenizer.eos_token_id
    tokenized = tokenize_splits(raw, tokenizer, "de", "en", max_source_length=8, max_target_length=8)
    out = capsys.readouterr().out
    assert "train: kept 2 of 4 pairs; dropped 2 longer than" in out  # training pairs are still dropped
    assert out.count("truncated to") == 2  # one line per evaluation split
    for split in ("validation", "test"):
        assert (
            f"{split}: 1 of 4 sources longer than 8 tokens were truncated to 8; 2 references longer than 8 tokens "
            "are truncated for the loss only" in out
        )
        rows = tokenized[split]
        assert list(rows["translation"]) == pairs  # the sentences whole, every row in the file's order
        assert sentence_pairs(rows[:], "de", "en") == ([p["de"] for p in pairs], [p["en"] for p in pairs])
        whole = [tokenizer(pair["de"])["input_ids"] for pair in pairs]
        assert len(whole[1]) > 8
        assert list(rows["input_ids"]) == [whole[0], whole[1][:7] + [eos], whole[2], [eos]]  # cut, the eos kept
        assert [len(labels) for labels in rows["labels"]] == [2, 8, 8, len(tokenizer("two")["input_ids"])]
        assert all(labels[-1] == eos for labels in rows["labels"])

    # learned positions limit both sides as well; nothing too long, nothing to say
    limited = tokenize_splits(raw, tokenizer, "de", "en", 8, 8, print_fn=None, max_positions=4)["test"]
    assert max(map(len, [*limited["input_ids"], *limited["labels"]])) == 4 and len(limited) == 4
    short = DatasetDict({"test": Dataset.from_dict({"translation": pairs[:1]})})
    tokenize_splits(short, tokenizer, "de", "en", 8, 8)
    assert "truncated" not in capsys.readouterr().out


def test_an_empty_source_is_refused_in_training_files_but_translated_in_evaluation_files(tmp_path):
    (tmp_path / "pairs.tsv").write_text("de\ten\neins\tone\n\ttwo\n", encoding="utf-8")
    path = str(tmp_path / "pairs.tsv")
    check_one_line_error(
        "line 3 has an empty or non-text 'de' side", source_lang="de", target_lang="en", train_file=path
    )
    raw, _, _ = load_raw_datasets(source_lang="de", target_lang="en", validation_file=path, test_file=path)
    for split in ("validation", "test"):
        assert [pair["de"] for pair in raw[split]["translation"]] == ["eins", ""]
    # the reference must still be there
    (tmp_path / "no-reference.tsv").write_text("de\ten\neins\tone\nzwei\t\n", encoding="utf-8")
    check_one_line_error(
        "line 3 has an empty or non-text 'en' side",
        source_lang="de",
        target_lang="en",
        test_file=str(tmp_path / "no-reference.tsv"),
    )


def test_datasets_still_starts_a_pool_for_one_process(monkeypatch):
    """Why tokenize_splits passes num_proc=None for one process: datasets' `map(num_proc=1)` (and `filter`) asks
    for a pool of one worker process, and replaces os.environ while it runs (when this fails, 1 can be passed on)."""
    pools = []

    class NoPool(Exception):
        pass

    def pool(processes, *args, **kwargs):
        pools.append(processes)
        raise NoPool

    monkeypatch.setattr(datasets.arrow_dataset.mp, "Pool", pool)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # map sets it for its workers
    dataset = datasets.Dataset.from_dict({"a": [1, 2, 3, 4]})
    with pytest.raises(NoPool):
        dataset.map(lambda batch: batch, batched=True, num_proc=1)
    with pytest.raises(NoPool):
        dataset.filter(lambda batch: [True] * len(batch["a"]), batched=True, num_proc=1)
    assert pools == [1, 1]
    assert "os.environ = prev_env" in inspect.getsource(datasets.Dataset.map)


def test_tokenizing_in_one_process_stays_in_this_process_and_leaves_the_environment_alone():
    """train.py passes its default of one worker; datasets 5.2 would start a pool for it and replace os.environ by a
    copy, so that a variable set before (a test's monkeypatch, a launcher's settings) outlived its removal."""
    environment = os.environ
    raw = DatasetDict({"train": Dataset.from_dict({"translation": [{"de": "eins", "en": "one"}] * 8})})
    tokenizer = train_tokenizer(["eins zwei drei", "one two three"] * 5, vocab_size=300)
    tokenized = tokenize_splits(raw, tokenizer, "de", "en", 8, 8, num_proc=1, print_fn=None)
    assert len(tokenized["train"]) == 8
    assert os.environ is environment


def test_a_restart_loads_the_tokenized_splits_from_the_cache(tmp_path, monkeypatch):
    """The second run reads the same file with the tokenizer the first one trained and saved: nothing is tokenised
    again. Another tokenizer, other languages or another file are tokenised again; other length limits reuse the
    tokenisation but not the filtered split."""
    words = ["eins", "zwei", "drei", "vier", "fünf"]
    rows = [{"translation": {"de": " ".join(words[: i % 5 + 1]), "en": f"{i} one two"}} for i in range(40)]
    train_file = tmp_path / "train.jsonl"
    train_file.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    cache = str(tmp_path / "cache")

    def tokenize(tokenizer, source_lang="de", target_lang="en", max_length=5, **kwargs) -> DatasetDict:
        raw, _, _ = load_raw_datasets(source_lang="de", target_lang="en", train_file=str(train_file), cache_dir=cache)
        kwargs.update(print_fn=None)
        return tokenize_splits(raw, tokenizer, source_lang, target_lang, max_length, max_length, **kwargs)

    calls = []
    original_call = PreTrainedTokenizerBase.__call__
    monkeypatch.setattr(
        PreTrainedTokenizerBase, "__call__", lambda self, *a, **k: calls.append(1) or original_call(self, *a, **k)
    )
    trained = train_tokenizer([" ".join(words), "one two"] * 5, vocab_size=300)
    first = tokenize(trained)
    assert calls and first["train"].cache_files and str(tmp_path / "cache") in first["train"].cache_files[0]["filename"]
    trained.save_pretrained(tmp_path / "tokenizer")
    saved = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")

    calls.clear()
    second = tokenize(saved)
    assert not calls  # loaded, not tokenised
    assert second["train"].cache_files == first["train"].cache_files
    assert second["train"].to_list() == first["train"].to_list()

    other_tokenizer = train_tokenizer([" ".join(words), "one two three"] * 5, vocab_size=290)
    for kwargs in (
        {"tokenizer": other_tokenizer},
        {"tokenizer": saved, "source_lang": "en", "target_lang": "de"},
        {"tokenizer": saved, "load_from_cache_file": False},
    ):
        calls.clear()
        again = tokenize(**kwargs)
        assert calls, kwargs
        if "load_from_cache_file" not in kwargs:
            assert again["train"].cache_files != first["train"].cache_files
    calls.clear()
    longer = tokenize(saved, max_length=8)
    assert not calls and len(longer["train"]) > len(first["train"])
    assert longer["train"].cache_files != first["train"].cache_files

    # the file changed: its rows are tokenised
    train_file.write_text("".join(json.dumps(row) + "\n" for row in rows[:20]), encoding="utf-8")
    calls.clear()
    changed = tokenize(saved)
    assert calls and changed["train"].cache_files != first["train"].cache_files


def test_tokenizing_processes_follow_the_idle_cpus_and_the_size_of_the_data(monkeypatch):
    monkeypatch.setattr(data.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    busy_asked = []

    def busy() -> float:
        busy_asked.append(1)
        return 2.2

    assert default_num_workers(1000, busy) == 1 and not busy_asked  # small data: no processes to start
    assert default_num_workers(data.MIN_ROWS_PER_WORKER * 3, busy) == 3
    assert default_num_workers(data.MIN_ROWS_PER_WORKER * 100, busy) == 6  # 8 CPUs, 2.2 of them busy
    assert default_num_workers(data.MIN_ROWS_PER_WORKER * 100) == 8


@pytest.mark.parametrize(
    "name, content, message",
    [
        (
            "tab.tsv",
            "de\ten\neins\tone\nzwei\nvier\tfour\n",
            "line 3 has 1 tab-separated field(s) but the header names 2",
        ),
        ("extra.tsv", "de\ten\neins\tone\ttoo\n", "line 2 has 3 tab-separated field(s)"),
        ("empty-side.tsv", "de\ten\neins\tone\nzwei\t \n", "line 3 has an empty or non-text 'en' side"),
        (
            "bad.jsonl",
            '{"translation": {"de": "eins", "en": "one"}}\n{"translation": {"de": "zwei",\n',
            "line 2 is not valid JSON",
        ),
        (
            "missing.jsonl",
            '{"translation": {"de": "a", "en": "b"}}\n\n{"translation": {"de": "c"}}\n',
            "line 3 has no 'en' sentence",
        ),
        (
            "number.jsonl",
            '{"translation": {"de": "a", "en": "b"}}\n{"translation": {"de": "c", "en": 3}}\n',
            "line 2 has an empty or non-text 'en' side: 3",
        ),
        ("list.jsonl", '{"translation": {"de": "a", "en": "b"}}\n["c", "d"]\n', "line 2 is a list, not an object"),
        ("array.json", '[{"de": "a", "en": "b"}, {"de": "", "en": "d"}]', "item 2 has an empty or non-text 'de' side"),
    ],
)
def test_a_malformed_row_names_the_file_and_the_line(tmp_path, name, content, message):
    (tmp_path / name).write_text(content, encoding="utf-8")
    text = check_one_line_error(re.escape(message), source_lang="de", target_lang="en", train_file=str(tmp_path / name))
    assert name in text
