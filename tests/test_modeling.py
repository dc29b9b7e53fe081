"""The plug-in behaves like a native transformers seq2seq model."""

import logging
import os
import subprocess
import sys
import textwrap
from unittest.mock import patch

import pytest
import torch
from conftest import decode_one_token_at_a_time, tiny_config, tiny_model
from transformers import (
    AttentionInterface,
    AutoModel,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    CompileConfig,
    GenerationConfig,
)
from transformers.cache_utils import EncoderDecoderCache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as hf_logging

from vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerForSequenceClassification,
    VanillaTransformerModel,
)
from vanilla_transformer import input_checks_vanilla_transformer as input_checks
from vanilla_transformer.modeling_vanilla_transformer import AddAndNorm, SinusoidalPositionalEncoding


def source_batch(batch: int = 3, length: int = 9, pad_last: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids in [3, 64) ending in eos (2); optionally the later rows right-padded with pad (0)."""
    ids = torch.randint(3, 64, (batch, length))
    ids[:, -1] = 2
    mask = torch.ones_like(ids)
    if pad_last:
        for row in range(1, batch):
            cut = length - 2 * row
            ids[row, cut - 1] = 2
            ids[row, cut:] = 0
            mask[row, cut:] = 0
    return ids, mask


# ---------------------------------------------------------------- components


def test_sinusoidal_encoding_matches_the_paper_formula():
    pe = SinusoidalPositionalEncoding(d_model=8)(torch.arange(50))
    pos, i = 17, 3
    angle = pos / 10000 ** (2 * i / 8)
    assert pe.shape == (50, 8)
    torch.testing.assert_close(pe[pos, 2 * i], torch.tensor(angle).sin())
    torch.testing.assert_close(pe[pos, 2 * i + 1], torch.tensor(angle).cos())
    # it extends past any table: position 5000 is still a valid encoding
    far = SinusoidalPositionalEncoding(d_model=8)(torch.tensor([5000]))
    assert torch.isfinite(far).all() and far.abs().max() <= 1


def test_heads_are_split_with_a_transpose_not_a_bare_view():
    model = tiny_model("eager")
    attention = model.model.encoder.layers[0].self_attn
    x = torch.randn(2, 5, 32)
    out, weights = attention(x)
    assert weights.shape == (2, 4, 5, 5)  # (batch, heads, q_len, kv_len)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))  # softmax over the keys
    # reference: explicit per-head computation
    q, k, v = attention.qkv_proj(x).chunk(3, dim=-1)
    heads = []
    for h in range(4):
        sl = slice(8 * h, 8 * (h + 1))
        w = torch.softmax(q[..., sl] @ k[..., sl].transpose(1, 2) / 8**0.5, dim=-1)
        heads.append(w @ v[..., sl])
    torch.testing.assert_close(out, attention.out_proj(torch.cat(heads, dim=-1)))


def test_layer_norm_uses_biased_variance_and_starts_at_identity():
    model = tiny_model()
    norm = model.model.encoder.layers[0].self_attn_norm.layer_norm
    assert torch.equal(norm.weight, torch.ones(32)) and torch.equal(norm.bias, torch.zeros(32))
    x = torch.randn(4, 32)
    expected = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    torch.testing.assert_close(norm(x), expected)


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_residual_dropout_zeroes_p_of_each_sublayer_output_and_scales_the_rest_to_keep_the_mean(p):
    """§5.4: dropout on each sub-layer's output before the residual sum, at the config's P_drop, only in training."""
    add_and_norm = AddAndNorm(tiny_config(dropout=p, normalize_before=True))  # pre-norm: the sum itself comes out
    residual, sublayer = torch.zeros(400, 500), torch.ones(400, 500, requires_grad=True)
    out = add_and_norm(residual, sublayer)
    kept = out != 0
    assert abs((~kept).float().mean().item() - p) < 0.005
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / (1 - p)))
    out.backward(torch.ones_like(out))
    assert torch.equal(sublayer.grad, out.detach())  # the same mask and scale in the gradient
    assert not torch.equal(add_and_norm(residual, sublayer) != 0, kept)  # a new mask on every call
    assert torch.equal(add_and_norm.eval()(residual, sublayer), sublayer)  # no dropout at inference


@pytest.mark.parametrize("scheme", ["normal", "xavier"])
def test_init_schemes_draw_the_documented_distributions(scheme):
    # big enough matrices for the sample standard deviations to be within a few percent of the documented ones
    config = tiny_config(vocab_size=4000, d_model=256, encoder_ffn_dim=1024, init_scheme=scheme)
    model = VanillaTransformerForConditionalGeneration(config)
    embedding = model.model.shared.weight
    qkv = model.model.encoder.layers[0].self_attn.qkv_proj  # (3 d_model, d_model)
    fc1 = model.model.encoder.layers[0].feed_forward.fc1  # (d_ffn, d_model)
    if scheme == "normal":  # N(0, 0.02) everywhere, as BART and Marian
        expected = {"embedding": 0.02, "qkv": 0.02, "fc1": 0.02}
    else:  # Xavier-uniform std = sqrt(2 / (fan_in + fan_out)); embeddings N(0, d_model^-0.5)
        expected = {"embedding": 256**-0.5, "qkv": (2 / (256 + 768)) ** 0.5, "fc1": (2 / (256 + 1024)) ** 0.5}
    assert embedding[1:].std().item() == pytest.approx(expected["embedding"], rel=0.05)
    assert qkv.weight.std().item() == pytest.approx(expected["qkv"], rel=0.05)
    assert fc1.weight.std().item() == pytest.approx(expected["fc1"], rel=0.05)
    if scheme == "xavier":  # uniform: bounded by sqrt(3) standard deviations
        assert qkv.weight.abs().max().item() <= 3**0.5 * expected["qkv"] + 1e-6
    assert torch.equal(embedding[config.pad_token_id], torch.zeros(256))  # the padding row is zero
    assert torch.equal(qkv.bias, torch.zeros(768)) and torch.equal(fc1.bias, torch.zeros(1024))
    assert model.lm_head.weight is embedding  # one matrix, initialised once


def sublayer_to_residual_ratios(model, ids) -> list[float]:
    """‖Sublayer(x)‖ / ‖x‖ at every Add & Norm of one forward pass."""
    ratios = []
    hooks = [
        module.register_forward_hook(lambda _, args, out: ratios.append((args[1].norm() / args[0].norm()).item()))
        for module in model.modules()
        if type(module).__name__ == "AddAndNorm"
    ]
    with torch.no_grad():
        model(input_ids=ids, labels=ids)
    for hook in hooks:
        hook.remove()
    return ratios


def test_normal_init_starts_each_sublayer_small_beside_its_residual():
    """Why "normal" is the default: each post-norm sub-layer starts at a fraction of its residual, so the stack
    starts close to the identity; Xavier makes sub-layer outputs about half the residual (docs/results.md)."""
    ids = torch.randint(4, 4000, (8, 16))
    sizes = dict(vocab_size=4000, d_model=256, encoder_ffn_dim=1024, decoder_ffn_dim=1024)
    normal = tiny_model(**sizes, init_scheme="normal")
    xavier = tiny_model(**sizes, init_scheme="xavier")
    assert max(sublayer_to_residual_ratios(normal, ids)) < 0.25
    assert min(sublayer_to_residual_ratios(xavier, ids)) > 0.3


def test_forward_returns_logits_not_probabilities():
    model = tiny_model()
    ids, mask = source_batch()
    logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits
    assert not torch.allclose(logits.exp().sum(-1), torch.ones(logits.shape[:2]))
    assert (logits < 0).any()


def test_decoder_self_attention_is_causal():
    model = tiny_model()
    ids, _ = source_batch(1, pad_last=False)
    decoder_ids = torch.randint(3, 64, (1, 6))
    changed = decoder_ids.clone()
    changed[0, 4] = (changed[0, 4] + 1) % 60 + 3
    a = model(input_ids=ids, decoder_input_ids=decoder_ids).logits
    b = model(input_ids=ids, decoder_input_ids=changed).logits
    torch.testing.assert_close(a[:, :4], b[:, :4])  # earlier positions cannot see position 4
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_parameter_count_of_the_base_model():
    """Table 3 reports 65M for the base model; with a 37,000-token shared vocabulary we count 63,082,496."""
    config = VanillaTransformerConfig(vocab_size=37000)
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(config)
    total = sum(p.numel() for p in model.parameters())  # tied matrices counted once
    d, ff, n, v = 512, 2048, 6, 37000
    attention = 4 * d * d + 4 * d
    ffn = 2 * d * ff + ff + d
    norm = 2 * d
    formula = v * d + n * (attention + ffn + 2 * norm) + n * (2 * attention + ffn + 3 * norm)
    assert total == formula == 63_082_496
    assert abs(total - 63e6) <= 1e6


# ---------------------------------------------------------------- save / load


def test_save_load_round_trip(tmp_path, caplog):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    files = set(os.listdir(tmp_path))
    assert "model.safetensors" in files and not any(f.endswith((".bin", ".pt", ".pth")) for f in files)
    assert {
        "configuration_vanilla_transformer.py",
        "modeling_vanilla_transformer.py",
        "input_checks_vanilla_transformer.py",
        "loss_vanilla_transformer.py",
        "pipeline_vanilla_transformer.py",
    } <= files

    hf_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING):
            loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    finally:
        hf_logging.disable_propagation()
    assert "newly initialized" not in caplog.text and "corrupted" not in caplog.text.lower()
    assert type(loaded) is VanillaTransformerForConditionalGeneration
    ids, mask = source_batch()
    torch.testing.assert_close(
        loaded(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits,
        model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits,
        rtol=0,
        atol=0,
    )
    shared = loaded.model.shared.weight
    assert loaded.lm_head.weight is shared
    assert loaded.model.encoder.embeddings.embed_tokens.weight is shared
    assert loaded.model.decoder.embeddings.embed_tokens.weight is shared

    half = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype="auto")
    assert half.dtype == torch.float32
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "bf16", dtype="auto").dtype == torch.bfloat16


def test_auto_classes(tmp_path):
    config = tiny_config()
    VanillaTransformerModel(config).save_pretrained(tmp_path / "base")
    assert type(AutoModel.from_pretrained(tmp_path / "base")) is VanillaTransformerModel
    VanillaTransformerForSequenceClassification(config).save_pretrained(tmp_path / "cls")
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "cls")
    assert type(model) is VanillaTransformerForSequenceClassification


def test_trust_remote_code_without_the_package(tmp_path):
    model = tiny_model()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=1, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_new_tokens=8
    )
    model.save_pretrained(tmp_path)
    ids, mask = source_batch()
    expected = model.generate(input_ids=ids, attention_mask=mask).tolist()
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "vanilla_transformer":
                    raise ModuleNotFoundError("vanilla_transformer is blocked in this test")
        sys.meta_path.insert(0, Block())
        try:
            import vanilla_transformer
            raise SystemExit("the package is importable")
        except ModuleNotFoundError:
            pass
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path)!r}, trust_remote_code=True).eval()
        assert "vanilla_transformer" not in type(model).__module__.split(".")[0]
        ids = torch.tensor({ids.tolist()})
        mask = torch.tensor({mask.tolist()})
        print(model.generate(input_ids=ids, attention_mask=mask).tolist())
        """
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert eval(result.stdout.strip().splitlines()[-1]) == expected


# ---------------------------------------------------------------- generation


def test_cache_and_no_cache_decode_the_same_tokens():
    model = tiny_model()
    ids, mask = source_batch()
    common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, min_new_tokens=12)
    with_cache = model.generate(**common, use_cache=True)
    without = model.generate(**common, use_cache=False)
    assert torch.equal(with_cache, without)
    beams = dict(common, num_beams=4, length_penalty=0.6, no_repeat_ngram_size=2)
    assert torch.equal(model.generate(**beams, use_cache=True), model.generate(**beams, use_cache=False))


