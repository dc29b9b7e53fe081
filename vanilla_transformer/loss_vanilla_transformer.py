"""The training loss: token cross-entropy with label smoothing (§5.4), in one memory-lean pass over the logits.

Copied into every checkpoint beside the modeling file, so it imports only torch.
"""

import torch

_BLOCKS = 16  # row blocks: 2048 positions × 32000 logits -> 16 MiB per block, which stays in cache


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
        log_normaliser, mean_logit = [], []
        for block in logits.tensor_split(_BLOCKS):
            block = block.to(sum_dtype)
            log_normaliser.append(torch.logsumexp(block, dim=-1))
            if label_smoothing:
                mean_logit.append(block.mean(dim=-1))
        log_normaliser = torch.cat(log_normaliser)  # (positions,)
        target_logit = logits.gather(1, targets[:, None]).squeeze(1).to(sum_dtype)
        # -log p(v) = log_normaliser - logit_v, so the smoothed loss is log_normaliser - (1-ε) logit_label - ε mean
        loss = log_normaliser - (1.0 - label_smoothing) * target_logit
        if label_smoothing:
            loss = loss - label_smoothing * torch.cat(mean_logit)
        ctx.save_for_backward(logits, log_normaliser, targets, labelled)
        ctx.label_smoothing = label_smoothing
        return (loss * labelled).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, log_normaliser, targets, labelled = ctx.saved_tensors
        eps = ctx.label_smoothing
        grad = torch.empty_like(logits)
        scale = (grad_output * labelled).to(grad.dtype)  # 0 where the label is -100
        # block by block, so that each pass over a block finds it in cache
        for block, norm, target, row_scale, grad_block in zip(
            *(t.tensor_split(_BLOCKS) for t in (logits, log_normaliser, targets, scale, grad))
        ):
            if block.dtype == norm.dtype:
                torch.sub(block, norm[:, None], out=grad_block).exp_()  # softmax(logits), written in place
            else:  # half precision: exponentiate in float32, then round once
                grad_block.copy_(torch.exp(block.to(norm.dtype) - norm[:, None]))
            if eps:
                grad_block.sub_(eps / logits.shape[-1])
            grad_block.scatter_add_(1, target[:, None], grad_block.new_full((len(target), 1), eps - 1.0))
            grad_block.mul_(row_scale[:, None])
        return grad, None, None


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
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing={label_smoothing!r} is invalid; it must be in [0, 1).")
    if labels.shape != logits.shape[:2]:
        raise ValueError(
            f"`labels` has shape {tuple(labels.shape)} but the decoder produced {tuple(logits.shape[:2])} "
            "(batch, target length) positions; labels must match decoder_input_ids position for position."
        )
    labels = labels.to(logits.device)
    loss = TokenCrossEntropy.apply(logits.flatten(0, 1), labels.flatten(), float(label_smoothing))
    if num_items_in_batch is None:
        num_items_in_batch = (labels != -100).sum()
    # A batch with no labelled token (all -100) gets loss 0.0, still attached to the graph, so that backward gives
    # zero gradients; a mean over zero items would be 0 / 0 = NaN and poison the weights.
    return loss / torch.as_tensor(num_items_in_batch, device=loss.device).clamp(min=1)
