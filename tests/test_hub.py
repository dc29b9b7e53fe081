"""Hub-ready checkpoints: model card, translation pipeline, loading without the package, push_to_hub.

Everything runs offline: the checkpoint is a tiny model trained for a second on a toy word-for-word en→de lexicon, the
tokenizer is built here, "the Hub" is tests/hub_server.py on 127.0.0.1, and "a user without the package" is a fresh
virtual environment that sees torch, transformers and tokenizers but cannot import vanilla_transformer.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import (
    LEXICON,
    ROOT,
    free_port,
    load_script,
    single_thread,
    tiny_config,
    train_toy_model,
    word_tokenizer,
)
from hub_server import LocalHub
from transformers import Seq2SeqTrainingArguments, pipeline

import vanilla_transformer
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.hub.model_card import write_model_card
from vanilla_transformer.inference.translate import translate
from vanilla_transformer.pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline

TOKEN = "hf_test_token_not_a_secret"
REPO_ID = "user/vanilla-transformer-toy-en-de"
SENTENCES = ["the cat sat on the mat", "the big dog is red", "blue house"]
# train.py's test split prefix is "predict"
METRICS = {"test_bleu": 41.2345, "test_chrf": 60.5, "predict_ter": 50.0, "eval_bleu": 39.75, "train_loss": 2.5}
SUBPROCESS_TIMEOUT_S = 120

# Run in the fresh environment: loads a checkpoint (folder or repo id) as a user without the package would, and
# writes what it generated to a JSON file.
LOADER = r"""
import json, sys
try:
    import vanilla_transformer
except ModuleNotFoundError as error:
    blocked = str(error)
else:
    sys.exit(f"vanilla_transformer is importable here: {vanilla_transformer.__file__}")
import torch
from transformers import (
    AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification, AutoTokenizer, pipeline,
)

model_id, sentences, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
tokenizer = AutoTokenizer.from_pretrained(model_id)
model = AutoModelForSeq2SeqLM.from_pretrained(model_id, trust_remote_code=True).eval()
inputs = tokenizer(sentences, return_tensors="pt", padding=True)
with torch.no_grad():
    ids = model.generate(**inputs)
    logits = model(**inputs, decoder_input_ids=ids).logits
translator = pipeline("translation", model=model_id, trust_remote_code=True)
autos = (AutoConfig, AutoModel, AutoModelForSequenceClassification)
auto_classes = {auto.__name__: type(auto.from_pretrained(model_id, trust_remote_code=True)).__name__ for auto in autos}
with open(out, "w") as f:
    json.dump({
        "blocked": blocked,
        "finders": [type(finder).__module__ for finder in sys.meta_path],
        "package_modules": sorted(m for m in sys.modules if m.split(".")[0] == "vanilla_transformer"),
        "model_class": f"{type(model).__module__}.{type(model).__name__}",
        "auto_classes": auto_classes,
        "ids": ids.tolist(),
        "logits": logits.tolist(),
        "pipeline": translator(sentences),
    }, f)
