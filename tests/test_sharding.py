"""Sharded training: FSDP2 through `accelerate launch` on 2 CPU processes in a gloo group, the checkpoint it saves,
its equivalence with a single-process run, resuming it, gradient checkpointing under it, and the start-up summary
naming the parallelism in use."""

import json
import subprocess
import sys
from types import SimpleNamespace

import fsdp_on_cpu
import pytest
import torch
from conftest import FSDP_LAUNCH, ROOT, TINY_OVERRIDES, free_port, script_env
from safetensors.torch import load_file

from vanilla_transformer.training import recipe
from vanilla_transformer.training.arguments import TranslationTrainingArguments
from vanilla_transformer.training.data import demo_corpus
from vanilla_transformer.training.sharding import check_parallelism_can_run
from vanilla_transformer.training.tokenizer import iterate_texts, train_tokenizer

# transformers' own flags for the same thing, with a plain multi-process launch; rank 0 alone builds the weights and
# sends each process its shards (cpu_ram_efficient_loading)
TRANSFORMERS_FSDP = [
    *("--fsdp", "full_shard auto_wrap", "--fsdp_config"),
    '{"transformer_layer_cls_to_wrap": ["EncoderLayer", "DecoderLayer"], "cpu_ram_efficient_loading": true}',
]

# Records, on rank 0, the weights gathered from the shards when training ends; with a step number as argv[2], ends
# both processes abruptly right after that checkpoint is written, as a kill would. FSDP2 runs on these CPU processes
# through the test setup (fsdp_on_cpu.py).
LAUNCHER = (
    f"""
import os, sys
sys.path.insert(0, {str(ROOT / "tests")!r})
import fsdp_on_cpu
fsdp_on_cpu.enable()
"""
    + """
import torch
from transformers import TrainerCallback

from vanilla_transformer.training import recipe


class Watch(TrainerCallback):
    def __init__(self, folder, stop_after):
        self.folder, self.stop_after = folder, stop_after

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.stop_after:
            sys.stdout.flush()
            os._exit(17)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # every rank takes part in gathering each DTensor
        full = {name: getattr(p, "full_tensor", lambda: p)().detach().clone() for name, p in model.state_dict().items()}
        if args.process_index == 0:
            torch.save(full, os.path.join(self.folder, "gathered.pt"))


recipe.main(sys.argv[3:], callbacks=[Watch(sys.argv[1], int(sys.argv[2]))])
"""
)


def train_args(output_dir, tokenizer: str) -> list[str]:
    """6 optimizer steps of a tiny model without dropout (so that runs differ only by how they are parallel), a
    checkpoint every 3 steps; 4 pairs per process."""
    return [
        *("--output_dir", str(output_dir), "--tokenizer_name", tokenizer, "--do_train", "--seed", "7"),
        *("--max_train_samples", "32", "--per_device_train_batch_size", "4", "--max_steps", "6"),
        *("--save_strategy", "steps", "--save_steps", "3", "--warmup_steps", "2", "--learning_rate", "1e-2"),
        *("--config_overrides", TINY_OVERRIDES + ",dropout=0.0", "--max_source_length", "32"),
        *("--max_target_length", "32", "--disable_tqdm", "true", "--report_to", "none"),
        *("--ddp_timeout", "30"),  # seconds a collective waits for the other process: a mismatch fails, not hangs
    ]


def launch(tmp_path, name: str, launch_flags: list[str], args: list[str], stop_after: int = 0):
    """`accelerate launch --num_processes 2 <launch_flags> train.py <args>` through LAUNCHER, in a folder `name`."""
    folder = tmp_path / name
    folder.mkdir()
    launcher = folder / "launcher.py"
    launcher.write_text(LAUNCHER)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1"]
    command += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    command += [*launch_flags, str(launcher), str(folder), str(stop_after), *args]
    return subprocess.run(command, capture_output=True, text=True, env=script_env(tmp_path), timeout=180), folder


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tokenizer"))
    train_tokenizer(iterate_texts(demo_corpus()["train"], "de", "en"), vocab_size=300).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, tokenizer):
    """One uninterrupted FSDP2 run: (its output folder, the launch's stdout, the weights gathered from the shards)."""
    tmp_path = tmp_path_factory.mktemp("fsdp")
    result, folder = launch(tmp_path, "straight", FSDP_LAUNCH, train_args(tmp_path / "out", tokenizer))
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / "out", result.stdout, torch.load(folder / "gathered.pt", weights_only=True)


