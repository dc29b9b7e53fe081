"""The model's training loss: label-smoothed token cross-entropy through ``model.loss_function``, equal to
transformers' LabelSmoother in value and gradient, with Trainer's normalisation; the loss without logits, equal to it
in every dtype; which of the two a forward computes (``loss_path``) on its own and under torch.compile, DDP, FSDP2,
peft, a stubbed GPU and other devices; and how the project's trainer asks for them."""

import copy
import functools

import pytest
import torch
import torch._dynamo
from conftest import tiny_marian, tiny_model
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.loss.loss_utils import ForCausalLMLoss
from transformers.trainer_pt_utils import LabelSmoother

from vanilla_transformer import loss_vanilla_transformer, modeling_vanilla_transformer
from vanilla_transformer.loss_vanilla_transformer import label_smoothed_cross_entropy, linear_cross_entropy
from vanilla_transformer.training.trainer import TranslationTrainer


def logits_and_labels(dtype=torch.float32, batch=3, length=7, vocab=50):
    logits = (3 * torch.randn(batch, length, vocab, dtype=torch.float64)).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (batch, length))
    labels[0, 2:] = -100  # padding
    labels[-1, 1] = -100
    return logits, labels


def smoothed(logits, labels, epsilon=0.0, num_items_in_batch=None):
    """The model's loss_function, called as the model calls it."""
    return label_smoothed_cross_entropy(
        logits,
        None,
        logits.shape[-1],
        num_items_in_batch=num_items_in_batch,
        shift_labels=labels,
        label_smoothing=epsilon,
    )


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("num_items_in_batch", [None, 40])
def test_value_and_gradient_equal_transformers_label_smoother(epsilon, num_items_in_batch):
    logits, labels = logits_and_labels()
    ours = smoothed(logits, labels, epsilon, num_items_in_batch)
    (grad,) = torch.autograd.grad(ours, logits)
    theirs = LabelSmoother(epsilon=epsilon)({"logits": logits}, labels, num_items_in_batch=num_items_in_batch)
    (expected_grad,) = torch.autograd.grad(theirs, logits)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert grad[0, 2:].abs().max() == 0 and grad[-1, 1].abs().max() == 0  # -100 positions get no gradient


def test_unshifted_labels_are_shifted_as_transformers_causal_lm_loss_shifts_them():
    """Called with ``labels`` alone (no ``shift_labels``) it is transformers' ForCausalLMLoss, smoothing aside."""
    logits, labels = logits_and_labels()
    ours = label_smoothed_cross_entropy(logits, labels, 50)
    torch.testing.assert_close(ours, ForCausalLMLoss(logits, labels, 50), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_sum_in_float32(dtype):
    """Autocast hands the loss half-precision logits: the sums are taken in float32, so the loss is that of the same
    (rounded) logits in float32, and the gradient comes back in the logits' dtype."""
    logits, labels = logits_and_labels(dtype, length=64, vocab=1000)
    loss = smoothed(logits, labels, 0.1)
    (grad,) = torch.autograd.grad(loss, logits)
    exact_logits = logits.detach().float().requires_grad_()
    expected = smoothed(exact_logits, labels, 0.1)
    (expected_grad,) = torch.autograd.grad(expected, exact_logits)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad.float(), expected_grad, rtol=1e-2, atol=1e-6)  # one rounding of each entry


def test_bad_label_smoothing_and_labels_are_named():
    logits, labels = logits_and_labels()
    hidden, weight, _ = hidden_weight_and_labels()
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"label_smoothing=.* must be in \[0, 1\)"):
            smoothed(logits, labels, bad)
        with pytest.raises(ValueError, match=r"label_smoothing=.* must be in \[0, 1\)"):
            linear_cross_entropy(hidden, weight, labels, bad)
    with pytest.raises(ValueError, match=r"`labels` has shape \(3, 6\)"):
        smoothed(logits, labels[:, :6])
    with pytest.raises(ValueError, match=r"`labels` has shape \(3, 6\)"):
        linear_cross_entropy(hidden, weight, labels[:, :6])


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
    expected = smoothed(hidden @ weight.T, labels, epsilon, num_items_in_batch=40)
    expected_grads = torch.autograd.grad(expected, (hidden, weight))
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-6)
    assert grads[0][0, 2:].abs().max() == 0  # -100 positions get no gradient
    with torch.no_grad():  # forward only: the same value
        torch.testing.assert_close(linear_cross_entropy(hidden, weight, labels, epsilon, 40), expected)