"""

# Imported by a .pth file of the fresh environment: even an installed (non-editable) copy of the package stays hidden.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> SimpleNamespace:
    """A folder saved as train.py saves one (model, tokenizer, model card), and what the package generates from it."""
    model_dir = tmp_path_factory.mktemp("hub") / "toy-en-de"
    tokenizer = word_tokenizer(list(LEXICON) + list(LEXICON.values()))
    with single_thread():
        model = train_toy_model(tokenizer)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    training_args = Seq2SeqTrainingArguments(
        output_dir=str(model_dir),
        learning_rate=5e-4,
        lr_scheduler_type="inverse_sqrt",
        warmup_steps=4000,
        label_smoothing_factor=0.1,
        per_device_train_batch_size=64,
        generation_num_beams=4,
        seed=1234,
        report_to="none",
    )
    write_model_card(
        str(model_dir),
        metrics=METRICS,
        training_args=training_args,
        dataset_name="toy-lexicon",
        source_lang="en",
        target_lang="de",
    )
    inputs = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    with torch.no_grad(), single_thread():
        ids = model.generate(**inputs)
        logits = model(**inputs, decoder_input_ids=ids).logits
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    assert len(set(texts)) == len(SENTENCES), f"the toy model should translate each sentence differently: {texts}"
    return SimpleNamespace(path=model_dir, model=model, tokenizer=tokenizer, ids=ids, logits=logits, texts=texts)


def subprocess_env(home: Path, **overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_")) and k != "PYTHONPATH"}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", OMP_NUM_THREADS="1")
    return {**env, **overrides}


def load_as_user_without_package(python: str, model_id: str, env: dict[str, str], workdir: Path) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    script, out = workdir / "load.py", workdir / "out.json"
    script.write_text(LOADER)
    # cwd and the script's folder are both outside the repository, so the source tree is not on sys.path either
    result = subprocess.run(
        [python, str(script), model_id, json.dumps(SENTENCES), str(out)],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(out.read_text())


def assert_same_translations(loaded: dict, checkpoint: SimpleNamespace) -> None:
    assert loaded["blocked"] == "vanilla_transformer is blocked in this environment"
    assert not any("editable" in finder for finder in loaded["finders"]), loaded["finders"]
    assert loaded["package_modules"] == []
    # the model class comes from the code saved in the checkpoint, imported by transformers
    assert loaded["model_class"].startswith("transformers_modules.")
    assert loaded["model_class"].endswith(".modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration")
    assert loaded["auto_classes"] == {
        "AutoConfig": "VanillaTransformerConfig",
        "AutoModel": "VanillaTransformerModel",
        "AutoModelForSequenceClassification": "VanillaTransformerForSequenceClassification",
    }
    assert loaded["ids"] == checkpoint.ids.tolist()
    torch.testing.assert_close(torch.tensor(loaded["logits"]), checkpoint.logits, rtol=1e-4, atol=1e-5)
    assert loaded["pipeline"] == [{"translation_text": text} for text in checkpoint.texts]


CARD_RESULTS = {("test", "bleu"): 41.2345, ("test", "chrf"): 60.5, ("test", "ter"): 50.0, ("validation", "bleu"): 39.75}


def card_results(meta: dict) -> dict[tuple[str, str], float]:
    """(split, metric) -> value, from the model-index metadata."""
    (model,) = meta["model-index"]
    return {(r["dataset"]["split"], m["type"]): m["value"] for r in model["results"] for m in r["metrics"]}


def front_matter(readme: str) -> dict:
    match = re.match(r"\A---\n(.*?)\n---\n", readme, flags=re.S)
    assert match, "README.md must start with a YAML block between '---' lines"
    return yaml.safe_load(match.group(1))


def test_saved_folder_has_everything_a_hub_user_needs(checkpoint):
    files = {path.name for path in checkpoint.path.iterdir()}
    expected = {
        "config.json",
        "configuration_vanilla_transformer.py",
        "modeling_vanilla_transformer.py",
        "input_checks_vanilla_transformer.py",
        "loss_vanilla_transformer.py",
        "pipeline_vanilla_transformer.py",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    }
    assert expected <= files
    package = Path(vanilla_transformer.__file__).parent
    for source in (
        "configuration_vanilla_transformer.py",
        "modeling_vanilla_transformer.py",
        "input_checks_vanilla_transformer.py",
        "loss_vanilla_transformer.py",
        "pipeline_vanilla_transformer.py",
    ):
        assert (checkpoint.path / source).read_bytes() == (package / source).read_bytes()
    config = json.loads((checkpoint.path / "config.json").read_text())
    modeling = "modeling_vanilla_transformer"
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModel": f"{modeling}.VanillaTransformerModel",
        "AutoModelForSeq2SeqLM": f"{modeling}.VanillaTransformerForConditionalGeneration",
        "AutoModelForSequenceClassification": f"{modeling}.VanillaTransformerForSequenceClassification",
    }
    translation = config["custom_pipelines"]["translation"]
    assert translation == {
        "impl": "pipeline_vanilla_transformer.VanillaTransformerTranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
    # the model code does not carry the pipeline: it has its own file, which imports only torch and transformers
    modeling_code = (checkpoint.path / "modeling_vanilla_transformer.py").read_text()
    assert "Pipeline" not in modeling_code.replace("pipeline_vanilla_transformer.py", "")
    pipeline_code = (checkpoint.path / "pipeline_vanilla_transformer.py").read_text()
    assert "class VanillaTransformerTranslationPipeline(" in pipeline_code
    assert set(re.findall(r"^(?:from|import) (\w+)", pipeline_code, re.M)) == {"torch", "transformers"}
    generation = json.loads((checkpoint.path / "generation_config.json").read_text())
    assert {key: generation[key] for key in ("decoder_start_token_id", "eos_token_id", "max_new_tokens")} == {
        "decoder_start_token_id": 1,
        "eos_token_id": 2,
        "max_new_tokens": 12,
    }


def test_model_card_metadata_and_content_come_from_the_run(checkpoint):
    readme = (checkpoint.path / "README.md").read_text()
    meta = front_matter(readme)
    assert meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "translation"
    assert meta["language"] == ["en", "de"]
    assert meta["license"] == "apache-2.0"
    assert meta["datasets"] == ["toy-lexicon"]
    assert meta["metrics"] == ["bleu", "chrf", "ter"]
    assert {"translation", "vanilla-transformer"} <= set(meta["tags"])
    assert card_results(meta) == CARD_RESULTS
    # architecture from config.json and the weights, recipe from the training arguments
    parameters = sum(p.numel() for p in checkpoint.model.parameters())  # tied matrices once
    for row in (
        f"| parameters | {parameters:,} |",
        "| layers (encoder + decoder) | 2 + 2 |",
        "| d_model | 32 |",
        "| feed-forward width d_ff (encoder / decoder) | 64 / 64 |",
        "| attention heads (encoder / decoder) | 4 / 4 |",
        "| dropout (residual / attention / activation) | 0.0 / 0.0 / 0.0 |",
        "| normalization | post-norm (as in the paper) |",
        f"| vocabulary | {len(checkpoint.tokenizer)} (shared source/target) |",
        "| peak learning rate | `0.0005` |",
        "| learning-rate schedule | `inverse_sqrt` |",
        "| warmup steps | `4000` |",
        "| label smoothing | `0.1` |",
        "| batch size per device | `64` |",
        "| seed | `1234` |",
        "| epochs | `3.0` |",
        "| test bleu | 41.23 |",
        "| train loss | 2.5 |",
        "| max_new_tokens | `12` |",
    ):
        assert row in readme, row
    assert "max steps" not in readme  # Trainer ignores max_steps=-1: no noise from unused arguments
    # usage for both the installed package and trust_remote_code, and the pipeline
    assert 'AutoModelForSeq2SeqLM.from_pretrained("toy-en-de", trust_remote_code=True)' in readme
    assert "import vanilla_transformer" in readme
    assert 'pipeline("translation", model="toy-en-de", trust_remote_code=True)' in readme


def test_model_card_describes_each_config_and_refresh_keeps_what_was_recorded(tmp_path):
    big = tmp_path / "big"
    VanillaTransformerConfig(
        d_model=1024, encoder_ffn_dim=4096, encoder_attention_heads=16, dropout=0.3
    ).save_pretrained(big)
    variant = tmp_path / "variant"
    VanillaTransformerConfig(d_model=48, normalize_before=True, position_embedding_type="learned").save_pretrained(
        variant
    )
    write_model_card(str(big), metrics={"test_bleu": 28.4}, training_args={"learning_rate": 1e-3, "output_dir": "x"})
    write_model_card(str(variant), source_lang="fr", target_lang="en", dataset_name="wmt14")
    big_card, variant_card = (big / "README.md").read_text(), (variant / "README.md").read_text()
    assert "## Architecture (the paper's big model)" in big_card
    assert "| d_model | 1024 |" in big_card and "| normalization | post-norm (as in the paper) |" in big_card
    assert "## Architecture\n" in variant_card and "the paper's" not in variant_card.split("## Training")[0]
    assert "| d_model | 48 |" in variant_card and "| normalization | pre-norm |" in variant_card
    assert "| positions | learned, max 1024 |" in variant_card
    assert "The training arguments of this checkpoint were not recorded." in variant_card
    assert "metrics" not in front_matter(variant_card)  # no figures, no claims
    assert "La maison est merveilleuse." in variant_card  # the usage example is in the source language

    # a refresh (what push_to_hub.py does) keeps metrics, recipe, dataset and languages recorded earlier; a dataset
    # that is not a Hub id (a file, a description) stays out of the `datasets` metadata
    write_model_card(str(big), source_lang="en", target_lang="de", dataset_name="the demo corpus (built in)")
    before = (big / "README.md").read_text()
    write_model_card(str(big), repo_id="someone/big-en-de")
    after = (big / "README.md").read_text()
    assert front_matter(after) == {**front_matter(before), "model-index": front_matter(after)["model-index"]}
    assert "datasets" not in front_matter(after) and "trained on `the demo corpus (built in)`" in after
    (model_index,) = front_matter(after)["model-index"]
    assert model_index["name"] == "big-en-de"
    assert model_index["results"][0]["dataset"] == {
        "name": "the demo corpus (built in)",
        "type": "custom",
        "split": "test",
    }
    assert model_index["results"][0]["metrics"][0]["value"] == 28.4
    assert "| peak learning rate | `0.001` |" in after
    assert 'from_pretrained("someone/big-en-de", trust_remote_code=True)' in after
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        write_model_card(str(tmp_path / "missing"))


def test_model_card_counts_the_parameters_of_a_sharded_checkpoint(tmp_path):
    model = VanillaTransformerForConditionalGeneration(tiny_config())
    model.save_pretrained(tmp_path, max_shard_size="50KB")
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    write_model_card(str(tmp_path))
    parameters = sum(p.numel() for p in model.parameters())  # tied matrices once
    assert f"| parameters | {parameters:,} |" in (tmp_path / "README.md").read_text()
    next(tmp_path.glob("model-*-of-*.safetensors")).unlink()
    write_model_card(str(tmp_path))
    assert "| parameters | unknown |" in (tmp_path / "README.md").read_text()


@pytest.mark.usefixtures("one_thread")
def test_translation_pipeline_gives_what_generate_gives(checkpoint):
    translator = pipeline("translation", model=str(checkpoint.path), trust_remote_code=True)
    assert type(translator).__name__ == "VanillaTransformerTranslationPipeline"
    assert translator(SENTENCES[0]) == [{"translation_text": checkpoint.texts[0]}]
    assert translator(SENTENCES) == [{"translation_text": text} for text in checkpoint.texts]
    assert translator(SENTENCES, batch_size=3) == translator(SENTENCES)
    # the tokens themselves, for an unpadded sentence
    inputs = checkpoint.tokenizer(SENTENCES[1], return_tensors="pt")
    expected = checkpoint.model.generate(**inputs)[0]
    (record,) = translator(SENTENCES[1], return_tensors=True)
    assert torch.equal(record["translation_token_ids"], expected)
    # generation parameters go to generate(): two beams, two answers per sentence
    beams = checkpoint.model.generate(**inputs, num_beams=2, num_return_sequences=2)
    texts = checkpoint.tokenizer.batch_decode(beams, skip_special_tokens=True)
    assert translator(SENTENCES[1], num_beams=2, num_return_sequences=2) == [{"translation_text": t} for t in texts]
    with pytest.raises(TypeError, match="translates str or list"):
        translator(42)
    # in-memory objects: pipeline() needs a path or repo id to find custom_pipelines, the class works directly
    direct = VanillaTransformerTranslationPipeline(model=checkpoint.model, tokenizer=checkpoint.tokenizer)
    assert direct(SENTENCES) == [{"translation_text": text} for text in checkpoint.texts]
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        pipeline("translation", model=str(checkpoint.path))


@pytest.mark.slow
def test_loads_and_translates_without_the_package(checkpoint, fresh_python, tmp_path):
    env = subprocess_env(tmp_path / "hf_home")
    loaded = load_as_user_without_package(fresh_python, str(checkpoint.path), env, tmp_path / "run")
    assert_same_translations(loaded, checkpoint)


def push_to_local_hub(args: list[str], tmp_path: Path, overrides: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a Python script (`args`: its path and arguments) that pushes to the local Hub named by `overrides`, with
    this checkout's package (not whichever an editable install points at)."""
    return subprocess.run(
        [sys.executable, *args],
        env=subprocess_env(tmp_path / "push_home", PYTHONPATH=str(ROOT), **overrides),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )


