"""Clear errors for bad model inputs, kept out of the model code. Copied into every checkpoint beside it, so it
imports only torch and the configuration file."""

import torch

from .configuration_vanilla_transformer import VanillaTransformerConfig

_HOST_DEVICES = ("cpu",)  # reading a tensor's values there costs no device-to-host synchronisation


def check_inputs(
    config: VanillaTransformerConfig,
    input_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    *,
    decoder: bool = False,
    past_length: int | torch.Tensor = 0,
    encoder_hidden_states: torch.Tensor | None = None,
    encoder_attention_mask: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
) -> None:
    """Turn bad inputs into one clear error (argument, value, what is allowed) instead of an IndexError in the
    embedding, a shape error deep in attention, or a silently misaligned mask. Names are those the user passed to the
    top-level model. Shapes cost nothing and are always checked. Values are read only where they already are on the
    host (CPU tensors): on an accelerator, reading the id range or a static cache's length (a device tensor) would
    copy it to the host and stall the queue of kernels, in every training step and every decoding step; an
    out-of-range id there fails in the embedding instead. Skipped under torch.compile, whose graphs must not branch
    on tensor values."""
    if torch.compiler.is_compiling():
        return
    prefix = "decoder_" if decoder else ""
    vocab_field = "decoder_vocab_size" if decoder else "vocab_size"
    vocab_size = getattr(config, vocab_field)

    def check_ids(name: str, ids: torch.Tensor, ignore_index: int | None = None) -> None:
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"`{name}` must hold integer token ids, got dtype {ids.dtype}.")
        if ids.ndim != 2:
            raise ValueError(f"`{name}` must have shape (batch, sequence length), got {tuple(ids.shape)}.")
        if ignore_index is not None:
            ids = ids.masked_fill(ids == ignore_index, 0)
        if ids.numel() == 0 or ids.device.type not in _HOST_DEVICES:
            return
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0 or high >= vocab_size:
            allowed = f"[0, {vocab_field}={vocab_size})" + (f" or {ignore_index}" if ignore_index is not None else "")
            raise ValueError(
                f"`{name}` contains the token id {low if low < 0 else high}; ids must be in {allowed}. Check that the "
                "tokenizer matches the model config."
            )

    if labels is not None:
        check_ids("labels", labels, ignore_index=-100)
    if input_ids is None and inputs_embeds is None:
        return
    name = f"{prefix}input_ids" if input_ids is not None else f"{prefix}inputs_embeds"
    if input_ids is not None:
        check_ids(name, input_ids)
    batch_size, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
    if batch_size == 0 or length == 0:
        raise ValueError(
            f"`{name}` has shape {tuple((input_ids if input_ids is not None else inputs_embeds).shape)}: an empty "
            "batch or a zero-length sequence; every sequence needs at least one token (e.g. the eos token)."
        )
    if encoder_hidden_states is not None and encoder_hidden_states.shape[0] != batch_size:
        made_from = " (or `labels`, from which they are made)" if input_ids is not None else ""
        raise ValueError(
            f"`{name}`{made_from} has batch size {batch_size} but the source (`input_ids` or `encoder_outputs`) has "
            f"{encoder_hidden_states.shape[0]}: each target sentence needs its source sentence."
        )
    # A 4D mask is already prepared (generate builds one for a static cache) and is passed through as it is. A static
    # cache's length is a tensor on the device, unread here (a sync per decoding step): the batch size is still checked.
    static_past = isinstance(past_length, torch.Tensor)
    masks = [
        (f"{prefix}attention_mask", attention_mask, (batch_size, None if static_past else past_length + length), name)
    ]
    if encoder_hidden_states is not None:
        masks.append(("attention_mask", encoder_attention_mask, tuple(encoder_hidden_states.shape[:2]), "input_ids"))
    for mask_name, mask, (rows, columns), of in masks:
        if mask is None or mask.ndim == 4:
            continue
        if mask.ndim != 2 or mask.shape[0] != rows or (columns is not None and mask.shape[1] != columns):
            what = "past + current tokens" if (static_past or past_length) and of == name else "sequence length"
            raise ValueError(
                f"`{mask_name}` has shape {tuple(mask.shape)} but `{of}` needs ({rows}, {columns or what}) (batch, "
                f"{what}): one 1 (keep) or 0 (padding) per token."
            )


__all__ = ["check_inputs"]
