"""CTranslate2 export: the exported model computes what the transformers model computes (log-probabilities, greedy
and beam-search translations) for every architecture option, int8 stays close, and bad input gets one clear error."""

import json
import os
import shutil
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import load_script, tiny_model, word_tokenizer
from transformers import BartConfig

ctranslate2 = pytest.importorskip("ctranslate2", reason="the ctranslate2 extra (part of the test extra)")

from vanilla_transformer.hub.upload import export_for_upload  # noqa: E402
from vanilla_transformer.inference.ctranslate2 import (  # noqa: E402
    EXPORT_INFO,
    INSTALL_HINT,
    export_ctranslate2,
    load_ctranslate2_translator,
    require_ctranslate2,
)
from vanilla_transformer.inference.translate import translate  # noqa: E402

WORDS = [f"w{i}" for i in range(60)]  # ids 4 … 63 of the word tokenizer

# Every architecture option the export covers; each entry overrides tiny_config (2+2 layers, d_model 32, vocab 64).
VARIANTS = {
    "post-norm": {},
    "pre-norm": {"normalize_before": True},
    "learned-positions": {"position_embedding_type": "learned"},
    "separate-vocabularies": {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 80},
    "unscaled-gelu": {"scale_embedding": False, "activation_function": "gelu"},
    "untied-projection": {"tie_word_embeddings": False, "normalize_before": True},
}


