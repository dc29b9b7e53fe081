"""A Hugging Face Space that serves a pushed model with the package's web demo (`vanilla_transformer.demo.app`).

`write_space(folder, model_id)` writes what the Space needs:

- ``app.py``: builds the demo for ``model_id``, which the Space downloads from the Hub when it starts, and launches it;
- ``requirements.txt``: what the demo imports besides gradio (a Space installs gradio itself, at the README's
  ``sdk_version``);
- ``README.md``: the Space's metadata (``sdk: gradio``, ``sdk_version``, ``app_file``, ``models: [model_id]``, ...);
- ``vanilla_transformer/``: this package's own code, which is not on PyPI, so that the Space runs the same app as
  ``scripts/demo.py`` does here.

`upload_space(space_id, model_id)` writes them into a temporary folder and uploads them in one commit.
`space_id_for(space, repo_id)` is the Space's id for push_to_hub.py's ``--space``, checked before any upload.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from huggingface_hub import CommitInfo, HfApi, SpaceCardData

PACKAGE = Path(__file__).resolve().parents[1]  # the vanilla_transformer folder
# what the demo imports besides gradio, with the bounds of setup.cfg (install_requires and the demo extra)
REQUIREMENTS = ["torch>=2.4", "transformers>=5.24,<6", "huggingface_hub>=1.0", "matplotlib>=3.7"]

APP = '''"""The web demo of {model_id}: the Transformer of "Attention Is All You Need", trained and shared with the
vanilla-transformer package (its code is in vanilla_transformer/; the app is vanilla_transformer/demo/app.py)."""

from vanilla_transformer.demo.app import build_app, launch_app

launch_app(build_app("{model_id}"))
'''


def space_id_for(space: str, repo_id: str) -> tuple[str | None, str | None]:
    """(the Space's id, None) for push_to_hub.py's ``--space``: ``space`` as given when it is namespace/name, else in
    ``repo_id``'s namespace; or (None, what is wrong in one line), checked before anything is uploaded."""
    space_id = space if "/" in space else f"{repo_id.split('/')[0]}/{space}"
    if space_id.count("/") != 1 or not all(space_id.split("/")):
        return None, f"--space {space!r} must be a name or namespace/name, e.g. vanilla-transformer-en-de-demo"
    if importlib.util.find_spec("gradio") is None:
        return None, "--space needs gradio, whose release the Space then runs: pip install 'vanilla-transformer[demo]'"
    return space_id, None


def write_space(folder: str, model_id: str, *, private_model: bool = False) -> list[str]:
    """Write a Space that serves the Hub model ``model_id`` with the web demo into ``folder`` (created if needed);
    returns the paths written, relative to ``folder``. ``private_model``: say in the README that the Space needs a
    token to read the model."""
    if model_id.count("/") != 1:
        raise ValueError(f"model_id {model_id!r} must be a Hub id, namespace/name.")
    try:  # the Space runs the gradio release the demo was built and tested with
        gradio_version = metadata.version("gradio")
    except metadata.PackageNotFoundError:
        raise ImportError(
            "A Space runs the demo, which needs gradio: pip install 'vanilla-transformer[demo]'."
        ) from None
    os.makedirs(folder, exist_ok=True)
    name = model_id.split("/")[1]
    card = SpaceCardData(
        title=name[:30],  # the Hub shows at most 30 characters
        emoji="🔤",
        colorFrom="indigo",
        colorTo="blue",
        sdk="gradio",
        sdk_version=gradio_version,
        python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
        app_file="app.py",
        models=[model_id],
        license="apache-2.0",  # the package's code, which the Space runs
        tags=["translation", "vanilla-transformer", "attention-visualization"],
        short_description=f"Translate with {name} and see its attention"[:60],
    )
    token_note = (
        f"\n\n`{model_id}` is private: give this Space a secret named `HF_TOKEN` holding a token that can read it."
        if private_model
        else ""
    )
    readme = (
        f"---\n{card.to_yaml()}\n---\n\n# {name}\n\n"
        f'Translate with [{model_id}](https://huggingface.co/{model_id}), a Transformer of "Attention Is All You '
        'Need" trained with the `vanilla-transformer` package: type a sentence to see the translation by beam search, '
        "the n-best list with scores, and the attention behind the chosen translation (encoder-decoder attention by "
        "layer and head, encoder and decoder self-attention), beside the model's size and the metrics of its model "
        f"card.{token_note}\n"
    )
    files = {
        "README.md": readme,
        "app.py": APP.format(model_id=model_id),
        "requirements.txt": "\n".join(REQUIREMENTS) + "\n",
    }
    for path, text in files.items():
        Path(folder, path).write_text(text, encoding="utf-8")
    written = list(files)
    for source in sorted(PACKAGE.rglob("*.py")):
        relative = source.relative_to(PACKAGE.parent)
        if "__pycache__" not in relative.parts:
            os.makedirs(Path(folder, relative).parent, exist_ok=True)
            shutil.copyfile(source, Path(folder, relative))
            written.append(relative.as_posix())
    return written


def upload_space(
    space_id: str,
    model_id: str,
    *,
    private: bool = False,
    commit_message: str = "Upload the vanilla-transformer demo",
) -> tuple[str, CommitInfo, list[str]]:
    """Create the Space ``space_id`` if needed (Gradio, private when ``private``), and upload in one commit a demo of
    the Hub model ``model_id`` (``write_space``); returns the Space's URL, the commit and the files uploaded."""
    api = HfApi()
    with tempfile.TemporaryDirectory() as folder:
        files = write_space(folder, model_id, private_model=private)
        url = api.create_repo(space_id, repo_type="space", space_sdk="gradio", private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=space_id,
            repo_type="space",
            folder_path=folder,
            commit_message=commit_message,
            delete_patterns=["vanilla_transformer/*"],  # modules an older upload had and this version lacks
        )
    return str(url), commit, files


__all__ = ["REQUIREMENTS", "space_id_for", "upload_space", "write_space"]