@pytest.mark.slow
def test_push_to_hub_round_trip_through_a_local_hub(checkpoint, fresh_python, tmp_path):
    model_dir = tmp_path / "toy-en-de"
    shutil.copytree(checkpoint.path, model_dir)
    # Trainer leftovers that must not be uploaded
    (model_dir / "checkpoint-10").mkdir()
    (model_dir / "checkpoint-10" / "model.safetensors").write_bytes(b"old weights")
    (model_dir / "optimizer.pt").write_bytes(b"optimizer state")
    with LocalHub(token=TOKEN, lifetime_s=4 * SUBPROCESS_TIMEOUT_S) as hub:
        overrides = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_TOKEN": TOKEN}
        push = push_to_local_hub(
            [str(ROOT / "scripts" / "push_to_hub.py"), "--model_dir", str(model_dir)]
            + ["--repo_id", REPO_ID, "--private", "--commit_message", "First upload"],
            tmp_path,
            overrides,
        )
        assert push.returncode == 0, push.stderr[-4000:]
        repo = hub.repos[REPO_ID]
        assert repo.private and repo.messages[repo.head] == "First upload"
        # the Hub holds exactly the folder, with the model card refreshed for the repo id
        local = {p.name: p.read_bytes() for p in model_dir.iterdir() if p.is_file() and p.name != "optimizer.pt"}
        assert hub.files(REPO_ID) == local
        readme = local["README.md"].decode()
        assert f'from_pretrained("{REPO_ID}", trust_remote_code=True)' in readme
        meta = front_matter(readme)  # what train.py recorded survives the refresh
        assert (meta["language"], meta["datasets"], card_results(meta)) == (["en", "de"], ["toy-lexicon"], CARD_RESULTS)

        # a user without the package, and with an empty cache, loads it by repo id
        home = tmp_path / "user_home"
        loaded = load_as_user_without_package(
            fresh_python, REPO_ID, subprocess_env(home, **overrides), tmp_path / "run"
        )
        assert_same_translations(loaded, checkpoint)
        (snapshot,) = (home / "hub" / f"models--{REPO_ID.replace('/', '--')}" / "snapshots").iterdir()
        assert snapshot.name == repo.head
        for path in snapshot.iterdir():
            assert path.read_bytes() == local[path.name], path.name
        assert ("HEAD", f"/{REPO_ID}/resolve/{repo.head}/model.safetensors", 200) in hub.requests