def random_sentences(n: int, seed: int, longest: int = 12, words: int = len(WORDS)) -> list[str]:
    """n sentences of 1 … `longest` words drawn from the first `words` of WORDS."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (n,), generator=generator).tolist()
    return [" ".join(WORDS[i] for i in torch.randint(0, words, (k,), generator=generator).tolist()) for k in lengths]


def save(model, folder) -> str:
    model.save_pretrained(folder)
    word_tokenizer(WORDS).save_pretrained(folder)
    return str(folder)


def transformers_log_probs(model, tokenizer, source: str, target: str) -> torch.Tensor:
    """log p(target token | source, previous target tokens) for each target token, eos included."""
    input_ids = tokenizer(source, return_tensors="pt")["input_ids"]
    labels = tokenizer(target, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=input_ids, labels=labels).logits[0]
    return logits.log_softmax(-1).gather(1, labels[0][:, None]).squeeze(1)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_float32_export_computes_the_same_model(variant, tmp_path, one_thread):
    """Teacher-forced log-probabilities agree to 1e-4 (every weight, norm, scale and position in its place), and
    greedy decoding gives the same tokens on 50 sentences. Weights are drawn wider than at initialisation so that
    the outputs depend on them."""
    model = tiny_model(init_std=0.3, max_position_embeddings=64, **VARIANTS[variant])
    exported = export_ctranslate2(save(model, tmp_path / "model"), str(tmp_path / "ct2"))
    translator = load_ctranslate2_translator(exported, threads=1)
    tokenizer = translator.tokenizer

    sources, targets = random_sentences(8, seed=1), random_sentences(8, seed=2)
    results = translator.translator.score_batch(
        [translator.encode(s) for s in sources], [translator.encode(t)[:-1] for t in targets]
    )  # CTranslate2 appends the end token to each target itself
    for source, target, result in zip(sources, targets, results):
        expected = transformers_log_probs(model, tokenizer, source, target)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)

    sentences = random_sentences(50, seed=3)
    expected = translate(model, tokenizer, sentences, batch_size=16, num_beams=1, max_new_tokens=20, progress=False)
    got = translator.translate(sentences, batch_size=16, num_beams=1, max_new_tokens=20, progress=False)
    assert got == expected
    assert len(set(expected)) > 10, "the outputs should differ between sentences"


def reverse_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    sources = random_sentences(n, seed=seed, longest=7, words=10)
    return sources, [" ".join(s.split()[::-1]) for s in sources]


TRAINING_SEED = 5


@pytest.fixture(scope="module")
def trained_model_dir(tmp_path_factory) -> str:
    """A tiny post-norm model that learned to reverse 64 word sequences (TRAINING_SEED): translations that depend on
    the source."""
    torch.manual_seed(0)
    tokenizer = word_tokenizer(WORDS)
    model = tiny_model(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, dropout=0.0).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sources, targets = reverse_pairs(64, seed=TRAINING_SEED)
        batch = tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        batch.pop("token_type_ids", None)
        for step in range(400):
            loss = model(**batch).loss
            if step % 25 == 0 and loss.item() < 0.02:
                break
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return save(model.eval(), tmp_path_factory.mktemp("trained") / "model")


def test_trained_model_greedy_and_beam_translations_are_identical(trained_model_dir, tmp_path, one_thread):
    from vanilla_transformer.inference.translate import load_translator

    model, tokenizer = load_translator(trained_model_dir, device="cpu")
    translator = load_ctranslate2_translator(export_ctranslate2(trained_model_dir, str(tmp_path / "ct2")), threads=1)
    sources, references = reverse_pairs(64, seed=TRAINING_SEED)
    for num_beams in (1, 4):
        expected = translate(model, tokenizer, sources, batch_size=16, num_beams=num_beams, progress=False)
        got = translator.translate(sources, batch_size=16, num_beams=num_beams, progress=False)
        assert got == expected, f"num_beams={num_beams}"
    exact = sum(h == r for h, r in zip(got, references))
    assert exact >= 48, f"the trained model reverses only {exact}/64 sentences: the test would prove little"


def test_several_workers_translate_batches_at_once_in_input_order(trained_model_dir, tmp_path):
    exported = export_ctranslate2(trained_model_dir, str(tmp_path / "ct2"))
    sources, _ = reverse_pairs(64, seed=TRAINING_SEED)
    sources = sources[::-1] + [""]  # not sorted by length, and an empty line
    expected = load_ctranslate2_translator(exported, threads=1).translate(sources, batch_size=4, num_beams=2)
    workers = load_ctranslate2_translator(exported, threads=1, inter_threads=2)
    assert workers.translator.num_translators == 2
    assert workers.translate(sources, batch_size=4, num_beams=2) == expected
    assert expected[-1] == ""
    with pytest.raises(ValueError, match="inter_threads=0 is invalid"):
        load_ctranslate2_translator(exported, inter_threads=0)


def test_int8_export_translates_like_the_float_model(trained_model_dir, tmp_path, one_thread):
    float_translator = load_ctranslate2_translator(trained_model_dir, threads=1)
    int8_dir = export_ctranslate2(trained_model_dir, str(tmp_path / "int8"), quantization="int8")
    int8_translator = load_ctranslate2_translator(int8_dir, threads=1)
    assert json.load(open(os.path.join(int8_dir, EXPORT_INFO)))["quantization"] == "int8"
    assert os.path.getsize(os.path.join(int8_dir, "model.bin")) < 0.5 * 4 * sum(
        p.numel() for p in tiny_model(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128).parameters()
    ), "int8 weights should take about a byte each"
    sources, _ = reverse_pairs(64, seed=TRAINING_SEED)
    same = sum(a == b for a, b in zip(float_translator.translate(sources), int8_translator.translate(sources)))
    assert same >= 60, f"int8 changed {64 - same}/64 translations"


def test_export_folder_translates_on_its_own(trained_model_dir, tmp_path, one_thread):
    """Tokenizer, generation config and position table travel with the export; the model folder is not needed."""
    model_dir = shutil.copytree(trained_model_dir, tmp_path / "model")
    exported = export_ctranslate2(str(model_dir), str(tmp_path / "ct2"))
    expected = load_ctranslate2_translator(exported, threads=1).translate(["w1 w2 w3"])
    shutil.rmtree(model_dir)
    assert {"model.bin", "tokenizer.json", "generation_config.json", EXPORT_INFO} <= set(os.listdir(exported))
    assert load_ctranslate2_translator(exported, threads=1).translate(["w1 w2 w3"]) == expected == ["w3 w2 w1"]


def test_too_long_input_is_refused_with_a_clear_error(trained_model_dir, tmp_path):
    exported = export_ctranslate2(trained_model_dir, str(tmp_path / "ct2"), max_positions=8)
    translator = load_ctranslate2_translator(exported, threads=1)
    assert translator.translate(["w1 w2 w3 w4 w5 w6 w7"], num_beams=1) == ["w7 w6 w5 w4 w3 w2 w1"]  # 8 tokens: fits
    with pytest.raises(ValueError, match="sentence 2 has 9 tokens but the CTranslate2 export accepts at most 8"):
        translator.translate(["w1", "w1 w2 w3 w4 w5 w6 w7 w8"])


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_translations_stop_at_the_end_of_the_position_table(positions, tmp_path, one_thread):
    """A model that never ends its sentences: the translation has as many tokens as there are positions, the same
    tokens as generate()'s, and asking for more is no error."""
    model = tiny_model(init_std=0.3, position_embedding_type=positions, max_position_embeddings=8)
    exported = export_ctranslate2(save(model, tmp_path / "model"), str(tmp_path / "ct2"), max_positions=8)
    translator = load_ctranslate2_translator(exported, threads=1)
    for num_beams in (1, 4):
        got = translator.translate(["w1 w2"], num_beams=num_beams, max_new_tokens=100)
        assert got == translate(model, translator.tokenizer, ["w1 w2"], num_beams=num_beams, max_new_tokens=8)
        assert len(got[0].split()) == 8


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"activation_function": "tanh"}, "activation_function='tanh' has no CTranslate2 equivalent"),
        ({"decoder_attention_heads": 2}, "decoder_attention_heads=2 differ"),
        ({"position_embedding_type": "learned", "max_position_embeddings": 16}, "exceeds the learned position table"),
    ],
)
def test_unsupported_options_are_refused(overrides, message, tmp_path):
    model_dir = save(tiny_model(**overrides), tmp_path / "model")
    with pytest.raises(ValueError, match=message):
        export_ctranslate2(model_dir, str(tmp_path / "ct2"), max_positions=32)
    assert not os.path.exists(tmp_path / "ct2")


