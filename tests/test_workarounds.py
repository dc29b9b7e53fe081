"""The library behaviour each workaround in vanilla_transformer/training/workarounds/ exists for, and the private
fields and methods it touches.

Each test names the workaround it checks. A test named `..._still_...` asserts that the library still has the limit:
when it fails, the library changed underneath, and the workaround's module says whether it can go. The others assert
that what a workaround reaches into (a private field, an overridden method) is still there and still does what the
workaround relies on: when one fails, the workaround must change. All run in this process, in seconds: a process
group of one process (gloo) stands in for a launch where FSDP needs one.
"""

import contextlib
import dataclasses
import functools
import gc
import inspect
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch
import transformers
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader, skip_first_batches
from conftest import LAUNCH_ENV, free_port, tiny_model, transformers_warnings
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer, Trainer, TrainerCallback, TrainingArguments

from vanilla_transformer.training.batching import TokenBatchSampler
from vanilla_transformer.training.sharding import tied_names
from vanilla_transformer.training.workarounds import (
    accelerate_batch_sampler_shard,
    datasets_no_public_fingerprint,
    torch_cpu_bf16_flash_attention,
    torch_cpu_bf16_kernel_caches,
    torch_fsdp_aliased_module_load,
    torch_fsdp_class_swap,
    torch_fsdp_gathered_ties,
    transformers_no_batch_sampler_hook,
    transformers_resume_past_the_end,
    transformers_tied_names_missing_on_resume,
)


def sharded_tiny_model() -> torch.nn.Module:
    """A tiny model sharded with FSDP2, each layer a unit, as Accelerate's TRANSFORMER_BASED_WRAP does."""
    from torch.distributed.fsdp import fully_shard

    model = tiny_model()
    for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
        fully_shard(layer)
    return fully_shard(model)


# --------------------------------------------------------------------------------------------------------------------
# accelerate_batch_sampler_shard
# --------------------------------------------------------------------------------------------------------------------

LENGTHS = [3, 5, 2, 7, 4, 4, 6, 1, 8, 2, 3]


def token_batches_on_rank_1_of_2() -> tuple[TokenBatchSampler, DataLoader]:
    """Token batches of LENGTHS and the DataLoader that Accelerate prepares for process 1 of 2."""
    sampler = TokenBatchSampler(LENGTHS, LENGTHS, 16, seed=0, num_replicas=1, rank=0)
    loader = DataLoader(list(range(len(LENGTHS))), batch_sampler=sampler, collate_fn=list)
    return sampler, prepare_data_loader(loader, num_processes=2, process_index=1, put_on_device=False)


def test_accelerate_batch_sampler_shard_still_has_no_set_epoch():
    """accelerate_batch_sampler_shard: `prepare` wraps a batch sampler in a BatchSamplerShard, which has no set_epoch
    of its own, so that the epoch the Trainer sets through skip_first_batches on a resume stops there."""
    sampler, prepared = token_batches_on_rank_1_of_2()
    assert isinstance(prepared.batch_sampler, BatchSamplerShard) and prepared.batch_sampler.batch_sampler is sampler
    assert not hasattr(BatchSamplerShard, "set_epoch")