# Run with the package: save_pretrained(push_to_hub=True) of the model, as a transformers user pushes one.
SAVE_AND_PUSH = r"""
import sys
from vanilla_transformer import VanillaTransformerForConditionalGeneration

model_dir, out_dir, repo_id = sys.argv[1:]
model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir)
model.save_pretrained(out_dir, push_to_hub=True, repo_id=repo_id, private=True, commit_message="Saved and pushed")
"""


@pytest.mark.slow
def test_save_pretrained_with_push_to_hub_uploads_the_pipeline_file(checkpoint, tmp_path):
    """config.json declares custom_pipelines, so the pushed repo holds the pipeline's file: transformers uploads
    before save_pretrained returns, and the file is copied into the folder before that upload."""
    script, out_dir = tmp_path / "save_and_push.py", tmp_path / "pushed"
    script.write_text(SAVE_AND_PUSH)
    with LocalHub(token=TOKEN, lifetime_s=2 * SUBPROCESS_TIMEOUT_S) as hub:
        overrides = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_TOKEN": TOKEN}
        push = push_to_local_hub([str(script), str(checkpoint.path), str(out_dir), REPO_ID], tmp_path, overrides)
        assert push.returncode == 0, push.stderr[-4000:]
        repo, files = hub.repos[REPO_ID], hub.files(REPO_ID)
    assert repo.private and repo.messages[repo.head] == "Saved and pushed"  # save_pretrained's arguments still apply
    assert json.loads(files["config.json"])["custom_pipelines"]["translation"]["impl"].startswith(
        "pipeline_vanilla_transformer."
    )
    package_pipeline = Path(vanilla_transformer.__file__).with_name("pipeline_vanilla_transformer.py").read_bytes()
    assert files.get("pipeline_vanilla_transformer.py") == package_pipeline
    assert files == {p.name: p.read_bytes() for p in out_dir.iterdir()}  # the folder as saved, all of it


