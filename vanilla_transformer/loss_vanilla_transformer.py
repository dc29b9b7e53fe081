"""The training loss: token cross-entropy with label smoothing (§5.4), from the logits
(``label_smoothed_cross_entropy``, the model's ``loss_function``) or, on CPUs, without making the logits at all
(``linear_cross_entropy``). ``LossPath`` says which of the two a forward with labels computes, and why.

Copied into every checkpoint beside the modeling file, so it imports only torch.
"""

import re
from typing import NamedTuple

import torch
from torch.nn import functional as F

_ROWS = 512  # positions per block of linear_cross_entropy: the fastest base step of 256, 512 and 1024 (small: equal)
# linear_cross_entropy pads its labelled positions with zero rows to a multiple of this. On a CPU, oneDNN builds and
# caches a kernel for every shape of a bf16 product; the count of labelled tokens changes with every batch, so unpadded
# a long run caches hundreds of kernels for the three vocabulary-sized products (2.1 GiB peak RSS after 1,000 token
# batches at d_model 256 with an 8,000-token vocabulary; 1.4 GiB padded, at the same speed; 2026-12-04, AMX Xeon).
_ROW_MULTIPLE = 8
# The devices where the model computes the loss without logits when asked to (skip_logits): it is measured faster than
# the loss of the logits on CPUs; elsewhere it is not measured, and its 512-row loop would be bound by kernel launches.
LOGIT_FREE_DEVICES = ("cpu",)


class LossPath(NamedTuple):
    """Which loss a forward with labels computes: without logits (``linear_cross_entropy``) when ``logit_free``,
    else ``model.loss_function`` on the logits; ``reason`` says why."""

    logit_free: bool
    reason: str

    def __str__(self) -> str:
        loss = "cross-entropy without logits" if self.logit_free else "model.loss_function on the logits"
        return f"{loss} ({self.reason})"


def _check(labels: torch.Tensor, positions: torch.Size, label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing={label_smoothing!r} is invalid; it must be in [0, 1).")
    if labels.shape != positions:
        raise ValueError(
            f"`labels` has shape {tuple(labels.shape)} but the decoder produced {tuple(positions)} "
            "(batch, target length) positions; labels must match decoder_input_ids position for position."
        )


def _mean(loss: torch.Tensor, labelled: torch.Tensor, num_items_in_batch: int | torch.Tensor | None) -> torch.Tensor:
    if num_items_in_batch is None:
        num_items_in_batch = labelled.sum()
    # A batch with no labelled token (all -100) gets loss 0.0, still attached to the graph, so that backward gives
    # zero gradients; a mean over zero items would be 0 / 0 = NaN and poison the weights.
    return loss / torch.as_tensor(num_items_in_batch, device=loss.device).clamp(min=1)


def label_smoothed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    vocab_size: int,
    num_items_in_batch: int | torch.Tensor | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    **kwargs,
) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss`` with label smoothing: the summed token cross-entropy against the target
    smoothed by ε ("label smoothing of value ε_ls = 0.1", §5.4) over the positions not labelled ``ignore_index``,
    divided by their count or by ``num_items_in_batch`` (Trainer passes the count of the whole accumulated batch).
    Its value is that of transformers' ``LabelSmoother``; at ε = 0 that of ``F.cross_entropy``.

    The model calls it as transformers' encoder-decoder models do, with ``labels=None`` and the targets as
    ``shift_labels`` (the decoder input is already shifted right); ``labels`` alone are shifted, as
    ``ForCausalLMLoss`` shifts them. The sums are taken in float32 (or float64) whatever the logits' dtype.

    logits: (batch, length, vocab); shift_labels: (batch, length).
    """
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    _check(shift_labels, logits.shape[:-1], label_smoothing)
    targets = shift_labels.to(logits.device)
    loss = F.cross_entropy(
        logits.to(torch.promote_types(logits.dtype, torch.float32)).view(-1, vocab_size),
        targets.reshape(-1),
        ignore_index=ignore_index,
        reduction="sum",
        label_smoothing=label_smoothing,
    )
    return _mean(loss, targets != ignore_index, num_items_in_batch)


def _smoothed_target_logit(logits: torch.Tensor, targets: torch.Tensor, eps: float) -> torch.Tensor:
    """(1-ε) logit_label + ε mean_v logit_v per row: since -log p(v) = log Σ exp(logits) - logit_v, the smoothed loss of
    a position is its log-normaliser minus this."""
    value = (1.0 - eps) * logits.gather(1, targets[:, None]).squeeze(1)
    return value + eps * logits.mean(dim=-1) if eps else value


def _smoothed_gradient_(
    exp: torch.Tensor, targets: torch.Tensor, eps: float, row_scale: torch.Tensor, normaliser: torch.Tensor
) -> None:
    """exp(logits) / normaliser = softmax -> (softmax - (1-ε) onehot(label) - ε/V) × row_scale, in place: the gradient
    of the smoothed loss with respect to the logits, in two passes over the block."""
    exp.mul_((row_scale / normaliser)[:, None])
    if eps:
        exp.sub_((row_scale * (eps / exp.shape[-1]))[:, None])
    exp.scatter_add_(1, targets[:, None], (row_scale * (eps - 1.0))[:, None])


# One op per module that defines it: the file is also imported from checkpoints (trust_remote_code) under other module
# names, each with its own copy of the code, and a second definition of one op name would replace the first's code.
_OP_NAME = re.sub(r"\W", "_", __name__) + "::linear_cross_entropy"


@torch.library.custom_op(_OP_NAME, mutates_args=())
def _linear_cross_entropy(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float,
    dtype: torch.dtype,
    with_gradients: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Σ smoothed loss, its gradient for hidden_states, its gradient for weight) of the logits hidden_states @ weight.T
    over the positions not labelled -100, computed 512 positions at a time; without ``with_gradients``, the loss
    alone and two empty tensors. The products run in ``dtype``, the sums in float32 (or float64).

    An op of its own (``torch.library.custom_op``), so that ``torch.compile`` calls it as one opaque step: the
    labelled count and the loop over blocks then run on the real shapes, and new lengths compile nothing new.
    hidden_states: (positions, d_model), weight: (vocab, d_model), labels: (positions,).
    """
    with torch.autocast(hidden_states.device.type, enabled=False):
        # positions labelled -100 (padding) add nothing to the loss: their logits are not even computed. The labelled
        # ones are followed by as many zero rows labelled -100 (which add nothing either) as make a multiple of
        # _ROW_MULTIPLE.
        labelled = labels != -100
        rows = hidden_states[labelled]
        padding = -len(rows) % _ROW_MULTIPLE
        hidden = F.pad(rows, (0, 0, 0, padding)).to(dtype)
        row_labels = F.pad(labels[labelled], (0, padding), value=-100)
        matrix = weight.to(dtype)
        targets = row_labels.masked_fill(row_labels == -100, 0)
        sum_dtype = torch.promote_types(dtype, torch.float32)
        grad_hidden = torch.empty_like(hidden) if with_gradients else None
        grad_weight = None
        total = torch.zeros((), dtype=sum_dtype, device=hidden.device)
        # one block of logits, reused: fresh memory of this size costs page faults on every allocation
        buffer = hidden.new_empty(min(_ROWS, len(hidden)), len(matrix))
        for start in range(0, len(hidden), _ROWS):
            block_rows = slice(start, start + _ROWS)
            block = hidden[block_rows]
            logits = torch.mm(block, matrix.T, out=buffer[: len(block)]).to(sum_dtype)
            target, scale = targets[block_rows], (row_labels[block_rows] != -100).to(sum_dtype)  # 0 where -100
            smoothed = _smoothed_target_logit(logits, target, label_smoothing)  # before the block is overwritten
            max_logit = logits.amax(dim=-1, keepdim=True)
            exp = logits.sub_(max_logit).exp_()  # in place: the block becomes exp(logits - max)
            sum_exp = exp.sum(dim=-1)
            # the log-normaliser log Σ exp(logits) = max + log Σ exp(logits - max)
            total += ((max_logit.squeeze(1) + sum_exp.log() - smoothed) * scale).sum()
            if not with_gradients:
                continue
            _smoothed_gradient_(exp, target, label_smoothing, scale, normaliser=sum_exp)
            gradient = exp.to(dtype)  # (rows, vocab): d loss / d logits
            torch.mm(gradient, matrix, out=grad_hidden[block_rows])
            if grad_weight is None:
                grad_weight = (gradient.T @ block).to(weight.dtype)
            elif grad_weight.dtype == dtype:
                grad_weight.addmm_(gradient.T, block)
            else:  # half-precision products, float32 weights: accumulate in the weight's dtype
                grad_weight += gradient.T @ block
        if not with_gradients:
            return total, hidden_states.new_empty(0), weight.new_empty(0)
        if grad_weight is None:  # no positions at all
            grad_weight = torch.zeros_like(weight)
        # the labelled rows' gradients back in their places; every other position gets 0
        grad_states = torch.zeros_like(hidden_states)
        grad_states[labelled] = grad_hidden[: len(rows)].to(hidden_states.dtype)
    return total, grad_states, grad_weight


