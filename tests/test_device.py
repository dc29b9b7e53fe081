"""What a run decides on its device (training/device.py), tested on a CPU: with CUDA reported (torch's CUDA queries and
the training arguments' device stubbed) train.py's defaults are bf16, TF32 and a token batch from the GPU's memory,
the collator pads to a multiple of 8, the attention, threads and kernel caches are left to transformers and PyTorch,
and translate.py decodes in bf16; on a CPU nothing of that changes, and a flag given always wins."""

from types import SimpleNamespace

import pytest
import torch
import transformers
from conftest import load_script, tiny_model, word_tokenizer

from vanilla_transformer.training import device as device_defaults
from vanilla_transformer.training import recipe
from vanilla_transformer.training.arguments import TranslationTrainingArguments
from vanilla_transformer.training.cpu import set_cpu_threads
from vanilla_transformer.training.device import DeviceDefaults, decide, gpu_token_batch, pad_to_multiple_of
from vanilla_transformer.training.presets import PRESETS
from vanilla_transformer.training.workarounds import torch_cpu_bf16_flash_attention, torch_cpu_bf16_kernel_caches

H100 = ("NVIDIA H100 80GB HBM3", 79.1, 9, True)
H200 = ("NVIDIA H200", 139.8, 9, True)
V100 = ("Tesla V100-SXM2-32GB", 31.7, 7, False)  # no bf16, no TF32


@pytest.fixture(autouse=True)
def _fresh_transformers_checks():
    """transformers caches what it finds (`lru_cache` on `is_torch_bf16_gpu_available`, `is_torch_tf32_available`,
    ...): what a stubbed GPU made it find must not outlive the test, nor what an earlier test found enter it."""

    def clear() -> None:
        for check in vars(transformers.utils.import_utils).values():
            if callable(getattr(check, "cache_clear", None)):
                check.cache_clear()

    clear()
    yield
    clear()


def report_gpu(monkeypatch, name: str, memory_gib: float, major: int, bf16: bool) -> list[bool]:
    """Make torch and the training arguments report one CUDA GPU; returns the TF32 switches transformers makes."""
    properties = SimpleNamespace(name=name, total_memory=int(memory_gib * 2**30), major=major, minor=0)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args, **kwargs: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *args, **kwargs: properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # transformers' TF32 check asks for a CUDA build
    monkeypatch.setattr(TranslationTrainingArguments, "_setup_devices", property(lambda self: torch.device("cuda")))
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    tf32_switches: list[bool] = []
    monkeypatch.setattr(transformers.training_args, "enable_tf32", tf32_switches.append)  # not the real backends
    # the CPU's bf16 recipe (compact's native_bf16_cpu) must not leak onto the GPU
    monkeypatch.setattr(device_defaults, "native_bf16_matmul", lambda: "amx_bf16")
    return tf32_switches


@pytest.mark.parametrize(
    "gpu, bf16, tf32, tokens",
    [(H100, True, True, 9216), (H200, True, True, 17408), (V100, False, False, 3072)],
)
def test_a_gpu_decides_bf16_tf32_and_a_token_batch_from_its_memory(monkeypatch, gpu, bf16, tf32, tokens):
    report_gpu(monkeypatch, *gpu)
    decided = decide()
    assert decided == DeviceDefaults("cuda", gpu[0], bf16=bf16, tf32=tf32, max_tokens_per_batch=tokens)
    assert decided.decode_dtype == (torch.bfloat16 if bf16 else None)
    assert decide("cpu").device == "cpu" and decide("cpu").decode_dtype is None  # translate.py --device cpu
    assert gpu_token_batch(8 * 2**30) == 2048  # the floor


