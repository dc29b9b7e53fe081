#!/usr/bin/env python
"""Build an English->French parallel corpus from the gettext catalogs (.mo files) installed on this machine.

Every .mo catalog pairs an English message (msgid) with its human translation (msgstr). This script reads the French
catalogs with the standard library, cleans the pairs and splits them by a hash of the normalised English side, so
that near-duplicates ("Open file", "_Open File…") never land in two splits:

    python benchmarks/build_mo_corpus.py --output_dir data/en-fr
    # data/en-fr/{train,validation,test}.jsonl, one {"translation": {"en": ..., "fr": ...}} per line

The same installed files give the same corpus on every run. German catalogs are never read by default (they are kept
for independent evaluation).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import struct
import unicodedata
from collections.abc import Iterable, Iterator

SEARCH_ROOTS = ("/usr/share/locale", "/usr/share/vim", "/usr/local/share/locale", "/usr/lib/locale", "/opt")
RESERVED_LANGUAGES = {"de"}  # kept for independent evaluation of the project: never built here


def read_mo(path: str) -> Iterator[tuple[str, str]]:
    """(msgid, msgstr) pairs of a GNU .mo file: plural entries give their first (singular) forms, a message context
    (``ctxt\\x04id``) is dropped."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 20:
        raise ValueError(f"{path}: too short for a .mo file")
    for order in ("<", ">"):
        magic, _revision, count, ids_at, strs_at = struct.unpack(order + "5I", data[:20])
        if magic == 0x950412DE:
            break
    else:
        raise ValueError(f"{path}: not a .mo file (bad magic number)")

    def string(table: int, i: int) -> str:
        length, offset = struct.unpack(order + "2I", data[table + 8 * i : table + 8 * i + 8])
        return data[offset : offset + length].decode("utf-8", errors="replace")

    for i in range(count):
        msgid, msgstr = string(ids_at, i), string(strs_at, i)
        msgid = msgid.split("\x04", 1)[-1].split("\x00", 1)[0]
        yield msgid, msgstr.split("\x00", 1)[0]


def find_catalogs(language: str, roots: Iterable[str] = SEARCH_ROOTS) -> list[str]:
    """Every .mo file under `roots` in a `<language>` or `<language>_XX` locale folder, sorted, with no duplicates."""
    pattern = re.compile(rf"/{re.escape(language)}(_[A-Za-z]+)?(\.[\w-]+)?(@\w+)?/LC_MESSAGES/[^/]+\.mo$")
    found = set()
    for root in roots:
        for path in glob.glob(os.path.join(root, "**", "*.mo"), recursive=True):
            if pattern.search(path):
                found.add(os.path.realpath(path))
    return sorted(found)


def clean(text: str) -> str:
    """One line of plain text: keyboard accelerators (``_File``, ``&Open``) and surrounding spaces removed, runs of
    whitespace (newlines included) made one space."""
    text = re.sub(r"(?<![\w&_])[_&](?=\w)", "", text)
    return re.sub(r"\s+", " ", text).strip()


FORMAT_SPECIFIER = re.compile(r"%(\d+\$)?[-+ #0']*(\d+|\*)?(\.(\d+|\*))?(hh|h|ll|l|L|z|j|t)?[a-zA-Z%]|\{[^{}]*\}")


def normalise(text: str) -> str:
    """The key near-duplicates share: lower case, letters only (format specifiers such as %s and {name}, accents,
    digits, punctuation and spaces dropped)."""
    text = unicodedata.normalize("NFKD", FORMAT_SPECIFIER.sub("", text).lower())
    return "".join(c for c in text if c.isalpha())


def usable(source: str, target: str, max_chars: int) -> bool:
    if not source or not target or source == target:
        return False
    if len(source) > max_chars or len(target) > max_chars:
        return False
    # format-only or symbol-only messages ("%s: %s", "---") teach nothing
    return bool(normalise(source))


def collect_pairs(paths: Iterable[str], max_chars: int = 200) -> list[tuple[str, str]]:
    """Clean pairs from the catalogs in `paths`, in file order, each English sentence once (its first translation)."""
    pairs, seen = [], set()
    for path in paths:
        for msgid, msgstr in read_mo(path):
            if not msgid:  # the catalog's header
                continue
            source, target = clean(msgid), clean(msgstr)
            if usable(source, target, max_chars) and source not in seen:
                seen.add(source)
                pairs.append((source, target))
    return pairs


def split_pairs(
    pairs: list[tuple[str, str]], test_size: int = 1000, validation_size: int = 1000
) -> dict[str, list[tuple[str, str]]]:
    """Split by a hash of the normalised source: pairs whose sources normalise alike share a group, groups are ordered
    by their hash, and the first groups fill the test split, the next the validation split, the rest training."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for pair in pairs:
        groups.setdefault(normalise(pair[0]), []).append(pair)
    order = sorted(groups, key=lambda key: hashlib.sha256(key.encode()).hexdigest())
    splits: dict[str, list[tuple[str, str]]] = {"test": [], "validation": [], "train": []}
    for key in order:
        if len(splits["test"]) < test_size:
            splits["test"].extend(groups[key])
        elif len(splits["validation"]) < validation_size:
            splits["validation"].extend(groups[key])
        else:
            splits["train"].extend(groups[key])
    return splits


def write_jsonl(path: str, pairs: list[tuple[str, str]], source_lang: str, target_lang: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for source, target in pairs:
            f.write(json.dumps({"translation": {source_lang: source, target_lang: target}}, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--language", default="fr", help="The catalogs' language (the target side); default fr.")
    parser.add_argument("--roots", nargs="+", default=list(SEARCH_ROOTS), help="Folders searched for .mo files.")
    parser.add_argument("--max_chars", type=int, default=200, help="Drop pairs with a longer side (characters).")
    parser.add_argument("--test_size", type=int, default=1000)
    parser.add_argument("--validation_size", type=int, default=1000)
    args = parser.parse_args(argv)
    if args.language.split("_")[0] in RESERVED_LANGUAGES:
        parser.error(f"the {args.language!r} catalogs are reserved for independent evaluation; pick another language")

    paths = find_catalogs(args.language, args.roots)
    if not paths:
        parser.error(f"no {args.language!r} .mo catalogs under {args.roots}")
    pairs = collect_pairs(paths, args.max_chars)
    splits = split_pairs(pairs, args.test_size, args.validation_size)
    os.makedirs(args.output_dir, exist_ok=True)
    for name, split in splits.items():
        write_jsonl(os.path.join(args.output_dir, f"{name}.jsonl"), split, "en", args.language)
    counts = {name: len(split) for name, split in splits.items()}
    print(
        f"corpus en-{args.language}: {len(paths)} catalogs, {len(pairs)} pairs -> "
        + ", ".join(f"{name} {count}" for name, count in counts.items())
        + f" in {args.output_dir}"
    )
    return counts


if __name__ == "__main__":
    main()