def assert_same_weights(saved: dict, expected: dict, atol: float = 0.0) -> None:
    """`saved` (a model.safetensors, tied names stored once) against a full state dict with every name."""
    assert set(saved) <= set(expected) and set(expected) - set(saved) == {
        "lm_head.weight",
        "model.encoder.embeddings.embed_tokens.weight",
        "model.decoder.embeddings.embed_tokens.weight",
    }
    for name, tensor in saved.items():
        if atol == 0.0:
            assert torch.equal(tensor, expected[name]), name
        else:
            torch.testing.assert_close(tensor, expected[name], rtol=0.0, atol=atol, msg=name)


@pytest.mark.distributed
def test_fsdp_run_says_it_is_sharded_and_saves_a_normal_checkpoint(fsdp_run):
    out, stdout, gathered = fsdp_run
    # the start-up summary, read from Accelerate's state after set-up, and what FSDP made of the model
    summary = (
        "parallelism: FSDP2 (full shard, wrapping EncoderLayer, DecoderLayer, FULL_STATE_DICT) over 2 processes, gloo"
    )
    assert summary in stdout
    # lm_head's FSDP unit has hooks that the loss without logits would bypass: the loss of the logits, said once
    loss = "loss: label smoothing 0.1, model.loss_function on the logits (lm_head has forward hooks (an FSDP unit"
    assert stdout.count(loss) == 1
    # the root, one unit per layer, and the tied embedding / lm_head in one unit of their own
    wrapped = "FSDP wrapped 5 modules (1 VanillaTransformerForConditionalGeneration, 1 Embedding, 1 EncoderLayer, "
    assert wrapped + "1 DecoderLayer, 1 Linear); process 0 holds " in stdout
    holds = stdout.split("process 0 holds ")[1].split(" parameters")[0]
    local, total = (int(n.replace(",", "")) for n in holds.split(" of the "))
    assert total == sum(
        t.numel() for name, t in gathered.items() if "embed_tokens" not in name and "lm_head" not in name
    )
    assert abs(local - total / 2) <= 64  # half of every tensor, up to a row of uneven splits

    for folder in (out, out / "checkpoint-6"):
        files = {p.name for p in folder.iterdir()}
        # not PyTorch's FSDP sources: the class FSDP swaps in is not what the checkpoint names
        assert not any(name.startswith("_fsdp") for name in files), files
        assert {"modeling_vanilla_transformer.py", "configuration_vanilla_transformer.py", "config.json"} <= files
        auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
        assert (
            auto_map["AutoModelForSeq2SeqLM"]
            == "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration"
        )
        # the shared embedding is stored once, as a single-process save stores it, and equals the gathered shards
        assert_same_weights(load_file(str(folder / "model.safetensors")), gathered)
    assert torch.equal(gathered["lm_head.weight"], gathered["model.shared.weight"])


LOADER = r"""
import json, sys
try:
    import vanilla_transformer
except ModuleNotFoundError:
    pass
else:
    sys.exit("vanilla_transformer is importable here")
import torch
from transformers import AutoModelForSeq2SeqLM

model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True)
shared = model.get_input_embeddings().weight
torch.save({k: v.clone() for k, v in model.state_dict().items()}, sys.argv[2])
print(json.dumps({
    "class": f"{type(model).__module__}.{type(model).__name__}",
    "tied": [model.lm_head.weight is shared, model.model.encoder.embeddings.embed_tokens.weight is shared,
             model.model.decoder.embeddings.embed_tokens.weight is shared],
    "distributed": torch.distributed.is_initialized(),
}))
"""


