"""Tied weights: the token embedding that serves both stacks, and the pre-softmax projection tied to it
(§3.4), load, reload and resume without missing keys, without a parameter left on the meta device, and still tied."""

import copy
import os
from unittest.mock import patch

import pytest
import torch
from conftest import TINY_OVERRIDES, tiny_config, transformers_warnings
from safetensors.torch import save_file
from transformers import PreTrainedModel, set_seed

from vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerForSequenceClassification,
    VanillaTransformerModel,
)
from vanilla_transformer.training import recipe
from vanilla_transformer.training.sharding import tied_names
from vanilla_transformer.training.workarounds.torch_fsdp_gathered_ties import share_tied_tensors

MODEL_CLASSES = [
    VanillaTransformerModel,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerForSequenceClassification,
]
# the config's two tie options: one embedding for both stacks (§3.4), and lm_head tied to the target embedding
TIE_OPTIONS = [
    {},
    {"tie_word_embeddings": False},
    {"share_encoder_decoder_embeddings": False},
    {"share_encoder_decoder_embeddings": False, "tie_word_embeddings": False},
]
CASES = [
    pytest.param(cls, options, id=f"{cls.__name__.removeprefix('VanillaTransformer') or 'Model'}-{'-'.join(options)}")
    for cls in MODEL_CLASSES
    for options in TIE_OPTIONS
]


