#!/usr/bin/env python
"""Is one system's BLEU really higher than another's? A paired bootstrap (sacreBLEU's `--paired-bs`) on a test set:

    python benchmarks/compare.py --references test.fr --baseline anchor.txt --system ours.txt

Prints both BLEU scores with their 95% bootstrap intervals, the difference and its p-value.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest


def paired_bootstrap(
    references: Sequence[str], baseline: Sequence[str], system: Sequence[str], n_samples: int = 1000
) -> dict[str, float]:
    """BLEU of `baseline` and `system` on `references` with 95% bootstrap half-intervals, and the p-value of the
    paired bootstrap test that `system`'s gain over `baseline` is chance (sacreBLEU's implementation, with its fixed
    seed, so the same inputs give the same figures)."""
    if not len(references) == len(baseline) == len(system):
        raise ValueError(
            f"references, baseline and system must have the same number of lines: "
            f"{len(references)}, {len(baseline)}, {len(system)}"
        )
    test = PairedTest(
        [("baseline", list(baseline)), ("system", list(system))],
        {"BLEU": BLEU(references=None)},
        [list(references)],
        test_type="bs",
        n_samples=n_samples,
    )
    _, scores = test()
    base, ours = scores["BLEU"]
    return {
        "baseline_bleu": base.score,
        "baseline_ci": float(base.ci),
        "system_bleu": ours.score,
        "system_ci": float(ours.ci),
        "delta": ours.score - base.score,
        "p_value": float(ours.p_value),
    }


def format_comparison(result: dict[str, float]) -> str:
    return (
        f"baseline BLEU {result['baseline_bleu']:.2f} ± {result['baseline_ci']:.2f}, "
        f"system BLEU {result['system_bleu']:.2f} ± {result['system_ci']:.2f}, "
        f"delta {result['delta']:+.2f} (paired bootstrap p = {result['p_value']:.4f})"
    )


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().rstrip("\n").split("\n")


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--references", required=True, help="One reference per line.")
    parser.add_argument("--baseline", required=True, help="The baseline's translations, one per line.")
    parser.add_argument("--system", required=True, help="The system's translations, one per line.")
    parser.add_argument("--n_samples", type=int, default=1000)
    args = parser.parse_args(argv)
    result = paired_bootstrap(
        read_lines(args.references), read_lines(args.baseline), read_lines(args.system), args.n_samples
    )
    print(format_comparison(result))
    return result


if __name__ == "__main__":
    main()