@pytest.mark.distributed
def test_fsdp_checkpoint_loads_without_the_package_and_without_fsdp(fsdp_run, fresh_python, tmp_path):  # noqa: F811
    out, _, gathered = fsdp_run
    script = tmp_path / "load.py"
    script.write_text(LOADER)
    result = subprocess.run(
        [fresh_python, str(script), str(out), str(tmp_path / "loaded.pt")],
        capture_output=True,
        text=True,
        env=script_env(tmp_path),
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["class"].endswith("modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration")
    assert not report["class"].startswith("vanilla_transformer.")  # the checkpoint's own code, not the package
    assert report["tied"] == [True, True, True]  # one tensor, not four equal ones
    assert not report["distributed"]
    loaded = torch.load(tmp_path / "loaded.pt", weights_only=True)
    assert loaded.keys() == gathered.keys()
    for name in gathered:
        assert torch.equal(loaded[name], gathered[name]), name


@pytest.mark.distributed
def test_fsdp_matches_a_single_process_run_with_the_same_global_batch(fsdp_run, tmp_path, tokenizer, capsys):
    out, _, gathered = fsdp_run
    args = train_args(tmp_path / "single", tokenizer)
    args[args.index("--per_device_train_batch_size") + 1] = "8"  # 4 pairs x 2 processes
    recipe.main(args + ["--threads", "1"])
    assert "; parallelism: single process on cpu\n" in capsys.readouterr().out
    single = load_file(str(tmp_path / "single" / "model.safetensors"))
    # The same 8 pairs make each step in both runs (accelerate hands process k every 2nd batch of 4 of the same
    # shuffled order), but the gradients are summed in another order (two halves, averaged across processes), so
    # float32 rounding differs at ~1e-7 relative, and Adam (ε 1e-9) blows that up for entries whose gradients are
    # tiny. Each of the 6 steps moves a weight by up to ~lr = 1e-2; 1e-3 is a tenth of one step. Measured: 3e-5 at
    # most, while a global batch of 4 or another data order ends 5e-2 away.
    assert_same_weights(single, gathered, atol=1e-3)


@pytest.mark.distributed
def test_fsdp_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(fsdp_run, tmp_path, tokenizer):
    out, _, gathered = fsdp_run
    args = train_args(tmp_path / "out", tokenizer)
    stopped, _ = launch(tmp_path, "stopped", FSDP_LAUNCH, args, stop_after=3)
    assert stopped.returncode != 0  # ended right after checkpoint-3, before finishing
    assert (tmp_path / "out" / "checkpoint-3").is_dir() and not (tmp_path / "out" / "model.safetensors").exists()
    resumed, folder = launch(tmp_path, "resumed", FSDP_LAUNCH, args + ["--resume_from_checkpoint", "last"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    at_3 = load_file(str(tmp_path / "out" / "checkpoint-3" / "model.safetensors"))
    final = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert any(not torch.equal(at_3[name], final[name]) for name in final)  # steps 4-6 did train
    # the optimizer state and schedule came back too: the same floats as the uninterrupted run
    assert_same_weights(final, gathered)


@pytest.mark.distributed
def test_gradient_checkpointing_and_rank0_loading_under_fsdp_with_transformers_flags(fsdp_run, tmp_path, tokenizer):
    out, _, gathered = fsdp_run
    args = train_args(tmp_path / "out", tokenizer) + [*TRANSFORMERS_FSDP, "--gradient_checkpointing", "true"]
    result, folder = launch(tmp_path, "checkpointed", ["--multi_gpu"], args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "parallelism: FSDP2 (full shard, wrapping EncoderLayer, DecoderLayer, FULL_STATE_DICT)" in result.stdout
    # recomputing the layers' activations in the backward pass, and weights sent from rank 0, give the same floats
    assert_same_weights(load_file(str(tmp_path / "out" / "model.safetensors")), gathered)


@pytest.mark.parametrize("version", ["1", "2"])
def test_fsdp_on_cpu_processes_is_refused_in_one_line(tmp_path, tokenizer, monkeypatch, version, capsys):
    # what `accelerate launch --use_fsdp` sets (Accelerate's default --fsdp_version is 1)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", version)
    with pytest.raises(SystemExit) as info:
        recipe.main(train_args(tmp_path / "out", tokenizer))
    assert "pairs" not in capsys.readouterr().out  # refused before the data is read, let alone tokenised
    assert str(info.value.code) == (
        f"train.py: error: FSDP (version {version}) cannot run on CPU processes: Accelerate turns it on for "
        "accelerators only and would train them with plain DDP; launch them with `accelerate launch --multi_gpu` "
        "(DDP), or shard on GPUs."
    )


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 1}}, r"FSDP \(version 1\) cannot run on CPU"),
        ({"fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 2}}, r"FSDP \(version 2\) cannot run on CPU"),
        ({"deepspeed": "ds_config.json"}, "DeepSpeed cannot run on CPU processes"),
    ],
)
def test_sharding_that_cannot_run_on_cpu_processes_is_refused(settings, message, monkeypatch):
    # transformers' flags as the training arguments hold them (parsing --deepspeed needs deepspeed installed)
    monkeypatch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False)  # the arguments set it; restored after
    fsdp_args = None
    if "fsdp" in settings:
        fsdp_args = TranslationTrainingArguments(output_dir="x", **settings).fsdp_plugin_args
    args = SimpleNamespace(fsdp_plugin_args=fsdp_args, deepspeed=settings.get("deepspeed"))
    with pytest.raises(ValueError, match=message):
        check_parallelism_can_run(args)
    check_parallelism_can_run(SimpleNamespace(fsdp_plugin_args=None, deepspeed=None))  # nothing asked: nothing said