@pytest.mark.parametrize(
    "files, message",
    [
        (None, r"--model_dir '.*' is not a folder"),
        ([], r"has no config.json or model.safetensors; pass a folder written by save_pretrained"),
        (["config.json"], r"has no model.safetensors;"),
        (["model.safetensors"], r"has no config.json;"),
    ],
)
def test_push_to_hub_rejects_a_folder_that_is_not_a_checkpoint(tmp_path, capsys, files, message):
    model_dir = tmp_path / "model"
    if files is not None:
        model_dir.mkdir()
        for name in files:
            (model_dir / name).write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        load_script("push_to_hub").main(["--model_dir", str(model_dir), "--repo_id", REPO_ID])
    error = str(exit_info.value.code)
    assert re.search(message, error) and "\n" not in error and error.startswith("push_to_hub.py: error:")
    assert not (model_dir / "README.md").exists()


def test_push_to_hub_rejects_a_repo_id_without_namespace(checkpoint):
    with pytest.raises(SystemExit, match="--repo_id 'name-only' must be namespace/name"):
        load_script("push_to_hub").main(["--model_dir", str(checkpoint.path), "--repo_id", "name-only"])


# --------------------------------------------------------------------------------------------------------------------
# A Space that serves the pushed model with the web demo
# --------------------------------------------------------------------------------------------------------------------