def test_the_trainer_deals_out_token_batches_and_a_resume_sets_their_epoch(tmp_path):
    """accelerate_batch_sampler_shard.forward_set_epoch, and the rank-aware path of transformers' Trainer it works
    with (TokenBatchSampler is a BatchRebalanceSampler): the Trainer's DataLoader of process 1 of 2 yields that
    process's share of the token batches, and the epoch set through skip_first_batches, as the Trainer sets it when it
    resumes mid-epoch, reaches the sampler."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    assert "isinstance(sampler, BatchRebalanceSampler)" in inspect.getsource(Trainer._get_dataloader)
    sampler = TokenBatchSampler(LENGTHS, LENGTHS, 16, seed=0, num_replicas=2, rank=1)
    assert isinstance(sampler, BatchRebalanceSampler)
    loader = DataLoader(list(range(len(LENGTHS))), batch_sampler=sampler, collate_fn=list)
    prepared = prepare_data_loader(loader, num_processes=2, process_index=1, put_on_device=False)
    prepared.batch_sampler.num_processes, prepared.batch_sampler.process_index = 1, 0  # what the Trainer does
    assert accelerate_batch_sampler_shard.forward_set_epoch(prepared)
    for _ in range(2):  # each pass is the next epoch (DataLoaderShard.set_epoch), with its own order
        assert list(prepared) == sampler.epoch_order()[1::2]
    skipped = skip_first_batches(prepared, 1)
    skipped.batch_sampler.batch_sampler.set_epoch(7)  # what Trainer._run_epoch calls
    assert sampler.epoch == 7
    # one process: no wrapper, nothing to forward
    assert not accelerate_batch_sampler_shard.forward_set_epoch(DataLoader([0], batch_sampler=sampler))


# --------------------------------------------------------------------------------------------------------------------
# torch_fsdp_class_swap, torch_fsdp_gathered_ties, torch_fsdp_aliased_module_load
# --------------------------------------------------------------------------------------------------------------------


def test_fully_shard_still_saves_its_own_class_in_the_auto_map(one_process_group, tmp_path):
    """torch_fsdp_class_swap: `fully_shard` swaps the model's class for one defined in PyTorch's FSDP package, and
    transformers' saving of a trust_remote_code model names that class's module in the auto_map; inside
    `model_class_unwrapped` the model is its own class again, and after it sharded again."""
    from torch.distributed.fsdp import FSDPModule
    from transformers.dynamic_module_utils import custom_object_save

    model = sharded_tiny_model()
    sharded_class = type(model)
    assert sharded_class.__module__.startswith("torch.distributed.fsdp")
    model._auto_class = "AutoModelForSeq2SeqLM"
    config = {}
    custom_object_save(model, str(tmp_path), config=config)
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == f"_fsdp_init.{sharded_class.__name__}"

    with torch_fsdp_class_swap.model_class_unwrapped(model):
        config = {}
        custom_object_save(model, str(tmp_path), config=config)
    expected = "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration"
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == expected
    assert type(model) is sharded_class and isinstance(model, FSDPModule)


def gathered_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict of a sharded model, with the options Accelerate gathers it with on several processes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def test_fsdp_still_gathers_tied_names_as_separate_tensors(one_process_group):
    """torch_fsdp_gathered_ties: the full state dict of a sharded model holds `lm_head.weight` and
    `model.shared.weight` (and both `embed_tokens`) as separate equal tensors; the workaround makes them one."""
    model = sharded_tiny_model()
    state_dict = gathered_state_dict(model)
    names = ["lm_head.weight", *tied_names(model)]
    assert {name for name in names if state_dict[name] is not state_dict["model.shared.weight"]} == set(names)
    assert all(torch.equal(state_dict[name], state_dict["model.shared.weight"]) for name in names)
    torch_fsdp_gathered_ties.share_tied_tensors(state_dict, model)
    assert all(state_dict[name] is state_dict["model.shared.weight"] for name in names)


def test_fsdp_still_fails_to_load_a_full_state_dict_with_module_aliases(one_process_group, tmp_path):
    """torch_fsdp_aliased_module_load: PyTorch's full-state-dict loader with rank 0's broadcast (the options
    Accelerate's load_fsdp_model uses on several processes) fails with a KeyError on the second name of the shared
    embedding module; the workaround loads the same file."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    saved = {name: tensor.clone() for name, tensor in gathered_state_dict(sharded_tiny_model()).items()}
    model = sharded_tiny_model()  # other random weights
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, cpu_offload=True)
    with pytest.raises(KeyError, match="embed_tokens"):
        set_model_state_dict(model, dict(saved), options=options)

    path = tmp_path / "pytorch_model_fsdp.bin"
    torch.save(saved, path)
    accelerator = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    torch_fsdp_aliased_module_load.load_full_state_dict_checkpoint(accelerator, model, str(path))
    for name, tensor in gathered_state_dict(model).items():
        torch.testing.assert_close(tensor, saved[name], rtol=0, atol=0, msg=name)


# --------------------------------------------------------------------------------------------------------------------
# torch_gloo_group_teardown
# --------------------------------------------------------------------------------------------------------------------


