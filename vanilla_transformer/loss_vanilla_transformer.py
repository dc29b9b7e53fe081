"""The training loss: token cross-entropy with label smoothing (§5.4), in one memory-lean pass over the logits, or
without making the logits at all (the project's trainer asks for that in training steps).

Copied into every checkpoint beside the modeling file, so it imports only torch.
"""

import torch
from torch.nn import functional as F

_BLOCKS = 16  # row blocks: 2048 positions × 32000 logits -> 16 MiB per block, which stays in cache
_ROWS = 512  # positions per block of LinearCrossEntropy: the fastest base step of 256, 512 and 1024 (small: equal)
# linear_cross_entropy pads its labelled positions with zero rows to a multiple of this. On a CPU, oneDNN builds and
# caches a kernel for every shape of a bf16 product; the count of labelled tokens changes with every batch, so unpadded
# a long run caches hundreds of kernels for the three vocabulary-sized products (2.1 GiB peak RSS after 1,000 token
# batches at d_model 256 with an 8,000-token vocabulary; 1.4 GiB padded, at the same speed; 2026-12-04, AMX Xeon).
_ROW_MULTIPLE = 8


def _smoothed_target_logit(logits: torch.Tensor, targets: torch.Tensor, eps: float) -> torch.Tensor:
    """(1-ε) logit_label + ε mean_v logit_v per row: since -log p(v) = log Σ exp(logits) - logit_v, the smoothed loss of
    a position is its log-normaliser minus this."""
    value = (1.0 - eps) * logits.gather(1, targets[:, None]).squeeze(1)
    return value + eps * logits.mean(dim=-1) if eps else value


def _smoothed_gradient_(
    exp: torch.Tensor,
    targets: torch.Tensor,
    eps: float,
    row_scale: torch.Tensor,
    normaliser: torch.Tensor | None = None,
) -> None:
    """exp(logits) / normaliser = softmax -> (softmax - (1-ε) onehot(label) - ε/V) × row_scale, in place: the gradient
    of the smoothed loss with respect to the logits, in two passes over the block."""
    exp.mul_((row_scale if normaliser is None else row_scale / normaliser)[:, None])
    if eps:
        exp.sub_((row_scale * (eps / exp.shape[-1]))[:, None])
    exp.scatter_add_(1, targets[:, None], (row_scale * (eps - 1.0))[:, None])