def test_cache_holds_cross_attention_computed_once():
    model = tiny_model()
    ids, mask = source_batch()
    out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=torch.ones(3, 1, dtype=torch.long))
    cache = out.cache
    assert isinstance(cache, EncoderDecoderCache)
    keys = cache.cross_attention_cache.layers[0].keys
    assert keys.shape == (3, 4, ids.shape[1], 8)
    step = model(
        encoder_outputs=(out.encoder_last_hidden_state,),
        attention_mask=mask,
        decoder_input_ids=torch.full((3, 1), 5),
        cache=cache,
    )
    assert step.cache.cross_attention_cache.layers[0].keys is keys  # reused, not recomputed
    assert step.cache.get_seq_length() == 2


def test_incremental_decoding_matches_full_forward():
    model = tiny_model()
    ids, mask = source_batch()
    decoder_ids = torch.randint(3, 64, (3, 7))
    full = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    stepwise, _ = decode_one_token_at_a_time(model, ids, mask, decoder_ids)
    torch.testing.assert_close(stepwise, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("use_cache", [False, True, None])
def test_a_given_cache_is_used_whatever_use_cache_says(use_cache):
    """As in Marian and BART, `use_cache` only asks for a new cache: a continuation from a given one (peft's
    PrefixTuning passes its prefix so, with labels, which set use_cache=False) equals the full forward, and the cache
    holds the past and the new tokens."""
    model = tiny_model()
    ids, mask = source_batch()
    decoder_ids = torch.randint(3, 64, (3, 7))
    full = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    past = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids[:, :3], use_cache=True).cache
    rest = model(
        input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids[:, 3:], cache=past, use_cache=use_cache
    )
    torch.testing.assert_close(rest.logits, full[:, 3:], atol=1e-5, rtol=1e-5)
    assert rest.cache is past and past.get_seq_length() == 7
    labels = decoder_ids[:, 3:]
    with_labels = model(input_ids=ids, attention_mask=mask, decoder_input_ids=labels, cache=past, labels=labels)
    assert with_labels.logits.shape == (3, 4, 64)  # read the cache (10 positions then), not failed on the mask


