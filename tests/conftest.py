"""Helpers shared by the tests: tiny configs, models and tokenizers, loading and running the scripts, one CPU thread."""

import atexit
import contextlib
import importlib.util
import logging
import os
import random
import shutil
import site
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

# before transformers imports huggingface_hub, which reads HF_HUB_OFFLINE once, at import
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# datasets' cache of this test process alone (each of `pytest -n`'s workers has its own), emptied at exit: not the
# user's ~/.cache, where earlier runs' files and another worker's could meet these tests'
if "HF_DATASETS_CACHE" not in os.environ:
    os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="vanilla-transformer-tests-datasets-")
    atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: E402
from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast  # noqa: E402

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `pytest -n auto --dist worksteal` (the README's command), the slow and multi-process tests first: each
    worker starts with half of the list and an idle one takes the end of the other's, so the long tests are shared
    out early and the run ends on short ones. (Not under xdist's default `--dist load`, which would hand the first
    worker all the long tests in its first chunk: 892 s instead of 769 s for everything on 2 cores.)"""
    if config.getoption("dist", default="no") == "worksteal":
        items.sort(key=lambda item: not (item.get_closest_marker("slow") or item.get_closest_marker("distributed")))


# `accelerate launch` flags of docs/training.md's "Sharded: FSDP2": FSDP2, one unit per encoder/decoder layer, a full
# state dict in checkpoints
FSDP_LAUNCH = [
    *("--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"),
    *("--fsdp_transformer_layer_cls_to_wrap", "EncoderLayer,DecoderLayer", "--fsdp_state_dict_type", "FULL_STATE_DICT"),
    *("--fsdp_reshard_after_forward", "true"),
]

# --config_overrides of the scripts' end-to-end tests: a 1+1-layer, d_model 32 model
TINY_OVERRIDES = (
    "d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=2,decoder_attention_heads=2,"
    "encoder_ffn_dim=64,decoder_ffn_dim=64"
)


def tiny_config(**overrides) -> VanillaTransformerConfig:
    """A 2+2-layer, d_model 32 model: big enough to have every component, small enough for CPU tests."""
    values = dict(
        vocab_size=64,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
    )
    values.update(overrides)
    return VanillaTransformerConfig(**values)


def tiny_model(
    attn_implementation: str | None = None, dtype: torch.dtype | None = None, **overrides
) -> VanillaTransformerForConditionalGeneration:
    """A fresh model of ``tiny_config(**overrides)`` in eval mode, optionally with another attention implementation
    and dtype."""
    model = VanillaTransformerForConditionalGeneration(tiny_config(**overrides))
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def tiny_marian(**overrides) -> MarianMTModel:
    """A fresh MarianMTModel in eval mode with the sizes, ids and dropout of ``tiny_config(**overrides)``: the model
    the tests run beside ours."""
    config = tiny_config(**overrides)
    sizes = ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim", "decoder_ffn_dim")
    sizes += ("encoder_attention_heads", "decoder_attention_heads", "max_position_embeddings")
    dropouts = ("dropout", "attention_dropout", "activation_dropout")
    ids = ("pad_token_id", "eos_token_id", "decoder_start_token_id")
    marian = MarianConfig(
        **{field: getattr(config, field) for field in sizes + dropouts + ids}, decoder_vocab_size=config.vocab_size
    )
    return MarianMTModel(marian).eval()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@contextlib.contextmanager
def transformers_warnings(caplog):
    """caplog's records of transformers' warnings, each once: listened to on transformers' own logger, which stops
    propagating to the root logger (caplog's) meanwhile, as it does by default (a test before may have turned that
    on, and each record would then arrive twice)."""
    library = logging.getLogger("transformers")
    propagate = library.propagate
    library.addHandler(caplog.handler)
    library.propagate = False
    try:
        with caplog.at_level(logging.WARNING, logger="transformers"):
            yield
    finally:
        library.removeHandler(caplog.handler)
        library.propagate = propagate


@contextlib.contextmanager
def single_thread():
    """torch on one intra-op thread: the models are tiny, and on a CPU shared with other work a second thread only
    adds contention (a step can get 10-30x slower); one thread everywhere also keeps the numbers comparable."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def one_thread():
    with single_thread():
        yield


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with the model's special ids (pad 0, bos 1, eos 2, unk 3); sentences end with eos."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


# A toy word-for-word English→German lexicon: a tiny model learns it in about a second (train_toy_model)
LEXICON = {
    "the": "der",
    "cat": "katze",
    "dog": "hund",
    "house": "haus",
    "sat": "sitzt",
    "on": "auf",
    "mat": "matte",
    "is": "ist",
    "big": "gross",
    "small": "klein",
    "red": "rot",
    "blue": "blau",
}


def train_toy_model(tokenizer: PreTrainedTokenizerFast, steps: int = 80) -> VanillaTransformerForConditionalGeneration:
    """About a second of training, so that translations depend on the input (a random model repeats one word); about
    350 steps translate sentences of up to six words word for word."""
    torch.manual_seed(0)
    rng = random.Random(0)
    config = tiny_config(vocab_size=len(tokenizer), max_position_embeddings=64, dropout=0.0)
    model = VanillaTransformerForConditionalGeneration(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(steps):
        source = [" ".join(rng.choice(list(LEXICON)) for _ in range(rng.randint(2, 6))) for _ in range(16)]
        target = [" ".join(LEXICON[word] for word in sentence.split()) for sentence in source]
        batch = tokenizer(source, text_target=target, return_tensors="pt", padding=True)
        labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.generation_config.max_new_tokens = 12
    return model.eval()


def load_script(name: str, folder: str = "scripts"):
    """Import <folder>/<name>.py (scripts/ or benchmarks/) as a module, e.g. to call its main() in-process."""
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses with postponed annotations look their module up there
    spec.loader.exec_module(module)
    return module


def script_env(tmp_path) -> dict[str, str]:
    """The environment of a script run in a subprocess: offline, its own datasets cache, one thread."""
    return dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_DATASETS_CACHE=str(tmp_path / "datasets-cache"),
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
    )


def run_script(name: str, args: list[str], tmp_path, **kwargs) -> subprocess.CompletedProcess:
    """Run scripts/<name>.py in a subprocess with ``script_env``; its output is captured as text."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        env=script_env(tmp_path),
        **kwargs,
    )


def decode_one_token_at_a_time(model, input_ids, attention_mask, decoder_input_ids) -> tuple[torch.Tensor, object]:
    """Run the encoder once, then the decoder one target token per call with the KV cache, as generate() does; returns
    the logits of all steps, concatenated along the target length, and the final cache."""
    encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    cache, steps = None, []
    for t in range(decoder_input_ids.shape[1]):
        out = model(
            encoder_outputs=encoder_outputs,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids[:, t : t + 1],
            cache=cache,
            use_cache=True,
        )
        cache = out.cache
        steps.append(out.logits)
    return torch.cat(steps, dim=1), cache


# Python of an environment without this package, as a Hub user without it has
BLOCKER = """
import sys

class _NoVanillaTransformer:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] == "vanilla_transformer":
            raise ModuleNotFoundError("vanilla_transformer is blocked in this environment", name=name)
        return None

