"""The model's training loss: label-smoothed token cross-entropy, equal to transformers' LabelSmoother in value and
gradient, in every dtype, with Trainer's normalisation, with or without the logits made, and taken by the project's
trainer."""

import copy
import functools

import pytest
import torch
from conftest import tiny_model
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.trainer_pt_utils import LabelSmoother

from vanilla_transformer import loss_vanilla_transformer
from vanilla_transformer.loss_vanilla_transformer import (
    LinearCrossEntropy,
    TokenCrossEntropy,
    linear_cross_entropy,
    token_cross_entropy,
)
from vanilla_transformer.training.trainer import TranslationTrainer


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


def hidden_weight_and_labels(dtype=torch.float32, batch=3, length=7, d_model=8, vocab=50):
    hidden = torch.randn(batch, length, d_model, dtype=torch.float64).to(dtype).requires_grad_()
    weight = torch.randn(vocab, d_model, dtype=torch.float64).to(dtype).requires_grad_()
    _, labels = logits_and_labels(batch=batch, length=length, vocab=vocab)
    return hidden, weight, labels


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("rows", [4, 256])  # several blocks (the last one shorter), and one
def test_linear_cross_entropy_equals_the_loss_of_the_logits(epsilon, rows, monkeypatch):
    """Without making the logits, the same loss and the same gradients for the hidden states and the weight."""
    monkeypatch.setattr(loss_vanilla_transformer, "_ROWS", rows)
    hidden, weight, labels = hidden_weight_and_labels()
    loss = linear_cross_entropy(hidden, weight, labels, epsilon, num_items_in_batch=40)
    grads = torch.autograd.grad(loss, (hidden, weight))
    expected = token_cross_entropy(hidden @ weight.T, labels, epsilon, num_items_in_batch=40)
    expected_grads = torch.autograd.grad(expected, (hidden, weight))
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-6)
    assert grads[0][0, 2:].abs().max() == 0  # -100 positions get no gradient
    with torch.no_grad():  # forward only: the same value
        torch.testing.assert_close(linear_cross_entropy(hidden, weight, labels, epsilon, 40), expected)


class _CountProducts(TorchDispatchMode):
    """Counts the matrix products (mm, addmm and their in-place and out= forms) run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.products = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.products += func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_)
        return func(*args, **(kwargs or {}))


class _ProductDims(TorchDispatchMode):
    """The dimensions of the matrix products (mm, addmm_) run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.dims = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm_):
            self.dims |= {dim for matrix in args[-2:] for dim in matrix.shape}
        return func(*args, **(kwargs or {}))


def test_linear_cross_entropy_multiplies_multiples_of_8_rows():
    """Labelled counts that change with every batch make products of a few shapes only (oneDNN keeps a kernel per
    shape): padded to a multiple of 8 with rows that add nothing, and the loss and gradients are unchanged."""
    torch.manual_seed(0)
    weight = torch.randn(50, 12, dtype=torch.float64, requires_grad=True)  # vocabulary 50, d_model 12
    rows = set()
    for labelled in range(1, 18):
        hidden = torch.randn(2, 10, 12, dtype=torch.float64, requires_grad=True)
        labels = torch.full((2, 10), -100)
        labels.view(-1)[torch.randperm(20)[:labelled]] = torch.randint(0, 50, (labelled,))
        with _ProductDims() as products:
            loss = linear_cross_entropy(hidden, weight, labels, 0.1)
            grads = torch.autograd.grad(loss, (hidden, weight))
        rows |= products.dims - {50, 12}
        expected = token_cross_entropy(hidden @ weight.T, labels, 0.1)
        torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)
        for grad, expected_grad in zip(grads, torch.autograd.grad(expected, (hidden, weight))):
            torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)
    assert rows == {8, 16, 24}


