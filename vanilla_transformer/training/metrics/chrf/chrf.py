"""chrF and chrF++ (Popović, 2015; 2017) as an `evaluate` metric module, shipped with vanilla-transformer so that it
loads offline: `evaluate.load("<package>/metrics/chrf")`. Backed by the `sacrebleu` package; scores are 0-100."""

import datasets
import evaluate
import sacrebleu

_DESCRIPTION = """Character n-gram F-score: the F_beta of character n-gram precision and recall, averaged over n-gram
orders; with word_order=2 it is chrF++ (word unigrams and bigrams too). Computed by sacreBLEU."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of hypothesis strings.
    references: list of reference strings (one reference each), or list of lists of strings (the same number of
        references for every prediction).
    char_order: the largest character n-gram order (6).
    word_order: the largest word n-gram order: 0 for chrF (default), 2 for chrF++.
    beta: recall is beta times as important as precision (2).
    lowercase: compare case-insensitively.
    whitespace: count whitespace in character n-grams.
    eps_smoothing: smoothing of the chrF++ reference implementation instead of sacreBLEU's.
Returns:
    score: chrF, 0-100. char_order, word_order, beta: the parameters. signature: sacreBLEU's signature.
"""

_CITATION = """@inproceedings{popovic-2015-chrf,
    title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\\'c}, Maja",
    booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
    year = "2015",
    pages = "392--395",
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Chrf(evaluate.Metric):
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
            reference_urls=["https://www.statmt.org/wmt15/pdf/WMT49.pdf"],
        )

    def _compute(
        self,
        predictions,
        references,
        char_order=6,
        word_order=0,
        beta=2,
        lowercase=False,
        whitespace=False,
        eps_smoothing=False,
    ):
        references = [[r] if isinstance(r, str) else list(r) for r in references]
        counts = {len(r) for r in references}
        if len(counts) > 1:
            raise ValueError(f"chrf: every prediction needs the same number of references, got {sorted(counts)}.")
        streams = [[refs[i] for refs in references] for i in range(counts.pop() if counts else 0)]
        chrf = sacrebleu.CHRF(
            char_order=char_order,
            word_order=word_order,
            beta=beta,
            lowercase=lowercase,
            whitespace=whitespace,
            eps_smoothing=eps_smoothing,
        )
        result = chrf.corpus_score(predictions, streams)
        return {
            "score": result.score,
            "char_order": char_order,
            "word_order": word_order,
            "beta": beta,
            "signature": str(chrf.get_signature()),
        }