def gloo_worker_threads() -> int:
    """The gloo worker threads (`pt_gloo_runloop`) this process runs."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return names.count("pt_gloo_runloop")


def gloo_worker_threads_settled(seconds: float = 10.0) -> int:
    """The count once it has held for half a second, or after `seconds`: gloo starts its threads asynchronously, and
    on a busy machine some may not be listed yet."""
    deadline, count = time.monotonic() + seconds, gloo_worker_threads()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if (again := gloo_worker_threads()) == count:
            break
        count = again
    return count


def gloo_worker_threads_once_ended(expected: int, seconds: float = 10.0) -> int:
    """The count once it is down to `expected`, or after `seconds`: a thread told to end may still be listed for a
    moment on a busy machine."""
    deadline = time.monotonic() + seconds
    while (count := gloo_worker_threads()) > expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def test_torch_still_runs_cpu_bf16_attention_through_the_flash_kernel():
    """torch_cpu_bf16_flash_attention: SDPA on a CPU sends bf16 attention with a padding mask, under autocast as
    train.py trains, to the flash-attention kernel whose bf16 backward is slow there. (Whether that backward is still
    slow is a benchmark's question, not a timed test's: the module's docstring says which.)"""
    from torch.profiler import ProfilerActivity, profile

    query, key, value = (torch.randn(4, 2, 16, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(4, 1, 16, 16, dtype=torch.bool)
    mask[:, :, :, 13:] = False  # the last three keys are padding
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        assert output.dtype == torch.bfloat16
        output.float().sum().backward()
    assert torch_cpu_bf16_flash_attention.SLOW_KERNEL in {event.key for event in prof.key_averages()}


def test_bf16_training_on_a_cpu_takes_eager_attention_unless_one_is_given(tmp_path):
    """torch_cpu_bf16_flash_attention.attention_for_training: eager for bf16 on a CPU; a given implementation always
    wins; float32 keeps the model's own (None)."""
    choose = torch_cpu_bf16_flash_attention.attention_for_training
    bf16 = TrainingArguments(output_dir=str(tmp_path), bf16=True, use_cpu=True, report_to=[])
    float32 = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert choose(None, bf16) == "eager"
    assert choose("sdpa", bf16) == "sdpa"
    assert choose(None, float32) is None
    assert choose("eager", float32) == "eager"


# Multiplies bf16 matrices of 400 shapes (rows 8, 16, ..., 3,200) in a fresh process, under autocast as train.py
# trains, and prints how much its resident memory grew, in KiB per shape. Large tensors are made and freed first, as a
# training step does, so that glibc serves later blocks from its heap as it would in a run.
_KERNELS_PER_SHAPE = """
import torch

def resident():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))

torch.set_num_threads(1)
weight = torch.randn(256, 1024)
for _ in range(3):
    big = torch.randn(4096, 2048)
    del big
before = resident()
with torch.autocast("cpu", dtype=torch.bfloat16):
    for rows in range(8, 8 * 400 + 1, 8):
        (torch.randn(rows, 256) @ weight).sum()
print((resident() - before) / 400)
"""


def kib_per_bf16_shape(**capacities: int) -> float:
    env = {name: value for name, value in os.environ.items() if name not in torch_cpu_bf16_kernel_caches.VARIABLES}
    env.update({name: str(value) for name, value in capacities.items()}, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", _KERNELS_PER_SHAPE], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return float(done.stdout.split()[-1])


@pytest.mark.slow
@pytest.mark.skipif(
    not (os.path.exists("/proc/self/status") and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="needs oneDNN's bf16 products and Linux's /proc",
)
def test_torch_still_keeps_about_a_mib_of_bf16_kernels_per_shape():
    """torch_cpu_bf16_kernel_caches: with the libraries' default capacities, every new shape of a bf16 product on a
    CPU keeps at least a quarter of a MiB (0.7 measured); the two variables the workaround sets bound it (400 shapes
    against a capacity of 64: under half of that)."""
    default = kib_per_bf16_shape()
    limited = kib_per_bf16_shape(**dict.fromkeys(torch_cpu_bf16_kernel_caches.VARIABLES, 64))
    assert default > 256, f"{default:.0f} KiB per shape"
    assert limited < default / 2, f"{limited:.0f} against {default:.0f} KiB per shape"


def test_bf16_training_on_a_cpu_limits_the_kernel_caches_unless_the_environment_sets_them(tmp_path):
    """torch_cpu_bf16_kernel_caches.limit_kernel_caches: both capacities for bf16 on a CPU; a value already in the
    environment is kept; float32 sets nothing."""
    limit = torch_cpu_bf16_kernel_caches.limit_kernel_caches
    bf16 = TrainingArguments(output_dir=str(tmp_path), bf16=True, use_cpu=True, report_to=[])
    float32 = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    environ = {}
    assert limit(bf16, environ) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}
    assert environ == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}
    environ = {"LRU_CACHE_CAPACITY": "1024"}
    assert limit(bf16, environ) == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64"}
    assert environ["LRU_CACHE_CAPACITY"] == "1024"
    environ = {}
    assert limit(float32, environ) == {} and environ == {}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_torch_gloo_workers_still_outlive_destroy_process_group_under_ddp(monkeypatch):
    """torch_gloo_group_teardown: destroy_process_group leaves a gloo group's worker threads running while a DDP
    model's Reducer holds the group; they end only when the model is freed, from C++ with the GIL held (the deadlock
    the workaround avoids). Without a DDP model they end in destroy_process_group."""
    gc.collect()  # what earlier tests left to the garbage collector
    before = gloo_worker_threads()  # groups that DTensor's caches keep (earlier tests sharded models) keep theirs
    for name, value in zip(LAUNCH_ENV, ("127.0.0.1", str(free_port()), "0", "1", "0", "1")):
        monkeypatch.setenv(name, value)
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    started = gloo_worker_threads_settled() - before
    assert started > 0
    torch.distributed.destroy_process_group()
    assert gloo_worker_threads() - before == started
    del ddp
    gc.collect()
    assert gloo_worker_threads_once_ended(before) == before

    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    torch.distributed.all_reduce(torch.ones(2))  # gloo starts its workers at the first collective
    assert gloo_worker_threads_settled() - before == started
    torch.distributed.destroy_process_group()
    assert gloo_worker_threads_once_ended(before) == before


# --------------------------------------------------------------------------------------------------------------------
# transformers_resume_past_the_end, transformers_tied_names_missing_on_resume, transformers_ddp_timeout_on_cpu
# --------------------------------------------------------------------------------------------------------------------


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, x, y):
        return {"loss": ((self.linear(x).squeeze(-1) - y) ** 2).mean()}


class CountSteps(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


class StopIfFinished(Trainer):
    def _run_epoch(self, *args, **kwargs):
        if transformers_resume_past_the_end.stop_if_finished(self):
            return
        return super()._run_epoch(*args, **kwargs)


def test_transformers_still_trains_past_the_end_of_a_resumed_run(tmp_path, one_thread):
    """transformers_resume_past_the_end: a Trainer resumed from a run's final checkpoint (step 3 of 3, not at an
    epoch's end) trains one step more; with the workaround it trains none."""
    data = datasets.Dataset.from_dict({"x": [[float(i), 1.0] for i in range(16)], "y": [float(i) for i in range(16)]})

    def args() -> TrainingArguments:
        return TrainingArguments(
            str(tmp_path), max_steps=3, save_steps=3, per_device_train_batch_size=2, use_cpu=True, report_to="none"
        )

    Trainer(Regression(), args(), train_dataset=data).train()
    for trainer_class, steps in ((Trainer, 1), (StopIfFinished, 0)):
        count = CountSteps()
        trainer = trainer_class(Regression(), args(), train_dataset=data, callbacks=[count])
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
        assert (count.steps, trainer.state.global_step) == (steps, 3 + steps), trainer_class.__name__


def test_transformers_still_warns_about_tied_names_on_resume(caplog):
    """transformers_tied_names_missing_on_resume: what torch's load_state_dict reports for a checkpoint that stores
    the tied weight once, Trainer's `_issue_warnings_after_load` warns about as missing; without the names that were
    loaded under the name they alias, nothing is missing."""
    model = tiny_model()
    stored_once = {name: tensor for name, tensor in model.state_dict().items() if name not in tied_names(model)}
    load_result = model.load_state_dict(stored_once, strict=False)
    assert set(load_result.missing_keys) == set(tied_names(model)) != set()
    with transformers_warnings(caplog):
        Trainer._issue_warnings_after_load(SimpleNamespace(model=model), load_result)
    (record,) = caplog.records
    assert "missing keys" in record.getMessage() and "lm_head.weight" in record.getMessage()
    kept = transformers_tied_names_missing_on_resume.drop_loaded_tied_names(load_result, model)
    assert kept.missing_keys == [] and kept.unexpected_keys == load_result.unexpected_keys


def test_transformers_still_drops_the_process_group_timeout_on_cpu(tmp_path, monkeypatch):
    """transformers_ddp_timeout_on_cpu: transformers 5.24's TrainingArguments give Accelerate the ddp_timeout only
    for accelerator devices. When this fails, transformers passes it on CPU too: remove the workaround."""
    given = {}

    class Stop(Exception):
        pass

    def record(**kwargs):
        given.update(kwargs)
        raise Stop

    monkeypatch.setattr(transformers.training_args, "PartialState", record)
    with pytest.raises(Stop):  # the arguments set the devices up as they are made
        transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, ddp_timeout=30, report_to="none")
    assert given.get("cpu") and "timeout" not in given


def test_setup_devices_is_still_a_cached_property():
    """transformers_ddp_timeout_on_cpu: TranslationTrainingArguments overrides TrainingArguments' private
    `_setup_devices`, a cached_property that sets the devices up, and calls it through super()."""
    assert isinstance(inspect.getattr_static(TrainingArguments, "_setup_devices"), functools.cached_property)
    assert "PartialState(" in inspect.getsource(TrainingArguments._setup_devices.func)


# Trainer methods TranslationTrainer overrides (their parameters) and a call that shows the Trainer still uses each
OVERRIDDEN = {
    "_save": (["self", "output_dir", "state_dict"], "save_model", "self._save("),
    "_run_epoch": (
        ["self", "model", "epoch", "train_dataloader", "steps_in_epoch", "num_update_steps_per_epoch", "trial"]
        + ["ignore_keys_for_eval", "start_time", "resume_from_checkpoint", "epochs_trained"]
        + ["steps_trained_in_current_epoch"],
        "_inner_training_loop",
        "self._run_epoch(",
    ),
    "_load_from_checkpoint": (["self", "resume_from_checkpoint", "model"], "train", "self._load_from_checkpoint("),
    "_issue_warnings_after_load": (
        ["self", "load_result"],
        "_load_from_checkpoint",
        "self._issue_warnings_after_load(",
    ),
    "create_accelerator_and_postprocess": (["self"], "__init__", "self.create_accelerator_and_postprocess()"),
}


@pytest.mark.parametrize("name", sorted(OVERRIDDEN))
def test_the_trainer_methods_the_workarounds_override_still_exist(name):
    """The workarounds in TranslationTrainer's overrides: Seq2SeqTrainer still has the method, with the parameters
    the override passes on, and still calls it where the workaround expects."""
    parameters, caller, call = OVERRIDDEN[name]
    assert list(inspect.signature(getattr(Seq2SeqTrainer, name)).parameters) == parameters
    assert call in inspect.getsource(getattr(Trainer, caller))


def test_transformers_still_takes_no_batch_sampler():
    """transformers_no_batch_sampler_hook: neither the Trainer, its training DataLoader method nor its arguments take
    a batch sampler (or a sampler) of the caller's."""
    assert not [name for name in inspect.signature(Trainer.__init__).parameters if "sampler" in name]
    assert list(inspect.signature(Trainer.get_train_dataloader).parameters) == ["self"]
    assert not [field.name for field in dataclasses.fields(TrainingArguments) if "sampler" in field.name]


def test_the_trainer_dataloader_the_token_batches_go_through_still_exists():
    """transformers_no_batch_sampler_hook: `Trainer._get_dataloader` still takes the arguments the workaround passes,
    is what `get_train_dataloader` calls, and hands a rank-aware batch sampler to the DataLoader; the DataLoader it
    builds for a tiny trainer draws the batches of the sampler the workaround gives it."""
    parameters = list(inspect.signature(Trainer._get_dataloader).parameters)
    assert parameters[:6] == ["self", "dataset", "description", "batch_size", "sampler_fn", "is_training"]
    assert "self._get_dataloader(" in inspect.getsource(Trainer.get_train_dataloader)
    assert "isinstance(sampler, BatchRebalanceSampler)" in inspect.getsource(Trainer._get_dataloader)
    rows = [{"input_ids": [5] * n, "labels": [6] * n} for n in LENGTHS]
    args = TrainingArguments(output_dir="unused", report_to="none", use_cpu=True)
    trainer = Trainer(tiny_model(), args, data_collator=list, train_dataset=datasets.Dataset.from_list(rows))
    sampler = TokenBatchSampler(LENGTHS, LENGTHS, 16, seed=0, shuffle=False)
    loader = transformers_no_batch_sampler_hook.train_dataloader(trainer, lambda dataset: sampler)
    drawn = [[len(row["input_ids"]) for row in batch] for batch in loader]
    assert drawn == [[LENGTHS[i] for i in batch] for batch in sampler.batches] and len(drawn) > 1


def test_datasets_still_has_no_public_fingerprint():
    """datasets_no_public_fingerprint: `Dataset` has no public fingerprint; the private one the workaround reads is a
    string that a transform changes."""
    dataset = datasets.Dataset.from_dict({"a": [1]})
    assert not [name for name in dir(datasets.Dataset) if "fingerprint" in name and not name.startswith("_")]
    fingerprint = datasets_no_public_fingerprint.fingerprint_of(dataset)
    assert isinstance(fingerprint, str) and fingerprint != datasets_no_public_fingerprint.fingerprint_of(
        dataset.map(lambda row: row)
    )