@pytest.mark.parametrize("no_grad", [torch.no_grad, torch.inference_mode])
def test_linear_cross_entropy_without_grad_computes_the_loss_alone(no_grad, monkeypatch):
    """Under no_grad the weight and hidden states still require grad, but no gradient is wanted: one product per block
    of 4 positions (the logits), not three, and the same loss."""
    monkeypatch.setattr(loss_vanilla_transformer, "_ROWS", 4)
    hidden, weight, labels = hidden_weight_and_labels()
    rows = -(-int((labels != -100).sum()) // 8) * 8  # the labelled positions, padded to a multiple of 8
    blocks = rows // 4
    with _CountProducts() as with_grad:
        expected = linear_cross_entropy(hidden, weight, labels, 0.1)
    with no_grad(), _CountProducts() as without_grad:
        loss = linear_cross_entropy(hidden, weight, labels, 0.1)
    assert with_grad.products == 3 * blocks and without_grad.products == blocks
    torch.testing.assert_close(loss, expected.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_linear_cross_entropy_gradcheck_in_float64(epsilon, monkeypatch):
    monkeypatch.setattr(loss_vanilla_transformer, "_ROWS", 2)
    hidden, weight, labels = hidden_weight_and_labels(torch.float64, batch=2, length=3, d_model=4, vocab=6)

    def loss(h, w):
        return LinearCrossEntropy.apply(h.flatten(0, 1), w, labels.flatten(), epsilon)

    assert torch.autograd.gradcheck(loss, (hidden, weight))


def test_linear_cross_entropy_under_bf16_autocast():
    """Under autocast the products run in bfloat16, like nn.Linear's, and the sums in float32: the loss is close to
    float32's, and the gradients come back in the dtypes of the float32 hidden states and weight."""
    hidden, weight, labels = hidden_weight_and_labels(d_model=64, vocab=1000)
    with torch.autocast("cpu", torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, labels, 0.1)
        logits = torch.nn.functional.linear(hidden, weight)
        reference = token_cross_entropy(logits, labels, 0.1)  # the unfused path under the same autocast
    grads = torch.autograd.grad(loss, (hidden, weight))
    expected_grads = torch.autograd.grad(reference, (hidden, weight))
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert grads[0].dtype == grads[1].dtype == torch.float32
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=0)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=2e-2, atol=2e-3)
    exact = linear_cross_entropy(hidden, weight, labels, 0.1)
    torch.testing.assert_close(loss, exact, rtol=2e-2, atol=0)  # bfloat16 products: 8 bits of mantissa


def test_model_skip_logits_gives_the_same_loss_without_logits():
    model = tiny_model(dropout=0.0).train()
    ids, labels = torch.randint(3, 64, (4, 6)), torch.randint(3, 64, (4, 5))
    labels[0, 2:] = -100
    results = []
    for skip_logits in (False, True):
        model.zero_grad()
        out = model(input_ids=ids, labels=labels, smoothing=0.1, skip_logits=skip_logits)
        out.loss.backward()
        results.append((out, [p.grad.clone() for p in model.parameters()]))
    (full, full_grads), (skipped, skipped_grads) = results
    assert full.logits.shape == (4, 5, 64) and skipped.logits is None
    torch.testing.assert_close(skipped.loss, full.loss, rtol=1e-6, atol=0)
    for a, b in zip(skipped_grads, full_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="skip_logits=True returns only the loss, so it needs `labels`"):
        model(input_ids=ids, decoder_input_ids=labels.clamp(min=0), skip_logits=True)
    # a hook (or an adapter) on lm_head would be bypassed by the fused loss: lm_head then runs as usual
    calls = []
    model.lm_head.register_forward_hook(lambda *args: calls.append(1))
    hooked = model(input_ids=ids, labels=labels, smoothing=0.1, skip_logits=True)
    assert calls == [1] and hooked.logits is not None
    torch.testing.assert_close(hooked.loss, full.loss, rtol=1e-6, atol=0)


