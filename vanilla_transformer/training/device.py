"""What the device a run finds decides by default, in one place: `decide()` reads the device once and returns the
`DeviceDefaults` that train.py's defaults (precision, TF32, token batch), its start-up line and translate.py's
decoding dtype come from. A flag given always wins over them.

On a GPU that computes in bf16 (CUDA: `torch.cuda.is_bf16_supported`), training runs in bf16 autocast, float32
products in TF32 (compute capability 8.0 or newer: transformers' `--tf32`), a preset that batches by tokens gets a
token batch scaled from the GPU's memory, and translate.py decodes in bf16. On a CPU nothing changes here: bf16 only
where the CPU multiplies it in hardware, train.py runs as one process and the preset asks for it (`compact`); the
CPU's threads (cpu.py), kernel caches and training attention (workarounds/) decide for themselves, from the
training arguments' device."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .cpu import native_bf16_matmul
from .presets import PRESETS

# A token batch per GPU (per side, per accelerator step) of 128 tokens per GiB of the GPU's memory, in multiples of
# 1,024 and at least 2,048: 9,216 on an 80 GB H100, 17,408 on a 141 GB H200, 4,096 on a 40 GB A100. The paper's
# batches held about 25,000 tokens per side over 8 GPUs (§5.1); fairseq's base recipe runs 4,096 per 16 GB GPU in fp16.
# Not yet measured on a GPU against other sizes (docs/training.md).
GPU_TOKENS_PER_GIB = 128
GPU_MIN_TOKENS = 2048

# transformers' precision flags and the device flag: given, the preset's own (float32) defaults stand
PRECISION_FLAGS = {"bf16", "fp16", "use_cpu"}


@dataclass(frozen=True)
class DeviceDefaults:
    """What a run defaults to on its device (`decide`)."""

    device: str  # the torch device type the run computes on: "cpu", "cuda", ...
    name: str  # the GPU's name, or "CPU"
    bf16: bool  # bf16 by default: a GPU that computes in bf16, or a CPU (alone) that multiplies it in hardware
    tf32: bool = False  # float32 products in TF32 (CUDA compute capability 8.0 or newer)
    max_tokens_per_batch: int | None = None  # for a preset that batches by tokens; None keeps the preset's
    cpu_bf16_feature: str | None = None  # a CPU's bf16 feature (cpu.native_bf16_matmul), as the start-up line names

    @property
    def decode_dtype(self) -> torch.dtype | None:
        """translate.py's dtype: bf16 on a GPU that computes in it; elsewhere (CPUs included) None, the dtype the
        model was saved in."""
        return torch.bfloat16 if self.bf16 and self.device != "cpu" else None

    def training_defaults(self, preset: str, given: set[str]) -> dict:
        """The training-argument defaults of `preset` on this device (applied unless the flag is given; `given`: the
        flags given). On a CPU alone that multiplies bf16 in hardware, a preset's ``native_bf16_cpu`` defaults
        (compact: bf16 autocast, with the batch and learning rate measured for it) replace its others, unless a
        precision or device flag is given. On a GPU (without --use_cpu): bf16 unless a precision is given (a flag,
        or `accelerate launch --mixed_precision`), TF32, and the GPU's token batch for a preset that batches by
        tokens."""
        if preset not in PRESETS:
            raise ValueError(f"--preset {preset!r} is unknown; allowed: {', '.join(PRESETS)}.")
        defaults = dict(PRESETS[preset]["training"])
        if self.device == "cpu" or "use_cpu" in given:
            if self.device == "cpu" and self.bf16 and not PRECISION_FLAGS & given:
                # with bf16, train.py's implied_defaults adds --use_cpu, as for a --bf16 given
                defaults.update(PRESETS[preset].get("native_bf16_cpu", {}))
            return defaults
        launcher_precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        if self.bf16 and not PRECISION_FLAGS & given and launcher_precision == "no":
            defaults["bf16"] = True
        if self.tf32:
            defaults["tf32"] = True
        if self.max_tokens_per_batch and "max_tokens_per_batch" in defaults:
            defaults["max_tokens_per_batch"] = self.max_tokens_per_batch
        return defaults

    def describe_precision(self, training_args) -> str:
        """The training precision in a few words, as the start-up line prints it: the autocast the Trainer's
        Accelerator runs (``training_args.mixed_precision``: --bf16, --fp16 or `accelerate launch --mixed_precision`),
        TF32, and on a CPU in bf16 the hardware feature that makes it pay."""
        kind = training_args.mixed_precision
        tf32 = "; float32 products in TF32" if training_args.tf32 else ""
        if kind in (None, "no"):
            return f"float32{tf32}"
        if self.device != "cpu" or kind != "bf16":
            return f"{kind} autocast{tf32}"
        feature = self.cpu_bf16_feature
        why = f"this CPU multiplies bf16 in hardware ({feature})" if feature else "this CPU emulates bf16 products"
        return f"bf16 autocast ({why}; --bf16 false for float32)"


DTYPES = ("float32", "bfloat16", "float16")  # translate.py's --dtype


def decode_dtype(device: str | None = None, given: str | None = None) -> torch.dtype | None:
    """translate.py's dtype on `device` (its --device): `given` (its --dtype, one of `DTYPES`) wins; else the
    device's (``DeviceDefaults.decode_dtype``: bf16 on a GPU that computes in it, else None: as the model was saved)."""
    return getattr(torch, given) if given else decide(device).decode_dtype


def pad_to_multiple_of(training_args) -> int | None:
    """The collator's ``pad_to_multiple_of`` for the precision the Trainer's Accelerator runs
    (``training_args.mixed_precision``): 8 under bf16 or fp16, whose tensor-core kernels want dimensions in multiples
    of 8 (https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/), else none."""
    return 8 if training_args.mixed_precision in ("bf16", "fp16") else None


def gpu_token_batch(memory_bytes: int) -> int:
    """The token batch for a GPU of `memory_bytes` (``GPU_TOKENS_PER_GIB``)."""
    tokens = int(memory_bytes / 2**30 * GPU_TOKENS_PER_GIB) // 1024 * 1024
    return max(GPU_MIN_TOKENS, tokens)


def decide(device: str | None = None) -> DeviceDefaults:
    """The defaults for `device` (a torch device type: translate.py's --device, "cpu" for --use_cpu); default: the
    accelerator if there is one, else the CPU. Reads CUDA's bf16 support, compute capability and memory, or the CPU's
    bf16 feature (for one process: WORLD_SIZE 1)."""
    if device is None:
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        device = accelerator.type if accelerator is not None else "cpu"
    device = torch.device(device).type
    if device == "cpu":
        feature = native_bf16_matmul() if int(os.environ.get("WORLD_SIZE", "1")) == 1 else None
        return DeviceDefaults("cpu", "CPU", bf16=feature is not None, cpu_bf16_feature=feature)
    if device != "cuda":  # other accelerators: transformers' defaults
        return DeviceDefaults(device, device, bf16=False)
    properties = torch.cuda.get_device_properties()
    return DeviceDefaults(
        "cuda",
        properties.name,
        bf16=torch.cuda.is_bf16_supported(),
        tf32=properties.major >= 8,
        max_tokens_per_batch=gpu_token_batch(properties.total_memory),
    )