def test_past_key_values_is_still_accepted():
    model = tiny_model()
    ids, _ = source_batch(1, pad_last=False)
    out = model(input_ids=ids, decoder_input_ids=torch.ones(1, 1, dtype=torch.long), use_cache=True)
    with pytest.warns(FutureWarning):
        nxt = model(input_ids=ids, decoder_input_ids=torch.full((1, 1), 5), past_key_values=out.cache)
    assert nxt.cache.get_seq_length() == 2


@pytest.mark.parametrize("pre_norm", [False, True])
def test_eager_and_sdpa_agree(pre_norm):
    eager = tiny_model("eager", normalize_before=pre_norm)
    sdpa = tiny_model("sdpa", normalize_before=pre_norm)
    sdpa.load_state_dict(eager.state_dict())
    ids, mask = source_batch()
    decoder_ids = torch.randint(3, 64, (3, 6))
    decoder_mask = torch.ones_like(decoder_ids)
    decoder_mask[2, 4:] = 0
    kwargs = dict(
        input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids, decoder_attention_mask=decoder_mask
    )
    torch.testing.assert_close(eager(**kwargs).logits, sdpa(**kwargs).logits, atol=1e-5, rtol=1e-5)


def test_padded_batch_gives_the_same_tokens_as_each_sentence_alone():
    model = tiny_model()
    ids, mask = source_batch()
    common = dict(max_new_tokens=10, num_beams=1, do_sample=False)
    batched = model.generate(input_ids=ids, attention_mask=mask, **common)
    for row in range(ids.shape[0]):
        length = int(mask[row].sum())
        alone = model.generate(input_ids=ids[row : row + 1, :length], **common)
        n = alone.shape[1]
        assert torch.equal(batched[row, :n], alone[0])
        assert (batched[row, n:] == 0).all()  # finished rows are padded


