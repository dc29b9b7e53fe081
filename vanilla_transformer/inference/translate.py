"""Translating with a trained model: sentences in length-sorted batches with beam search (loading it:
`inference.loading`). Imports neither datasets nor the training stack."""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


@torch.inference_mode()
def translate(
    model: PreTrainedModel,
    tokenizer,
    sentences: Sequence[str],
    *,
    batch_size: int = 32,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_new_tokens: int | None = None,
    extra_tokens: int = 50,
    progress: bool | None = None,
) -> list[str]:
    """Translate `sentences` with beam search, in batches of similar length (less padding), returning the
    translations in input order. Without `max_new_tokens`, each batch may produce its longest input + `extra_tokens`
    tokens (§6.1: "maximum output length to input length + 50"). `num_beams` and `length_penalty` default to the
    model's generation config. `progress`: a tqdm bar (default: when there is more than one batch). Empty lines
    translate to empty lines."""
    encoded = [tokenizer(s)["input_ids"] if s.strip() else None for s in sentences]
    device = next(model.parameters()).device

    def run_batch(batch: list[list[int]]) -> list[str]:
        inputs = tokenizer.pad({"input_ids": batch}, return_tensors="pt").to(device)
        limit = max_new_tokens if max_new_tokens is not None else inputs["input_ids"].shape[1] + extra_tokens
        kwargs = {"max_new_tokens": limit, "max_length": None}  # the generation config's max_length yields to it
        if num_beams is not None:
            kwargs["num_beams"] = num_beams
        if length_penalty is not None:
            kwargs["length_penalty"] = length_penalty
        outputs = model.generate(**inputs, **kwargs)
        return tokenizer.batch_decode(outputs, skip_special_tokens=True)

    return translate_in_batches(encoded, run_batch, batch_size=batch_size, progress=progress)
