"""Property-based tests (hypothesis) over random tiny configs, batch shapes and padding patterns: no NaN,
padding invariance, cache equals no cache, eager equals sdpa. All in fp32, models in eval mode."""

import torch
from conftest import decode_one_token_at_a_time, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vanilla_transformer import VanillaTransformerForConditionalGeneration

VOCAB = 32
ATOL = 1e-5
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def models(draw, attn_implementation: str | None = None) -> VanillaTransformerForConditionalGeneration:
    d_model = draw(st.sampled_from([16, 32]))
    heads = st.sampled_from([h for h in (1, 2, 4, 8) if d_model % h == 0])
    fields = dict(
        vocab_size=VOCAB,
        d_model=d_model,
        encoder_layers=draw(st.integers(1, 2)),
        decoder_layers=draw(st.integers(1, 2)),
        encoder_attention_heads=draw(heads),
        decoder_attention_heads=draw(heads),
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        normalize_before=draw(st.booleans()),
        position_embedding_type=draw(st.sampled_from(["sinusoidal", "learned"])),
        max_position_embeddings=16,
    )
    seed = draw(st.integers(0, 2**16))
    attn_implementation = attn_implementation or draw(st.sampled_from(["eager", "sdpa"]))
    torch.manual_seed(seed)
    return tiny_model(attn_implementation, **fields)


@st.composite
def lengths(draw, max_length: int) -> list[int]:
    """Real lengths of the sentences of a batch; the batch is right-padded to the longest."""
    return draw(st.lists(st.integers(1, max_length), min_size=1, max_size=3))


def right_padded(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (len(lengths), max(lengths)), generator=generator)
    mask = (torch.arange(max(lengths)) < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


@SETTINGS
@given(model=models(), data=st.data())
def test_no_nan_whatever_the_padding(model, data):
    """Any mask pattern, fully padded rows included, gives finite logits."""
    batch = data.draw(st.integers(1, 3))
    src_len, tgt_len = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 6))
    bits = st.lists(st.integers(0, 1), min_size=batch * src_len, max_size=batch * src_len)
    source_mask = torch.tensor(data.draw(bits)).view(batch, src_len)
    bits = st.lists(st.integers(0, 1), min_size=batch * tgt_len, max_size=batch * tgt_len)
    target_mask = torch.tensor(data.draw(bits)).view(batch, tgt_len)
    with torch.no_grad():
        logits = model(
            input_ids=torch.randint(0, VOCAB, (batch, src_len)),
            attention_mask=source_mask,
            decoder_input_ids=torch.randint(0, VOCAB, (batch, tgt_len)),
            decoder_attention_mask=target_mask,
        ).logits
    assert torch.isfinite(logits).all()


@SETTINGS
@given(model=models(), source_lengths=lengths(8), target_lengths=st.data(), seed=st.integers(0, 1000))
def test_padding_invariance(model, source_lengths, target_lengths, seed):
    """Each sentence of a right-padded batch gets, at its real positions, the logits it gets alone."""
    target_lengths = target_lengths.draw(
        st.lists(st.integers(1, 6), min_size=len(source_lengths), max_size=len(source_lengths))
    )
    source, source_mask = right_padded(source_lengths, seed)
    target, target_mask = right_padded(target_lengths, seed + 1)
    with torch.no_grad():
        batched = model(
            input_ids=source, attention_mask=source_mask, decoder_input_ids=target, decoder_attention_mask=target_mask
        ).logits
        for row, (s, t) in enumerate(zip(source_lengths, target_lengths)):
            alone = model(input_ids=source[row : row + 1, :s], decoder_input_ids=target[row : row + 1, :t]).logits
            torch.testing.assert_close(batched[row : row + 1, :t], alone, atol=ATOL, rtol=0)


@SETTINGS
@given(model=models(), source_lengths=lengths(8), target_length=st.integers(1, 6), seed=st.integers(0, 1000))
def test_cache_equals_no_cache(model, source_lengths, target_length, seed):
    """Decoding one token at a time with the KV cache gives the logits of one full forward."""
    source, source_mask = right_padded(source_lengths, seed)
    target = torch.randint(3, VOCAB, (len(source_lengths), target_length))
    with torch.no_grad():
        full = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=target, use_cache=False).logits
        stepwise, cache = decode_one_token_at_a_time(model, source, source_mask, target)
    assert cache.get_seq_length() == target_length
    torch.testing.assert_close(stepwise, full, atol=ATOL, rtol=0)


@SETTINGS
@given(model=models("eager"), source_lengths=lengths(8), target_lengths=st.data(), seed=st.integers(0, 1000))
def test_eager_equals_sdpa(model, source_lengths, target_lengths, seed):
    """The paper's attention written out and torch's fused kernel agree on padded batches."""
    target_lengths = target_lengths.draw(
        st.lists(st.integers(1, 6), min_size=len(source_lengths), max_size=len(source_lengths))
    )
    source, source_mask = right_padded(source_lengths, seed)
    target, target_mask = right_padded(target_lengths, seed + 1)
    inputs = dict(
        input_ids=source, attention_mask=source_mask, decoder_input_ids=target, decoder_attention_mask=target_mask
    )
    with torch.no_grad():
        eager = model(**inputs).logits
        model.set_attn_implementation("sdpa")
        sdpa = model(**inputs).logits
    torch.testing.assert_close(sdpa, eager, atol=ATOL, rtol=0)