def test_bad_folders_and_options_are_refused(trained_model_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is not a saved model folder"):
        export_ctranslate2(str(tmp_path / "empty"), str(tmp_path / "ct2"))
    BartConfig(vocab_size=64, d_model=32).save_pretrained(tmp_path / "bart")
    with pytest.raises(ValueError, match="is a 'bart' model, not a vanilla_transformer one"):
        export_ctranslate2(str(tmp_path / "bart"), str(tmp_path / "ct2"))
    with pytest.raises(ValueError, match="quantization='int4' is not supported; allowed: int8"):
        export_ctranslate2(trained_model_dir, str(tmp_path / "ct2"), quantization="int4")
    with pytest.raises(ValueError, match="neither a CTranslate2 export .* nor a saved model"):
        load_ctranslate2_translator(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="compute_type='int3' is not supported"):
        load_ctranslate2_translator(trained_model_dir, compute_type="int3")
    exported = export_ctranslate2(trained_model_dir, str(tmp_path / "ct2"))
    with pytest.raises(ValueError, match="already exists; remove it or pass --force"):
        export_ctranslate2(trained_model_dir, exported)
    with pytest.raises(ValueError, match="is already a CTranslate2 export"):
        export_ctranslate2(exported, str(tmp_path / "again"))


# --------------------------------------------------------------------------------------------------------------------
# The device and the compute type, on a machine with a GPU (stubbed: CTranslate2 reports a CUDA device)

# What CTranslate2 raises at the first translation where its wheel's CUDA libraries are not those of the machine
CUDA_LIBRARY_ERROR = "Library libcublas.so.12 is not found or cannot be loaded"
CUDA_COMPUTE_TYPES = {"float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16", "int8_bfloat16"}
FALLBACK = f"CTranslate2: CUDA libraries did not load ({CUDA_LIBRARY_ERROR}); translating on the CPU"


class CudaTranslatorStub:
    """A ctranslate2.Translator on "cuda": it builds, and translates only if `libraries_load`."""

    def __init__(self, path, device, libraries_load, **options):
        self.device, self.compute_type, self.libraries_load = device, options["compute_type"], libraries_load

    def translate_batch(self, sources, **options):
        if not self.libraries_load:
            raise RuntimeError(CUDA_LIBRARY_ERROR)
        return [SimpleNamespace(hypotheses=[["w1"]]) for _ in sources]


def stub_one_gpu(monkeypatch, libraries_load: bool) -> list[str]:
    """CTranslate2 reports one CUDA device and its compute types; Translators on "cuda" are stubs, on "cpu" real.
    Returns the devices of the Translators built, in order."""
    cpu_translator, cpu_types = ctranslate2.Translator, ctranslate2.get_supported_compute_types
    built = []

    def translator(path, device="cpu", **options):
        built.append(device)
        if device == "cuda":
            return CudaTranslatorStub(path, device, libraries_load, **options)
        return cpu_translator(path, device=device, **options)

    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 1)
    monkeypatch.setattr(
        ctranslate2,
        "get_supported_compute_types",
        lambda device: CUDA_COMPUTE_TYPES if device == "cuda" else cpu_types(device),
    )
    monkeypatch.setattr(ctranslate2, "Translator", translator)
    return built