def test_generation_strategies_and_dict_outputs():
    model = tiny_model("eager")
    ids, mask = source_batch()
    greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6)
    assert greedy.shape[0] == 3 and (greedy[:, 0] == 1).all()  # starts with decoder_start_token_id
    beam = model.generate(
        input_ids=ids,
        attention_mask=mask,
        num_beams=4,
        num_return_sequences=2,
        length_penalty=0.8,
        no_repeat_ngram_size=2,
        max_new_tokens=6,
    )
    assert beam.shape[0] == 6
    for row in beam.tolist():  # no repeated bigram
        bigrams = [tuple(row[i : i + 2]) for i in range(len(row) - 1) if 0 not in row[i : i + 2]]
        assert len(bigrams) == len(set(bigrams))
    torch.manual_seed(1)
    sampled = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=10, top_p=0.9, max_new_tokens=6)
    assert sampled.shape[0] == 3
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=4,
        min_new_tokens=4,
        return_dict_in_generate=True,
        output_scores=True,
        output_attentions=True,
        output_hidden_states=True,
    )
    assert len(out.scores) == 4 and out.scores[0].shape == (3, 64)
    assert len(out.cross_attentions) == 4 and out.cross_attentions[0][0].shape == (3, 4, 1, ids.shape[1])
    assert len(out.encoder_attentions) == 2 and len(out.encoder_hidden_states) == 3
    assert len(out.decoder_hidden_states[0]) == 3