@pytest.mark.parametrize("fused", [False, True])
def test_a_batch_without_labelled_tokens_has_loss_zero_and_zero_gradients(fused):
    """All -100 (a batch of padding): 0, not 0 / 0 = NaN, and gradients of 0 that leave the weights alone."""
    hidden, weight, labels = hidden_weight_and_labels()
    labels = torch.full_like(labels, -100)
    if fused:
        loss = linear_cross_entropy(hidden, weight, labels, 0.1)
    else:
        loss = smoothed(hidden @ weight.T, labels, 0.1)
    grads = torch.autograd.grad(loss, (hidden, weight))
    assert loss.item() == 0.0 and all(grad.abs().max() == 0 for grad in grads)


def matrix_products(function) -> list[list[list[int]]]:
    """The input shapes of every matrix product (mm, addmm_) that ``function()`` runs, the loss's op included (a
    dispatch mode would see the op only, not the products inside it)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, record_shapes=True) as profile:
        function()
    return [event.input_shapes for event in profile.events() if event.name in ("aten::mm", "aten::addmm_")]


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
        results = []

        def step(hidden=hidden, labels=labels, results=results):
            loss = linear_cross_entropy(hidden, weight, labels, 0.1)
            results.append((loss, torch.autograd.grad(loss, (hidden, weight))))

        shapes = matrix_products(step)
        rows |= {dim for product in shapes for matrix in product[-2:] for dim in matrix} - {50, 12}
        (loss, grads) = results[0]
        expected = smoothed(hidden @ weight.T, labels, 0.1)
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
    results = []
    with_grad = matrix_products(lambda: results.append(linear_cross_entropy(hidden, weight, labels, 0.1)))
    with no_grad():
        without_grad = matrix_products(lambda: results.append(linear_cross_entropy(hidden, weight, labels, 0.1)))
    assert len(with_grad) == 3 * blocks and len(without_grad) == blocks
    torch.testing.assert_close(results[1], results[0].detach(), rtol=0, atol=0)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_linear_cross_entropy_gradcheck_in_float64(epsilon, monkeypatch):
    monkeypatch.setattr(loss_vanilla_transformer, "_ROWS", 2)
    hidden, weight, labels = hidden_weight_and_labels(torch.float64, batch=2, length=3, d_model=4, vocab=6)
    assert torch.autograd.gradcheck(lambda h, w: linear_cross_entropy(h, w, labels, epsilon), (hidden, weight))


def test_linear_cross_entropy_under_bf16_autocast():
    """Under autocast the products run in bfloat16, like nn.Linear's, and the sums in float32: the loss is close to
    float32's, and the gradients come back in the dtypes of the float32 hidden states and weight."""
    hidden, weight, labels = hidden_weight_and_labels(d_model=64, vocab=1000)
    with torch.autocast("cpu", torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, labels, 0.1)
        logits = torch.nn.functional.linear(hidden, weight)
        reference = smoothed(logits, labels, 0.1)  # the unfused path under the same autocast
    grads = torch.autograd.grad(loss, (hidden, weight))
    expected_grads = torch.autograd.grad(reference, (hidden, weight))
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert grads[0].dtype == grads[1].dtype == torch.float32
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=0)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=2e-2, atol=2e-3)
    exact = linear_cross_entropy(hidden, weight, labels, 0.1)
    torch.testing.assert_close(loss, exact, rtol=2e-2, atol=0)  # bfloat16 products: 8 bits of mantissa


def test_linear_cross_entropy_in_float16():
    """A float16 model (no autocast): float16 products, float32 sums, float16 gradients close to float32's."""
    hidden, weight, labels = hidden_weight_and_labels(torch.float16, d_model=64, vocab=1000)
    loss = linear_cross_entropy(hidden, weight, labels, 0.1)
    grads = torch.autograd.grad(loss, (hidden, weight))
    exact = [t.detach().float().requires_grad_() for t in (hidden, weight)]
    expected = linear_cross_entropy(*exact, labels, 0.1)
    expected_grads = torch.autograd.grad(expected, exact)
    assert loss.dtype == torch.float32 and grads[0].dtype == grads[1].dtype == torch.float16
    torch.testing.assert_close(loss, expected, rtol=1e-3, atol=0)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad.float(), expected_grad, rtol=1e-2, atol=1e-3)


