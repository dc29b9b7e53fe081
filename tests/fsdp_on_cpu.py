"""Test setup: FSDP2 on CPU processes, which Accelerate drops and the toolkit refuses, so that the multi-process tests
run the FSDP2 code paths (sharded training, saving, resuming) on the CPU processes this machine has.

Accelerate turns FSDP on for accelerators only: on CPU processes in a gloo group its state stays MULTI_CPU (plain data
parallelism) and the FSDP plugin is dropped, and the toolkit refuses such a launch in one line
(`sharding.check_parallelism_can_run`). PyTorch's FSDP2 (`fully_shard`) itself runs on CPU tensors over gloo, so
`enable()`, called by the tests' launchers before the recipe runs, lets `TranslationTrainer` put the plugin back into
the Accelerate state after its set-up, as Accelerate does on GPUs (including its private
`PartialState._shared_state["distributed_type"]`, which every later `AcceleratorState()` copies over its own), then
tells the Trainer (`is_fsdp_enabled`) and makes the check transformers makes when Accelerate keeps the plugin itself.
Accelerate's and the Trainer's usual FSDP2 paths apply from there. FSDP1 and DeepSpeed are still refused.

Written for Accelerate 1.15 (checked with 1.16.0). tests/test_sharding.py's
`test_accelerate_still_drops_fsdp_on_cpu_processes` fails when Accelerate keeps FSDP on CPU processes, and
`test_the_fsdp_type_holds_only_through_accelerates_shared_state` when the private state written here changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformers import Seq2SeqTrainer, TrainingArguments

from vanilla_transformer.training import recipe
from vanilla_transformer.training.sharding import check_parallelism_can_run, requested_fsdp_version
from vanilla_transformer.training.trainer import TranslationTrainer

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import Trainer


def enable() -> None:
    """Make the recipe and `TranslationTrainer` run FSDP2 on CPU processes when the launch asks for it (see the
    module's docstring); FSDP1 and DeepSpeed are refused as before."""

    def check_all_but_fsdp2(args: TrainingArguments) -> None:
        if requested_fsdp_version(args) != 2:
            check_parallelism_can_run(args)

    def create_accelerator_and_postprocess(self) -> None:
        check_all_but_fsdp2(self.args)
        Seq2SeqTrainer.create_accelerator_and_postprocess(self)
        enable_in_trainer(self)

    recipe.check_parallelism_can_run = check_all_but_fsdp2  # the recipe checks before it reads the data
    TranslationTrainer.create_accelerator_and_postprocess = create_accelerator_and_postprocess


def enable_fsdp_on_cpu(accelerator: Accelerator, args: TrainingArguments) -> bool:
    """Turn FSDP2 on for CPU processes in a gloo group when the launch asked for it and Accelerate dropped it (see
    the module's docstring). Returns True when it did."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    if state.distributed_type != DistributedType.MULTI_CPU or requested_fsdp_version(args) is None:
        return False
    plugin_args = getattr(args, "fsdp_plugin_args", None)
    plugin = FullyShardedDataParallelPlugin(**(plugin_args or {}))  # else from the FSDP_* environment
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    # as Accelerate does on GPUs: every later AcceleratorState() copies the process state's type over its own
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return True


def enable_in_trainer(trainer: Trainer) -> bool:
    """`enable_fsdp_on_cpu` for a Trainer whose accelerator is set up, and what transformers does after it when
    Accelerate keeps the plugin itself: `is_fsdp_enabled`, and refusing FSDP's and the Trainer's activation
    checkpointing together. Returns True when it turned FSDP on."""
    if not enable_fsdp_on_cpu(trainer.accelerator, trainer.args):
        return False
    trainer.is_fsdp_enabled = True
    # the check transformers makes when Accelerate keeps the plugin itself
    if trainer.accelerator.state.fsdp_plugin.activation_checkpointing and trainer.args.activation_checkpointing:
        raise ValueError(
            "FSDP's activation checkpointing (fsdp_activation_checkpointing) and --gradient_checkpointing "
            "(--activation_checkpointing) both checkpoint the layers; choose one."
        )
    return True
