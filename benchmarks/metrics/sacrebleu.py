"""sacreBLEU (Post, 2018) as an `evaluate` metric module, for transformers' run_translation.py in
benchmarks/end_to_end.py: copied there as `sacrebleu/sacrebleu.py` into the script's working directory, so that its
`evaluate.load("sacrebleu")` loads it offline. Backed by the `sacrebleu` package; scores are on a 0-100 scale."""

import datasets
import evaluate
import sacrebleu

_DESCRIPTION = """Corpus-level BLEU as computed by sacreBLEU: detokenized hypotheses and references, sacreBLEU's own
tokenisation (13a by default), so that scores are comparable across papers."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of hypothesis strings.
    references: list of reference strings (one reference each), or list of lists of strings (the same number of
        references for every prediction).
    tokenize: sacreBLEU tokenizer: "13a" (default), "intl", "zh", "ja-mecab", "char", "none", ...
    lowercase: compare case-insensitively.
    smooth_method: "exp" (default), "floor", "add-k" or "none".
    smooth_value: the value for "floor" and "add-k".
    force: allow tokenized input without a warning.
    use_effective_order: use the orders that have matches only (for sentence-level scores).
Returns:
    score: BLEU, 0-100. counts, totals, precisions: n-gram statistics for n = 1..4. bp: the brevity penalty.
    sys_len, ref_len: hypothesis and reference lengths in tokens. signature: sacreBLEU's reproducibility signature.
"""

_CITATION = """@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Sacrebleu(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            homepage="https://github.com/mjpost/sacrebleu",
            features=[
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
                ),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
            codebase_urls=["https://github.com/mjpost/sacrebleu"],
            reference_urls=["https://github.com/mjpost/sacrebleu"],
        )

    def _compute(
        self,
        predictions,
        references,
        tokenize="13a",
        lowercase=False,
        smooth_method="exp",
        smooth_value=None,
        force=False,
        use_effective_order=False,
    ):
        references = [[r] if isinstance(r, str) else list(r) for r in references]
        counts = {len(r) for r in references}
        if len(counts) > 1:
            raise ValueError(f"sacrebleu: every prediction needs the same number of references, got {sorted(counts)}.")
        # sacreBLEU wants one stream per reference position: (prediction, reference) -> (reference, prediction)
        streams = [[refs[i] for refs in references] for i in range(counts.pop() if counts else 0)]
        bleu = sacrebleu.BLEU(
            lowercase=lowercase,
            tokenize=tokenize,
            smooth_method=smooth_method,
            smooth_value=smooth_value,
            force=force,
            effective_order=use_effective_order,
        )
        result = bleu.corpus_score(predictions, streams)
        return {
            "score": result.score,
            "counts": result.counts,
            "totals": result.totals,
            "precisions": result.precisions,
            "bp": result.bp,
            "sys_len": result.sys_len,
            "ref_len": result.ref_len,
            "signature": str(bleu.get_signature()),
        }
