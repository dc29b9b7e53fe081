"""sacreBLEU (Post, 2018) as an `evaluate` metric module, for transformers' run_translation.py in
benchmarks/end_to_end.py: copied there as `sacrebleu/sacrebleu.py` into the script's working directory, so that its
`evaluate.load("sacrebleu")` loads it offline. It scores with the toolkit's own scorer (`inference.score.score`), so
that the Marian side's BLEU is computed as ours is; scores are on a 0-100 scale."""

import datasets
import evaluate

from vanilla_transformer.inference.score import score

_DESCRIPTION = """Corpus-level BLEU and chrF as computed by sacreBLEU with its defaults (13a tokenisation): detokenized
hypotheses and references, so that scores are comparable across papers."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of hypothesis strings.
    references: list of reference strings, or list of one-element lists of strings (one reference each).
Returns:
    score: BLEU, 0-100. chrf: chrF, 0-100. exact_match: % of predictions equal to their reference.
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

    def _compute(self, predictions, references):
        references = [[r] if isinstance(r, str) else list(r) for r in references]
        if any(len(r) != 1 for r in references):
            raise ValueError("sacrebleu: one reference per prediction, as run_translation.py gives.")
        scores = score(predictions, [r[0] for r in references])
        return {"score": scores["bleu"], "chrf": scores["chrf"], "exact_match": scores["exact_match"]}
