#!/usr/bin/env python
"""Mean ± standard deviation over seeds of the result.json files that anchor.py and recipe.py write, one row per
recipe, best validation BLEU first:

    python benchmarks/run.py summarize outputs/anchor-* outputs/recipe-*

Choose on validation: the test column is there to be read once, for the recipe chosen. Prints a Markdown table with
each seed's numbers beside the means.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics


def load_results(folders: list[str]) -> list[dict]:
    """The result.json of each folder (folders without one are skipped, with a note)."""
    results = []
    for folder in folders:
        path = os.path.join(folder, "result.json")
        if not os.path.isfile(path):
            print(f"note: {folder} holds no result.json (a run not finished?)")
            continue
        with open(path) as f:
            results.append(json.load(f))
    return results


def mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def summarize(results: list[dict]) -> list[dict]:
    """One row per recipe: the seeds, mean ± sd of validation and test BLEU, and the mean training minutes."""
    recipes: dict[str, list[dict]] = {}
    for result in results:
        recipes.setdefault(result["recipe"], []).append(result)
    rows = []
    for recipe, runs in recipes.items():
        runs = sorted(runs, key=lambda run: run.get("seed", 0))
        validation = [run["validation_bleu"] for run in runs if run.get("validation_bleu") is not None]
        test = [run["test_bleu"] for run in runs if run.get("test_bleu") is not None]
        rows.append(
            {
                "recipe": recipe,
                "seeds": [run.get("seed") for run in runs],
                "validation_bleu": validation,
                "test_bleu": test,
                "validation": mean_sd(validation),
                "test": mean_sd(test),
                "train_minutes": round(statistics.mean(run.get("train_minutes", 0.0) for run in runs), 1),
            }
        )
    rows.sort(key=lambda row: -statistics.mean(row["validation_bleu"]) if row["validation_bleu"] else 0.0)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [
        "| recipe | seeds | validation BLEU | test BLEU | per seed (validation / test) | train min |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        per_seed = ", ".join(f"{v:.2f} / {t:.2f}" for v, t in zip(row["validation_bleu"], row["test_bleu"]))
        seeds = ", ".join(str(seed) for seed in row["seeds"])
        lines.append(
            f"| {row['recipe']} | {seeds} | {row['validation']} | {row['test']} | {per_seed} | {row['train_minutes']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="Output folders of anchor.py / recipe.py runs.")
    args = parser.parse_args(argv)
    rows = summarize(load_results(args.folders))
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