class TokenCrossEntropy(torch.autograd.Function):
    """Σ over positions labelled ≠ -100 of -(1-ε) log p(label) - ε/V Σ_v log p(v): the summed cross-entropy against
    the target smoothed by ε ("label smoothing of value ε_ls = 0.1", §5.4). Its value is that of transformers'
    ``LabelSmoother`` (ε > 0) or ``F.cross_entropy(reduction="sum", ignore_index=-100)`` (ε = 0) before averaging.

    Those keep a log-softmax of the logits' size (batch × length × vocabulary, the largest activations of a
    translation model) for the backward pass, which then allocates more such tensors. This keeps only the logits,
    which the model returns anyway, and one log-normaliser per position, and writes the gradient
    softmax(logits) - (1-ε) onehot(label) - ε/V straight into one new tensor, block by block of rows that stay in
    cache. Sums are taken in float32 (or float64) whatever the logits' dtype.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        # logits: (positions, vocab), labels: (positions,)
        labelled = labels != -100
        targets = labels.masked_fill(~labelled, 0)
        sum_dtype = torch.promote_types(logits.dtype, torch.float32)
        log_normaliser, smoothed = [], []
        for block, target in zip(logits.tensor_split(_BLOCKS), targets.tensor_split(_BLOCKS)):
            block = block.to(sum_dtype)
            log_normaliser.append(torch.logsumexp(block, dim=-1))
            smoothed.append(_smoothed_target_logit(block, target, label_smoothing))
        log_normaliser = torch.cat(log_normaliser)  # (positions,)
        loss = log_normaliser - torch.cat(smoothed)
        ctx.save_for_backward(logits, log_normaliser, targets, labelled)
        ctx.label_smoothing = label_smoothing
        return (loss * labelled).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, log_normaliser, targets, labelled = ctx.saved_tensors
        grad = torch.empty_like(logits)
        scale = (grad_output * labelled).to(log_normaliser.dtype)  # 0 where the label is -100
        # block by block, so that each pass over a block finds it in cache
        for block, norm, target, row_scale, grad_block in zip(
            *(t.tensor_split(_BLOCKS) for t in (logits, log_normaliser, targets, scale, grad))
        ):
            if block.dtype == norm.dtype:
                torch.sub(block, norm[:, None], out=grad_block).exp_()  # softmax(logits), written in place
                _smoothed_gradient_(grad_block, target, ctx.label_smoothing, row_scale)
            else:  # half precision: the gradient in float32, then round once
                softmax = torch.exp(block.to(norm.dtype) - norm[:, None])
                _smoothed_gradient_(softmax, target, ctx.label_smoothing, row_scale)
                grad_block.copy_(softmax)
        return grad, None, None


class LinearCrossEntropy(torch.autograd.Function):
    """``TokenCrossEntropy`` of the logits ``hidden_states @ weight.T`` (the pre-softmax projection, §3.4), which never
    exist whole: 512 positions at a time, the block of logits is made, its loss summed and its gradient written in
    place, and that gradient is multiplied straight into the gradients of the hidden states and of the weight.

    Training needs no logits, only the loss and these two gradients, so this saves the two largest tensors of the
    step (the logits and their gradient, positions × vocabulary each) and the time to fill them from fresh memory.
    The products are the three the unfused path computes; the weight's gradient is accumulated block by block.

    ``grad_enabled``: whether the caller's grad mode was on (``torch.is_grad_enabled()`` before ``apply``). Inside
    ``forward`` grad mode is always off, and ``ctx.needs_input_grad`` says True under ``torch.no_grad()`` too, so the
    caller tells: when False only the loss is computed (one product per block instead of three, no gradient buffers).
    """

    @staticmethod
    def forward(
        ctx,
        hidden_states: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        label_smoothing: float,
        grad_enabled: bool = True,
    ) -> torch.Tensor:
        # hidden_states: (positions, d_model), weight: (vocab, d_model), labels: (positions,)
        device = hidden_states.device.type
        # the products in autocast's dtype when it is on (as nn.Linear would), the loss's sums in float32 or more
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden_states.dtype
        with torch.autocast(device, enabled=False):
            hidden, matrix = hidden_states.to(dtype), weight.to(dtype)
            labelled = labels != -100
            targets = labels.masked_fill(~labelled, 0)
            sum_dtype = torch.promote_types(dtype, torch.float32)
            need_grad = grad_enabled and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
            grad_hidden = torch.empty_like(hidden) if need_grad else None
            grad_weight = None
            total = torch.zeros((), dtype=sum_dtype, device=hidden.device)
            # one block of logits, reused: fresh memory of this size costs page faults on every allocation
            buffer = hidden.new_empty(min(_ROWS, len(hidden)), len(matrix))
            for start in range(0, len(hidden), _ROWS):
                rows = slice(start, start + _ROWS)
                block = hidden[rows]
                logits = torch.mm(block, matrix.T, out=buffer[: len(block)]).to(sum_dtype)
                target, scale = targets[rows], labelled[rows].to(sum_dtype)  # scale: 0 where the label is -100
                smoothed = _smoothed_target_logit(logits, target, label_smoothing)  # before the block is overwritten
                max_logit = logits.amax(dim=-1, keepdim=True)
                exp = logits.sub_(max_logit).exp_()  # in place: the block becomes exp(logits - max)
                sum_exp = exp.sum(dim=-1)
                # the log-normaliser log Σ exp(logits) = max + log Σ exp(logits - max)
                total += ((max_logit.squeeze(1) + sum_exp.log() - smoothed) * scale).sum()
                if not need_grad:
                    continue
                _smoothed_gradient_(exp, target, label_smoothing, scale, normaliser=sum_exp)
                gradient = exp.to(dtype)  # (rows, vocab): d loss / d logits
                torch.mm(gradient, matrix, out=grad_hidden[rows])
                if grad_weight is None:
                    grad_weight = (gradient.T @ block).to(weight.dtype)
                elif grad_weight.dtype == dtype:
                    grad_weight.addmm_(gradient.T, block)
                else:  # half-precision products, float32 weights: accumulate in the weight's dtype
                    grad_weight += gradient.T @ block
            if need_grad and grad_weight is None:  # no positions at all
                grad_weight = torch.zeros_like(weight)
        ctx.gradients, ctx.hidden_dtype = (grad_hidden, grad_weight), hidden_states.dtype
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None, None]:
        grad_hidden, grad_weight = ctx.gradients
        return (grad_hidden * grad_output).to(ctx.hidden_dtype), grad_weight * grad_output, None, None, None


def _check(labels: torch.Tensor, positions: torch.Size, label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing={label_smoothing!r} is invalid; it must be in [0, 1).")
    if labels.shape != positions:
        raise ValueError(
            f"`labels` has shape {tuple(labels.shape)} but the decoder produced {tuple(positions)} "
            "(batch, target length) positions; labels must match decoder_input_ids position for position."
        )


def _mean(loss: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None) -> torch.Tensor:
    if num_items_in_batch is None:
        num_items_in_batch = (labels != -100).sum()
    # A batch with no labelled token (all -100) gets loss 0.0, still attached to the graph, so that backward gives
    # zero gradients; a mean over zero items would be 0 / 0 = NaN and poison the weights.
    return loss / torch.as_tensor(num_items_in_batch, device=loss.device).clamp(min=1)


def token_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """The mean of ``TokenCrossEntropy`` over the labelled tokens, or over ``num_items_in_batch`` (Trainer passes the
    count of the whole accumulated batch, so that gradient accumulation gives the mean over that batch).

    logits: (batch, length, vocab); labels: (batch, length), -100 where no loss is wanted.
    """
    _check(labels, logits.shape[:2], label_smoothing)
    labels = labels.to(logits.device)
    loss = TokenCrossEntropy.apply(logits.flatten(0, 1), labels.flatten(), float(label_smoothing))
    return _mean(loss, labels, num_items_in_batch)


def linear_cross_entropy(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """``token_cross_entropy(hidden_states @ weight.T, labels, ...)`` without the logits (``LinearCrossEntropy``), over
    the labelled positions only. Under ``torch.no_grad()`` (or inference mode) it computes the loss alone, without
    the two gradient products.

    hidden_states: (batch, length, d_model); weight: (vocab, d_model); labels: (batch, length).
    """
    _check(labels, hidden_states.shape[:2], label_smoothing)
    labels = labels.to(hidden_states.device).flatten()
    # positions labelled -100 (padding) add nothing to the loss: their logits are not even computed. The labelled ones
    # are followed by as many zero rows labelled -100 (which add nothing either) as make a multiple of _ROW_MULTIPLE.
    labelled = labels != -100
    hidden_states, labels = hidden_states.flatten(0, 1)[labelled], labels[labelled]
    padding = -len(labels) % _ROW_MULTIPLE
    hidden_states, labels = F.pad(hidden_states, (0, 0, 0, padding)), F.pad(labels, (0, padding), value=-100)
    # grad mode is off inside the Function's forward, so it is read here
    loss = LinearCrossEntropy.apply(hidden_states, weight, labels, float(label_smoothing), torch.is_grad_enabled())
    return _mean(loss, labels, num_items_in_batch)
