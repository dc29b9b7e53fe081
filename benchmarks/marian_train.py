#!/usr/bin/env python
"""train.py with transformers' MarianMTModel in place of this project's model: Marian in the project's recipe.

Everything but the model is train.py's (its flags, defaults, tokenizer, token batches, time budget, schedule,
evaluation); the model is OPUS-MT's architecture (`anchor.marian_config`: swish, scaled embeddings, sinusoidal
positions, init std 0.02) at the size of train.py's preset (`--preset`, default compact), started from the tokenizer's
bos as train.py requires (OPUS-MT starts from pad). MarianMTModel takes no `label_smoothing` (it has no `loss_path`),
so the trainer smooths its logits with Trainer's `LabelSmoother`, the same loss as ours computed the stock way. Set
against `recipe.py`'s run of train.py at the same size, seed and CPU time, it separates what the recipe gives from
what the model gives:

    OMP_NUM_THREADS=1 python benchmarks/run.py recipe --model marian --data_dir data/en-fr \
        --output_dir outputs/marian-recipe --max_train_minutes 6 -- --seed 42 --threads 1

On the French corpus Marian did best with `--vocab_size 4000 --max_tokens_per_batch 512 --learning_rate 1e-3`: ahead
of train.py's bf16 batch and rate at 6, 24 and 48 minutes, level at 12 (AMD EPYC, 2026-12-06: docs/results.md).

`--config_name` and `--config_overrides` (fields of our config) are refused; `--model_name_or_path` is train.py's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from anchor import marian_config  # noqa: E402
from transformers import MarianConfig, MarianMTModel  # noqa: E402

from vanilla_transformer.inference.loading import check_tokenizer_matches_config  # noqa: E402
from vanilla_transformer.training import recipe  # noqa: E402
from vanilla_transformer.training.data import DataError  # noqa: E402
from vanilla_transformer.training.presets import PRESETS  # noqa: E402


def train_marian(argv: list[str] | None, config_for: Callable) -> dict:
    """train.py with `MarianMTModel(config_for(model_args, tokenizer))` in place of a fresh model of ours (a
    --model_name_or_path still loads as train.py loads it). The decoder starts from the tokenizer's bos, as train.py
    requires (OPUS-MT starts from pad)."""

    def build_marian(model_args, tokenizer, tokenizer_source):
        if model_args.model_name_or_path is not None:
            return recipe.build_model(model_args, tokenizer, tokenizer_source)
        config = config_for(model_args, tokenizer)
        config.decoder_start_token_id = config.bos_token_id = tokenizer.bos_token_id
        model = MarianMTModel(config)
        check_tokenizer_matches_config(tokenizer, model.config, tokenizer_source)
        return model

    return recipe.main(argv, model_builder=build_marian)


def preset_config(model_args, tokenizer) -> MarianConfig:
    """OPUS-MT's architecture at the size of train.py's --preset."""
    if model_args.config_name or model_args.config_overrides:
        raise DataError("marian_train: --config_name/--config_overrides set our config's fields")
    size = {**PRESETS[model_args.preset]["config"], "max_position_embeddings": 512}
    return marian_config(len(tokenizer), size, pad=tokenizer.pad_token_id, eos=tokenizer.eos_token_id)


def main(argv: list[str] | None = None) -> dict:
    return train_marian(argv, preset_config)


if __name__ == "__main__":
    main()