def test_a_checkpoints_copy_of_the_loss_defines_its_own_op():
    """A checkpoint loaded with trust_remote_code imports its copy of this file under another module name, in the same
    process as the package: each copy keeps an op of its own (a second definition of one op name would replace the
    first's code), and both compute the same loss."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "transformers_modules.checkpoint.loss_vanilla_transformer", loss_vanilla_transformer.__file__
    )
    copy_ = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy_)
    assert copy_._OP_NAME != loss_vanilla_transformer._OP_NAME
    hidden, weight, labels = hidden_weight_and_labels()
    torch.testing.assert_close(
        copy_.linear_cross_entropy(hidden, weight, labels, 0.1),
        linear_cross_entropy(hidden, weight, labels, 0.1),
        rtol=0,
        atol=0,
    )


def model_batch(batch=4):
    ids, labels = torch.randint(3, 64, (batch, 6)), torch.randint(3, 64, (batch, 5))
    labels[0, 2:] = -100
    return ids, labels


@pytest.fixture
def fused_calls(monkeypatch) -> list[int]:
    """One entry per call of the loss without logits from the model's forward."""
    calls = []

    def recording(*args, **kwargs):
        calls.append(1)
        return linear_cross_entropy(*args, **kwargs)

    monkeypatch.setattr(modeling_vanilla_transformer, "linear_cross_entropy", recording)
    return calls


def test_model_skip_logits_gives_the_same_loss_without_logits(fused_calls):
    model = tiny_model(dropout=0.0).train()
    ids, labels = model_batch()
    results = []
    for skip_logits in (False, True):
        model.zero_grad()
        out = model(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=skip_logits)
        out.loss.backward()
        results.append((out, [p.grad.clone() for p in model.parameters()]))
    (full, full_grads), (skipped, skipped_grads) = results
    assert full.logits.shape == (4, 5, 64) and skipped.logits is None and fused_calls == [1]
    torch.testing.assert_close(skipped.loss, full.loss, rtol=1e-6, atol=0)
    for a, b in zip(skipped_grads, full_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="skip_logits=True returns only the loss, so it needs `labels`"):
        model(input_ids=ids, decoder_input_ids=labels.clamp(min=0), skip_logits=True)


