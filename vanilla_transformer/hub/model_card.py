"""Model cards: the README.md, with Hub YAML metadata, that describes a saved checkpoint.

`write_model_card` reads what it describes from the checkpoint folder itself (config.json, generation_config.json, the
safetensors header), so the card states the architecture and recipe that were actually used, not boilerplate. What it
is given is recorded next to the weights, so that a later refresh (scripts/push_to_hub.py) keeps it:

- metrics are merged into ``all_results.json`` (the file `Trainer.save_metrics` writes, read back if it exists);
- the training recipe goes to ``training_args.json`` (only the hyperparameters the card reports);
- dataset, languages and license are read back from the YAML metadata of the previous README.md.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from huggingface_hub import EvalResult, ModelCardData, metadata_load
from safetensors import safe_open

DEFAULT_LICENSE = "apache-2.0"
RESULTS_FILE = "all_results.json"
TRAINING_ARGS_FILE = "training_args.json"
# metric ids of https://hf.co/metrics that go to the card's `metrics` and `model-index` metadata
QUALITY_METRICS = {
    "bleu": "BLEU",
    "sacrebleu": "BLEU",
    "chrf": "chrF",
    "chrf++": "chrF++",
    "ter": "TER",
    "comet": "COMET",
    "meteor": "METEOR",
    "accuracy": "Accuracy",
}
SPLITS = {"train": "train", "eval": "validation", "validation": "validation", "test": "test", "predict": "test"}
# (training argument, what the card calls it), in the order the recipe table lists them
RECIPE = [
    ("optim", "optimizer"),
    ("learning_rate", "peak learning rate"),
    ("adam_beta1", "Adam β1"),
    ("adam_beta2", "Adam β2"),
    ("adam_epsilon", "Adam ε"),
    ("weight_decay", "weight decay"),
    ("lr_scheduler_type", "learning-rate schedule"),
    ("lr_scheduler_kwargs", "schedule arguments"),
    ("warmup_steps", "warmup steps"),
    ("warmup_ratio", "warmup ratio"),
    ("per_device_train_batch_size", "batch size per device"),
    ("gradient_accumulation_steps", "gradient accumulation steps"),
    ("num_train_epochs", "epochs"),
    ("max_steps", "max steps"),
    ("label_smoothing_factor", "label smoothing"),
    ("max_grad_norm", "gradient clipping (max norm)"),
    ("bf16", "bf16 mixed precision"),
    ("fp16", "fp16 mixed precision"),
    ("seed", "seed"),
    ("generation_num_beams", "beams at evaluation"),
    ("generation_max_length", "max length at evaluation"),
]
DECODING = ["num_beams", "max_length", "max_new_tokens", "length_penalty", "early_stopping", "no_repeat_ngram_size"]
EXAMPLES = {
    "en": "The house is wonderful.",
    "de": "Das Haus ist wunderbar.",
    "fr": "La maison est merveilleuse.",
    "es": "La casa es maravillosa.",
}
# Table 3 of the paper
PAPER_MODELS = {
    "base": dict(d_model=512, encoder_ffn_dim=2048, encoder_attention_heads=8, encoder_layers=6, dropout=0.1),
    "big": dict(d_model=1024, encoder_ffn_dim=4096, encoder_attention_heads=16, encoder_layers=6, dropout=0.3),
}


CTRANSLATE2_FOLDER = "ctranslate2"  # the subfolder of push_to_hub.py --with_ctranslate2's export


def write_model_card(
    model_dir: str,
    *,
    metrics: dict[str, Any] | None = None,
    training_args: Any | None = None,
    dataset_name: str | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    repo_id: str | None = None,
    license: str | None = None,
    ctranslate2: str | None = None,
) -> str:
    """Write `model_dir/README.md` describing the checkpoint in `model_dir` and return its path.

    Args:
        model_dir: a folder written by `save_pretrained` (config.json is required).
        metrics: evaluation figures such as ``{"test_bleu": 27.3, "eval_chrf": 55.1, "train_loss": 2.1}``; merged
            into, and completed from, the folder's all_results.json.
        training_args: the `Seq2SeqTrainingArguments` (or a dict of them) of the run; defaults to the folder's
            training_args.json.
        dataset_name, source_lang, target_lang, license: default to the previous card's metadata.
        repo_id: the Hub id the usage examples load (defaults to the folder name).
        ctranslate2: the quantization of a CTranslate2 export in the folder's `ctranslate2/` subfolder, which the
            card then explains how to use; None: no such section.
    """
    config_path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(
            f"write_model_card: model_dir={model_dir!r} has no config.json; pass a folder written by save_pretrained."
        )
    config = _read_json(config_path)
    generation = _read_json(os.path.join(model_dir, "generation_config.json")) or {}
    readme_path = os.path.join(model_dir, "README.md")
    previous = (metadata_load(readme_path) or {}) if os.path.isfile(readme_path) else {}

    metrics = _record_metrics(model_dir, metrics)
    recipe = _record_recipe(model_dir, training_args)
    languages = previous.get("language") or []
    languages = [source_lang or _item(languages, 0), target_lang or _item(languages, 1)]
    source_lang, target_lang = languages
    dataset_name = dataset_name or _item(previous.get("datasets") or [], 0) or _previous_dataset_name(previous)
    license = license or previous.get("license") or DEFAULT_LICENSE
    repo_id = repo_id or os.path.basename(os.path.abspath(model_dir))
    model_name = repo_id.split("/")[-1]

    results = _eval_results(metrics, dataset_name, source_lang, target_lang)
    card_data = ModelCardData(
        language=[lang for lang in languages if lang] or None,
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        datasets=[dataset_name] if _is_hub_id(dataset_name) else None,
        metrics=sorted({result.metric_type for result in results}) or None,
        tags=["translation", "vanilla-transformer", "encoder-decoder", "attention-is-all-you-need", "custom_code"],
        model_name=model_name,
        eval_results=results or None,
    )
    pair = f" from {source_lang} to {target_lang}" if source_lang and target_lang else ""
    example = EXAMPLES.get(source_lang or "", "A sentence to translate.")
    sections = [
        f"---\n{card_data.to_yaml()}\n---",
        f"# {model_name}",
        f'Translation{pair} with the encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., '
        "2017), implemented from scratch as a native transformers model by the `vanilla-transformer` package"
        + (f", trained on `{dataset_name}`." if dataset_name else "."),
        _architecture(config, _count_parameters(model_dir)),
        _recipe(recipe),
        _evaluation(metrics),
        _decoding(generation),
        _usage(repo_id, example),
        _ctranslate2_usage(repo_id, example, ctranslate2),
    ]
    with open(readme_path, "w", encoding="utf-8") as f:
        f.write("\n\n".join(section for section in sections if section) + "\n")
    return readme_path


def _read_json(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def _is_hub_id(name: str | None) -> bool:
    """`datasets` metadata takes Hub dataset ids ("wmt14", "org/name"); a file path or a description goes elsewhere."""
    return bool(name) and re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) is not None


def _previous_dataset_name(previous: dict) -> str | None:
    # a dataset that is not a Hub id survives in the model-index, the only place the metadata has for it
    try:
        name = previous["model-index"][0]["results"][0]["dataset"]["name"]
    except (KeyError, IndexError, TypeError):
        return None
    return None if name == "custom data" else name


def _item(values: Any, index: int) -> Any:
    values = [values] if isinstance(values, str) else list(values)
    return values[index] if index < len(values) else None


def _record_metrics(model_dir: str, metrics: dict[str, Any] | None) -> dict[str, float]:
    path = os.path.join(model_dir, RESULTS_FILE)
    recorded = _read_json(path) or {}
    if metrics:
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        recorded.update(numbers)
        _write_json(path, recorded)
    return recorded


def _record_recipe(model_dir: str, training_args: Any | None) -> dict[str, Any]:
    path = os.path.join(model_dir, TRAINING_ARGS_FILE)
    if training_args is None:
        return _read_json(path) or {}
    values = training_args.to_dict() if hasattr(training_args, "to_dict") else dict(training_args)
    recipe = {key: values[key] for key, _ in RECIPE if key in values}
    recipe = json.loads(json.dumps(recipe, default=str))  # enums and the like as plain JSON
    _write_json(path, recipe)
    return recipe


def _split_metric(key: str) -> tuple[str | None, str]:
    prefix, _, name = key.partition("_")
    return (SPLITS[prefix], name) if prefix in SPLITS and name else (None, key)


def _eval_results(
    metrics: dict[str, float], dataset_name: str | None, source_lang: str | None, target_lang: str | None
) -> list[EvalResult]:
    results = []
    for key, value in sorted(metrics.items()):
        split, name = _split_metric(key)
        if split in (None, "train") or name.lower() not in QUALITY_METRICS or not math.isfinite(value):
            continue
        results.append(
            EvalResult(
                task_type="translation",
                task_name=f"Translation {source_lang or '?'} to {target_lang or '?'}",
                dataset_type=dataset_name if _is_hub_id(dataset_name) else "custom",
                dataset_name=dataset_name or "custom data",
                dataset_split=split,
                metric_type=name.lower(),
                metric_name=f"{split.capitalize()} {QUALITY_METRICS[name.lower()]}",
                metric_value=round(value, 4),
            )
        )
    return results


def _count_parameters(model_dir: str) -> int | None:
    """Count the stored parameters from the tensor shapes that safetensors reads from the file headers, without
    loading the tensors (tied matrices are stored, and counted, once); None when a weights file is missing."""
    index = _read_json(os.path.join(model_dir, "model.safetensors.index.json"))
    files = sorted(set(index["weight_map"].values())) if index else ["model.safetensors"]
    total = 0
    for name in files:
        path = os.path.join(model_dir, name)
        if not os.path.isfile(path):
            return None
        with safe_open(path, framework="pt") as f:
            total += sum(math.prod(f.get_slice(key).get_shape()) for key in f.keys())
    return total


def _table(rows: list[tuple[str, Any]], header: tuple[str, str]) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    return "\n".join(lines + [f"| {name} | {value} |" for name, value in rows])


def _architecture(config: dict, parameters: int | None) -> str:
    c = config.get
    size = next(
        (f" (the paper's {name} model)" for name, values in PAPER_MODELS.items() if _matches(config, values)), ""
    )
    vocab = f"{c('vocab_size')} (shared source/target)"
    if not c("share_encoder_decoder_embeddings", True):
        vocab = f"{c('vocab_size')} source, {c('decoder_vocab_size')} target"
    rows = [
        ("parameters", f"{parameters:,}" if parameters is not None else "unknown"),
        ("layers (encoder + decoder)", f"{c('encoder_layers')} + {c('decoder_layers')}"),
        ("d_model", c("d_model")),
        ("feed-forward width d_ff (encoder / decoder)", f"{c('encoder_ffn_dim')} / {c('decoder_ffn_dim')}"),
        ("attention heads (encoder / decoder)", f"{c('encoder_attention_heads')} / {c('decoder_attention_heads')}"),
        ("activation", c("activation_function")),
        (
            "dropout (residual / attention / activation)",
            _slash(c, "dropout", "attention_dropout", "activation_dropout"),
        ),
        ("positions", f"{c('position_embedding_type')}, max {c('max_position_embeddings')}"),
        ("normalization", "pre-norm" if c("normalize_before") else "post-norm (as in the paper)"),
        ("vocabulary", vocab),
        ("embeddings scaled by √d_model", c("scale_embedding")),
        ("output projection tied to embeddings", c("tie_word_embeddings")),
        (
            "ids: pad / bos / eos / decoder start",
            _slash(c, "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"),
        ),
    ]
    return f"## Architecture{size}\n\nFrom `config.json`:\n\n" + _table(rows, ("", "value"))


def _matches(config: dict, values: dict) -> bool:
    return all(config.get(key) == value for key, value in values.items())


def _slash(get, *keys: str) -> str:
    return " / ".join(str(get(key)) for key in keys)


def _recipe(recipe: dict[str, Any]) -> str:
    labels = dict(RECIPE)
    recipe = {key: value for key, value in recipe.items() if key in labels and value not in (None, {})}
    # Trainer stops at max_steps when it is set, whatever the number of epochs
    recipe.pop("num_train_epochs" if recipe.get("max_steps", -1) > 0 else "max_steps", None)
    rows = [(labels[key], f"`{value}`") for key, value in recipe.items()]
    if not rows:
        return "## Training\n\nThe training arguments of this checkpoint were not recorded."
    return "## Training\n\nThe `Seq2SeqTrainingArguments` of the run:\n\n" + _table(rows, ("hyperparameter", "value"))


def _evaluation(metrics: dict[str, float]) -> str:
    if not metrics:
        return "## Evaluation\n\nNo evaluation results were recorded."
    rows = []
    for key, value in sorted(metrics.items()):
        split, name = _split_metric(key)
        shown = f"{value:.4g}" if isinstance(value, float) else value
        rows.append((f"{split} {name}" if split else name, shown))
    return "## Evaluation\n\nFrom `all_results.json`:\n\n" + _table(rows, ("metric", "value"))


def _decoding(generation: dict) -> str:
    rows = [(key, f"`{generation[key]}`") for key in DECODING if generation.get(key) is not None]
    if not rows:
        return ""
    return (
        "## Decoding\n\n`generation_config.json`, used by `generate()` and the pipeline unless overridden:\n\n"
        + _table(rows, ("parameter", "value"))
    )


def _ctranslate2_usage(repo_id: str, example: str, quantization: str | None) -> str:
    if not quantization:
        return ""
    return f"""## Fast inference with CTranslate2

