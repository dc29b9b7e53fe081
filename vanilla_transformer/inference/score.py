"""Scoring translations against their references: corpus sacreBLEU and chrF with the sacrebleu package's defaults
(Post, 2018), and exact match. The one scorer of the toolkit: evaluation during and after training,
`scripts/translate.py --references` and the benchmarks all report these figures."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """``{"bleu", "chrf", "exact_match"}`` of `hypotheses` against one reference each: `sacrebleu.corpus_bleu` and
    `sacrebleu.corpus_chrf` (0-100), and the percentage of hypotheses equal to their reference; both sides stripped of
    surrounding spaces, each figure rounded to 4 decimals."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} translations for {len(references)} references; they must pair up.")
    hypotheses = [h.strip() for h in hypotheses]
    references = [r.strip() for r in references]
    exact = sum(h == r for h, r in zip(hypotheses, references))
    return {
        "bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 4),
        "chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 4),
        "exact_match": round(100.0 * exact / max(len(references), 1), 4),
    }


def make_compute_metrics(tokenizer) -> Callable:
    """`compute_metrics` for a stock `Seq2SeqTrainer` with ``predict_with_generate``: the generated ids and the labels
    decoded, then `score`. (train.py's trainer does not need it: it translates and scores the sentences themselves.)"""

    def compute_metrics(eval_prediction) -> dict[str, float]:
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        predictions = predictions[0] if isinstance(predictions, tuple) else predictions
        # -100 marks padding that the Trainer added between batches and the labels' padding; it is not a token
        pad = tokenizer.pad_token_id
        hypotheses = tokenizer.batch_decode(np.where(predictions != -100, predictions, pad), skip_special_tokens=True)
        references = tokenizer.batch_decode(np.where(labels != -100, labels, pad), skip_special_tokens=True)
        return score(hypotheses, references)

    return compute_metrics


def signatures() -> dict[str, str]:
    """sacreBLEU's signatures of `score`'s BLEU and chrF (one reference each: its settings and version), to print
    beside the figures."""
    import sacrebleu

    metrics = {"bleu": sacrebleu.BLEU(), "chrf": sacrebleu.CHRF()}
    for metric in metrics.values():
        metric.corpus_score(["a"], [["a"]])  # a signature names the number of references, known once scored
    return {name: str(metric.get_signature()) for name, metric in metrics.items()}