def test_static_cache_generation_matches_dynamic():
    model = tiny_model()
    ids, mask = source_batch()
    common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8)
    static = model.generate(**common, cache_implementation="static")
    assert torch.equal(static, model.generate(**common))


def test_compiles_as_one_graph_for_a_forward_and_a_static_cache_generate():
    """`_can_compile_fullgraph`: torch.compile(fullgraph=True) traces without a graph break (the eager backend: the
    tracing is what is tested, not the code generation), and generate's compiled static-cache decoding gives the same
    tokens as the dynamic cache."""
    model = tiny_model()
    ids, mask = source_batch()
    decoder_ids = torch.randint(3, 64, (3, 5))
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        torch.testing.assert_close(
            compiled(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits, expected
        )
    config = CompileConfig(fullgraph=True, backend="eager")
    config._compile_all_devices = True  # transformers compiles generate's decoding step only on GPUs otherwise
    common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6)
    with patch.object(torch, "compile", wraps=torch.compile) as compile_calls:
        static = model.generate(**common, cache_implementation="static", compile_config=config)
    assert compile_calls.call_args.kwargs["fullgraph"] is True
    assert torch.equal(static, model.generate(**common))


def test_attention_backend_kwargs_reach_the_attention_function():
    """`_supports_attention_backend`: a function registered with transformers' AttentionInterface is used by every
    attention module, and keyword arguments given to the model's forward reach it."""
    calls = []

    def recording_attention(module, query, key, value, attention_mask, **kwargs):
        calls.append((module.is_causal, module.is_cross_attention, kwargs.get("backend_option")))
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("recording", recording_attention)
    AttentionMaskInterface.register("recording", sdpa_mask)  # the masks sdpa takes, as it delegates to sdpa
    model = tiny_model()
    ids, mask = source_batch()
    expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits
    model.set_attn_implementation("recording")
    logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids, backend_option="seen").logits
    torch.testing.assert_close(logits, expected)
    # 2 encoder layers (self), 2 decoder layers (causal self and cross)
    assert sorted(calls) == sorted([(False, False, "seen")] * 2 + [(True, False, "seen"), (False, True, "seen")] * 2)


# the Python entry points through which a tensor's value reaches the host (a device sync on an accelerator)
HOST_READS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")