def test_model_loss_is_label_smoothed_through_its_loss_function_and_accumulates_exactly():
    """``label_smoothing`` reaches the model's loss_function (its ``loss_type`` in transformers' LOSS_MAPPING) and
    equals LabelSmoother on the logits; with Trainer's num_items_in_batch the summed micro-batch gradients equal the
    whole batch's."""
    model = tiny_model().train()
    assert model.loss_type == "VanillaTransformerForConditionalGeneration"
    assert model.loss_function is label_smoothed_cross_entropy

    class Renamed(type(model)):  # a subclass of another name keeps the loss (not ForCausalLMLoss, which drops ε)
        pass

    assert Renamed(model.config).loss_function is label_smoothed_cross_entropy
    ids, labels = model_batch()
    total = int((labels != -100).sum())
    out = model(input_ids=ids, labels=labels, label_smoothing=0.1, num_items_in_batch=total)
    expected = LabelSmoother(epsilon=0.1)(out, labels, num_items_in_batch=total)
    torch.testing.assert_close(out.loss, expected, rtol=1e-6, atol=0)
    unsmoothed = model(input_ids=ids, labels=labels, num_items_in_batch=total).loss
    assert (out.loss - unsmoothed).abs() > 1e-3  # ε took effect

    model.eval()  # no dropout, so that micro-batches see the same network
    model(input_ids=ids, labels=labels, label_smoothing=0.1, num_items_in_batch=total).loss.backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for row in range(4):
        rows = slice(row, row + 1)
        model(input_ids=ids[rows], labels=labels[rows], label_smoothing=0.1, num_items_in_batch=total).loss.backward()
    for a, b in zip(whole, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_a_loss_function_set_by_the_user_wins(fused_calls):
    """``model.loss_function = fn`` gets the logits, the targets and the keyword arguments, label smoothing
    included, also when only the loss is asked for; the loss without logits would bypass it."""
    model = tiny_model(dropout=0.0).train()
    ids, labels = model_batch()
    seen = []

    def loss_function(logits, labels, vocab_size, shift_labels=None, **kwargs):
        seen.append((logits.shape, shift_labels, kwargs["label_smoothing"]))
        return logits.float().logsumexp(-1).mean()

    model.loss_function = loss_function
    assert model.loss_path() == (False, "model.loss_function was replaced: it gets the logits")
    out = model(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True)
    assert fused_calls == [] and out.logits is None and len(seen) == 1
    assert seen[0][0] == (4, 5, 64) and seen[0][1] is labels and seen[0][2] == 0.1


def test_loss_path_eager_on_cpu_and_with_a_hook_on_lm_head(fused_calls):
    """On a CPU, a forward asked for the loss alone computes it without logits; a hook on lm_head (which that would
    bypass) sends it through lm_head and the loss function instead, with the same loss."""
    model = tiny_model(dropout=0.0).train()
    ids, labels = model_batch()
    assert model.loss_path() == (True, "lm_head is a plain nn.Linear on cpu")
    assert str(model.loss_path()) == "cross-entropy without logits (lm_head is a plain nn.Linear on cpu)"
    assert model.loss_path(skip_logits=False) == (False, "the logits are asked for")
    fused = model(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True)
    calls = []
    model.lm_head.register_forward_hook(lambda *args: calls.append(1))
    assert model.loss_path() == (
        False,
        "lm_head has forward hooks (an FSDP unit or another hook), which it would bypass",
    )
    hooked = model(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True)
    assert fused_calls == [1] and calls == [1] and hooked.logits is None
    torch.testing.assert_close(hooked.loss, fused.loss, rtol=1e-6, atol=0)


def test_loss_path_on_a_stubbed_gpu_is_the_loss_of_the_logits(fused_calls, monkeypatch, tmp_path, one_thread):
    """On a GPU the loss of the logits is the default (the loss without logits is measured faster on CPUs only). With
    the parameters reporting a CUDA device (a stub: they stay on the CPU), a forward asked for the loss alone computes
    it from the logits, train.py's trainer computes the same loss that way and says so when training starts."""
    model = tiny_model(dropout=0.0).train()
    ids, labels = model_batch()
    without_logits = model(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True).loss
    assert fused_calls == [1]
    monkeypatch.setattr(torch.nn.Parameter, "device", property(lambda self: torch.device("cuda")), raising=False)
    assert model.lm_head.weight.device.type == "cuda"
    assert model.loss_path() == (False, "on cuda the loss of the logits is the default")
    out = model(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True)
    assert fused_calls == [1] and out.logits is None
    torch.testing.assert_close(out.loss, without_logits, rtol=1e-6, atol=0)
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), label_smoothing_factor=0.1, report_to=[], use_cpu=True)
    trainer = TranslationTrainer(model=model, args=args)
    loss = trainer.compute_loss(model, {"input_ids": ids, "labels": labels})
    assert fused_calls == [1]
    torch.testing.assert_close(loss, without_logits, rtol=1e-6, atol=0)
    assert trainer.describe_loss() == (
        "loss: label smoothing 0.1, model.loss_function on the logits (on cuda the loss of the logits is the default), "
        "in the model's forward"
    )


def test_loss_path_off_the_logit_free_devices_eager_and_compiled(fused_calls, monkeypatch):
    """The device decision forced as on a GPU (the CPU struck from the devices of the loss without logits), and on
    the meta device: the loss of the logits, eager and under torch.compile, whose graphs then hold no loss op (the
    compiled forward decides on the module itself, as the eager one)."""
    on_meta = tiny_model().to("meta")
    assert on_meta.loss_path() == (False, "on meta the loss of the logits is the default")
    monkeypatch.setattr(modeling_vanilla_transformer, "LOGIT_FREE_DEVICES", ("cuda",))
    model = tiny_model(dropout=0.0).train()
    ids, labels = model_batch()
    assert model.loss_path() == (False, "on cpu the loss of the logits is the default")
    out = model(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True)
    assert fused_calls == [] and out.logits is None
    expected = model(input_ids=ids, labels=labels, label_smoothing=0.1)
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-6, atol=0)
    torch._dynamo.reset()
    graphs = []
    compiled = torch.compile(model, backend=lambda graph, inputs: graphs.append(graph) or graph.forward)
    loss = compiled(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True).loss
    namespace, name = loss_vanilla_transformer._OP_NAME.split("::")
    op = getattr(getattr(torch.ops, namespace), name).default
    assert graphs and not any(op in [node.target for node in graph.graph.nodes] for graph in graphs)
    torch.testing.assert_close(loss, expected.loss, rtol=1e-6, atol=0)