def test_auto_device_falls_back_to_the_cpu_in_one_line_where_the_cuda_libraries_do_not_load(
    trained_model_dir, tmp_path, monkeypatch, caplog, capsys
):
    exported = export_ctranslate2(trained_model_dir, str(tmp_path / "ct2"))
    expected = load_ctranslate2_translator(exported, threads=1).translate(["w1 w2 w3"])
    built = stub_one_gpu(monkeypatch, libraries_load=False)

    with caplog.at_level("WARNING", logger="vanilla_transformer.inference.ctranslate2"):
        translator = load_ctranslate2_translator(exported, device="auto", threads=1)
    assert built == ["cuda", "cpu"]  # tried on the GPU, which failed at its first token
    assert [record.getMessage() for record in caplog.records] == [FALLBACK]
    assert translator.translator.device == "cpu" and translator.translate(["w1 w2 w3"]) == expected == ["w3 w2 w1"]

    # translate.py's default device is auto: the same line, then the translations
    caplog.clear()
    load_script("translate").main(["--model_dir", exported, "--engine", "ctranslate2", "--text", "w1 w2 w3"])
    assert [record.getMessage() for record in caplog.records] == [FALLBACK]
    assert capsys.readouterr().out == "w3 w2 w1\n"

    # where the libraries load, auto is the GPU, silently
    caplog.clear()
    built = stub_one_gpu(monkeypatch, libraries_load=True)
    assert load_ctranslate2_translator(exported, device="auto").translator.device == "cuda"
    assert built == ["cuda"] and not caplog.records


def test_cuda_asked_for_where_its_libraries_do_not_load_is_a_one_line_error(trained_model_dir, tmp_path, monkeypatch):
    exported = export_ctranslate2(trained_model_dir, str(tmp_path / "ct2"))
    stub_one_gpu(monkeypatch, libraries_load=False)
    with pytest.raises(RuntimeError, match=f"^CTranslate2 cannot translate on cuda: {CUDA_LIBRARY_ERROR}$"):
        load_ctranslate2_translator(exported, device="cuda")
    with pytest.raises(
        SystemExit, match=f"^translate.py: error: CTranslate2 cannot translate on cuda: {CUDA_LIBRARY_ERROR}$"
    ):
        load_script("translate").main(
            ["--model_dir", exported, "--engine", "ctranslate2", "--device", "cuda", "--text", "w1"]
        )
    # a CUDA runtime the driver cannot run: CTranslate2's device count raises, and auto is the CPU
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: (_ for _ in ()).throw(RuntimeError("driver")))
    assert load_ctranslate2_translator(exported, device="auto", threads=1).translator.device == "cpu"


def test_a_compute_type_the_device_cannot_run_is_a_clear_error_naming_those_it_can(
    trained_model_dir, tmp_path, monkeypatch
):
    exported = export_ctranslate2(trained_model_dir, str(tmp_path / "ct2"))
    cpu_types = ctranslate2.get_supported_compute_types("cpu")
    # CTranslate2 computes in none of these on a CPU
    unsupported = next(t for t in ("float16", "int8_float16", "int8_bfloat16") if t not in cpu_types)
    with pytest.raises(
        ValueError, match=f"^compute_type='{unsupported}' is not supported on cpu by CTranslate2"
    ) as error:
        load_ctranslate2_translator(exported, device="cpu", compute_type=unsupported)
    assert f"supported there: {', '.join(sorted(cpu_types))}, or default" in str(error.value)

    stub_one_gpu(monkeypatch, libraries_load=True)
    for device in ("cuda", "auto"):  # int16 has no CUDA kernels
        with pytest.raises(ValueError, match="compute_type='int16' is not supported on cuda") as error:
            load_ctranslate2_translator(exported, device=device, compute_type="int16")
        assert f"supported there: {', '.join(sorted(CUDA_COMPUTE_TYPES))}, or default" in str(error.value)
    assert load_ctranslate2_translator(
        exported, device="cuda", compute_type="int8_float16"
    ).translator.compute_type == ("int8_float16")
    with pytest.raises(SystemExit, match=r"^translate.py: error: compute_type='int16' is not supported on cuda"):
        load_script("translate").main(
            ["--model_dir", exported, "--engine", "ctranslate2", "--compute_type", "int16", "--text", "w1"]
        )


