"""Checkpoint folders: resume training only from ones that were completely written, average several checkpoints into
one model. (Loading a trained model: `inference.loading.load_trained_model`, also importable from here.)

Resume training only from checkpoints that were completely written.

transformers' Trainer writes ``checkpoint-<step>/`` in place, one file after another: the model (and tokenizer), then
``optimizer.pt`` and ``scheduler.pt``, the RNG states, and ``trainer_state.json`` last. A run killed during that
write leaves a folder that looks like a checkpoint, and that ``transformers.trainer_utils.get_last_checkpoint``
returns, but resuming from it fails with a traceback about a cut-off or missing file, and the run cannot go on until
someone deletes the folder by hand. ``last_complete_checkpoint`` skips such folders; ``check_checkpoint`` refuses one
named explicitly with a one-line reason.

Complete means: ``trainer_state.json`` parses and names the folder's step (being written last, it vouches for the
files before it), and every weights file and ``torch.save`` archive is whole (a safetensors header that covers the
file; a zip archive with its central directory, which is written last).
"""

from __future__ import annotations

import json
import logging
import os
import re
import zipfile
from collections.abc import Sequence

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from transformers import AutoTokenizer, PreTrainedModel
from transformers.trainer_utils import sort_checkpoints
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME
from transformers.utils.hub import get_checkpoint_shard_files

from ..inference.loading import load_trained_model  # moved there; imported from here too
from .sharding import tied_names

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"


def checkpoint_problem(folder: str) -> str | None:
    """Why ``folder`` is not a complete Trainer checkpoint, in a few words; None when it is complete."""
    if not os.path.isdir(folder):
        return "it is not a folder"
    state_path = os.path.join(folder, TRAINER_STATE)
    if not os.path.isfile(state_path):
        return f"{TRAINER_STATE} is missing (the Trainer writes it last: the save was interrupted)"
    try:
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
    except (ValueError, UnicodeDecodeError):
        return f"{TRAINER_STATE} is cut off or corrupt"
    match = _CHECKPOINT.match(os.path.basename(os.path.normpath(folder)))
    if match and state.get("global_step") != int(match.group(1)):
        return f"{TRAINER_STATE} has global_step={state.get('global_step')}, not {match.group(1)}"

    names = sorted(os.listdir(folder))
    weights = [n for n in names if n.endswith(".safetensors")]
    if not weights and not any(n in ("pytorch_model.bin", "model.safetensors.index.json") for n in names):
        return "it holds no model weights (model.safetensors)"
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                shards = set(json.load(f)["weight_map"].values())
        except (ValueError, KeyError):
            return "model.safetensors.index.json is cut off or corrupt"
        if missing := sorted(shards - set(names)):
            return f"the weights shard {missing[0]} is missing"
    for name in weights:
        try:
            with safe_open(os.path.join(folder, name), framework="pt") as f:
                f.keys()
        except (SafetensorError, OSError):
            return f"{name} is cut off or corrupt"
    for name in names:
        if name.endswith((".pt", ".pth", ".bin")):
            try:
                zipfile.ZipFile(os.path.join(folder, name)).close()  # torch.save writes a zip; its directory is last
            except (zipfile.BadZipFile, OSError):
                return f"{name} is cut off or corrupt"
    return None


