"""The model's training loss: label-smoothed token cross-entropy, equal to transformers' LabelSmoother in value and
gradient, in every dtype, with Trainer's normalisation, and taken by the project's trainer."""

import copy

import pytest
import torch
from conftest import tiny_model
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.trainer_pt_utils import LabelSmoother

from vanilla_transformer.loss_vanilla_transformer import TokenCrossEntropy, token_cross_entropy
from vanilla_transformer.training import TranslationTrainer


def logits_and_labels(dtype=torch.float32, batch=3, length=7, vocab=50):
    logits = (3 * torch.randn(batch, length, vocab, dtype=torch.float64)).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (batch, length))
    labels[0, 2:] = -100  # padding
    labels[-1, 1] = -100
    return logits, labels


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("num_items_in_batch", [None, 40])
def test_value_and_gradient_equal_transformers_label_smoother(epsilon, num_items_in_batch):
    logits, labels = logits_and_labels()
    ours = token_cross_entropy(logits, labels, epsilon, num_items_in_batch)
    (grad,) = torch.autograd.grad(ours, logits)
    theirs = LabelSmoother(epsilon=epsilon)({"logits": logits}, labels, num_items_in_batch=num_items_in_batch)
    (expected_grad,) = torch.autograd.grad(theirs, logits)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert grad[0, 2:].abs().max() == 0 and grad[-1, 1].abs().max() == 0  # -100 positions get no gradient


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_gradcheck_in_float64(epsilon):
    logits, labels = logits_and_labels(torch.float64, batch=2, length=3, vocab=6)
    assert torch.autograd.gradcheck(
        lambda x: TokenCrossEntropy.apply(x.flatten(0, 1), labels.flatten(), epsilon), logits
    )


def test_unsmoothed_loss_is_cross_entropy():
    logits, labels = logits_and_labels()
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(token_cross_entropy(logits, labels), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_sum_in_float32(dtype):
    """Autocast hands the loss half-precision logits: the normaliser and the sums stay in float32, so the loss is
    that of the same (rounded) logits in float32, and the gradient comes back in the logits' dtype."""
    logits, labels = logits_and_labels(dtype, length=64, vocab=1000)
    loss = token_cross_entropy(logits, labels, 0.1)
    (grad,) = torch.autograd.grad(loss, logits)
    exact_logits = logits.detach().float().requires_grad_()
    expected = token_cross_entropy(exact_logits, labels, 0.1)
    (expected_grad,) = torch.autograd.grad(expected, exact_logits)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad.float(), expected_grad, rtol=1e-2, atol=1e-6)  # one rounding of each entry


def test_bad_label_smoothing_and_labels_are_named():
    logits, labels = logits_and_labels()
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"label_smoothing=.* must be in \[0, 1\)"):
            token_cross_entropy(logits, labels, bad)
    with pytest.raises(ValueError, match=r"`labels` has shape \(3, 6\)"):
        token_cross_entropy(logits, labels[:, :6])


def test_model_loss_is_label_smoothed_and_accumulates_exactly():
    """The model's label_smoothing equals LabelSmoother on its logits; with Trainer's num_items_in_batch the summed
    micro-batch gradients equal the whole batch's."""
    model = tiny_model().train()
    ids = torch.randint(3, 64, (4, 6))
    labels = torch.randint(3, 64, (4, 5))
    labels[0, 2:] = -100  # unequal numbers of labelled tokens per example
    total = int((labels != -100).sum())
    torch.manual_seed(0)
    out = model(input_ids=ids, labels=labels, label_smoothing=0.1, num_items_in_batch=total)
    expected = LabelSmoother(epsilon=0.1)(out, labels, num_items_in_batch=total)
    torch.testing.assert_close(out.loss, expected, rtol=1e-6, atol=0)

    model.eval()  # no dropout, so that micro-batches see the same network
    model(input_ids=ids, labels=labels, label_smoothing=0.1, num_items_in_batch=total).loss.backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for row in range(4):
        rows = slice(row, row + 1)
        model(input_ids=ids[rows], labels=labels[rows], label_smoothing=0.1, num_items_in_batch=total).loss.backward()
    for a, b in zip(whole, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_project_trainer_hands_label_smoothing_to_the_model(tmp_path, monkeypatch, one_thread):
    """train.py's trainer gives the same loss and gradients as Seq2SeqTrainer with its LabelSmoother, but the model
    computes them: LabelSmoother is never called in training."""
    model = tiny_model(dropout=0.0).train()
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), label_smoothing_factor=0.1, report_to=[], use_cpu=True, gradient_accumulation_steps=2
    )
    labels = torch.tensor([[8, 9, 2, -100, -100], [11, 12, 13, 14, 2]])
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 2], [10, 2, 0, 0]]),
        "attention_mask": torch.tensor([[1] * 4, [1, 1, 0, 0]]),
    }
    batch |= {"labels": labels, "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels)}

    def step(trainer_class):
        copy_ = copy.deepcopy(model)
        trainer = trainer_class(model=copy_, args=args)
        loss = trainer.compute_loss(copy_, dict(batch), num_items_in_batch=torch.tensor(20))
        loss.backward()
        return loss, [p.grad for p in copy_.parameters()], trainer

    expected, expected_grads, _ = step(Seq2SeqTrainer)
    calls = []
    monkeypatch.setattr(LabelSmoother, "__call__", lambda *a, **k: calls.append(1))
    loss, grads, trainer = step(TranslationTrainer)
    assert calls == [] and trainer.label_smoother.epsilon == 0.1  # still there for evaluation with generation
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