sys.meta_path.insert(0, _NoVanillaTransformer())
"""


@pytest.fixture(scope="session")
def fresh_python(tmp_path_factory) -> str:
    """Python of a new virtual environment with this environment's packages but without vanilla_transformer.

    The parent site-packages come in through a .pth file, which does not run the .pth files inside that folder, so
    the editable install's import hook of this package is not installed; a second .pth blocks the package outright.
    """
    venv = tmp_path_factory.mktemp("venv") / "no-package"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    purelib = Path(
        subprocess.run(
            [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    parents = [*site.getsitepackages(), *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))]
    (purelib / "parent_site_packages.pth").write_text("\n".join(dict.fromkeys(parents)) + "\n")
    (purelib / "_no_vanilla_transformer.py").write_text(BLOCKER)
    (purelib / "_no_vanilla_transformer.pth").write_text("import _no_vanilla_transformer\n")
    return str(venv / "bin" / "python")


def free_port() -> int:
    """A free TCP port on this machine, for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def one_process_group(monkeypatch):
    """A gloo process group of one process, in this process, as `accelerate launch` would set it up."""
    for name, value in zip(LAUNCH_ENV, ("127.0.0.1", str(free_port()), "0", "1", "0", "1")):
        monkeypatch.setenv(name, value)
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture
def reset_accelerate():
    """Accelerate's process-wide state, reset before and after the test."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        yield
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
