#!/usr/bin/env python
"""Publish a saved checkpoint folder on the Hugging Face Hub.

    python scripts/push_to_hub.py --model_dir runs/base-en-de --repo_id user/vanilla-transformer-en-de \
        [--with_ctranslate2 int8] [--space vanilla-transformer-en-de-demo]

Refreshes the model card (README.md) from the folder's config, results and previous card, creates the repo if needed,
and uploads the folder in one commit, without Trainer's checkpoint-*/ folders and optimizer/scheduler states. The
token comes from `hf auth login` or HF_TOKEN; HF_ENDPOINT selects another Hub.

--with_ctranslate2 also exports the model to CTranslate2 (int8: fast CPU translation) into `ctranslate2/` and uploads
it in the same commit (docs/deployment.md); otherwise `ctranslate2/` stays behind (an export of older weights never
travels with newer ones). --space NAME also uploads a Gradio Space serving the model with scripts/demo.py's web demo.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from huggingface_hub import HfApi
from transformers import HfArgumentParser

from vanilla_transformer.hub.model_card import CTRANSLATE2_FOLDER, write_model_card
from vanilla_transformer.hub.space import space_id_for, upload_space
from vanilla_transformer.hub.upload import check_model_dir, export_for_upload, files_to_upload, ignore_patterns


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
    space: str | None = field(default=None, metadata={"help": "Also upload a Gradio Space with the web demo."})


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(PushArguments).parse_args_into_dataclasses(args=argv)
    problem = check_model_dir(args.model_dir)
    if problem is None and args.repo_id.count("/") != 1:
        problem = f"--repo_id {args.repo_id!r} must be namespace/name, e.g. your-username/vanilla-transformer-en-de"
    space_id, problem = space_id_for(args.space, args.repo_id) if problem is None and args.space else (None, problem)
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
    if space_id is not None:
        url, space_commit, _ = upload_space(space_id, args.repo_id, private=args.private)
        print(f"\nspace:  {url}{' (private)' * args.private}\ncommit: {space_commit.commit_url}")


if __name__ == "__main__":
    main()
