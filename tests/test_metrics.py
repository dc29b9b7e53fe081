"""train.py's compute_metrics: sacreBLEU and chrF as the sacrebleu package computes them, exact match, and the
generated length up to the first eos."""

import numpy as np
import pytest
import sacrebleu
from transformers import EvalPrediction, GenerationConfig

from vanilla_transformer.inference.score import score, signatures
from vanilla_transformer.inference.translate import output_limit
from vanilla_transformer.training.tokenizer import train_tokenizer
from vanilla_transformer.training.trainer import generated_lengths, make_compute_metrics

HYPOTHESES = ["three hundred forty-two", "the cat sat on a mat", "one thousand one hundred", "seven"]
REFERENCES = ["three hundred forty-two", "the cat sat on the mat", "one thousand one", "seventeen"]
WIDTH = 16


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(REFERENCES * 5 + HYPOTHESES * 5, vocab_size=300)


def generated(tokenizer, sentences: list[str], fill: int) -> np.ndarray:
    """What generate returns: the decoder start token (bos), the tokens, eos, then `fill` to a common width."""
    rows = [[tokenizer.bos_token_id] + tokenizer(s)["input_ids"] for s in sentences]
    return np.array([row + [fill] * (WIDTH - len(row)) for row in rows])


def test_compute_metrics_equals_the_sacrebleu_package(tokenizer):
    compute_metrics = make_compute_metrics(tokenizer)
    # predictions padded with pad (within a batch) and -100 (between batches), labels with -100
    perfect = compute_metrics(
        EvalPrediction(
            predictions=generated(tokenizer, REFERENCES, -100), label_ids=generated(tokenizer, REFERENCES, -100)
        )
    )
    assert perfect["bleu"] == pytest.approx(100) and perfect["chrf"] == pytest.approx(100)
    assert perfect["exact_match"] == 100
    for fill in (tokenizer.pad_token_id, -100):
        predictions = generated(tokenizer, HYPOTHESES, fill)
        metrics = compute_metrics(
            EvalPrediction(predictions=predictions, label_ids=generated(tokenizer, REFERENCES, -100))
        )
        assert metrics["exact_match"] == 25.0
        bleu, chrf = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]), sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES])
        assert 0 < bleu.score < 100 and 0 < chrf.score < 100
        assert metrics["bleu"] == round(bleu.score, 4) and metrics["chrf"] == round(chrf.score, 4)


def test_gen_len_counts_up_to_the_first_eos(tokenizer):
    """A finished beam is padded with eos (or pad) up to the longest one: the padding is not generated text, and
    neither is the decoder start token."""
    eos, pad, bos = tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id
    words = [len(tokenizer(s)["input_ids"]) for s in HYPOTHESES]  # the tokens and eos
    expected = float(np.mean(words))
    compute_metrics = make_compute_metrics(tokenizer)
    labels = generated(tokenizer, REFERENCES, -100)
    for fill in (eos, pad, -100):
        predictions = generated(tokenizer, HYPOTHESES, fill)
        assert compute_metrics(EvalPrediction(predictions=predictions, label_ids=labels))["gen_len"] == expected
    # no eos (generation stopped at max_length): every token after the start counts
    assert generated_lengths(np.array([[bos, 7, 8, 9]]), pad, eos, bos).tolist() == [3]
    assert generated_lengths(
        np.array([[bos, 7, eos, eos, eos], [bos, eos, pad, pad, pad]]), pad, eos, bos
    ).tolist() == [
        2,
        1,
    ]


def test_score_equals_the_sacrebleu_package():
    """inference.score: the one scorer of evaluation, translate.py and the benchmarks."""
    perfect = score(REFERENCES, REFERENCES)
    assert perfect == {"bleu": pytest.approx(100), "chrf": pytest.approx(100), "exact_match": 100.0}
    scores = score([f" {h} " for h in HYPOTHESES], REFERENCES)  # surrounding spaces do not count
    bleu, chrf = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]), sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES])
    assert scores == {"bleu": round(bleu.score, 4), "chrf": round(chrf.score, 4), "exact_match": 25.0}
    with pytest.raises(ValueError, match="3 translations for 4 references"):
        score(HYPOTHESES[:3], REFERENCES)
    signature = signatures()
    assert signature["bleu"].startswith("nrefs:1|") and "tok:13a" in signature["bleu"]
    assert signature["chrf"].startswith("nrefs:1|")


def test_the_output_limit_is_the_input_length_plus_50_unless_given():
    """inference.translate.output_limit: §6.1's limit, a given max_new_tokens, a cap (train.py's
    --generation_max_length, counting the decoder start token), or a checkpoint's own max_new_tokens."""
    config = GenerationConfig(max_length=20)
    assert output_limit(7, config) == {"max_new_tokens": 57, "max_length": None}  # the config's max_length yields
    assert output_limit(7, config, max_new_tokens=3) == {"max_new_tokens": 3, "max_length": None}
    assert output_limit(7, config, max_length=30) == {"max_length": 30, "max_new_tokens": None}
    assert output_limit(7, config, max_length=300) == {"max_length": 58, "max_new_tokens": None}
    assert output_limit(7, GenerationConfig(max_new_tokens=5)) == {}  # the checkpoint's stands
