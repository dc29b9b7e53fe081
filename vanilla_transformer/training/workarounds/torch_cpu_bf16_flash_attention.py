"""Workaround for torch 2.13: on a CPU, SDPA sends bf16 attention to its flash-attention kernel, whose backward in
bf16 is several times slower than the same attention written as two products and a softmax.

Written for torch 2.13.0 (CPU build, installed).

The limit: `torch.nn.functional.scaled_dot_product_attention` on a CPU runs bf16 inputs (autocast included) through
`_scaled_dot_product_flash_attention_for_cpu`; at a translation model's lengths its bf16 backward dominates a
training step (docs/performance.md#why-bf16-the-eager-attention-and-kernel-caches).

The workaround (`attention_for_training`): where train.py trains on a CPU in bf16 and no `--attn_implementation` is
given, the model trains with "eager", set by transformers' `set_attn_implementation`. Decoding has no backward pass,
and there SDPA is the faster one: so once training is over, the model decodes with the implementation it had
before (evaluations during training keep the training one). The choice is not saved:
config.json holds no attention implementation, so the saved model loads with transformers' default.

It can go when torch sends CPU bf16 attention elsewhere, or when that kernel's bf16 backward is as fast as "eager":
tests/test_workarounds.py's `test_torch_still_runs_cpu_bf16_attention_through_the_flash_kernel` fails on the first;
`python benchmarks/run.py model_speed --sizes small --dtype bf16 --rows train_ls --attn_implementation sdpa` against
the same with `eager` measures the second.
"""

from __future__ import annotations

from transformers import TrainingArguments

SLOW_KERNEL = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"


def attention_for_training(given: str | None, training_args: TrainingArguments) -> str | None:
    """The attention implementation to train with: `given` (--attn_implementation) whenever it is given; else "eager"
    for bf16 training on a CPU (the limit above; the arguments' mixed_precision: --bf16 or `accelerate launch
    --mixed_precision bf16`); else None, which keeps the model's own (transformers' default)."""
    if given is not None:
        return given
    if training_args.mixed_precision == "bf16" and training_args.device.type == "cpu":
        return "eager"
    return None