def test_a_cpu_decides_as_before(monkeypatch):
    """The CPU keeps its own rule: bf16 where it multiplies bf16 in hardware and train.py runs alone; no TF32, no
    token batch of its own, and translate.py decodes in the model's saved dtype."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(device_defaults, "native_bf16_matmul", lambda: "avx512_bf16")
    assert decide() == DeviceDefaults("cpu", "CPU", bf16=True, cpu_bf16_feature="avx512_bf16")
    assert decide().decode_dtype is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert decide() == DeviceDefaults("cpu", "CPU", bf16=False)
    compact = decide().training_defaults("compact", set())
    assert compact == PRESETS["compact"]["training"] and "tf32" not in compact


def test_train_py_defaults_on_a_gpu_and_the_flags_that_win(tmp_path, monkeypatch):
    tf32_switches = report_gpu(monkeypatch, *H100)
    own_data = ["--output_dir", str(tmp_path), "--train_file", str(tmp_path / "train.jsonl")]

    def parsed(argv: list[str]):
        return recipe.parse_arguments(argv)[2]

    args = parsed(own_data)  # compact: bf16, TF32, the GPU's token batch, the preset's learning rate
    assert (args.bf16, args.fp16, args.tf32, args.use_cpu, args.mixed_precision) == (True, False, True, False, "bf16")
    assert (args.max_tokens_per_batch, args.learning_rate) == (9216, PRESETS["compact"]["training"]["learning_rate"])
    assert args.dataloader_pin_memory is True and tf32_switches == [True]
    assert pad_to_multiple_of(args) == 8
    assert recipe.describe_precision(args) == "bf16 autocast; float32 products in TF32"

    demo = parsed(["--output_dir", str(tmp_path)])  # small: pairs, as the preset says, in bf16
    assert (demo.bf16, demo.tf32, demo.max_tokens_per_batch, demo.per_device_train_batch_size) == (True, True, None, 64)

    args = parsed(own_data + ["--bf16", "false"])
    assert (args.bf16, args.mixed_precision, args.tf32, pad_to_multiple_of(args)) == (False, "no", True, None)
    assert recipe.describe_precision(args) == "float32; float32 products in TF32"
    args = parsed(own_data + ["--fp16", "true"])
    assert (args.bf16, args.fp16, args.mixed_precision, pad_to_multiple_of(args)) == (False, True, "fp16", 8)
    args = parsed(own_data + ["--tf32", "false", "--max_tokens_per_batch", "4000"])
    assert (args.bf16, args.tf32, args.max_tokens_per_batch) == (True, False, 4000)
    args = parsed(own_data + ["--use_cpu", "true"])  # the CPU, told: the preset's plain defaults
    assert (args.bf16, args.tf32, args.max_tokens_per_batch) == (False, None, 512)

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # `accelerate launch --mixed_precision fp16` wins
    args = parsed(own_data)
    assert (args.bf16, args.mixed_precision, args.max_tokens_per_batch) == (False, "fp16", 9216)
    assert recipe.describe_precision(args) == "fp16 autocast; float32 products in TF32"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # accelerate launch's default: the GPU's bf16
    assert parsed(own_data).bf16 is True

    report_gpu(monkeypatch, *V100)  # no bf16: float32, no TF32, the pad multiple only under a precision given
    args = parsed(own_data)
    assert (args.bf16, args.tf32, args.max_tokens_per_batch, pad_to_multiple_of(args)) == (False, None, 3072, None)


def test_a_run_on_a_gpu_leaves_attention_threads_and_kernel_caches_alone(tmp_path, monkeypatch):
    """The CPU's choices stay on the CPU: the attention is the model's own (sdpa, not the CPU's bf16 eager), PyTorch's
    threads are its default, oneDNN's cache capacities are not set; the start-up line names the GPU."""
    report_gpu(monkeypatch, *H100)
    _, _, args, _ = recipe.parse_arguments(["--output_dir", str(tmp_path), "--train_file", "t.jsonl"])
    assert args.bf16 and args.device.type == "cuda"
    assert torch_cpu_bf16_flash_attention.attention_for_training(None, args) is None
    environ: dict[str, str] = {}
    assert torch_cpu_bf16_kernel_caches.limit_kernel_caches(args, environ) == {} and environ == {}
    threads = torch.get_num_threads()
    assert set_cpu_threads(None) == f"{threads} (PyTorch's default)" and torch.get_num_threads() == threads

    model = tiny_model()
    model_args = recipe.ModelArguments(preset="compact")
    assert recipe.choose_attention(model, model_args, args) == "sdpa" == model.config._attn_implementation
    args.distributed_state = None  # what the stubbed device set-up leaves unset: one process
    line = recipe.describe_run(model, model_args, args, "de", "en", "a tokenizer", "16 (PyTorch's default)")
    assert "device: NVIDIA H100 80GB HBM3; precision: bf16 autocast; float32 products in TF32; attention: sdpa" in line
    assert "<= 9216 padded tokens per side per device" in line


def test_the_start_up_line_names_the_precision_accelerate_launch_asked_for(tmp_path, monkeypatch):
    """`accelerate launch --mixed_precision bf16` trains in bf16 although --bf16 is not given: the start-up line, the
    collator's pad multiple and the CPU's bf16 workarounds follow the precision the Accelerator runs."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(device_defaults, "native_bf16_matmul", lambda: None)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    _, _, args, _ = recipe.parse_arguments(["--output_dir", str(tmp_path), "--use_cpu", "true"])
    assert (args.bf16, args.mixed_precision, pad_to_multiple_of(args)) == (False, "bf16", 8)
    assert recipe.describe_precision(args).startswith("bf16 autocast (this CPU emulates bf16 products")
    assert torch_cpu_bf16_flash_attention.attention_for_training(None, args) == "eager"
    assert torch_cpu_bf16_kernel_caches.limit_kernel_caches(args, {}) != {}
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    _, _, args, _ = recipe.parse_arguments(["--output_dir", str(tmp_path), "--use_cpu", "true"])
    assert (args.mixed_precision, pad_to_multiple_of(args), recipe.describe_precision(args)) == ("no", None, "float32")


def test_translate_py_decodes_in_bf16_on_a_gpu_unless_a_dtype_is_given(monkeypatch, tmp_path):
    script = load_script("translate")
    asked: list[dict] = []

    def load_engine(model_dir, engine="transformers", **options):
        asked.append(options)
        return lambda sentences, **kwargs: list(sentences)

    monkeypatch.setattr(script, "load_engine", load_engine)
    monkeypatch.setattr(script, "set_cpu_threads", lambda threads: None)
    run = ["--model_dir", str(tmp_path), "--text", "w1"]
    report_gpu(monkeypatch, *H100)
    script.main(run)
    script.main(run + ["--dtype", "float32"])
    script.main(run + ["--device", "cpu"])
    script.main(run + ["--engine", "ctranslate2"])  # CTranslate2: its --compute_type decides
    assert [options.get("dtype") for options in asked] == [torch.bfloat16, torch.float32, None, None]
    report_gpu(monkeypatch, *V100)
    script.main(run)
    assert asked[-1]["dtype"] is None


def test_a_model_loads_in_the_dtype_asked_for_and_ctranslate2_refuses_one(tmp_path):
    from vanilla_transformer.inference.loading import load_engine, load_translator

    trained_model_dir = str(tmp_path)  # an untrained tiny model: only the dtype matters here
    tiny_model().save_pretrained(trained_model_dir)
    word_tokenizer(["w1", "w2"]).save_pretrained(trained_model_dir)

    model, _ = load_translator(trained_model_dir, device="cpu", dtype=torch.bfloat16)
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    model, _ = load_translator(trained_model_dir, device="cpu")
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}  # as saved
    translate = load_engine(trained_model_dir, device="cpu", dtype=torch.bfloat16)
    assert len(translate(["w1 w2"], max_new_tokens=4)) == 1
    with pytest.raises(ValueError, match="--dtype applies to --engine transformers only"):
        load_engine(trained_model_dir, "ctranslate2", dtype=torch.bfloat16)