def check_checkpoint(folder: str) -> None:
    """Raise ValueError naming the problem unless ``folder`` is a complete checkpoint to resume from."""
    problem = checkpoint_problem(folder)
    if problem is not None:
        raise ValueError(
            f"--resume_from_checkpoint {folder!r} is not a complete checkpoint: {problem}. Resume from an earlier "
            "checkpoint-* folder (or pass 'last' to pick the newest complete one)."
        )


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest completely written ``checkpoint-<step>`` in ``output_dir`` (None if there is none); a drop-in
    replacement for ``transformers.trainer_utils.get_last_checkpoint`` that skips, with a warning, the folders an
    interrupted save left behind."""
    for folder in reversed(sort_checkpoints(output_dir)):  # the Trainer's checkpoint-<step> folders, newest first
        problem = checkpoint_problem(folder)
        if problem is None:
            return folder
        logger.warning("Not resuming from %s: %s.", folder, problem)
    return None


def load_weights(checkpoint: str) -> dict[str, torch.Tensor]:
    """The tensors of a saved model (one safetensors file or a sharded set, whose shards transformers'
    ``get_checkpoint_shard_files`` reads from the index as ``from_pretrained`` does), as stored: tied copies appear
    once."""
    single, index = os.path.join(checkpoint, SAFE_WEIGHTS_NAME), os.path.join(checkpoint, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(single):
        return load_file(single)
    if os.path.isfile(index):
        shards, _ = get_checkpoint_shard_files(checkpoint, index)
        return {name: tensor for shard in shards for name, tensor in load_file(shard).items()}
    raise ValueError(f"{checkpoint!r} holds no model.safetensors (or sharded index); is it a saved model?")


def average_weights(checkpoints: Sequence[str]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the checkpoints' floating-point tensors, summed in float64 and rounded once to each
    tensor's dtype; other tensors (integer buffers) must be equal in all checkpoints and are kept."""
    if not checkpoints:
        raise ValueError("no checkpoints to average.")
    total: dict[str, torch.Tensor] = {}
    for i, checkpoint in enumerate(checkpoints):
        weights = load_weights(checkpoint)
        if i == 0:
            dtypes = {name: tensor.dtype for name, tensor in weights.items()}
            total = {
                name: tensor.to(torch.float64) if tensor.is_floating_point() else tensor
                for name, tensor in weights.items()
            }
            continue
        if weights.keys() != total.keys():
            raise ValueError(f"{checkpoint!r} has different tensors from {checkpoints[0]!r}; is it the same model?")
        for name, tensor in weights.items():
            if tensor.shape != total[name].shape:
                raise ValueError(
                    f"{checkpoint!r}: {name} has shape {tuple(tensor.shape)}, expected {tuple(total[name].shape)}."
                )
            if tensor.is_floating_point():
                total[name] += tensor.to(torch.float64)
            elif not torch.equal(tensor, total[name]):
                raise ValueError(f"{checkpoint!r}: the non-float tensor {name} differs between checkpoints.")
    return {
        name: (tensor / len(checkpoints)).to(dtypes[name]) if dtypes[name].is_floating_point else tensor
        for name, tensor in total.items()
    }


def save_averaged_model(checkpoints: Sequence[str], output_dir: str) -> PreTrainedModel:
    """Average `checkpoints` into a model saved in `output_dir` with the last checkpoint's config, generation config
    and tokenizer, loadable with `AutoModelForSeq2SeqLM.from_pretrained(output_dir)`."""
    averaged = average_weights(checkpoints)
    model = load_trained_model(checkpoints[-1])
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    if unexpected:
        raise ValueError(f"the checkpoints hold tensors the model does not have: {unexpected[:5]}")
    # tied weights (lm_head = the shared embedding) are stored once, so their other names are the only ones missing
    untied = set(missing) - tied_names(model).keys()
    if untied:
        raise ValueError(f"the checkpoints lack tensors of the model: {sorted(untied)[:5]}")
    os.makedirs(output_dir, exist_ok=True)
    model.save_pretrained(output_dir)
    try:
        AutoTokenizer.from_pretrained(checkpoints[-1]).save_pretrained(output_dir)
    except (OSError, ValueError):
        pass  # a checkpoint saved without its tokenizer: the model is still usable with the original one
    return model


__all__ = [
    "check_checkpoint",
    "checkpoint_problem",
    "last_complete_checkpoint",
    "load_trained_model",
    "load_weights",
    "average_weights",
    "save_averaged_model",
]
