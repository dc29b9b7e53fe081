"""The project's own sacreBLEU and chrF `evaluate` modules: loaded by path, offline, equal to sacrebleu."""

import os

import evaluate
import numpy as np
import pytest
import sacrebleu
from transformers import EvalPrediction

from vanilla_transformer.training.metrics import METRICS_DIR, load_metric, metric_path
from vanilla_transformer.training.tokenizer import train_tokenizer
from vanilla_transformer.training.trainer import make_compute_metrics

HYPOTHESES = ["three hundred forty-two", "the cat sat on a mat", "one thousand one hundred", "seven"]
REFERENCES = ["three hundred forty-two", "the cat sat on the mat", "one thousand one", "seventeen"]


def test_modules_load_by_path_offline():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # set by conftest: nothing may come from the Hub
    for name in ("sacrebleu", "chrf"):
        assert os.path.isfile(os.path.join(METRICS_DIR, name, f"{name}.py"))
        module = evaluate.load(metric_path(name))
        assert module.compute(predictions=["a b c d e"], references=[["a b c d e"]])["score"] == pytest.approx(100)
    with pytest.raises(ValueError, match="unknown metric 'rouge'"):
        metric_path("rouge")


def test_scores_equal_the_sacrebleu_package():
    bleu = load_metric("sacrebleu").compute(predictions=HYPOTHESES, references=REFERENCES)
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    assert bleu["score"] == pytest.approx(expected.score) and 0 < bleu["score"] < 100
    assert bleu["counts"] == expected.counts and bleu["sys_len"] == expected.sys_len

    chrf = load_metric("chrf").compute(predictions=HYPOTHESES, references=REFERENCES)
    assert chrf["score"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score)
    chrf_pp = load_metric("chrf").compute(predictions=HYPOTHESES, references=REFERENCES, word_order=2)
    assert chrf_pp["score"] == pytest.approx(sacrebleu.CHRF(word_order=2).corpus_score(HYPOTHESES, [REFERENCES]).score)


def test_several_references_per_prediction():
    others = ["three hundred and forty-two", "a cat sat on a mat", "one thousand one hundred", "seventeen"]
    references = [[a, b] for a, b in zip(REFERENCES, others)]
    bleu = load_metric("sacrebleu").compute(predictions=HYPOTHESES, references=references)
    assert bleu["score"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES, others]).score)
    assert bleu["score"] > load_metric("sacrebleu").compute(predictions=HYPOTHESES, references=REFERENCES)["score"]
    with pytest.raises(ValueError, match="same number of references"):
        load_metric("sacrebleu").compute(predictions=HYPOTHESES[:2], references=[["a"], ["b", "c"]])


def test_compute_metrics_decodes_generated_ids():
    tokenizer = train_tokenizer(REFERENCES * 5 + HYPOTHESES * 5, vocab_size=300)
    width = 16

    def ids(sentences, fill):
        rows = [[tokenizer.bos_token_id] + tokenizer(s)["input_ids"] for s in sentences]
        return np.array([row + [fill] * (width - len(row)) for row in rows])

    compute_metrics = make_compute_metrics(tokenizer)
    # predictions padded with pad (within a batch) and -100 (between batches), labels with -100
    perfect = compute_metrics(EvalPrediction(predictions=ids(REFERENCES, -100), label_ids=ids(REFERENCES, -100)))
    assert perfect["bleu"] == pytest.approx(100) and perfect["chrf"] == pytest.approx(100)
    assert perfect["exact_match"] == 100
    metrics = compute_metrics(EvalPrediction(predictions=ids(HYPOTHESES, 0), label_ids=ids(REFERENCES, -100)))
    assert metrics["exact_match"] == 25.0
    assert metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, abs=1e-3)
    assert metrics["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score, abs=1e-3)