def test_model_loss_is_label_smoothed_and_accumulates_exactly():
    """The model's smoothing equals LabelSmoother on its logits; with Trainer's num_items_in_batch the summed
    micro-batch gradients equal the whole batch's."""
    model = tiny_model().train()
    ids = torch.randint(3, 64, (4, 6))
    labels = torch.randint(3, 64, (4, 5))
    labels[0, 2:] = -100  # unequal numbers of labelled tokens per example
    total = int((labels != -100).sum())
    torch.manual_seed(0)
    out = model(input_ids=ids, labels=labels, smoothing=0.1, num_items_in_batch=total)
    expected = LabelSmoother(epsilon=0.1)(out, labels, num_items_in_batch=total)
    torch.testing.assert_close(out.loss, expected, rtol=1e-6, atol=0)

    model.eval()  # no dropout, so that micro-batches see the same network
    model(input_ids=ids, labels=labels, smoothing=0.1, num_items_in_batch=total).loss.backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for row in range(4):
        rows = slice(row, row + 1)
        model(input_ids=ids[rows], labels=labels[rows], smoothing=0.1, num_items_in_batch=total).loss.backward()
    for a, b in zip(whole, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def record_forward_kwargs(monkeypatch, model) -> list[dict]:
    """The keyword arguments of every call of the model's forward (whose signature the trainer still reads)."""
    calls, forward = [], type(model).forward

    @functools.wraps(forward)
    def recording_forward(self, **kwargs):
        calls.append(kwargs)
        return forward(self, **kwargs)

    monkeypatch.setattr(type(model), "forward", recording_forward)
    return calls


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
    model_kwargs = record_forward_kwargs(monkeypatch, model)
    loss, grads, trainer = step(TranslationTrainer)
    assert calls == [] and trainer.label_smoother.epsilon == 0.1  # still there for evaluation with generation
    assert model_kwargs[-1]["smoothing"] == 0.1 and model_kwargs[-1]["skip_logits"] is True
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_project_trainer_skips_the_logits_in_training_only(tmp_path, monkeypatch, one_thread):
    """Without label smoothing too, training steps ask the model for the loss alone; evaluation keeps the logits."""
    model = tiny_model(dropout=0.0)
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    labels = torch.tensor([[8, 9, 2, -100], [11, 12, 13, 2]])
    batch = {"input_ids": torch.tensor([[5, 6, 7, 2], [10, 2, 0, 0]]), "labels": labels}
    model_kwargs = record_forward_kwargs(monkeypatch, model)
    trainer = TranslationTrainer(model=model, args=args)
    loss = trainer.compute_loss(model, dict(batch))
    assert model_kwargs[-1]["skip_logits"] is True and "smoothing" not in model_kwargs[-1]
    torch.testing.assert_close(loss, Seq2SeqTrainer(model=model, args=args).compute_loss(model, dict(batch)))
    loss, outputs = trainer.compute_loss(model, dict(batch), return_outputs=True)
    assert "skip_logits" not in model_kwargs[-1] and outputs.logits.shape == (2, 4, 64)


def test_a_stock_trainer_evaluates_our_model_with_its_loss_and_labels(tmp_path, one_thread):
    """Trainer takes every argument of ``forward`` with "label" in its name for a label input (``find_labels``) and
    computes an evaluation loss only when all of them are in the batch: ours has ``labels`` alone, so a stock
    Seq2SeqTrainer without generation reports ``eval_loss`` and hands the labels to ``compute_metrics``."""
    from conftest import word_tokenizer
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq

    model = tiny_model(dropout=0.0)
    tokenizer = word_tokenizer(["a", "b", "c", "d", "e"])
    rows = [{"input_ids": [5, 6, 7, 2], "labels": [8, 2]}, {"input_ids": [6, 2], "labels": [5, 6, 7, 8, 2]}] * 3
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, per_device_eval_batch_size=4)
    seen = []
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        eval_dataset=Dataset.from_list(rows),
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_metrics=lambda prediction: seen.append(prediction.label_ids) or {},
    )
    assert trainer.label_names == ["labels"]
    metrics = trainer.evaluate()
    batch = DataCollatorForSeq2Seq(tokenizer, model=model)(rows)
    with torch.no_grad():
        expected = model(**batch).loss
    torch.testing.assert_close(metrics["eval_loss"], expected.item(), rtol=1e-4, atol=0)
    assert seen[0].shape[0] == len(rows) and (seen[0][0, :2] == [8, 2]).all()