def test_loss_path_with_peft_lora_on_lm_head(fused_calls):
    """peft's LoRA on lm_head replaces it with an adapter layer, whose weight alone is not the projection: the loss
    of the logits, through the adapter; the adapter's gradient flows."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["lm_head", "qkv_proj"], task_type="SEQ_2_SEQ_LM")
    model = peft.get_peft_model(tiny_model(dropout=0.0).train(), config)
    base = model.get_base_model()
    assert base.loss_path() == (
        False,
        "lm_head is a peft.tuners.lora.layer.Linear (an adapter?), not a bias-free nn.Linear",
    )
    ids, labels = model_batch()
    out = model(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True)
    out.loss.backward()
    assert fused_calls == [] and out.logits is None
    assert base.lm_head.lora_B["default"].weight.grad is not None
    # LoRA elsewhere only: lm_head stays plain, and the loss without logits runs
    plain = peft.get_peft_model(tiny_model(dropout=0.0).train(), peft.LoraConfig(r=4, target_modules=["qkv_proj"]))
    assert plain.get_base_model().loss_path().logit_free
    plain(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True).loss.backward()
    assert fused_calls == [1]


@pytest.fixture
def gloo_group(tmp_path):
    """A process group of this one process (gloo), as DDP and FSDP2 need; destroyed afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_loss_path_under_ddp(gloo_group, fused_calls):
    """DDP wraps the model and leaves lm_head as it is: the loss without logits runs inside the wrapped forward, and
    DDP's gradient hooks see its gradients."""
    model = tiny_model(dropout=0.0).train()
    reference = copy.deepcopy(model)
    wrapped = torch.nn.parallel.DistributedDataParallel(model)
    ids, labels = model_batch()
    assert model.loss_path().logit_free
    wrapped(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True).loss.backward()
    reference(input_ids=ids, labels=labels, label_smoothing=0.1).loss.backward()
    assert fused_calls == [1]
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


def test_loss_path_under_fsdp2(gloo_group, fused_calls):
    """FSDP2 as Accelerate applies it (one unit per layer, the tied embedding and lm_head in one unit, the root):
    lm_head's weight is sharded outside that unit's hooks, which the loss without logits would bypass, so the loss
    of the logits runs, and says why."""
    from torch.distributed.fsdp import fully_shard

    model = tiny_model(dropout=0.0).train()
    reference = copy.deepcopy(model)
    for layer in (*model.model.encoder.layers, *model.model.decoder.layers):
        fully_shard(layer)
    fully_shard([model.model.shared, model.lm_head])
    fully_shard(model)
    assert model.loss_path() == (
        False,
        "lm_head has forward hooks (an FSDP unit or another hook), which it would bypass",
    )
    ids, labels = model_batch()
    loss = model(input_ids=ids, labels=labels, label_smoothing=0.1, skip_logits=True).loss
    expected = reference(input_ids=ids, labels=labels, label_smoothing=0.1).loss
    assert fused_calls == []
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)


def record_forward_kwargs(monkeypatch, model) -> list[dict]:
    """The keyword arguments of every call of the model's forward."""
    calls, forward = [], type(model).forward

    @functools.wraps(forward)
    def recording_forward(self, **kwargs):
        calls.append(kwargs)
        return forward(self, **kwargs)

    monkeypatch.setattr(type(model), "forward", recording_forward)
    return calls


def test_project_trainer_hands_label_smoothing_to_the_model(tmp_path, monkeypatch, one_thread):
    """train.py's trainer gives the same loss and gradients as Seq2SeqTrainer with its LabelSmoother, but the model
    computes them: LabelSmoother is off, and the model gets ε and skip_logits."""
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
    model_kwargs = record_forward_kwargs(monkeypatch, model)
    loss, grads, trainer = step(TranslationTrainer)
    assert trainer.label_smoother is None and trainer.model_computes_loss
    assert model_kwargs[-1]["label_smoothing"] == 0.1 and model_kwargs[-1]["skip_logits"] is True
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert trainer.describe_loss() == (
        "loss: label smoothing 0.1, cross-entropy without logits (lm_head is a plain nn.Linear on cpu), "
        "in the model's forward"
    )


def test_project_trainer_skips_the_logits_in_training_only(tmp_path, monkeypatch, one_thread):
    """Without label smoothing too, training steps ask the model for the loss alone; evaluation keeps the logits."""
    model = tiny_model(dropout=0.0)
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    labels = torch.tensor([[8, 9, 2, -100], [11, 12, 13, 2]])
    batch = {"input_ids": torch.tensor([[5, 6, 7, 2], [10, 2, 0, 0]]), "labels": labels}
    model_kwargs = record_forward_kwargs(monkeypatch, model)
    trainer = TranslationTrainer(model=model, args=args)
    loss = trainer.compute_loss(model, dict(batch))
    assert model_kwargs[-1]["skip_logits"] is True and "label_smoothing" not in model_kwargs[-1]
    torch.testing.assert_close(loss, Seq2SeqTrainer(model=model, args=args).compute_loss(model, dict(batch)))
    loss, outputs = trainer.compute_loss(model, dict(batch), return_outputs=True)
    assert "skip_logits" not in model_kwargs[-1] and outputs.logits.shape == (2, 4, 64)


