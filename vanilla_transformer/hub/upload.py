"""Uploading a saved model folder to the Hub: what is checked before, what is uploaded (not Trainer's intermediate
checkpoints nor optimizer states; a CTranslate2 export only when asked for), and the export that may travel with it.
`scripts/push_to_hub.py` runs them."""

from __future__ import annotations

import os

from huggingface_hub.errors import StrictDataclassError
from huggingface_hub.utils import filter_repo_objects
from safetensors import SafetensorError
from transformers import AutoModel

from ..inference.loading import load_trained_model
from .model_card import CTRANSLATE2_FOLDER

IGNORE_PATTERNS = ["checkpoint-*", "*.pt", "*.pth", ".git/*"]


def check_model_dir(model_dir: str) -> str | None:
    """Return what is wrong with `model_dir` as a checkpoint to upload, in one line, or None."""
    if not os.path.isdir(model_dir):
        return f"--model_dir {model_dir!r} is not a folder"
    missing = [name for name in ("config.json",) if not os.path.isfile(os.path.join(model_dir, name))]
    weights = ("model.safetensors", "model.safetensors.index.json")
    if not any(os.path.isfile(os.path.join(model_dir, name)) for name in weights):
        missing.append("model.safetensors")
    if missing:
        return f"--model_dir {model_dir!r} has no {' or '.join(missing)}; pass a folder written by save_pretrained"
    try:
        load_trained_model(model_dir, AutoModel)
    except StrictDataclassError as error:  # a config value that @strict refuses: the field and why, on one line
        return " ".join(str(error).split())
    except (OSError, ValueError, SafetensorError) as error:
        return str(error).split("\n")[0]
    return None


def ignore_patterns(with_ctranslate2: str | None) -> list[str]:
    return IGNORE_PATTERNS if with_ctranslate2 else [*IGNORE_PATTERNS, f"{CTRANSLATE2_FOLDER}/*"]


def files_to_upload(model_dir: str, with_ctranslate2: str | None = None) -> list[tuple[str, int]]:
    paths = [
        os.path.relpath(os.path.join(root, name), model_dir).replace(os.sep, "/")
        for root, _, names in os.walk(model_dir)
        for name in names
    ]
    kept = filter_repo_objects(sorted(paths), ignore_patterns=ignore_patterns(with_ctranslate2))
    return [(path, os.path.getsize(os.path.join(model_dir, path))) for path in kept]


def export_for_upload(model_dir: str, quantization: str) -> str | None:
    """Export `model_dir` to CTranslate2 into its CTRANSLATE2_FOLDER (replacing an older export); return what went
    wrong in one line, or None."""
    from ..inference.ctranslate2 import export_ctranslate2

    try:
        export_ctranslate2(
            model_dir, os.path.join(model_dir, CTRANSLATE2_FOLDER), quantization=quantization, force=True
        )
    except (ValueError, OSError, ImportError, RuntimeError) as error:
        return f"--with_ctranslate2: {str(error).strip().splitlines()[0]}"
    print(f"exported to CTranslate2 ({quantization}): {os.path.join(model_dir, CTRANSLATE2_FOLDER)}")
    return None