def setup_cfg_requirements() -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options"]["install_requires"].splitlines()
    lines += [line for extra in config["options.extras_require"].values() for line in extra.splitlines()]
    return {line.strip() for line in lines if line.strip() and not line.strip().startswith("#")}


def test_a_space_holds_what_a_gradio_space_needs(tmp_path):
    from vanilla_transformer.hub.space import REQUIREMENTS, write_space

    try:
        gradio_version = metadata.version("gradio")  # without importing it: seconds
    except metadata.PackageNotFoundError:
        pytest.skip("needs gradio (the demo extra)")

    written = write_space(str(tmp_path), REPO_ID)
    meta = front_matter((tmp_path / "README.md").read_text())
    assert {key: meta[key] for key in ("sdk", "sdk_version", "app_file", "models", "license")} == {
        "sdk": "gradio",
        "sdk_version": gradio_version,  # the release the demo was tested with
        "app_file": "app.py",
        "models": [REPO_ID],
        "license": "apache-2.0",
    }
    assert len(meta["title"]) <= 30 and len(meta["short_description"]) <= 60  # the Hub's limits
    app = (tmp_path / "app.py").read_text()
    compile(app, "app.py", "exec")
    assert f'launch_app(build_app("{REPO_ID}"))' in app
    # what the demo imports besides gradio, with the bounds the package itself declares
    requirements = (tmp_path / "requirements.txt").read_text().split()
    assert requirements == REQUIREMENTS and set(requirements) <= setup_cfg_requirements()
    # the package's code, as it is here (no caches)
    package = Path(vanilla_transformer.__file__).parent
    copied = sorted(path for path in written if path.startswith("vanilla_transformer/"))
    assert copied == sorted(f"vanilla_transformer/{p.relative_to(package).as_posix()}" for p in package.rglob("*.py"))
    assert "vanilla_transformer/demo/app.py" in copied and not list(tmp_path.rglob("__pycache__"))
    for path in copied:
        assert (tmp_path / path).read_bytes() == (package.parent / path).read_bytes(), path
    assert set(written) == {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match="must be a Hub id, namespace/name"):
        write_space(str(tmp_path), "no-namespace")


