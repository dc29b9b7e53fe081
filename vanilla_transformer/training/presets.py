"""Model presets (small, compact, base, big) and the paper's decoding defaults: a fresh model's config and the
training defaults that each preset brings."""

from __future__ import annotations

import os

from transformers import GenerationConfig

from ..configuration_vanilla_transformer import VanillaTransformerConfig

# Each preset: the model (VanillaTransformerConfig fields), the tokenizer's vocabulary size when train.py trains one,
# the default longest source/target in tokens, training defaults that replace TranslationTrainingArguments' defaults
# unless given on the command line, and optionally whether to train in bf16 on a CPU that multiplies it natively.
# Learning rates follow the paper's schedule lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (§5.3), whose
# peak, reached at the end of warmup, is d_model^-0.5 * warmup^-0.5: 7e-4 for base and 4.9e-4 for big (warmup 4000).
PRESETS: dict[str, dict] = {
    "small": {
        "description": "a small model for the built-in demo corpus; learns it in about two minutes on 2 CPU cores",
        "config": {
            "d_model": 128,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 512,
            "decoder_ffn_dim": 512,
            "dropout": 0.1,
            "max_position_embeddings": 256,
        },
        # 400 entries leave ~140 merges after the 256 bytes: German numbers split into pieces like "drei", "tausend",
        # "ein", "undsiebzig", so that the model has to reorder units and tens itself
        "vocab_size": 400,
        "max_length": 64,
        "training": {
            # measured over 8 seeds on 2 CPU cores (2026-11): test BLEU 98.5-100 on every seed; 6 epochs at 2e-3
            # let one seed fall to 89.4 % exact match
            "learning_rate": 1e-3,
            "warmup_steps": 200,
            "num_train_epochs": 15,
            "per_device_train_batch_size": 64,
            "per_device_eval_batch_size": 128,
            "logging_steps": 50,
            "save_strategy": "epoch",
            "save_total_limit": 5,
        },
    },
    "compact": {
        "description": "the default for your own data: d_model 256, 3+3 layers, 4 heads, d_ff 1024, no dropout, an "
        "8000-token vocabulary, token batches and a linear decay; trains a strong translator from tens of thousands of "
        "pairs on a CPU (docs/training.md)",
        "config": {
            "d_model": 256,
            "encoder_layers": 3,
            "decoder_layers": 3,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 1024,
            "decoder_ffn_dim": 1024,
            # no dropout: runs of minutes to an hour on a CPU see a small corpus a few times and underfit; measured
            # on the French corpus (docs/results.md), P_drop 0.1 cost about 4 validation BLEU at 6 minutes
            "dropout": 0.0,
        },
        "vocab_size": 8000,
        "max_length": 256,
        # where the CPU multiplies bf16 in hardware (either feature of cpu.native_bf16_matmul) and train.py runs as one
        # process without an accelerator, unless --bf16, --fp16 or --use_cpu is given, these replace the training
        # defaults below. bf16 autocast: on the French corpus a step ran about 1.6x faster; per step it learned less
        # (one seed), but in the same 6 minutes it gained 8.4 test BLEU over float32. A 1,024-token step costs about
        # 1.5x a 512-token one with AMX and 1.6x with AVX-512 BF16 alone; with the peak learning rate raised by about
        # sqrt(2) it gained validation BLEU with AMX on every seed at 6 and 12 minutes (at 24, against 1,024 tokens at
        # 1e-3, it lost 0.75 on the one seed run side by side), and with AVX-512 BF16 alone (an AMD EPYC) on the
        # 3-seed means at 6, 12 and 24 minutes (+1.2, +1.9, +0.9). There 512 tokens at 1.5e-3 gained more at 6
        # minutes but lost at 12 and 24 (docs/results.md)
        "native_bf16_cpu": {"bf16": True, "max_tokens_per_batch": 1024, "learning_rate": 1.5e-3},
        # measured on a 57k-pair English-French corpus against Marian's recipe: see docs/results.md
        "training": {
            "learning_rate": 1e-3,
            # 400 warmup steps took a third of a 6-minute run; 200 gained about 5 validation BLEU there and 2 at 12
            # minutes; 100 lost at 12 minutes, and 50 (or 100 with a peak of 2e-3) diverged (docs/results.md)
            "warmup_steps": 200,
            "lr_scheduler_type": "linear",
            "max_tokens_per_batch": 512,
            "per_device_eval_batch_size": 64,
            "save_steps": 1000,
            "save_total_limit": 3,
        },
    },
    "base": {
        "description": "the paper's base model (Table 3): d_model 512, 6+6 layers, 8 heads, d_ff 2048, dropout 0.1",
        "config": {},  # VanillaTransformerConfig's defaults are the base model
        "vocab_size": 37000,  # §5.1: a shared source-target vocabulary of about 37000 tokens (WMT En-De)
        "max_length": 256,
        "training": {"learning_rate": 7e-4, "warmup_steps": 4000, "per_device_train_batch_size": 64},
    },
    "big": {
        "description": "the paper's big model (Table 3): d_model 1024, 6+6 layers, 16 heads, d_ff 4096, dropout 0.3",
        "config": {
            "d_model": 1024,
            "encoder_attention_heads": 16,
            "decoder_attention_heads": 16,
            "encoder_ffn_dim": 4096,
            "decoder_ffn_dim": 4096,
            "dropout": 0.3,
        },
        "vocab_size": 37000,
        "max_length": 256,
        "training": {"learning_rate": 4.9e-4, "warmup_steps": 4000, "per_device_train_batch_size": 32},
    },
}


