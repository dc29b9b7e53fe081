#!/usr/bin/env python
"""Publish a saved checkpoint folder on the Hugging Face Hub.

    python scripts/push_to_hub.py --model_dir runs/base-en-de --repo_id user/vanilla-transformer-en-de

Refreshes the model card (README.md) from the folder (config.json, generation_config.json, all_results.json,
training_args.json and the previous card's metadata), creates the repo if needed, and uploads the folder in one
commit. Trainer's intermediate checkpoints (checkpoint-*/) and optimizer/scheduler states are not uploaded. The token
comes from `hf auth login` or HF_TOKEN; HF_ENDPOINT selects another Hub.

    python scripts/push_to_hub.py --model_dir runs/base-en-de --repo_id user/vanilla-transformer-en-de \
        --with_ctranslate2 int8

also exports the model to CTranslate2 (int8 weights: fast CPU translation) into the folder's `ctranslate2/`
subfolder, uploads it in the same commit, and the model card says how to use it (docs/deployment.md). Without the
flag a `ctranslate2/` subfolder is not uploaded, so that an export of older weights never travels with newer ones.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from huggingface_hub import HfApi
from huggingface_hub.errors import StrictDataclassError
from huggingface_hub.utils import filter_repo_objects
from safetensors import SafetensorError
from transformers import AutoModel, HfArgumentParser

from vanilla_transformer.hub.model_card import CTRANSLATE2_FOLDER, write_model_card
from vanilla_transformer.inference.loading import load_trained_model

IGNORE_PATTERNS = ["checkpoint-*", "*.pt", "*.pth", ".git/*"]


@dataclass
class PushArguments:
    model_dir: str = field(metadata={"help": "Checkpoint folder written by scripts/train.py or save_pretrained."})
    repo_id: str = field(metadata={"help": "Hub repository to create or update, as namespace/name (user or org)."})
    private: bool = field(default=False, metadata={"help": "Create the repository as private (if it is new)."})
    commit_message: str = field(
        default="Upload vanilla-transformer checkpoint", metadata={"help": "Message of the upload commit."}
    )
    dataset_name: str | None = field(
        default=None, metadata={"help": "Training dataset id for the card, if not already in its metadata."}
    )
    source_lang: str | None = field(
        default=None, metadata={"help": "Source language code for the card, if not already in its metadata."}
    )
    target_lang: str | None = field(
        default=None, metadata={"help": "Target language code for the card, if not already in its metadata."}
    )
    with_ctranslate2: str | None = field(
        default=None,
        metadata={
            "help": f"Also upload a CTranslate2 export with these weights (e.g. int8) in {CTRANSLATE2_FOLDER}/; needs "
            "pip install 'vanilla-transformer[ctranslate2]'."
        },
    )


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
    from vanilla_transformer.inference.ctranslate2 import export_ctranslate2

    try:
        export_ctranslate2(
            model_dir, os.path.join(model_dir, CTRANSLATE2_FOLDER), quantization=quantization, force=True
        )
    except (ValueError, OSError, ImportError, RuntimeError) as error:
        return f"--with_ctranslate2: {str(error).strip().splitlines()[0]}"
    print(f"exported to CTranslate2 ({quantization}): {os.path.join(model_dir, CTRANSLATE2_FOLDER)}")
    return None


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(PushArguments).parse_args_into_dataclasses(args=argv)
    problem = check_model_dir(args.model_dir)
    if problem is None and args.repo_id.count("/") != 1:
        problem = f"--repo_id {args.repo_id!r} must be namespace/name, e.g. your-username/vanilla-transformer-en-de"
    if problem is None and args.with_ctranslate2:
        problem = export_for_upload(args.model_dir, args.with_ctranslate2)
    if problem:
        sys.exit(f"push_to_hub.py: error: {problem}")

    card = write_model_card(
        args.model_dir,
        repo_id=args.repo_id,
        dataset_name=args.dataset_name,
        source_lang=args.source_lang,
        target_lang=args.target_lang,
        ctranslate2=args.with_ctranslate2,
    )
    print(f"model card refreshed: {card}")

    api = HfApi()
    repo_url = api.create_repo(args.repo_id, private=args.private, exist_ok=True)
    commit = api.upload_folder(
        repo_id=args.repo_id,
        folder_path=args.model_dir,
        commit_message=args.commit_message,
        ignore_patterns=ignore_patterns(args.with_ctranslate2),
    )

    files = files_to_upload(args.model_dir, args.with_ctranslate2)
    width = max(len(path) for path, _ in files)
    print(f"\n{'file':<{width}}  {'bytes':>12}")
    for path, size in files:
        print(f"{path:<{width}}  {size:>12,}")
    print(f"{'total':<{width}}  {sum(size for _, size in files):>12,}\n")
    print(f"repo:   {repo_url}{' (private)' if args.private else ''}")
    print(f"commit: {commit.commit_url}")


if __name__ == "__main__":
    main()