def test_project_trainer_under_torch_compile_takes_the_loss_without_logits(tmp_path, one_thread):
    """Handed a compiled model (as Accelerate hands it with torch_compile=True), the trainer still passes ε and
    skip_logits, which a compiled wrapper's bare signature used to hide: the graph calls the loss without logits."""
    model = tiny_model(dropout=0.0).train()
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), label_smoothing_factor=0.1, report_to=[], use_cpu=True)
    trainer = TranslationTrainer(model=model, args=args)
    ids, labels = model_batch()
    expected = model(input_ids=ids, labels=labels, label_smoothing=0.1).loss
    torch._dynamo.reset()
    graphs = []
    compiled = torch.compile(model, backend=lambda graph, inputs: graphs.append(graph) or graph.forward)
    loss = trainer.compute_loss(compiled, {"input_ids": ids, "labels": labels})
    namespace, name = loss_vanilla_transformer._OP_NAME.split("::")
    op = getattr(getattr(torch.ops, namespace), name).default
    assert sum([node.target for node in graph.graph.nodes].count(op) for graph in graphs) == 1
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)


def test_project_trainer_trains_marian_as_seq2seq_trainer_does(tmp_path, one_thread):
    """A model without the loss's keyword arguments (MarianMTModel, which the benchmarks train with this trainer):
    Trainer's LabelSmoother smooths its logits, as in Seq2SeqTrainer, and the start-up line says so."""
    model = tiny_marian(dropout=0.0)  # no dropout: the two trainers see the same network
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), label_smoothing_factor=0.1, report_to=[], use_cpu=True)
    trainer = TranslationTrainer(model=model, args=args)
    ids, labels = model_batch()
    batch = {
        "input_ids": ids,
        "labels": labels,
        "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels),
    }
    assert not trainer.model_computes_loss and trainer.label_smoother.epsilon == 0.1
    assert trainer.describe_loss() == "loss: Trainer's LabelSmoother (label smoothing 0.1) on the model's logits"
    loss = trainer.compute_loss(model, dict(batch))
    expected = Seq2SeqTrainer(model=model, args=args).compute_loss(model, dict(batch))
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("predict_with_generate", [False, True])
def test_project_trainer_evaluates_with_the_smoothed_loss(tmp_path, one_thread, predict_with_generate):
    """The evaluation loss is the label-smoothed loss, as Seq2SeqTrainer's LabelSmoother reports it, with and
    without generation (where Seq2SeqTrainer calls the model beside generate())."""
    from conftest import word_tokenizer
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq

    model = tiny_model(dropout=0.0)
    tokenizer = word_tokenizer(["a", "b", "c", "d", "e"])
    rows = [{"input_ids": [5, 6, 7, 2], "labels": [8, 2]}, {"input_ids": [6, 2], "labels": [5, 6, 7, 8, 2]}] * 3
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        report_to=[],
        use_cpu=True,
        per_device_eval_batch_size=6,
        label_smoothing_factor=0.1,
        predict_with_generate=predict_with_generate,
        generation_max_length=8,
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    metrics = {}
    for trainer_class in (Seq2SeqTrainer, TranslationTrainer):
        trainer = trainer_class(model=model, args=args, eval_dataset=Dataset.from_list(rows), data_collator=collator)
        metrics[trainer_class] = trainer.evaluate()["eval_loss"]
    batch = collator(rows)
    with torch.no_grad():
        expected = LabelSmoother(0.1)(model(**batch), batch["labels"]).item()
    assert metrics[TranslationTrainer] == pytest.approx(expected, rel=1e-5)
    assert metrics[Seq2SeqTrainer] == pytest.approx(expected, rel=1e-5)


def test_a_stock_trainer_evaluates_our_model_with_its_loss_and_labels(tmp_path, one_thread):
    """Trainer takes every argument of ``forward`` with "label" in its name for a label input (``find_labels``) and
    computes an evaluation loss only when all of them are in the batch: ours has ``labels`` alone (the loss's keyword
    arguments are not named arguments), so a stock Seq2SeqTrainer without generation reports ``eval_loss`` and hands
    the labels to ``compute_metrics``."""
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
