"""Workaround for Accelerate: FSDP is turned on only for accelerator devices, not for CPU processes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformers import TrainingArguments

from ..sharding import check_parallelism_can_run, requested_fsdp_version

if TYPE_CHECKING:
    from accelerate import Accelerator


def enable_fsdp_on_cpu(accelerator: Accelerator, args: TrainingArguments) -> bool:
    """Turn FSDP2 on for CPU processes in a gloo group when the launch asked for it and Accelerate dropped it (see
    the module's docstring). Returns True when it did."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU or requested_fsdp_version(args) is None:
        return False
    check_parallelism_can_run(args)
    plugin_args = getattr(args, "fsdp_plugin_args", None)
    plugin = FullyShardedDataParallelPlugin(**(plugin_args or {}))  # else from the FSDP_* environment
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    # as Accelerate does on GPUs: every later AcceleratorState() copies the process state's type over its own
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return True