# --------------------------------------------------------------------------------------------------------------------
# The test setup's FSDP2 on CPU processes (fsdp_on_cpu.py)
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def cpu_processes_asked_for_fsdp(monkeypatch, one_process_group, reset_accelerate):
    """An Accelerator of CPU processes launched with `--use_fsdp --fsdp_version 2` (one process here)."""
    from accelerate import Accelerator

    for name, value in (("ACCELERATE_USE_CPU", "true"), ("ACCELERATE_USE_FSDP", "true"), ("FSDP_VERSION", "2")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # else Accelerate sets the threads of MULTI_CPU processes
    return Accelerator()


def test_accelerate_still_drops_fsdp_on_cpu_processes(cpu_processes_asked_for_fsdp):
    """fsdp_on_cpu: CPU processes in a gloo group that asked for FSDP get plain data parallelism from Accelerate (what
    the toolkit refuses, and what the test setup undoes)."""
    from accelerate.utils import DistributedType

    state = cpu_processes_asked_for_fsdp.state
    assert state.backend == "gloo"
    assert state.distributed_type == DistributedType.MULTI_CPU
    assert getattr(state, "fsdp_plugin", None) is None


def test_the_fsdp_type_holds_only_through_accelerates_shared_state(cpu_processes_asked_for_fsdp):
    """fsdp_on_cpu: a later AcceleratorState() copies PartialState's private `_shared_state` over its own
    type (so setting the state's type alone does not hold), and the workaround makes FSDP2 hold."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    accelerator = cpu_processes_asked_for_fsdp
    assert PartialState._shared_state["distributed_type"] == DistributedType.MULTI_CPU
    accelerator.state.distributed_type = DistributedType.FSDP
    assert AcceleratorState().distributed_type == DistributedType.MULTI_CPU
    args = SimpleNamespace(fsdp_plugin_args=None, deepspeed=None)  # FSDP asked for by the launch's environment
    assert fsdp_on_cpu.enable_fsdp_on_cpu(accelerator, args)
    assert AcceleratorState().distributed_type == DistributedType.FSDP
    assert accelerator.is_fsdp2 and accelerator.state.fsdp_plugin.fsdp_version == 2
