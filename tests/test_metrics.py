"""The scorer of evaluation, translate.py and the benchmarks (inference.score): sacreBLEU and chrF as the sacrebleu
package computes them, and exact match; and the output limit and generated length of every translation
(inference.translate)."""

import numpy as np
import pytest
import sacrebleu
import torch
from transformers import EvalPrediction, GenerationConfig

from vanilla_transformer.inference.score import make_compute_metrics, score, signatures
from vanilla_transformer.inference.translate import generated_lengths, output_limit
from vanilla_transformer.training.tokenizer import train_tokenizer

HYPOTHESES = ["three hundred forty-two", "the cat sat on a mat", "one thousand one hundred", "seven"]
REFERENCES = ["three hundred forty-two", "the cat sat on the mat", "one thousand one", "seventeen"]


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


def test_the_generated_length_counts_up_to_the_first_eos():
    """inference.translate.generated_lengths (evaluation's ``gen_len``): a finished beam is padded with pad (or eos)
    up to the longest one; the padding is not generated text, and neither is the decoder start token."""
    pad, bos, eos = 0, 1, 2
    outputs = torch.tensor([[bos, 7, 8, eos, pad, pad], [bos, 7, eos, eos, eos, eos], [bos, eos, pad, pad, pad, pad]])
    assert generated_lengths(outputs, pad, eos, bos).tolist() == [3, 2, 1]
    # no eos (generation stopped at its length limit): every token after the start counts
    assert generated_lengths(torch.tensor([[bos, 7, 8, 9]]), pad, eos, bos).tolist() == [3]


def test_the_output_limit_is_the_input_length_plus_50_unless_given():
    """inference.translate.output_limit: §6.1's limit, a given max_new_tokens, a cap (train.py's
    --generation_max_length, counting the decoder start token), or a checkpoint's own max_new_tokens."""
    config = GenerationConfig(max_length=20)
    assert output_limit(7, config) == {"max_new_tokens": 57, "max_length": None}  # the config's max_length yields
    assert output_limit(7, config, max_new_tokens=3) == {"max_new_tokens": 3, "max_length": None}
    assert output_limit(7, config, max_length=30) == {"max_length": 30, "max_new_tokens": None}
    assert output_limit(7, config, max_length=300) == {"max_length": 58, "max_new_tokens": None}
    assert output_limit(7, GenerationConfig(max_new_tokens=5)) == {}  # the checkpoint's stands


def test_compute_metrics_for_a_stock_trainer_decodes_and_scores():
    """make_compute_metrics (for a plain Seq2SeqTrainer): generated ids and labels padded with -100 between batches,
    decoded, then scored as `score` scores."""
    tokenizer = train_tokenizer(REFERENCES * 5 + HYPOTHESES * 5, vocab_size=300)

    def padded(sentences: list[str]) -> np.ndarray:
        rows = [[tokenizer.bos_token_id] + tokenizer(s)["input_ids"] for s in sentences]
        return np.array([row + [-100] * (16 - len(row)) for row in rows])

    metrics = make_compute_metrics(tokenizer)(EvalPrediction(padded(HYPOTHESES), padded(REFERENCES)))
    assert metrics == score(HYPOTHESES, REFERENCES)
