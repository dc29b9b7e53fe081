"""Which parallelism a run uses, and what cannot run where.

`accelerate launch --use_fsdp` (or transformers' `--fsdp` flags) shards the model on GPUs; on CPU processes Accelerate
turns FSDP off (it keeps it for accelerators) and would train them with plain data parallelism without a word, so
`check_parallelism_can_run` refuses it there, as it refuses DeepSpeed: CPU processes train with DDP (`accelerate
launch --multi_gpu`). The tests run the FSDP2 paths on CPU processes all the same, with a test-only patch
(tests/fsdp_on_cpu.py). `describe_parallelism` reads the Accelerate state after set-up, and
`ParallelismReportCallback` counts the modules that FSDP actually wrapped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from transformers import TrainerCallback, TrainingArguments

if TYPE_CHECKING:
    from accelerate import Accelerator


def requested_fsdp_version(args: TrainingArguments) -> int | None:
    """The FSDP version the launch asked for: transformers' `--fsdp` flags (`args.fsdp_plugin_args`, default 2) first,
    else `accelerate launch --use_fsdp` (FSDP_VERSION, whose default is 1); None when neither asked for FSDP."""
    plugin_args = getattr(args, "fsdp_plugin_args", None)
    if plugin_args is not None:
        return int(plugin_args.get("fsdp_version", 2))
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("true", "1", "yes"):
        return int(os.environ.get("FSDP_VERSION", "1"))
    return None


def check_parallelism_can_run(args: TrainingArguments) -> None:
    """Refuse, before Accelerate is set up, sharding that cannot run on CPU processes, instead of training without it:

    - FSDP (`accelerate launch --use_fsdp`, transformers' `--fsdp`): Accelerate turns it on for accelerators only, so
      CPU processes would train with plain DDP (FSDP1's plugin even looks for a GPU and fails). FSDP shards a model
      whose weights, gradients and Adam state do not fit one device; CPU processes train with DDP.
    - DeepSpeed (`--deepspeed`, `accelerate launch --use_deepspeed`): Accelerate turns it on only off the CPU, so the
      processes would train with plain DDP; with the CPU left out of their set-up, DeepSpeed's CPU accelerator
      counts 2 ranks where Accelerate counts 1 and stops on its batch-size check."""
    if torch.accelerator.is_available():
        return
    version = requested_fsdp_version(args)
    if version is not None:
        raise ValueError(
            f"FSDP (version {version}) cannot run on CPU processes: Accelerate turns it on for accelerators only and "
            "would train them with plain DDP; launch them with `accelerate launch --multi_gpu` (DDP), or shard on GPUs."
        )
    if getattr(args, "deepspeed", None) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        raise ValueError(
            "DeepSpeed cannot run on CPU processes (Accelerate turns it on only on GPUs, and they would train with "
            "plain DDP); launch them with `accelerate launch --multi_gpu` (DDP), or shard on GPUs."
        )


def describe_parallelism(accelerator: Accelerator) -> str:
    """One phrase naming the parallelism the Accelerate state holds: single process, DDP, FSDP (version, sharding,
    wrapped layers, state dict type) or DeepSpeed (ZeRO stage), with the number of processes and the backend."""
    from accelerate.utils import DistributedType

    state = accelerator.state
    processes = state.num_processes
    device = state.device.type
    where = f"{processes} process{'es' if processes != 1 else ''}, {state.backend or 'no backend'} on {device}"
    kind = state.distributed_type
    if kind == DistributedType.FSDP:
        plugin = state.fsdp_plugin
        if plugin.fsdp_version == 2:
            sharding = "full shard" if plugin.reshard_after_forward else "shard grad op (no reshard after forward)"
        else:
            sharding = str(plugin.sharding_strategy).split(".")[-1]
        policy = getattr(plugin.auto_wrap_policy, "__name__", None) or getattr(
            getattr(plugin.auto_wrap_policy, "func", None), "__name__", "no auto-wrap"
        )
        layers = plugin.transformer_cls_names_to_wrap
        wrap = f"wrapping {', '.join(layers)}" if layers else policy.replace("_", " ")
        state_dict = str(plugin.state_dict_type).split(".")[-1]
        return f"FSDP{plugin.fsdp_version} ({sharding}, {wrap}, {state_dict}) over {where}"
    if kind == DistributedType.DEEPSPEED:
        return f"DeepSpeed ZeRO stage {state.deepspeed_plugin.zero_stage} over {where}"
    if kind == DistributedType.NO or processes == 1:
        return f"single process on {device}"
    return f"DDP over {where}"


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """{alias: name} for every state-dict name that holds the same tensor as an earlier one, found from the model's
    structure rather than its `_tied_weights_keys` (which transformers 5 reads as ties to make on load): a second
    path to the same module (`model.encoder.embeddings.embed_tokens.weight` when that embedding is the module
    `model.shared`), or a parameter tied to another (`lm_head.weight`)."""
    first: dict[int, str] = {}
    aliases = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        if id(tensor) in first:
            aliases[name] = first[id(tensor)]
        else:
            first[id(tensor)] = name
    return aliases


def count_fsdp_modules(model: torch.nn.Module) -> dict[str, int]:
    """How many modules of each class FSDP2 wrapped (`fully_shard`; a tied embedding and output projection share one
    unit); empty when it wrapped none."""
    from torch.distributed.fsdp import FSDPModule

    counts: dict[str, int] = {}
    for module in model.modules():
        if isinstance(module, FSDPModule):
            name = type(module).__name__.removeprefix("FSDP")
            counts[name] = counts.get(name, 0) + 1
    return counts


def local_parameter_share(model: torch.nn.Module) -> tuple[int, int]:
    """(elements this process holds, elements of the whole model) over the model's distinct parameters: equal
    without sharding, about 1/N of it with FSDP over N processes."""
    local = total = 0
    for parameter in model.parameters():  # each shared parameter once
        total += parameter.numel()
        to_local = getattr(parameter, "to_local", None)
        local += to_local().numel() if to_local is not None else parameter.numel()
    return local, total


class ParallelismReportCallback(TrainerCallback):
    """Prints, on the main process when training starts, what FSDP did to the model: the modules it wrapped and the
    share of the parameters process 0 holds, so a run shows that sharding took effect."""

    def __init__(self, print_fn: Callable[[str], None] = print):
        self.print_fn = print_fn

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None or not state.is_world_process_zero:
            return
        wrapped = count_fsdp_modules(model)
        if not wrapped:
            return
        local, total = local_parameter_share(model)
        listed = ", ".join(f"{count} {name}" for name, count in wrapped.items())
        self.print_fn(
            f"FSDP wrapped {sum(wrapped.values())} modules ({listed}); "
            f"process 0 holds {local:,} of the {total:,} parameters ({100 * local / max(1, total):.0f} %)"
        )
