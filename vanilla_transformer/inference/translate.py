"""Translating with a trained model: sentences in length-sorted batches with beam search, or one sentence into its
n-best list with scores (loading it: `inference.loading`). Imports neither datasets nor the training stack."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .loading import load_translator  # noqa: F401  (moved there; imported from here too)


def translate_in_batches(
    encoded: Sequence[Sequence | None],
    run_batch: Callable[[list], list[str] | Callable[[], list[str]]],
    *,
    batch_size: int = 32,
    progress: bool | None = None,
    lookahead: int = 0,
) -> list[str]:
    """The batching of `translate`, whatever the engine: `encoded` holds each sentence's tokens (None for an empty
    line, which translates to an empty line); sentences of similar length go through `run_batch` together (less
    padding), and the translations come back in input order. `progress`: a tqdm bar (default: when there is more than
    one batch).

    An engine that translates several batches at once returns from `run_batch` a function that waits for the
    translations; `lookahead` batches are then submitted ahead of the one being waited for."""
    from tqdm.auto import tqdm

    if batch_size <= 0:
        raise ValueError(f"batch_size={batch_size} must be positive.")
    todo = sorted((i for i, ids in enumerate(encoded) if ids is not None), key=lambda i: len(encoded[i]))
    batches = [todo[start : start + batch_size] for start in range(0, len(todo), batch_size)]
    translations = [""] * len(encoded)
    bar = tqdm(total=len(todo), unit="sent", disable=not (len(batches) > 1 if progress is None else progress))
    submitted = []
    for index, batch in enumerate(batches):
        while len(submitted) <= min(index + lookahead, len(batches) - 1):
            submitted.append(run_batch([encoded[i] for i in batches[len(submitted)]]))
        texts, submitted[index] = submitted[index], None
        for i, text in zip(batch, texts() if callable(texts) else texts):
            translations[i] = text.strip()
        bar.update(len(batch))
    bar.close()
    return translations


def generated_lengths(outputs: torch.Tensor, pad: int | None, eos: int | None, start: int | None) -> torch.Tensor:
    """Tokens in each row of generate()'s `outputs` up to and including its first eos: the decoder start token and
    the padding after a finished beam (pad, or eos again) do not count. Summed over a split and divided by its rows,
    the ``gen_len`` that Seq2SeqTrainer reports with ``predict_with_generate``."""
    is_eos = outputs == eos
    has_eos = is_eos.any(dim=1)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), outputs.shape[1])
    before = torch.arange(outputs.shape[1], device=outputs.device)[None, :] < first_eos[:, None]
    return (before & (outputs != pad) & (outputs != start)).sum(dim=1) + has_eos


# §6.1: "We set the maximum output length during inference to input length + 50"
EXTRA_TOKENS = 50


def output_limit(
    input_length: int,
    generation_config,
    max_new_tokens: int | None = None,
    max_length: int | None = None,
    extra_tokens: int = EXTRA_TOKENS,
) -> dict:
    """generate()'s length arguments for a batch whose longest source has `input_length` tokens: `max_new_tokens`
    when given; else at most the input length + `extra_tokens` new tokens (§6.1), capped by `max_length` when given
    (train.py's --generation_max_length, which counts the decoder start token); with neither, a generation config's
    own max_new_tokens (a checkpoint's) stands. One of the two is set and the other None: generate() prefers a
    max_new_tokens to any max_length, and warns when both are set."""
    if max_new_tokens is not None:
        return {"max_new_tokens": max_new_tokens, "max_length": None}
    if max_length is not None:
        return {"max_length": min(input_length + extra_tokens + 1, max_length), "max_new_tokens": None}
    if generation_config.max_new_tokens is not None:
        return {}
    return {"max_new_tokens": input_length + extra_tokens, "max_length": None}


@torch.inference_mode()
def generate_in_batches(
    model: PreTrainedModel,
    tokenizer,
    encoded: Sequence[Sequence[int] | None],
    *,
    batch_size: int = 32,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_new_tokens: int | None = None,
    max_length: int | None = None,
    extra_tokens: int = EXTRA_TOKENS,
    progress: bool | None = None,
    token_counts: list[int] | None = None,
    **generate_kwargs,
) -> list[str]:
    """`translate` on token ids: `encoded` holds each source's ids (None for an empty line, which translates to an
    empty line). Each length-sorted batch is padded, decoded by `model.generate` within `output_limit` and its output
    decoded to text; the translations come back in input order. A `token_counts` list is extended with the tokens
    generated for each source translated (`generated_lengths`), batch by batch. Further keyword arguments go to
    generate() (e.g. synced_gpus under FSDP)."""
    if num_beams is not None and num_beams < 1:
        raise ValueError(f"num_beams={num_beams} must be at least 1.")
    options = {"num_beams": num_beams, "length_penalty": length_penalty, **generate_kwargs}
    limits = {"max_new_tokens": max_new_tokens, "max_length": max_length, "extra_tokens": extra_tokens}

    def run_batch(batch: list[list[int]]) -> list[str]:
        outputs = generate_batch(model, tokenizer, batch, **limits, **options)
        if token_counts is not None:
            # the decoder starts from the tokenizer's bos (inference.loading.check_tokenizer_matches_config)
            ids = tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id
            token_counts.extend(generated_lengths(outputs, *ids).tolist())
        return tokenizer.batch_decode(outputs, skip_special_tokens=True)

    return translate_in_batches(encoded, run_batch, batch_size=batch_size, progress=progress)


def generate_batch(
    model: PreTrainedModel,
    tokenizer,
    batch: list[list[int]],
    *,
    max_new_tokens: int | None = None,
    max_length: int | None = None,
    extra_tokens: int = EXTRA_TOKENS,
    **generate_kwargs,
):
    """``model.generate`` on one batch of sources' token ids: padded, on the model's device, within `output_limit`;
    keyword arguments that are None are left to the model's generation config."""
    inputs = tokenizer.pad({"input_ids": batch}, return_tensors="pt").to(next(model.parameters()).device)
    limit = output_limit(
        inputs["input_ids"].shape[1], model.generation_config, max_new_tokens, max_length, extra_tokens
    )
    options = {name: value for name, value in generate_kwargs.items() if value is not None}  # None: the model's own
    return model.generate(**inputs, **limit, **options)


def translate(
    model: PreTrainedModel,
    tokenizer,
    sentences: Sequence[str],
    *,
    batch_size: int = 32,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_new_tokens: int | None = None,
    extra_tokens: int = EXTRA_TOKENS,
    progress: bool | None = None,
) -> list[str]:
    """Translate `sentences` with beam search, in batches of similar length (less padding), returning the
    translations in input order. Without `max_new_tokens`, each batch may produce its longest input + `extra_tokens`
    tokens (§6.1: "maximum output length to input length + 50"). `num_beams` and `length_penalty` default to the
    model's generation config. `progress`: a tqdm bar (default: when there is more than one batch). Empty lines
    translate to empty lines."""
    encoded = [tokenizer(s)["input_ids"] if s.strip() else None for s in sentences]
    return generate_in_batches(
        model,
        tokenizer,
        encoded,
        batch_size=batch_size,
        num_beams=num_beams,
        length_penalty=length_penalty,
        max_new_tokens=max_new_tokens,
        extra_tokens=extra_tokens,
        progress=progress,
    )


@dataclass
class Hypothesis:
    """One translation of an n-best list. ``token_ids``: what the decoder produced, from after the decoder start token
    up to and including eos. ``score``: what beam search ranks by, the log-probability divided by
    ``len(token_ids) ** length_penalty`` (transformers' ``sequences_scores``)."""

    text: str
    token_ids: list[int]
    log_probability: float
    score: float


@dataclass
class NBestList:
    """A sentence's translations, best first. ``source_ids``: the tokens the encoder read (eos included);
    ``source_length``: the sentence's length in tokens before truncation (more than ``len(source_ids)`` when it was
    cut to ``max_source_tokens``)."""

    source_ids: list[int]
    source_length: int
    hypotheses: list[Hypothesis]

    @property
    def truncated(self) -> bool:
        return self.source_length > len(self.source_ids)


@torch.inference_mode()
def translate_n_best(
    model: PreTrainedModel,
    tokenizer,
    text: str,
    *,
    num_beams: int | None = None,
    num_return_sequences: int | None = None,
    length_penalty: float | None = None,
    max_new_tokens: int | None = None,
    extra_tokens: int = EXTRA_TOKENS,
    max_source_tokens: int | None = None,
) -> NBestList:
    """`translate` for one sentence, returning its ``num_return_sequences`` best translations (default: one per beam)
    with their scores; the same generate() call (`generate_batch`: the output limit of §6.1, the model's generation
    config for what is not given). A sentence longer than ``max_source_tokens`` is cut to that many tokens (its eos
    kept)."""
    if not text.strip():
        raise ValueError("text is empty; give a sentence to translate.")
    config = model.generation_config
    num_beams = num_beams if num_beams is not None else config.num_beams or 1
    if length_penalty is None:
        length_penalty = config.length_penalty if config.length_penalty is not None else 1.0  # generate()'s default
    num_return_sequences = num_return_sequences if num_return_sequences is not None else num_beams
    if not 1 <= num_return_sequences <= num_beams:
        raise ValueError(f"num_return_sequences={num_return_sequences} must be between 1 and num_beams={num_beams}.")
    source_ids = tokenizer(text)["input_ids"]
    source_length = len(source_ids)
    if max_source_tokens is not None and source_length > max_source_tokens:
        source_ids = tokenizer(text, truncation=True, max_length=max_source_tokens)["input_ids"]
    outputs = generate_batch(
        model,
        tokenizer,
        [source_ids],
        max_new_tokens=max_new_tokens,
        extra_tokens=extra_tokens,
        num_beams=num_beams,
        num_return_sequences=num_return_sequences,
        length_penalty=length_penalty,
        output_scores=True,
        return_dict_in_generate=True,
    )
    # the log-probability of each chosen token: beam search's scores are already log-softmaxed, greedy's are logits
    beam_indices = outputs.beam_indices if num_beams > 1 else None
    steps = model.compute_transition_scores(
        outputs.sequences, outputs.scores, beam_indices, normalize_logits=beam_indices is None
    )
    eos = config.eos_token_id
    eos_ids = set(eos) if isinstance(eos, list) else {eos}
    hypotheses = []
    for row, sequence in enumerate(outputs.sequences.tolist()):
        produced = sequence[1:]  # after the decoder start token; shorter beams are padded after their eos
        ends = [i for i, token in enumerate(produced) if token in eos_ids]
        produced = produced[: ends[0] + 1] if ends else produced
        log_probability = float(steps[row, : len(produced)].sum())
        score = float(outputs.sequences_scores[row]) if beam_indices is not None else None
        hypotheses.append(
            Hypothesis(
                text=tokenizer.decode(produced, skip_special_tokens=True).strip(),
                token_ids=produced,
                log_probability=log_probability,
                score=score if score is not None else log_probability / len(produced) ** length_penalty,
            )
        )
    return NBestList(source_ids, source_length, hypotheses)