`{CTRANSLATE2_FOLDER}/` holds this model exported to [CTranslate2](https://github.com/OpenNMT/CTranslate2) with
{quantization} weights, with its tokenizer and generation config: several times `generate()`'s speed on CPU, for the
same translations (float32) or nearly the same (int8). With `pip install 'vanilla-transformer[ctranslate2]'`:

```python
import os
from huggingface_hub import snapshot_download
from vanilla_transformer.inference.ctranslate2 import load_ctranslate2_translator

folder = snapshot_download("{repo_id}", allow_patterns=["{CTRANSLATE2_FOLDER}/*"])
translator = load_ctranslate2_translator(os.path.join(folder, "{CTRANSLATE2_FOLDER}"))
print(translator.translate(["{example}"]))
```

or from the command line, `python scripts/translate.py --engine ctranslate2 --model_dir <that folder> --text "..."`.
Sources longer than the exported position table (`max_positions` in `vanilla_transformer_ctranslate2.json`) are
refused."""


def _usage(repo_id: str, example: str) -> str:
    return f"""## Usage

The repository holds the model code (`configuration_vanilla_transformer.py`, `modeling_vanilla_transformer.py`) and
the translation pipeline (`pipeline_vanilla_transformer.py`), so it loads with plain transformers and
`trust_remote_code=True`; nothing else needs to be installed:

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
model = AutoModelForSeq2SeqLM.from_pretrained("{repo_id}", trust_remote_code=True)
inputs = tokenizer(["{example}"], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**inputs), skip_special_tokens=True))
```

With the `vanilla-transformer` package installed, importing it registers the model with the Auto classes, and the
package's own code is used (no `trust_remote_code` needed):

```python
import vanilla_transformer  # noqa: F401
from transformers import AutoModelForSeq2SeqLM

model = AutoModelForSeq2SeqLM.from_pretrained("{repo_id}")
```

transformers 5 has no built-in translation pipeline any more; this repository declares its own (`custom_pipelines` in
`config.json`):

```python
from transformers import pipeline

translator = pipeline("translation", model="{repo_id}", trust_remote_code=True)
print(translator("{example}"))  # [{{'translation_text': '...'}}]
```

`config.json` maps `AutoConfig`, `AutoModel`, `AutoModelForSeq2SeqLM` and `AutoModelForSequenceClassification` to the
model code, so each of them loads this checkpoint with `trust_remote_code=True`."""