def groups(model: torch.nn.Module) -> list[set[str]]:
    """The state-dict names that hold one tensor, in groups of two or more."""
    by_tensor: dict[int, set[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_tensor.setdefault(id(tensor), set()).add(name)
    return sorted((names for names in by_tensor.values() if len(names) > 1), key=sorted)


def expected_groups(cls, options: dict) -> list[set[str]]:
    prefix = "" if cls is VanillaTransformerModel else "model."
    shared = options.get("share_encoder_decoder_embeddings", True)
    tied = options.get("tie_word_embeddings", True) and cls is VanillaTransformerForConditionalGeneration
    stacks = {f"{prefix}encoder.embeddings.embed_tokens.weight", f"{prefix}decoder.embeddings.embed_tokens.weight"}
    if shared:
        return [stacks | {f"{prefix}shared.weight"} | ({"lm_head.weight"} if tied else set())]
    return [{"lm_head.weight", f"{prefix}decoder.embeddings.embed_tokens.weight"}] if tied else []


def on_meta(model: torch.nn.Module) -> list[str]:
    return [name for name, tensor in model.state_dict(keep_vars=True).items() if tensor.device.type == "meta"]


@pytest.mark.parametrize(("cls", "options"), CASES)
def test_save_and_reload_is_complete_and_stays_tied(cls, options, tmp_path):
    model = cls(tiny_config(**options)).eval()
    assert groups(model) == expected_groups(cls, options)
    model.save_pretrained(tmp_path)
    reloaded, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"]) == (set(), set())
    assert info["mismatched_keys"] == set() and on_meta(reloaded) == []
    assert groups(reloaded) == expected_groups(cls, options)  # the same tensor under each tied name
    saved, loaded = model.state_dict(), reloaded.state_dict()
    assert saved.keys() == loaded.keys()
    for name in saved:
        assert torch.equal(saved[name], loaded[name]), name


@pytest.mark.parametrize(("cls", "options"), CASES)
def test_no_checkpoint_initialises_every_weight_as_a_fresh_model(cls, options):
    """What transformers' common test_can_init_all_missing_weights checks: loaded from an empty state dict, every
    weight is initialised (none left on meta) and, with the same seed, equal to a model built from the config."""
    config = tiny_config(**options)
    initialize = PreTrainedModel._initialize_weights

    def seeded(self, module, *args, **kwargs):  # the same draws for each module, whatever the order
        set_seed(0)
        initialize(self, module, *args, **kwargs)

    with patch.object(PreTrainedModel, "_initialize_weights", seeded):
        fresh = cls(copy.deepcopy(config))
        loaded = cls.from_pretrained(None, config=copy.deepcopy(config), state_dict={})
    assert on_meta(loaded) == []
    assert groups(loaded) == expected_groups(cls, options)
    loaded_state = loaded.state_dict()
    assert [name for name, value in fresh.state_dict().items() if not torch.equal(value, loaded_state[name])] == []


@pytest.mark.parametrize(("cls", "options"), CASES)
def test_a_checkpoint_without_weights_reports_every_weight_missing(cls, options, tmp_path):
    """What transformers' common test_model_weights_reload_no_missing_tied_weights checks: a checkpoint holding none
    of the weights reports each parameter missing, none ignored and nothing that is not a parameter."""
    cls(tiny_config(**options)).save_pretrained(tmp_path)
    save_file({"tensor": torch.tensor([1, 2])}, os.path.join(tmp_path, "model.safetensors"), metadata={"format": "pt"})
    reloaded, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    names = {name for name, _ in reloaded.named_parameters()} | {name for name, _ in reloaded.named_buffers()}
    missing = set(info["missing_keys"])
    assert names - missing == set()  # the first name of each tensor; its aliases may be reported too
    assert missing - names - set(tied_names(reloaded)) == set()
    assert on_meta(reloaded) == []


@pytest.mark.parametrize(("cls", "options"), CASES)
def test_tied_names_come_from_the_structure(cls, options):
    model = cls(tiny_config(**options))
    order, expected = list(model.state_dict()), {}
    for group in expected_groups(cls, options):
        first = min(group, key=order.index)
        expected.update({alias: first for alias in group - {first}})
    aliases = tied_names(model)
    assert aliases == expected
    # a gathered state dict (FSDP: one copy per name) is one tensor per group again
    gathered = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    shared = share_tied_tensors(gathered, model)
    assert all(shared[alias] is shared[name] for alias, name in aliases.items())


def test_resume_reports_no_missing_keys(tmp_path, caplog):
    """Resuming loads the checkpoint's weights into the model; its tied names are stored once, and are not missing."""

    def args(steps: int) -> list[str]:
        return [
            *("--output_dir", str(tmp_path / "run"), "--do_train", "--max_steps", str(steps), "--threads", "1"),
            *("--max_train_samples", "8", "--per_device_train_batch_size", "4", "--save_strategy", "steps"),
            *("--save_steps", "1", "--config_overrides", TINY_OVERRIDES, "--max_source_length", "16"),
            *("--max_target_length", "16", "--disable_tqdm", "true", "--report_to", "none"),
        ]

    recipe.main(args(1))
    assert (tmp_path / "run" / "checkpoint-1").is_dir()
    with transformers_warnings(caplog):
        recipe.main(args(2) + ["--resume_from_checkpoint", "last"])
    assert (tmp_path / "run" / "checkpoint-2").is_dir()  # it did resume and train
    messages = [record.getMessage() for record in caplog.records]
    assert not [m for m in messages if "missing keys" in m or "unexpected keys" in m], messages


def test_resume_still_reports_a_weight_stored_under_no_name(caplog):
    """The trainer drops a tied name from the report only when the tensor it aliases was loaded."""
    from vanilla_transformer.training.trainer import TranslationTrainer

    model = VanillaTransformerForConditionalGeneration(tiny_config())
    trainer = object.__new__(TranslationTrainer)  # only `model` is read
    trainer.model = model
    stored_once = {name: tensor for name, tensor in model.state_dict().items() if name not in tied_names(model)}
    with transformers_warnings(caplog):
        trainer._issue_warnings_after_load(model.load_state_dict(stored_once, strict=False))
        assert caplog.records == []
        del stored_once["model.shared.weight"]
        trainer._issue_warnings_after_load(model.load_state_dict(stored_once, strict=False))
    (record,) = caplog.records
    for name in ("model.shared.weight", "model.encoder.embeddings.embed_tokens.weight", "lm_head.weight"):
        assert name in record.getMessage()
