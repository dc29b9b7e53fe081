"""Workaround for `datasets`, whose `Dataset` has no public getter of its fingerprint.

Written for datasets 5.2.0 (installed).

The limit: a `Dataset`'s fingerprint (what its cache files are named after; each transform derives the next from it)
is the private attribute `Dataset._fingerprint`. The public API only sets one (`map(..., new_fingerprint=...)`) or
derives one from a hash of the transform function, which for the tokenisation would hash the tokenizer object with
its padding and truncation state (`data.tokenizer_fingerprint` hashes what encodes instead).

The workaround (`fingerprint_of`, in `data.tokenization_fingerprints`): read the attribute.

It can go when `Dataset` has a public fingerprint: tests/test_workarounds.py's
`test_datasets_still_has_no_public_fingerprint` then fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset


def fingerprint_of(dataset: Dataset) -> str:
    """`dataset`'s fingerprint: the same data (the same files, the same transforms) has the same one."""
    return dataset._fingerprint
