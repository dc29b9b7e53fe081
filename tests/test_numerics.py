"""Numbers stay finite where naive attention gives NaN: fully padded rows, long sequences, low precision, and batches
with nothing to learn from."""

import pytest
import torch
from conftest import tiny_model

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def padded_batch() -> dict[str, torch.Tensor]:
    """Row 0 is full, row 1 entirely padding (source and target), row 2 half padding."""
    source, target = torch.randint(3, 64, (3, 7)), torch.randint(3, 64, (3, 6))
    source_mask, target_mask = torch.ones_like(source), torch.ones_like(target)
    source_mask[1], target_mask[1] = 0, 0
    source_mask[2, 4:], target_mask[2, 3:] = 0, 0
    return dict(
        input_ids=source, attention_mask=source_mask, decoder_input_ids=target, decoder_attention_mask=target_mask
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-norm", "pre-norm"])
def test_fully_padded_rows_stay_finite(attn_implementation, dtype, normalize_before):
    model = tiny_model(attn_implementation, dtype, normalize_before=normalize_before)
    with torch.no_grad():
        out = model(**padded_batch())
    assert torch.isfinite(out.encoder_last_hidden_state).all()
    assert torch.isfinite(out.logits).all()
    assert out.logits.dtype == dtype


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_fully_padded_rows_give_finite_gradients(attn_implementation):
    model = tiny_model(attn_implementation, torch.float32)
    batch = padded_batch()
    labels = batch["decoder_input_ids"].masked_fill(batch["decoder_attention_mask"] == 0, -100)
    model(**batch, labels=labels).loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_long_sequences_stay_finite(attn_implementation, dtype):
    """2048 tokens, far past max_position_embeddings=128: sinusoidal positions extend, nothing overflows in fp16."""
    model = tiny_model(
        attn_implementation,
        dtype,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
    )
    source = torch.randint(3, 64, (1, 2048))
    with torch.no_grad():
        out = model(input_ids=source, decoder_input_ids=source)
    assert out.logits.shape == (1, 2048, 64)
    assert torch.isfinite(out.encoder_last_hidden_state).all() and torch.isfinite(out.logits).all()


@pytest.mark.parametrize("num_items_in_batch", [None, 0, torch.tensor(0)], ids=["mean", "sum/0", "sum/tensor0"])
def test_labels_all_minus_100_give_zero_loss_and_zero_gradients(num_items_in_batch):
    """Documented value: 0.0. A plain mean cross-entropy over zero items is 0/0 = NaN, which backward would spread
    into every weight; the model returns 0.0 attached to the graph instead, so the step changes nothing."""
    model = tiny_model("sdpa", torch.float32)
    model.train()
    source = torch.randint(3, 64, (2, 5))
    labels = torch.full((2, 4), -100)
    loss = model(input_ids=source, labels=labels, num_items_in_batch=num_items_in_batch).loss
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.equal(g, torch.zeros_like(g)) for g in grads)


def test_loss_over_some_labels_is_still_their_mean():
    model = tiny_model("sdpa", torch.float32)
    source, labels = torch.randint(3, 64, (2, 5)), torch.randint(3, 64, (2, 4))
    labels[0] = -100  # one sentence with nothing to learn, one with four labelled tokens
    out = model(input_ids=source, labels=labels)
    expected = torch.nn.functional.cross_entropy(out.logits[1], labels[1])
    torch.testing.assert_close(out.loss, expected)
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_mixed_precision_training_follows_fp32(attn_implementation, dtype):
    """Autocast (the Trainer's --bf16 / --fp16 path) with a padded batch: the loss stays fp32 and within the half
    precision's error of the fp32 loss, and every gradient is finite. CPU autocast stands in for the GPU's here."""
    model = tiny_model(attn_implementation, torch.float32)
    batch = padded_batch()
    labels = batch["decoder_input_ids"].masked_fill(batch["decoder_attention_mask"] == 0, -100)
    reference = model(**batch, labels=labels).loss
    with torch.autocast("cpu", dtype=dtype):
        out = model(**batch, labels=labels)
    assert out.logits.dtype == dtype and out.loss.dtype == torch.float32
    torch.testing.assert_close(out.loss, reference, atol=0.05, rtol=0.02)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