def apply_config_overrides(config: VanillaTransformerConfig, overrides: str | None) -> VanillaTransformerConfig:
    """Apply `"d_model=64,dropout=0.2,position_embedding_type=learned"` to `config` with transformers'
    `PreTrainedConfig.update_from_string` (as run_translation.py's `--config_overrides`: each value is read as the type
    of the field's current value, booleans as true/false), then run the config's checks again. A key the config lacks
    or a value of the wrong kind raises ValueError naming the item; a value the config refuses raises huggingface_hub's
    StrictDataclassError, as at construction."""
    for item in filter(None, (part.strip() for part in (overrides or "").split(","))):
        if item.count("=") != 1:
            raise ValueError(f"--config_overrides: {item!r} is not of the form key=value.")
        try:
            config.update_from_string(item)
        except (ValueError, TypeError, AttributeError) as error:  # an unknown key, a value not of the field's type
            raise ValueError(f"--config_overrides: {item!r}: {error}.") from None
    config.validate()
    return config


def build_config(
    preset: str | None = None,
    config_name: str | None = None,
    overrides: str | None = None,
    vocab_size: int | None = None,
) -> VanillaTransformerConfig:
    """A fresh model's config: from a JSON file/folder (`config_name`) or a preset, then `overrides` (the
    `--config_overrides` string, see `apply_config_overrides`); `vocab_size` (the tokenizer's) replaces the config's
    unless the config already holds that many entries."""
    if config_name is not None:
        if not os.path.exists(config_name):
            raise ValueError(f"--config_name {config_name!r} does not exist.")
        if os.path.isdir(config_name):
            config = VanillaTransformerConfig.from_pretrained(config_name)
        else:
            config = VanillaTransformerConfig.from_json_file(config_name)
        fields = config.to_dict()
    else:
        if preset not in PRESETS:
            raise ValueError(f"--preset {preset!r} is unknown; allowed: {', '.join(PRESETS)}.")
        fields = dict(PRESETS[preset]["config"])
    if config_name is None and vocab_size is not None:
        # a preset's vocabulary is the tokenizer's; a config file's is what the user wrote (checked against it later)
        fields["vocab_size"] = fields["decoder_vocab_size"] = vocab_size
    fields.pop("model_type", None)
    fields.pop("transformers_version", None)
    return apply_config_overrides(VanillaTransformerConfig(**fields), overrides)


def default_generation_config(config, num_beams: int = 4, max_length: int = 257) -> GenerationConfig:
    """Beam search as in the paper (§6.1: beam size 4); `max_length` counts the decoder start token. Beam search
    stops by transformers' default rule (`early_stopping=False`: when no running beam can still beat the finished
    ones), not at the first `num_beams` finished hypotheses (`True`), which can return a short, broken hypothesis
    while a running beam would have scored better: a demo training decoded 40 % of its test set exactly with `True`
    and 100 % with `False`."""
    return GenerationConfig(
        num_beams=num_beams,
        max_length=max_length,
        early_stopping=False,
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