def test_translate_script_turns_an_error_during_translation_into_one_line(trained_model_dir, tmp_path, monkeypatch):
    """A GPU out of memory, or a library that loads only at the first batch, fails inside the translation."""
    from vanilla_transformer.inference import ctranslate2 as engine

    def out_of_memory(self, sentences, **options):
        raise RuntimeError("CUDA failed with error out of memory\n(a long C++ trace)")

    monkeypatch.setattr(engine.CTranslate2Translator, "translate", out_of_memory)
    exported = export_ctranslate2(trained_model_dir, str(tmp_path / "ct2"))
    with pytest.raises(SystemExit, match=r"^translate.py: error: CUDA failed with error out of memory$"):
        load_script("translate").main(
            ["--model_dir", exported, "--engine", "ctranslate2", "--device", "cpu", "--text", "w1", "--threads", "1"]
        )


# --------------------------------------------------------------------------------------------------------------------
# The scripts


def test_export_script_and_translate_engines_agree(trained_model_dir, tmp_path, capsys, one_thread):
    exported = str(tmp_path / "ct2")
    load_script("export_ctranslate2").main(
        ["--model_dir", trained_model_dir, "--output_dir", exported, "--quantization", "float32"]
    )
    assert "exported" in capsys.readouterr().out
    sources, references = reverse_pairs(64, seed=TRAINING_SEED)
    (tmp_path / "src.txt").write_text("\n".join(sources) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(references) + "\n")
    outputs = {}
    for engine, model_dir in (("transformers", trained_model_dir), ("ctranslate2", exported)):
        load_script("translate").main(
            ["--model_dir", model_dir, "--engine", engine, "--input_file", str(tmp_path / "src.txt")]
            + ["--references", str(tmp_path / "ref.txt"), "--batch_size", "8", "--threads", "1", "--device", "cpu"]
            + ["--num_beams", "4", "--length_penalty", "0.6"]
        )
        outputs[engine] = capsys.readouterr()
    assert outputs["ctranslate2"].out == outputs["transformers"].out
    assert len(outputs["ctranslate2"].out.splitlines()) == 64
    bleu = [line for line in outputs["ctranslate2"].err.splitlines() if line.startswith("sacreBLEU")]
    assert bleu == [line for line in outputs["transformers"].err.splitlines() if line.startswith("sacreBLEU")]


def test_scripts_give_one_line_errors(trained_model_dir, tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit, match=r"^export_ctranslate2.py: error: .*quantization='int4' is not supported"):
        load_script("export_ctranslate2").main(
            ["--model_dir", trained_model_dir, "--output_dir", str(tmp_path / "x"), "--quantization", "int4"]
        )
    with pytest.raises(SystemExit, match=r"^translate.py: error: --engine 'onnx' is not supported"):
        load_script("translate").main(["--model_dir", trained_model_dir, "--engine", "onnx", "--text", "w1"])
    with pytest.raises(SystemExit, match=r"^translate.py: error: --compute_type and --inter_threads apply to"):
        load_script("translate").main(["--model_dir", trained_model_dir, "--compute_type", "int8", "--text", "w1"])
    exported = export_ctranslate2(trained_model_dir, str(tmp_path / "short"), max_positions=4)
    with pytest.raises(SystemExit, match=r"^translate.py: error: sentence 1 has 6 tokens .* at most 4"):
        load_script("translate").main(
            ["--model_dir", exported, "--engine", "ctranslate2", "--text", "w1 w2 w3 w4 w5", "--threads", "1"]
        )