@_linear_cross_entropy.register_fake
def _(hidden_states, weight, labels, label_smoothing, dtype, with_gradients):
    total = hidden_states.new_empty((), dtype=torch.promote_types(dtype, torch.float32))
    if not with_gradients:
        return total, hidden_states.new_empty(0), weight.new_empty(0)
    return total, torch.empty_like(hidden_states), torch.empty_like(weight)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*output[1:])


def _backward(ctx, grad_total: torch.Tensor, *_) -> tuple:
    # the gradients were made with the loss: backward only scales them
    grad_states, grad_weight = ctx.saved_tensors
    return grad_states * grad_total, grad_weight * grad_total, None, None, None, None


_linear_cross_entropy.register_autograd(_backward, setup_context=_setup_context)


def linear_cross_entropy(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """``label_smoothed_cross_entropy`` of the logits ``hidden_states @ weight.T`` (the pre-softmax projection, §3.4),
    which never exist whole: 512 positions at a time, the block of logits is made, its loss summed and its gradient
    written in place, and that gradient is multiplied straight into the gradients of the hidden states and of the
    weight; backward then only scales them.

    Training needs no logits, only the loss and these two gradients, so this saves the two largest tensors of the
    step (the logits and their gradient, positions × vocabulary each) and the time to fill them from fresh memory.
    The products are the three the unfused path computes, in autocast's dtype when it is on (as ``nn.Linear``'s
    would be). Under ``torch.no_grad()`` (or inference mode) it computes the loss alone: one product per block.

    hidden_states: (batch, length, d_model); weight: (vocab, d_model); labels: (batch, length).
    """
    _check(labels, hidden_states.shape[:2], label_smoothing)
    labels = labels.to(hidden_states.device)
    device = hidden_states.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden_states.dtype
    with_gradients = torch.is_grad_enabled() and (hidden_states.requires_grad or weight.requires_grad)
    loss, _, _ = _linear_cross_entropy(
        hidden_states.flatten(0, 1), weight, labels.flatten(), float(label_smoothing), dtype, with_gradients
    )
    return _mean(loss, labels != -100, num_items_in_batch)
