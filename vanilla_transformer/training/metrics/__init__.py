"""The project's own `evaluate` metric modules (sacreBLEU and chrF), loaded by path so that they work offline."""

from __future__ import annotations

import os

METRICS_DIR = os.path.dirname(os.path.abspath(__file__))
METRIC_NAMES = ("sacrebleu", "chrf")


def metric_path(name: str) -> str:
    """The directory `evaluate.load` takes for metric `name`."""
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r}; this package ships {', '.join(METRIC_NAMES)}.")
    return os.path.join(METRICS_DIR, name)


def load_metric(name: str, **kwargs):
    """`evaluate.load` of one of the package's metric modules, kept in memory: no cache files, so that several
    processes of a distributed run can compute it at once without sharing a lock."""
    import evaluate

    kwargs.setdefault("keep_in_memory", True)
    return evaluate.load(metric_path(name), **kwargs)
