"""The private methods of transformers' `Trainer` and `TrainingArguments` that the workarounds override, in one place:
`TranslationTrainer` and `TranslationTrainingArguments` inherit these mixins, so that the rest of the toolkit uses
public hooks only. Each override calls one named workaround module (its docstring says the limit, the version it was
written for and how to tell that it can go); tests/test_workarounds.py checks that the methods still exist, with the
parameters passed on, where the library still calls them."""

from __future__ import annotations

from functools import cached_property

import torch

from . import (
    torch_fsdp_aliased_module_load,
    torch_fsdp_class_swap,
    torch_fsdp_gathered_ties,
    transformers_ddp_timeout_on_cpu,
    transformers_resume_past_the_end,
    transformers_tied_names_missing_on_resume,
)


class TrainerOverrides:
    """Mixin for a `Seq2SeqTrainer` subclass (listed before it): the Trainer's private methods the workarounds
    override."""

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        # under FSDP, `state_dict` is the gathered full one
        if state_dict is not None:
            state_dict = torch_fsdp_gathered_ties.share_tied_tensors(state_dict, self.model)
        with torch_fsdp_class_swap.model_class_unwrapped(self.model):
            super()._save(output_dir, state_dict=state_dict)

    def _run_epoch(self, *args, **kwargs):
        if transformers_resume_past_the_end.stop_if_finished(self):
            return
        return super()._run_epoch(*args, **kwargs)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        if not torch_fsdp_aliased_module_load.load_in_trainer(self, resume_from_checkpoint, model):
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _issue_warnings_after_load(self, load_result) -> None:
        load_result = transformers_tied_names_missing_on_resume.drop_loaded_tied_names(load_result, self.model)
        super()._issue_warnings_after_load(load_result)


class TrainingArgumentsOverrides:
    """Mixin for a `TrainingArguments` subclass (listed before it): the private cached property the CPU process-group
    timeout overrides."""

    @cached_property
    def _setup_devices(self) -> torch.device:
        transformers_ddp_timeout_on_cpu.init_cpu_process_group(self)  # so that --ddp_timeout holds on CPU too
        return super()._setup_devices
