"""Parallel data for translation: the built-in demo corpus, loading user corpora, and tokenisation.

Every split ends up as a `datasets.Dataset` whose rows hold a `translation` dict (`{"de": ..., "en": ...}`, the
layout of transformers' run_translation.py and of Hub translation datasets such as wmt16), or one column per language
(TSV files). Problems with the data are raised as `DataError`, whose message is one line naming the culprit, before
any model is built.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import datasets
import pyarrow.compute
from datasets import Dataset, DatasetDict
from datasets.exceptions import DatasetGenerationError
from datasets.fingerprint import Hasher

from .workarounds.datasets_no_public_fingerprint import fingerprint_of

DEMO_SOURCE_LANG = "de"
DEMO_TARGET_LANG = "en"
SPLITS = ("train", "validation", "test")


class DataError(ValueError):
    """A problem with the user's data or data arguments; the message is one line meant for the command line."""


# --------------------------------------------------------------------------------------------------------------------
# The demo corpus: German number words -> English number words
# --------------------------------------------------------------------------------------------------------------------

_DE_UNITS = ["", "ein", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun"]
_DE_TEENS = ["zehn", "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn", "achtzehn", "neunzehn"]
_DE_TENS = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig", "neunzig"]
_EN_UNITS = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_EN_TEENS = [
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_EN_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _german_below_1000(n: int, final: bool) -> str:
    # "eins" only ends a number; inside a compound it is "ein" (einundzwanzig, einhundert, eintausend)
    hundreds, rest = divmod(n, 100)
    word = _DE_UNITS[hundreds] + "hundert" if hundreds else ""
    if rest == 1:
        word += "eins" if final else "ein"
    elif rest < 10:
        word += _DE_UNITS[rest]
    elif rest < 20:
        word += _DE_TEENS[rest - 10]
    else:
        tens, units = divmod(rest, 10)
        # units before tens, joined by "und": 42 = zweiundvierzig
        word += (_DE_UNITS[units] + "und" if units else "") + _DE_TENS[tens]
    return word


def german_number(n: int) -> str:
    """The German word for 1 <= n < 1,000,000, written as one compound: 342 -> "dreihundertzweiundvierzig"."""
    if not 1 <= n < 1_000_000:
        raise ValueError(f"german_number: n={n} is out of range; it must be in [1, 999999].")
    thousands, rest = divmod(n, 1000)
    word = _german_below_1000(thousands, final=False) + "tausend" if thousands else ""
    return word + (_german_below_1000(rest, final=True) if rest else "")


def _english_below_1000(n: int) -> list[str]:
    hundreds, rest = divmod(n, 100)
    words = [_EN_UNITS[hundreds], "hundred"] if hundreds else []
    if 0 < rest < 10:
        words.append(_EN_UNITS[rest])
    elif 10 <= rest < 20:
        words.append(_EN_TEENS[rest - 10])
    elif rest >= 20:
        tens, units = divmod(rest, 10)
        words.append(_EN_TENS[tens] + ("-" + _EN_UNITS[units] if units else ""))
    return words


def english_number(n: int) -> str:
    """The English words for 1 <= n < 1,000,000, American style: 342 -> "three hundred forty-two"."""
    if not 1 <= n < 1_000_000:
        raise ValueError(f"english_number: n={n} is out of range; it must be in [1, 999999].")
    thousands, rest = divmod(n, 1000)
    words = _english_below_1000(thousands) + ["thousand"] if thousands else []
    return " ".join(words + _english_below_1000(rest))


def demo_corpus(
    max_number: int = 9999, validation_size: int = 500, test_size: int = 500, seed: int = 20170612
) -> DatasetDict:
    """The built-in German->English corpus: every number from 1 to `max_number`, as words, split at random (with a
    fixed seed, so always the same way) into disjoint test, validation and train splits.

    German writes a number as one word with the units before the tens ("dreihundertzweiundvierzig"), English as several
    words in a different order ("three hundred forty-two"): the model has to segment and reorder, and the targets are
    long enough for BLEU to mean something.
    """
    if validation_size < 0 or test_size < 0 or validation_size + test_size >= max_number:
        raise DataError(
            f"demo corpus: validation_size={validation_size} + test_size={test_size} must leave training examples "
            f"among the {max_number} numbers."
        )
    numbers = list(range(1, max_number + 1))
    random.Random(seed).shuffle(numbers)
    split_numbers = {
        "train": numbers[test_size + validation_size :],
        "validation": numbers[test_size : test_size + validation_size],
        "test": numbers[:test_size],
    }
    return DatasetDict(
        {
            split: Dataset.from_dict(
                {
                    "translation": [
                        {DEMO_SOURCE_LANG: german_number(n), DEMO_TARGET_LANG: english_number(n)} for n in nums
                    ]
                }
            )
            for split, nums in split_numbers.items()
        }
    )


# --------------------------------------------------------------------------------------------------------------------
# Loading user corpora
# --------------------------------------------------------------------------------------------------------------------

JSON_EXTENSIONS = (".json", ".jsonl")
TSV_EXTENSIONS = (".tsv",)


def _check_file(flag: str, path: str) -> None:
    if not os.path.exists(path):
        raise DataError(f"{flag} {path!r} does not exist.")
    if not os.path.isfile(path):
        raise DataError(f"{flag} {path!r} is not a file.")
    if not path.endswith(JSON_EXTENSIONS + TSV_EXTENSIONS):
        raise DataError(
            f"{flag} {path!r} has an unknown extension; use .json/.jsonl (JSON lines with a `translation` dict) "
            "or .tsv (a header row of language codes, then one sentence pair per line)."
        )
    with open(path, encoding="utf-8") as f:
        if not any(line.strip() for line in f):
            raise DataError(f"{flag} {path!r} is empty.")


def _json_records(flag: str, path: str) -> Iterator[tuple[str, object]]:
    """(where, record) for each record of a JSON-lines file ("line N") or of a JSON list ("item N")."""
    with open(path, encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), "")
        f.seek(0)
        if first.lstrip().startswith("["):
            try:
                items = json.load(f)
            except json.JSONDecodeError as error:
                raise DataError(f"{flag} {path!r} is not valid JSON: {error}.") from None
            yield from ((f"item {i}", item) for i, item in enumerate(items, 1))
            return
        for number, line in enumerate(f, 1):  # streamed: a corpus may not fit in memory twice
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(f"{flag} {path!r} line {number} is not valid JSON: {error.msg}.") from None
                yield f"line {number}", record


def _tsv_records(flag: str, path: str) -> Iterator[tuple[str, object]]:
    """(where, {language: sentence}) for each line of a TSV file after its header (which names the languages)."""
    with open(path, encoding="utf-8") as f:
        lines = ((number, line.rstrip("\r\n")) for number, line in enumerate(f, 1) if line.strip())
        header = next(lines)[1].split("\t")
        if len(header) < 2 or len(set(header)) != len(header) or not all(header):
            raise DataError(
                f"{flag} {path!r}: the first line must name the language of each tab-separated column (e.g. "
                f"'de<TAB>en'), got {header!r}."
            )
        for number, line in lines:
            fields = line.split("\t")
            if len(fields) != len(header):
                raise DataError(
                    f"{flag} {path!r} line {number} has {len(fields)} tab-separated field(s) but the header names "
                    f"{len(header)} ({', '.join(header)})."
                )
            yield f"line {number}", dict(zip(header, fields))


def checked_pairs(
    flag: str, path: str, source_lang: str, target_lang: str, empty_source: bool = False, stamp: object = None
) -> Iterator[dict]:
    """The sentence pairs of a JSON-lines (or JSON list) or TSV file, ``{"translation": {source_lang: ...,
    target_lang: ...}}`` one per row, checked as they are read: a `DataError` names the file and the line of the
    first malformed row (not JSON, not an object, a missing language, an extra TSV field, a side that is empty or not
    text; `empty_source`: an empty source is allowed, as in a test file, where it still gets its line of output), or
    the languages the file offers when its first row lacks one. `stamp` (the file's size and modification time) only
    tells `datasets`' cache that the file changed."""
    records = _tsv_records(flag, path) if path.endswith(TSV_EXTENSIONS) else _json_records(flag, path)
    for index, (where, record) in enumerate(records):
        if not isinstance(record, dict):
            raise DataError(f"{flag} {path!r} {where} is a {type(record).__name__}, not an object of sentences.")
        pair = record.get("translation", record)
        if not isinstance(pair, dict):
            raise DataError(f"{flag} {path!r} {where}: `translation` must map languages to sentences.")
        for option, lang in (("--source_lang", source_lang), ("--target_lang", target_lang)):
            if index == 0 and lang not in pair:
                offered = sorted(pair)
                raise DataError(f"{flag} {path!r} has no {lang!r} sentences ({option} {lang}); it offers {offered}.")
            if lang not in pair:
                raise DataError(f"{flag} {path!r} {where} has no {lang!r} sentence.")
            empty_allowed = empty_source and lang == source_lang
            if not isinstance(pair[lang], str) or not (pair[lang].strip() or empty_allowed):
                raise DataError(f"{flag} {path!r} {where} has an empty or non-text {lang!r} side: {pair[lang]!r}.")
        yield {"translation": {source_lang: pair[source_lang], target_lang: pair[target_lang]}}


def load_data_file(
    flag: str, path: str, source_lang: str, target_lang: str, empty_source: bool = False, cache_dir: str | None = None
) -> Dataset:
    """One split from a file, read once: `checked_pairs` parses and checks it while `datasets` writes the pairs to
    its cache (a later run with the same, unchanged file loads them from there, and the split's fingerprint stays the
    same, so that its tokenisation is cached too)."""
    info = os.stat(path)
    features = datasets.Features(
        {"translation": {source_lang: datasets.Value("string"), target_lang: datasets.Value("string")}}
    )
    arguments = dict(flag=flag, path=os.path.abspath(path), source_lang=source_lang, target_lang=target_lang)
    arguments.update(empty_source=empty_source, stamp=(info.st_size, info.st_mtime_ns))
    try:
        return Dataset.from_generator(checked_pairs, features=features, cache_dir=cache_dir, gen_kwargs=arguments)
    except DatasetGenerationError as error:  # raised around the generator's own error
        cause = error.__cause__
        while cause is not None and not isinstance(cause, DataError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise cause from None


def languages_of(dataset: Dataset) -> list[str]:
    """The languages a split offers: the keys of its `translation` column, else its column names."""
    if "translation" in dataset.column_names:
        feature = dataset.features["translation"]
        if isinstance(feature, datasets.Translation):
            return list(feature.languages)
        if isinstance(feature, dict):
            return list(feature)
        raise DataError(f"the `translation` column has type {feature}; expected a dict of language -> sentence.")
    return list(dataset.column_names)


def check_language_pair(dataset: Dataset, origin: str, source_lang: str, target_lang: str) -> None:
    """Raise a `DataError` naming `origin` unless `dataset` has both languages."""
    available = languages_of(dataset)
    for flag, lang in (("--source_lang", source_lang), ("--target_lang", target_lang)):
        if lang not in available:
            raise DataError(f"{origin} has no {lang!r} sentences ({flag} {lang}); it offers {sorted(available)}.")
    if len(dataset) == 0:
        raise DataError(f"{origin} has no examples.")


def load_raw_datasets(
    *,
    source_lang: str | None,
    target_lang: str | None,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    test_file: str | None = None,
    cache_dir: str | None = None,
) -> tuple[DatasetDict, str, str]:
    """Load the splits that exist and check them; returns (splits, source_lang, target_lang).

    With no dataset and no files, returns the built-in demo corpus (German -> English).
    """
    files = {"train": train_file, "validation": validation_file, "test": test_file}
    given_files = {split: path for split, path in files.items() if path is not None}
    if dataset_name is not None and given_files:
        raise DataError("pass either --dataset_name or --train_file/--validation_file/--test_file, not both.")

    if dataset_name is None and not given_files:
        source_lang = source_lang or DEMO_SOURCE_LANG
        target_lang = target_lang or DEMO_TARGET_LANG
        raw = demo_corpus()
        for split in raw:
            check_language_pair(raw[split], f"the demo corpus ({split})", source_lang, target_lang)
        return raw, source_lang, target_lang

    # check every file before reading any, so that a typo in the last one is reported at once
    for split, path in given_files.items():
        _check_file(f"--{split}_file", path)
    if not source_lang or not target_lang:
        raise DataError("--source_lang and --target_lang are required with your own data (e.g. --source_lang de).")
    if source_lang == target_lang:
        raise DataError(f"--source_lang and --target_lang are both {source_lang!r}; they must differ.")

    raw = DatasetDict()
    if dataset_name is not None:
        raw = _load_named_dataset(dataset_name, dataset_config_name, cache_dir)
        origin = f"--dataset_name {dataset_name!r}" + (f" ({dataset_config_name})" if dataset_config_name else "")
        raw = DatasetDict({split: raw[split] for split in SPLITS if split in raw})
        if not raw:
            raise DataError(f"{origin} has none of the splits {list(SPLITS)}.")
        for split in raw:
            check_language_pair(raw[split], f"{origin} split {split!r}", source_lang, target_lang)
        return raw, source_lang, target_lang

    for split, path in given_files.items():
        flag = f"--{split}_file"
        raw[split] = load_data_file(
            flag, path, source_lang, target_lang, empty_source=split != "train", cache_dir=cache_dir
        )
        check_language_pair(raw[split], f"{flag} {path!r}", source_lang, target_lang)
    return raw, source_lang, target_lang


@dataclass
class DataArguments:
    """Which parallel data to read; none given = the built-in demo corpus. The command-line flags of every script that
    reads data (train.py, train_tokenizer.py, padding_efficiency.py), parsed with HfArgumentParser."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "A `datasets` translation dataset (Hub name or local folder), e.g. wmt16."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration, e.g. de-en."})
    train_file: str | None = field(
        default=None,
        metadata={"help": "Training pairs: .jsonl ({'translation': {lang: text}} per line) or .tsv (header: langs)."},
    )
    validation_file: str | None = field(default=None, metadata={"help": "Validation pairs (same formats)."})
    test_file: str | None = field(default=None, metadata={"help": "Test pairs (same formats)."})
    source_lang: str | None = field(default=None, metadata={"help": "Source language code, e.g. de (demo: de)."})
    target_lang: str | None = field(default=None, metadata={"help": "Target language code, e.g. en (demo: en)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Use only the first N test pairs."})

    def has_own_data(self) -> bool:
        return any((self.dataset_name, self.train_file, self.validation_file, self.test_file))

    def load(self, cache_dir: str | None = None) -> tuple[DatasetDict, str, str]:
        """``load_raw_datasets`` with these arguments: (splits, source_lang, target_lang), not yet cut to the
        ``max_*_samples`` (see ``max_samples``)."""
        return load_raw_datasets(
            source_lang=self.source_lang,
            target_lang=self.target_lang,
            dataset_name=self.dataset_name,
            dataset_config_name=self.dataset_config_name,
            train_file=self.train_file,
            validation_file=self.validation_file,
            test_file=self.test_file,
            cache_dir=cache_dir,
        )

    def max_samples(self) -> dict[str, int | None]:
        """The ``max_*_samples`` per split, for ``select_samples``."""
        return {"train": self.max_train_samples, "validation": self.max_eval_samples, "test": self.max_predict_samples}


def _load_named_dataset(name: str, config_name: str | None, cache_dir: str | None) -> DatasetDict:
    if os.path.isdir(name) and os.path.exists(os.path.join(name, "dataset_dict.json")):
        return datasets.load_from_disk(name)  # written by DatasetDict.save_to_disk
    try:
        loaded = datasets.load_dataset(name, config_name, cache_dir=cache_dir)
    except Exception as error:  # not found, offline, bad config...: all end the run the same way
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataError(f"--dataset_name {name!r} could not be loaded: {reason}") from error
    return loaded if isinstance(loaded, DatasetDict) else DatasetDict({"train": loaded})


def select_samples(raw: DatasetDict, max_samples: dict[str, int | None]) -> DatasetDict:
    """Keep the first `max_samples[split]` examples of each split (for quick runs)."""
    for split, limit in max_samples.items():
        if limit is not None and split in raw:
            if limit <= 0:
                raise DataError(f"--max_{split}_samples={limit} must be a positive integer.")
            raw[split] = raw[split].select(range(min(limit, len(raw[split]))))
    return raw


def sentence_pairs(batch: dict, source_lang: str, target_lang: str) -> tuple[list[str], list[str]]:
    """(sources, targets) of a batch of rows in either layout (`translation` dicts or one column per language)."""
    if "translation" in batch:
        rows = batch["translation"]
        return [row[source_lang] for row in rows], [row[target_lang] for row in rows]
    return list(batch[source_lang]), list(batch[target_lang])


# --------------------------------------------------------------------------------------------------------------------
# Tokenisation
# --------------------------------------------------------------------------------------------------------------------


# Part of the tokenized splits' cache key: change it whenever `tokenize_splits` gives other rows for the same inputs.
TOKENIZATION_VERSION = "2"


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of what decides the ids a tokenizer gives: its backend's JSON (normaliser, pre-tokeniser, model,
    post-processor with the eos it adds, special tokens), whether it was trained here or loaded from disk; the padding
    and truncation settings a call leaves behind are left out, since `tokenize_splits` uses neither. A tokenizer
    without a `tokenizers` backend is hashed whole."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return Hasher.hash(tokenizer)
    state = json.loads(backend.to_str())
    state.pop("padding", None)
    state.pop("truncation", None)
    return Hasher.hash(json.dumps(state, sort_keys=True))


def tokenization_fingerprints(
    dataset: Dataset,
    tokenizer_hash: str,
    source_lang: str,
    target_lang: str,
    max_source_length: int,
    max_target_length: int,
) -> tuple[str, str]:
    """The `datasets` fingerprints of a split once tokenised and once filtered by length: the same data (the split's
    own fingerprint, which follows its files), tokenizer, languages and (for the second) length limits give the same
    fingerprints, hence the same cache files."""
    tokenized = Hasher.hash(
        ["tokenize", TOKENIZATION_VERSION, fingerprint_of(dataset), tokenizer_hash, source_lang, target_lang]
    )
    return tokenized, Hasher.hash(["short_enough", tokenized, max_source_length, max_target_length])


# below this many rows per process, starting the processes costs more than they save: the tokenizers library already
# encodes on every core (docs/training.md#your-own-data)
MIN_ROWS_PER_WORKER = 50_000


def default_num_workers(num_rows: int, busy_cpus: Callable[[], float] | None = None) -> int:
    """--preprocessing_num_workers' default for a split of `num_rows` rows: one process per CPU this process may use
    that other work leaves idle (`busy_cpus()`: how many CPUs it keeps busy; asked only when it matters), and no more
    than one per MIN_ROWS_PER_WORKER rows."""
    most = num_rows // MIN_ROWS_PER_WORKER
    if most <= 1:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    busy = busy_cpus() if busy_cpus is not None else 0.0
    return max(1, min(most, int(cpus - busy + 0.5)))


def _count_longer(dataset: Dataset, column: str, limit: int) -> int:
    """How many rows of a tokenized split hold more than `limit` tokens in `column` (lengths read from Arrow)."""
    lengths = pyarrow.compute.list_value_length(dataset.with_format("arrow")[column])
    return int(pyarrow.compute.sum(pyarrow.compute.greater(lengths, limit)).as_py() or 0)


def tokenize_splits(
    raw: DatasetDict,
    tokenizer,
    source_lang: str,
    target_lang: str,
    max_source_length: int,
    max_target_length: int,
    num_proc: int | None = None,
    load_from_cache_file: bool = True,
    print_fn: Callable[[str], None] | None = print,
    max_positions: int | None = None,
) -> DatasetDict:
    """Tokenise every split, once, with `tokenizer(sources, text_target=targets)` (both end with eos).

    The training split drops the pairs whose source or target is longer than the limits, printing how many: its labels
    are never truncated. The validation and test splits keep every pair, in order, and their sentences beside the ids
    (`sentence_pairs` reads them), so that every line of the user's file is translated and scored against its target
    sentence as written: a source longer than `max_source_length` (or than `max_positions`, the model's learned
    positions, when given) is cut to it as the tokenizer's truncation cuts (its last tokens, the eos, kept), and so
    are the labels, which only the evaluation loss reads. One line per split says how many sources were cut, when any
    were.

    A split read from files (or any split with `datasets` cache files) is cached next to them, in `datasets`' cache:
    a later call with the same data, tokenizer, languages and limits loads the result instead of tokenising again
    (`load_from_cache_file=False` tokenises again). In-memory splits, like the demo corpus, are not cached."""
    if max_source_length <= 0 or max_target_length <= 0:
        raise DataError(
            f"--max_source_length={max_source_length} and --max_target_length={max_target_length} must be positive."
        )
    source_limit, target_limit = max_source_length, max_target_length
    if max_positions is not None:
        source_limit, target_limit = min(source_limit, max_positions), min(target_limit, max_positions)
    kept_at_end = tokenizer.num_special_tokens_to_add()  # the eos a sentence ends with, which truncation keeps

    def tokenize(batch: dict) -> dict:
        sources, targets = sentence_pairs(batch, source_lang, target_lang)
        for side, sentences in (("source", sources), ("target", targets)):
            if any(s is None for s in sentences):
                raise DataError(f"a {side} sentence is missing (null) in a row of the data.")
        return tokenizer(sources, text_target=targets)

    def cut(ids: list[int], limit: int) -> list[int]:
        return ids if len(ids) <= limit else ids[: limit - kept_at_end] + ids[len(ids) - kept_at_end :]

    def cut_to_the_limits(batch: dict) -> dict:
        return {
            "input_ids": [cut(ids, source_limit) for ids in batch["input_ids"]],
            "attention_mask": [mask[:source_limit] for mask in batch["attention_mask"]],
            "labels": [cut(ids, target_limit) for ids in batch["labels"]],
        }

    def short_enough(batch: dict) -> list[bool]:
        return [
            len(source) <= max_source_length and len(target) <= max_target_length
            for source, target in zip(batch["input_ids"], batch["labels"])
        ]

    # one process: this one (None); datasets' map(num_proc=1) starts a pool of one worker and replaces os.environ
    num_proc = num_proc if num_proc is not None and num_proc > 1 else None
    tokenizer_hash = tokenizer_fingerprint(tokenizer)
    tokenized = DatasetDict()
    for split, dataset in raw.items():
        tokenized_fingerprint, kept_fingerprint = tokenization_fingerprints(
            dataset, tokenizer_hash, source_lang, target_lang, max_source_length, max_target_length
        )
        if split != "train":
            encoded = dataset.map(
                tokenize,
                batched=True,
                num_proc=num_proc,
                load_from_cache_file=load_from_cache_file,
                new_fingerprint=Hasher.hash(["with its sentences", tokenized_fingerprint]),
                desc=f"Tokenizing {split}",
            )
            longer_sources = _count_longer(encoded, "input_ids", source_limit)
            longer_labels = _count_longer(encoded, "labels", target_limit)
            if longer_sources or longer_labels:
                encoded = encoded.map(
                    cut_to_the_limits,
                    batched=True,
                    num_proc=num_proc,
                    load_from_cache_file=load_from_cache_file,
                    new_fingerprint=Hasher.hash(["cut", tokenized_fingerprint, source_limit, target_limit]),
                    desc=f"Cutting {split} to the limits",
                )
            if print_fn is not None and (longer_sources or longer_labels):
                print_fn(
                    f"{split}: {longer_sources} of {len(encoded)} sources longer than {source_limit} tokens were "
                    f"truncated to {source_limit}"
                    + (
                        f"; {longer_labels} references longer than {target_limit} tokens are truncated for the "
                        "loss only (BLEU and chrF compare with the whole sentence)"
                        if longer_labels
                        else ""
                    )
                )
            tokenized[split] = encoded
            continue
        encoded = dataset.map(
            tokenize,
            batched=True,
            num_proc=num_proc,
            remove_columns=dataset.column_names,
            load_from_cache_file=load_from_cache_file,
            new_fingerprint=tokenized_fingerprint,
            desc=f"Tokenizing {split}",
        )
        kept = encoded.filter(
            short_enough,
            batched=True,
            num_proc=num_proc,
            load_from_cache_file=load_from_cache_file,
            new_fingerprint=kept_fingerprint,
        )
        dropped = len(encoded) - len(kept)
        if print_fn is not None:
            print_fn(
                f"{split}: kept {len(kept)} of {len(encoded)} pairs; dropped {dropped} longer than "
                f"max_source_length={max_source_length} or max_target_length={max_target_length} tokens"
            )
        if len(kept) == 0:
            raise DataError(
                f"{split}: every pair is longer than max_source_length={max_source_length} or "
                f"max_target_length={max_target_length} tokens; raise the limits."
            )
        tokenized[split] = kept
    return tokenized