def test_push_to_hub_rejects_a_space_name_with_two_slashes(checkpoint):
    with pytest.raises(SystemExit, match="--space 'a/b/c' must be a name or namespace/name"):
        load_script("push_to_hub").main(["--model_dir", str(checkpoint.path), "--repo_id", REPO_ID, "--space", "a/b/c"])


def wait_for_server(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the Space's app.py exited with {process.returncode}: {process.stderr.read()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the Space's app.py did not serve {url} within {timeout_s} s")


@pytest.mark.slow
def test_push_to_hub_with_a_space_that_serves_the_model(checkpoint, tmp_path):
    pytest.importorskip("gradio")
    from gradio_client import Client

    space_id = f"{REPO_ID.split('/')[0]}/toy-demo"
    with LocalHub(token=TOKEN, lifetime_s=4 * SUBPROCESS_TIMEOUT_S) as hub:
        overrides = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_TOKEN": TOKEN}
        push = push_to_local_hub(
            [str(ROOT / "scripts" / "push_to_hub.py"), "--model_dir", str(checkpoint.path)]
            + ["--repo_id", REPO_ID, "--space", "toy-demo"],
            tmp_path,
            overrides,
        )
        assert push.returncode == 0, push.stderr[-4000:]
        assert f"space:  {hub.endpoint}/spaces/{space_id}" in push.stdout
        files = hub.files(f"spaces/{space_id}")
        assert {"README.md", "app.py", "requirements.txt", "vanilla_transformer/demo/app.py"} <= set(files)
        assert front_matter(files["README.md"].decode())["models"] == [REPO_ID]

        # the Space as the Hub runs it: its own folder, its own copy of the package, the model from the Hub
        space = tmp_path / "space"
        for path, data in files.items():
            (space / path).parent.mkdir(parents=True, exist_ok=True)
            (space / path).write_bytes(data)
        port = free_port()
        env = subprocess_env(
            tmp_path / "space_home",
            **overrides,
            GRADIO_SERVER_NAME="127.0.0.1",
            GRADIO_SERVER_PORT=str(port),
            GRADIO_ANALYTICS_ENABLED="False",
        )
        which = subprocess.run(
            [sys.executable, "-c", "import vanilla_transformer; print(vanilla_transformer.__file__)"],
            cwd=space,
            env=env,
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT_S,
        )
        assert which.stdout.strip() == str(space / "vanilla_transformer" / "__init__.py"), which.stderr[-2000:]
        process = subprocess.Popen(
            [sys.executable, "app.py"], cwd=space, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        try:
            wait_for_server(f"http://127.0.0.1:{port}/", process, SUBPROCESS_TIMEOUT_S)
            client = Client(f"http://127.0.0.1:{port}/", verbose=False)
            note, translation, *_ = client.predict(SENTENCES[0], 4, "cross", 1, api_name="/translate")
        finally:
            process.terminate()
            process.wait(timeout=30)
    expected = translate(checkpoint.model, checkpoint.tokenizer, [SENTENCES[0]], num_beams=4)[0]
    assert (note, translation) == ("", expected)
    downloads = [path for method, path, status in hub.requests if method == "GET" and "/resolve/" in path]
    assert f"/{REPO_ID}/resolve/{hub.repos[REPO_ID].head}/model.safetensors" in downloads