@pytest.fixture
def plugin_host_reads(monkeypatch):
    """Counts the reads of tensor values that the plug-in's own code makes (the caller's file is a file a checkpoint
    carries), with the input checks treating the CPU as an accelerator, where each read is a device-to-host copy.
    transformers' own reads (generate's stopping test, its mask shortcuts) and the loss's are not the plug-in's."""
    monkeypatch.setattr(input_checks, "_HOST_DEVICES", ())
    plugin = {
        os.path.abspath(module.__file__)
        for module in (input_checks, sys.modules[VanillaTransformerForConditionalGeneration.__module__])
    }
    reads = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _original=original, **kwargs):
            caller = sys._getframe(1)
            if os.path.abspath(caller.f_code.co_filename) in plugin:
                reads.append(f"{_name} at {os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return reads


def test_a_training_forward_reads_no_tensor_values_on_an_accelerator(plugin_host_reads):
    """A sync per step stalls the host that should run ahead of the GPU: the input checks read no values there."""
    model = tiny_model().train()
    ids, mask = source_batch()
    labels = ids.masked_fill(mask == 0, -100)
    model(input_ids=ids, attention_mask=mask, labels=labels, decoder_attention_mask=mask).loss.backward()
    assert plugin_host_reads == []


def test_static_cache_decoding_steps_read_no_tensor_values_on_an_accelerator(plugin_host_reads):
    """With a static cache the past length is a device tensor: no decoding step reads it (or the ids)."""
    model = tiny_model()
    ids, mask = source_batch()
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, cache_implementation="static")
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, num_beams=2, cache_implementation="static")
    assert plugin_host_reads == []


def test_the_host_read_counter_sees_the_checks_on_the_cpu(plugin_host_reads, monkeypatch):
    """The counter above can fail: with the CPU counted as the host, the id checks read the id range."""
    monkeypatch.setattr(input_checks, "_HOST_DEVICES", ("cpu",))
    ids, mask = source_batch()
    tiny_model()(input_ids=ids, attention_mask=mask, labels=ids)
    assert len(plugin_host_reads) >= 2 and all("input_checks" in read for read in plugin_host_reads)


# ---------------------------------------------------------------- API surface


def test_outputs_tuples_embeddings_and_resizing():
    model = tiny_model("eager")
    ids, mask = source_batch()
    out = model(
        input_ids=ids, attention_mask=mask, decoder_input_ids=ids, output_attentions=True, output_hidden_states=True
    )
    assert len(out.encoder_attentions) == 2 and out.encoder_attentions[0].shape == (3, 4, 9, 9)
    assert len(out.decoder_attentions) == 2 and len(out.cross_attentions) == 2
    assert len(out.encoder_hidden_states) == 3 and len(out.decoder_hidden_states) == 3

    as_tuple = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], out.logits)

    embeds = model.get_input_embeddings()(ids)
    from_embeds = model(inputs_embeds=embeds, attention_mask=mask, decoder_inputs_embeds=embeds).logits
    torch.testing.assert_close(from_embeds, out.logits)
    assert model.get_encoder() is model.model.encoder

    model.resize_token_embeddings(80)
    assert model.config.vocab_size == model.config.decoder_vocab_size == 80
    assert model.lm_head.weight.shape == (80, 32) and model.lm_head.weight is model.model.shared.weight
    assert model(input_ids=ids, decoder_input_ids=ids).logits.shape[-1] == 80


@pytest.mark.parametrize(
    "model_class",
    [VanillaTransformerModel, VanillaTransformerForConditionalGeneration, VanillaTransformerForSequenceClassification],
)
def test_tuple_output_holds_the_dict_outputs_in_order(model_class):
    """return_dict=False gives the non-None fields of the dict output, in order, for every class and with every
    optional output captured (hidden states: embeddings + one per layer, attentions: one per layer)."""
    torch.manual_seed(0)
    model = model_class(tiny_config(num_labels=3)).eval()
    model.set_attn_implementation("eager")
    ids, mask = source_batch()
    ids[:, -1] = 2  # an eos token ends every row, for the classifier
    mask = torch.ones_like(ids)
    kwargs = dict(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    as_dict = model(**kwargs)
    as_tuple = model(**kwargs, return_dict=False)
    expected = [value for value in as_dict.to_tuple() if value is not None]
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(expected)
    for got, want in zip(as_tuple, expected):
        if isinstance(want, EncoderDecoderCache):  # the decoder's cache, a fresh one per call
            assert isinstance(got, EncoderDecoderCache)
            continue
        for g, w in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want))):
            torch.testing.assert_close(g, w)
    assert len(as_dict.encoder_hidden_states) == len(as_dict.decoder_hidden_states) == 3
    assert len(as_dict.encoder_attentions) == len(as_dict.decoder_attentions) == len(as_dict.cross_attentions) == 2
    # the last hidden state of each stack is the stack's output
    torch.testing.assert_close(as_dict.encoder_hidden_states[-1], as_dict.encoder_last_hidden_state)


