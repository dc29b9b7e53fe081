"""Loading a trained model for translating: the model (refused when its encoder or decoder weights are missing), its
tokenizer, the check that the two agree, and either engine as one translate function (`load_engine`). Imports neither
datasets nor the training stack."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from transformers import AutoTokenizer


def load_translator(model_dir: str, device: str | None = None, dtype: torch.dtype | None = None):
    """(model, tokenizer) from a saved model folder, in eval mode, on `device` (default: GPU if there is one), in
    `dtype` (default: as saved; translate.py decides it for the device: `training.device.decide`)."""
    if not os.path.isdir(model_dir):
        raise ValueError(f"--model_dir {model_dir!r} is not a folder.")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"--model_dir {model_dir!r} holds no config.json; is it a saved model?")
    if not any(os.path.isfile(os.path.join(model_dir, name)) for name in ("tokenizer.json", "tokenizer_config.json")):
        raise ValueError(f"--model_dir {model_dir!r} holds no tokenizer (tokenizer.json); save it beside the model.")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_trained_model(model_dir)
    if device is None:
        device = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def load_trained_model(model_dir: str, model_class=None, **kwargs):
    """``model_class.from_pretrained(model_dir, **kwargs)`` (default ``AutoModelForSeq2SeqLM``) for a *trained* model:
    a checkpoint that lacks encoder or decoder weights is refused. ``from_pretrained`` itself, as everywhere in
    transformers, starts missing weights from ``_init_weights`` and only reports them, which is right for a new task
    head but leaves a silently untrained model where translations were asked for. A missing task head (e.g. a
    classification head on a translation checkpoint) is allowed."""
    if model_class is None:
        from transformers import AutoModelForSeq2SeqLM as model_class
    model, info = model_class.from_pretrained(model_dir, output_loading_info=True, **kwargs)
    prefix = f"{model.base_model_prefix}."
    missing = sorted(k for k in info["missing_keys"] if k.removeprefix(prefix).split(".")[0] in _MODEL_BODY)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise OSError(
            f"The checkpoint {model_dir!r} lacks {len(missing)} encoder/decoder weight(s) ({shown}): the weights file "
            "is incomplete or belongs to another model. Re-save or re-download it; to start from random weights on "
            "purpose, build the model from its config instead."
        )
    return model


_MODEL_BODY = ("shared", "encoder", "decoder")


def check_tokenizer_matches_config(tokenizer, config, tokenizer_name: str = "the tokenizer") -> None:
    """The model reads the tokenizer's ids: pad, bos (= decoder start) and eos must agree, and every id must fit the
    embedding matrix. Raises a one-line ValueError naming the mismatch."""
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        have, want = getattr(tokenizer, name), getattr(config, name)
        # the config may list several eos ids (generation stops at any of them); the tokenizer's must be one of them
        if have != want and not (isinstance(want, (list, tuple)) and have in want):
            raise ValueError(
                f"{tokenizer_name} has {name}={have} but the model config has {name}={want}; use a tokenizer from "
                f"scripts/train_tokenizer.py or set {name.removesuffix('_id')} in the config (--config_overrides)."
            )
    if config.decoder_start_token_id != tokenizer.bos_token_id:
        raise ValueError(
            f"the model config has decoder_start_token_id={config.decoder_start_token_id} but {tokenizer_name} has "
            f"bos_token_id={tokenizer.bos_token_id}; the decoder must start from the bos token."
        )
    if len(tokenizer) > min(config.vocab_size, config.decoder_vocab_size):
        raise ValueError(
            f"{tokenizer_name} has {len(tokenizer)} tokens but the model's vocabulary holds only "
            f"{min(config.vocab_size, config.decoder_vocab_size)}."
        )


ENGINES = ("transformers", "ctranslate2")


def load_engine(
    model_dir: str,
    engine: str = "transformers",
    *,
    device: str | None = None,
    threads: int | None = None,
    compute_type: str = "default",
    inter_threads: int = 1,
    dtype: torch.dtype | None = None,
) -> Callable[..., list[str]]:
    """A function that translates a list of sentences (keywords: `batch_size`, `num_beams`, `length_penalty`,
    `max_new_tokens`, `progress`) with the model in `model_dir`: transformers' generate() (`inference.translate
    .translate`; `dtype` applies to it alone) or CTranslate2 (an export, or a saved model exported in memory first;
    `compute_type` and `inter_threads` apply to it alone). Both batch by length, as `translate_in_batches` does."""
    if engine not in ENGINES:
        raise ValueError(f"--engine {engine!r} is not supported; allowed: {', '.join(ENGINES)}.")
    if engine != "ctranslate2" and (compute_type != "default" or inter_threads != 1):
        raise ValueError("--compute_type and --inter_threads apply to --engine ctranslate2 only.")
    if engine == "ctranslate2" and dtype is not None:
        raise ValueError("--dtype applies to --engine transformers only; CTranslate2 computes in --compute_type.")
    if engine == "ctranslate2":
        from .ctranslate2 import load_ctranslate2_translator

        # "auto": a GPU where CTranslate2 sees one and its CUDA libraries load, else the CPU (saying why)
        translator = load_ctranslate2_translator(
            model_dir, device=device or "auto", compute_type=compute_type, threads=threads, inter_threads=inter_threads
        )
        return translator.translate
    from .translate import translate

    model, tokenizer = load_translator(model_dir, device=device, dtype=dtype)
    return lambda sentences, **options: translate(model, tokenizer, sentences, **options)


def split_lines(text: str) -> list[str]:
    """One sentence per line: `text` split at its line ends only. (`str.splitlines` also splits at a form feed,
    U+2028 and the like, which a sentence may hold: its translations would no longer line up with the references.)"""
    lines = text.replace("\r\n", "\n").split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def read_lines(flag: str, path: str) -> list[str]:
    """The lines of a text file given as `flag`, without their line ends; a one-line error when it is missing."""
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path!r} does not exist.")
    with open(path, encoding="utf-8") as f:
        return split_lines(f.read())