def test_without_ctranslate2_the_scripts_say_how_to_install_it(trained_model_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'vanilla-transformer\[ctranslate2\]'"):
        require_ctranslate2()
    expected = f"^export_ctranslate2.py: error: {INSTALL_HINT}$".replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(SystemExit, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_script("export_ctranslate2").main(["--model_dir", trained_model_dir, "--output_dir", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match=r"^translate.py: error: CTranslate2 is not installed; install it with"):
        load_script("translate").main(
            ["--model_dir", trained_model_dir, "--engine", "ctranslate2", "--text", "w1", "--threads", "1"]
        )


def test_push_to_hub_with_ctranslate2_exports_into_a_subfolder_and_explains_it(trained_model_dir, tmp_path, capsys):
    """What --with_ctranslate2 adds before the upload (the upload itself is test_hub's round trip): the export in
    ctranslate2/, listed for upload only with the flag, and a card section that loads it."""
    push = load_script("push_to_hub")
    model_dir = str(shutil.copytree(trained_model_dir, tmp_path / "model"))
    with pytest.raises(SystemExit, match=r"^push_to_hub.py: error: --with_ctranslate2: quantization='int3' is not"):
        push.main(["--model_dir", model_dir, "--repo_id", "user/toy", "--with_ctranslate2", "int3"])
    assert export_for_upload(model_dir, "int8") is None
    exported = os.path.join(model_dir, "ctranslate2")
    assert load_ctranslate2_translator(exported, threads=1).translate(["w1 w2 w3"]) == ["w3 w2 w1"]
    uploaded = {path for path, _ in push.files_to_upload(model_dir, "int8")}
    assert {"ctranslate2/model.bin", f"ctranslate2/{EXPORT_INFO}", "model.safetensors"} <= uploaded
    assert not any(path.startswith("ctranslate2/") for path, _ in push.files_to_upload(model_dir))

    from vanilla_transformer.hub.model_card import write_model_card

    card = open(write_model_card(model_dir, repo_id="user/toy", ctranslate2="int8")).read()
    assert "## Fast inference with CTranslate2" in card and "with\nint8 weights" in card
    assert 'snapshot_download("user/toy", allow_patterns=["ctranslate2/*"])' in card
    assert "CTranslate2" not in open(write_model_card(model_dir, repo_id="user/toy")).read()


# --------------------------------------------------------------------------------------------------------------------
# The benchmarks (no timing is asserted: the figures live in docs/performance.md and docs/deployment.md)


def test_speed_benchmark_tiny_run_times_every_engine_on_the_same_work(tmp_path, one_thread):
    sentences = [" ".join(WORDS[(i * 7 + j) % 60] for j in range(9 + i % 20)) for i in range(40)]
    data_file = tmp_path / "sentences.txt"
    data_file.write_text("\n".join(sentences) + "\n")
    word_tokenizer(WORDS).save_pretrained(tmp_path / "tokenizer")
    bench = load_script("ctranslate2_speed", folder="benchmarks")
    result = bench.main(
        ["--data_file", str(data_file), "--tokenizer_dir", str(tmp_path / "tokenizer"), "--sizes", "tiny"]
        + ["--sentences", "32", "--threads", "1", "--beams", "2", "--batch_size", "8", "--memory", "false"]
        + ["--output_file", str(tmp_path / "speed.json")]
    )
    (run,) = result["speed"]
    assert [row["engine"] for row in run["rows"]] == list(bench.ENGINES)
    assert run["sentences"] == 32 and run["tokens"] >= 32 * 10  # every source has 10 tokens or more
    assert run["rows"][0]["ratio"] == 1.0 and all(row["tokens_per_s"] > 0 for row in run["rows"])
    assert json.loads((tmp_path / "speed.json").read_text())["speed"][0]["tokens"] == run["tokens"]


def test_quality_benchmark_compares_the_exports_with_transformers(trained_model_dir, tmp_path, capsys):
    sources, references = reverse_pairs(16, seed=TRAINING_SEED)
    data_file = tmp_path / "test.jsonl"
    data_file.write_text(
        "".join(json.dumps({"translation": {"a": s, "b": r}}) + "\n" for s, r in zip(sources, references))
    )
    result = load_script("ctranslate2_quality", folder="benchmarks").main(
        ["--model_dir", trained_model_dir, "--data_file", str(data_file), "--source_lang", "a", "--target_lang", "b"]
        + ["--output_file", str(tmp_path / "quality.json")]
    )
    rows = {(row["engine"], row["num_beams"]): row for row in result["rows"]}
    assert set(rows) == {(e, b) for e in ("transformers", "ct2_float32", "ct2_int8") for b in (1, 4)}
    assert rows[("ct2_float32", 1)]["identical_to_transformers"] == 16
    assert rows[("ct2_float32", 4)]["bleu"] == rows[("transformers", 4)]["bleu"]
    assert "| beam 4 | ct2_int8 |" in capsys.readouterr().out