def test_output_attentions_with_sdpa_warns_and_returns_no_weights():
    """As Marian and BART: not an error but transformers' one-time sdpa warning, no weights, the same logits."""
    model = tiny_model("sdpa")
    ids, mask = source_batch()
    logger = hf_logging.get_logger("transformers.integrations.sdpa_attention")
    logging.Logger.warning_once.cache_clear()  # warned at most once per process: forget earlier tests' warnings
    with CaptureLogger(logger) as captured:
        out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids, output_attentions=True)
    assert "does not support `output_attentions=True`" in captured.out
    assert out.encoder_attentions == out.decoder_attentions == out.cross_attentions == ()
    torch.testing.assert_close(out.logits, model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits)


def test_gradient_checkpointing_gives_the_same_gradients():
    model = tiny_model()
    model.train()
    ids, mask = source_batch()
    labels = torch.randint(3, 64, (3, 5))

    def grads():
        torch.manual_seed(0)
        model.zero_grad()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads()
    model.activation_checkpointing_enable()
    assert model.model.encoder.layers[0].gradient_checkpointing
    for a, b in zip(plain, grads()):
        torch.testing.assert_close(a, b)


def test_loss_is_cross_entropy_over_shifted_labels_ignoring_minus_100():
    model = tiny_model()
    ids, mask = source_batch()
    labels = torch.randint(3, 64, (3, 5))
    labels[1, 3:] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    decoder_ids = model.prepare_decoder_input_ids_from_labels(labels)
    assert decoder_ids[0, 0] == 1 and torch.equal(
        decoder_ids[:, 1:][labels[:, :-1] != -100], labels[:, :-1][labels[:, :-1] != -100]
    )
    logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)


def test_gradient_accumulation_matches_one_big_batch():
    """Trainer passes num_items_in_batch; the summed micro-batch losses then equal the big batch's mean loss."""
    model = tiny_model()
    ids, mask = source_batch(4)
    labels = torch.randint(3, 64, (4, 6))
    labels[0, 2:] = -100  # unequal numbers of labelled tokens per example
    labels[3, 5:] = -100
    total = int((labels != -100).sum())

    model.zero_grad()
    model(input_ids=ids, attention_mask=mask, labels=labels, num_items_in_batch=total).loss.backward()
    big = [p.grad.clone() for p in model.parameters()]

    model.zero_grad()
    for row in range(4):
        sl = slice(row, row + 1)
        model(input_ids=ids[sl], attention_mask=mask[sl], labels=labels[sl], num_items_in_batch=total).loss.backward()
    for a, b in zip(big, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_device_map_auto_loads(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, device_map="auto")
    assert model.device.type == "cpu"
    assert model.lm_head.weight is model.model.shared.weight


@pytest.mark.parametrize(
    "problem_type, labels",
    [
        ("single_label_classification", torch.tensor([0, 2])),
        ("multi_label_classification", torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])),
        ("regression", torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.0, 0.0]])),
    ],
)
def test_sequence_classification_problem_types(problem_type, labels):
    config = tiny_config(num_labels=3, problem_type=problem_type)
    model = VanillaTransformerForSequenceClassification(config)
    ids, mask = source_batch(2)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert out.logits.shape == (2, 3)
    loss_fn = {
        "single_label_classification": lambda: torch.nn.functional.cross_entropy(out.logits, labels),
        "multi_label_classification": lambda: torch.nn.functional.binary_cross_entropy_with_logits(out.logits, labels),
        "regression": lambda: torch.nn.functional.mse_loss(out.logits, labels),
    }[problem_type]
    torch.testing.assert_close(out.loss, loss_fn())
