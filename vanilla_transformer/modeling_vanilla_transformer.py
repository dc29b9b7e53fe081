"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), as a transformers model.

Section numbers (§) refer to the paper. This file is copied into every saved checkpoint (``trust_remote_code``), so it
imports only torch, transformers and its sibling configuration file.
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.loss.loss_utils import LOSS_MAPPING
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
    Seq2SeqSequenceClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .input_checks_vanilla_transformer import check_inputs
from .loss_vanilla_transformer import LOGIT_FREE_DEVICES, LossPath, label_smoothed_cross_entropy, linear_cross_entropy


def shift_tokens_right(input_ids: torch.Tensor, pad_token_id: int | None, decoder_start_token_id: int | None):
    """Teacher forcing (§3.1): the decoder input is the target shifted one position right, behind a start token."""
    if decoder_start_token_id is None:
        raise ValueError(
            "`config.decoder_start_token_id` is None, but it is needed to build `decoder_input_ids` from `labels` "
            "or `input_ids`; set it in the config (the paper's start symbol, usually the bos id)."
        )
    if pad_token_id is None:
        raise ValueError("`config.pad_token_id` is None, but it is needed to replace -100 in shifted labels.")
    shifted = input_ids.new_empty(input_ids.shape)
    shifted[:, 1:] = input_ids[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


class SinusoidalPositionalEncoding(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)) (§3.5).

    Computed from the positions on every call rather than read from a table: it costs a few element-wise ops, extends
    to any length, and leaves no buffer that could come back uninitialised from ``from_pretrained``.
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        # (d_model / 2,): 1 / 10000^(2i / d_model), in fp32 whatever the model's dtype
        inv_freq = torch.exp(
            torch.arange(0, self.d_model, 2, device=position_ids.device, dtype=torch.float32)
            * (-math.log(10000.0) / self.d_model)
        )
        angles = position_ids.to(torch.float32)[..., None] * inv_freq  # (..., seq_len, d_model / 2)
        # interleave so that even dimensions hold sin and odd dimensions hold cos, as in the paper
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (..., seq_len, d_model)


class LearnedPositionalEmbedding(nn.Embedding):
    """Learned positional embeddings, the variant the paper compares in Table 3 row (E). `Embeddings` refuses a
    sequence longer than the table with a clear error."""


class Embeddings(nn.Module):
    """The input of either stack: token embeddings × √d_model plus positional encodings, then dropout (§3.4, §3.5,
    §5.4). One token matrix may serve both stacks and the pre-softmax projection (§3.4)."""

    def __init__(self, config: VanillaTransformerConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.config = config
        self.embed_tokens = embed_tokens
        self.scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        if config.position_embedding_type == "learned":
            self.embed_positions = LearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
        else:
            self.embed_positions = SinusoidalPositionalEncoding(config.d_model)

    def forward(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None = None, past: int | torch.Tensor = 0
    ) -> torch.Tensor:
        # `past` tokens are already in the decoder's cache: the new ones take the positions after them
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        length, max_positions = inputs_embeds.shape[1], self.config.max_position_embeddings
        # `past` is a tensor with a static cache: checking it would cost a device sync per decoding step
        if self.config.position_embedding_type == "learned" and isinstance(past, int) and past + length > max_positions:
            raise ValueError(
                f"Sequence too long: position {past + length - 1} needs more than max_position_embeddings="
                f"{max_positions} learned positions; shorten the input or use position_embedding_type='sinusoidal', "
                "which extends to any length."
            )
        positions = self.embed_positions(torch.arange(length, device=inputs_embeds.device) + past)
        hidden_states = inputs_embeds * self.scale + positions.to(inputs_embeds.dtype)
        return F.dropout(hidden_states, p=self.config.dropout, training=self.training)


def scaled_dot_product_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention(Q, K, V) = softmax(QKᵀ / √d_k) V (§3.2.1, Eq. 1): the "eager" implementation, which returns weights.

    The mask is additive and filled with the dtype's minimum (never -inf), so a fully padded row stays finite.
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (batch, heads, q_len, kv_len)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            attention_mask = torch.where(attention_mask, 0.0, torch.finfo(scores.dtype).min).to(scores.dtype)
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)  # normalise over the keys
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value)  # (batch, heads, q_len, head_dim)
    return output.transpose(1, 2), weights  # (batch, q_len, heads, head_dim)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V) (§3.2.2).

    One module serves encoder self-attention, masked decoder self-attention and encoder-decoder attention (§3.2.3).
    Self-attention projects Q, K and V with one fused matrix; encoder-decoder attention fuses K and V, which are
    computed once per source sentence and kept in the cache during generation.
    """

    def __init__(
        self,
        config: VanillaTransformerConfig,
        num_heads: int,
        is_causal: bool = False,
        is_cross_attention: bool = False,
        layer_idx: int | None = None,
    ):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5  # 1 / √d_k
        self.dropout = config.attention_dropout
        # Read by transformers' attention interfaces: encoder and cross-attention must say False explicitly, since
        # the interface assumes causal attention when no mask is given.
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        self.layer_idx = layer_idx
        d_model = config.d_model
        if is_cross_attention:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        # (batch, len, d_model) -> (batch, heads, len, head_dim): a view then a transpose, never a bare view
        return x.view(*x.shape[:-1], self.num_heads, self.head_dim).transpose(1, 2)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, q_len, _ = hidden_states.shape
        if self.is_cross_attention:
            query = self._split_heads(self.q_proj(hidden_states))
            cross_cache = cache.cross_attention_cache if isinstance(cache, EncoderDecoderCache) else None
            if cross_cache is not None and cache.is_updated.get(self.layer_idx):
                # the source sentence does not change while decoding: reuse its keys and values
                key = cross_cache.layers[self.layer_idx].keys
                value = cross_cache.layers[self.layer_idx].values
            else:
                key, value = self.kv_proj(key_value_states).chunk(2, dim=-1)
                key, value = self._split_heads(key), self._split_heads(value)  # (batch, heads, src_len, head_dim)
                if cross_cache is not None:
                    key, value = cross_cache.update(key, value, self.layer_idx)
                    cache.is_updated[self.layer_idx] = True
        else:
            qkv = self.qkv_proj(hidden_states)  # (batch, q_len, 3 * d_model)
            query, key, value = (self._split_heads(t) for t in qkv.chunk(3, dim=-1))  # (batch, heads, q_len, head_dim)
            if cache is not None:
                self_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
                key, value = self_cache.update(key, value, self.layer_idx)

        # "eager" is the paper's equation; "sdpa" (the default) and any registered function come from transformers
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, scaled_dot_product_attention
        )
        dropout = self.dropout if self.training else 0.0
        output, weights = attention_interface(
            self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling, **kwargs
        )
        output = output.reshape(batch_size, q_len, -1)  # concatenate the heads: (batch, q_len, d_model)
        return self.out_proj(output), weights


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied to each position separately (§3.3, Eq. 2)."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.activation = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout
        self.fc2 = nn.Linear(ffn_dim, config.d_model)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation(self.fc1(hidden_states))
        hidden_states = F.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)


class AddAndNorm(nn.Module):
    """The "Add & Norm" box of Figure 1: LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4).

    With ``normalize_before`` (pre-norm) the LayerNorm moves to the sub-layer's input instead:
    x + Dropout(Sublayer(LayerNorm(x))), and each stack ends with a final LayerNorm.
    """

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = config.dropout
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def sublayer_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(x) if self.normalize_before else x

    def forward(self, residual: torch.Tensor, sublayer_output: torch.Tensor) -> torch.Tensor:
        x = residual + F.dropout(sublayer_output, p=self.dropout, training=self.training)
        return x if self.normalize_before else self.layer_norm(x)


class EncoderLayer(GradientCheckpointingLayer):
    """One encoder layer: self-attention, then a position-wise feed-forward network, each with Add & Norm (§3.1)."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int):
        super().__init__()
        self.self_attn = MultiHeadAttention(config, config.encoder_attention_heads, layer_idx=layer_idx)
        self.self_attn_norm = AddAndNorm(config)
        self.feed_forward = PositionwiseFeedForward(config, config.encoder_ffn_dim)
        self.feed_forward_norm = AddAndNorm(config)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor:
        attn_output, _ = self.self_attn(
            self.self_attn_norm.sublayer_input(hidden_states), attention_mask=attention_mask, **kwargs
        )
        hidden_states = self.self_attn_norm(hidden_states, attn_output)
        ffn_output = self.feed_forward(self.feed_forward_norm.sublayer_input(hidden_states))
        return self.feed_forward_norm(hidden_states, ffn_output)


class DecoderLayer(GradientCheckpointingLayer):
    """One decoder layer: masked self-attention, encoder-decoder attention and a feed-forward network (§3.1)."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int):
        super().__init__()
        heads = config.decoder_attention_heads
        self.self_attn = MultiHeadAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_norm = AddAndNorm(config)
        self.encoder_attn = MultiHeadAttention(config, heads, is_cross_attention=True, layer_idx=layer_idx)
        self.encoder_attn_norm = AddAndNorm(config)
        self.feed_forward = PositionwiseFeedForward(config, config.decoder_ffn_dim)
        self.feed_forward_norm = AddAndNorm(config)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        attn_output, _ = self.self_attn(
            self.self_attn_norm.sublayer_input(hidden_states), attention_mask=attention_mask, cache=cache, **kwargs
        )
        hidden_states = self.self_attn_norm(hidden_states, attn_output)
        attn_output, _ = self.encoder_attn(
            self.encoder_attn_norm.sublayer_input(hidden_states),
            attention_mask=encoder_attention_mask,
            key_value_states=encoder_hidden_states,
            cache=cache,
            **kwargs,
        )
        hidden_states = self.encoder_attn_norm(hidden_states, attn_output)
        ffn_output = self.feed_forward(self.feed_forward_norm.sublayer_input(hidden_states))
        return self.feed_forward_norm(hidden_states, ffn_output)


class VanillaTransformerPreTrainedModel(PreTrainedModel):
    config_class = VanillaTransformerConfig
    config: VanillaTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["EncoderLayer", "DecoderLayer"]
    # Declared only what the tests run (on CPU): on a GPU, sdpa itself dispatches to FlashAttention kernels
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True

    def _init_weights(self, module: nn.Module) -> None:
        """Fresh weights by ``config.init_scheme`` (the paper does not give one). "normal" (default, BART's and
        Marian's): linear layers and embeddings N(0, init_std = 0.02). Each sub-layer's output then starts at about
        a tenth of its residual (Xavier: about half), so the post-norm stack starts close to the identity; on real
        data this trains several BLEU better (docs/results.md). "xavier" (tensor2tensor/fairseq): Xavier-uniform
        linear layers, N(0, d_model^-0.5) embeddings, so that embeddings × √d_model have unit variance. Both: zero
        biases, a zero padding row, LayerNorm at identity."""
        xavier = self.config.init_scheme == "xavier"
        if isinstance(module, nn.Linear):
            if xavier:
                init.xavier_uniform_(module.weight)
            else:
                init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = self.config.d_model**-0.5 if xavier else self.config.init_std
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


class Encoder(VanillaTransformerPreTrainedModel):
    """The encoder: embeddings × √d_model + positional encoding, then a stack of N EncoderLayers (§3.1, §3.4, §3.5)."""

    # output_hidden_states / output_attentions are recorded by hooks on these modules (transformers' output capturing)
    _can_record_outputs = {"hidden_states": EncoderLayer, "attentions": MultiHeadAttention}

    def __init__(self, config: VanillaTransformerConfig, embed_tokens: nn.Embedding):
        super().__init__(config)
        self.embeddings = Embeddings(config, embed_tokens)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.encoder_layers))
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds` to the encoder.")
        check_inputs(self.config, input_ids, inputs_embeds, attention_mask)
        hidden_states = self.embeddings(input_ids, inputs_embeds)
        # built once for all layers: None (nothing padded, sdpa) or (batch, 1, src_len, src_len)
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask)
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states)


class Decoder(VanillaTransformerPreTrainedModel):
    """The decoder: target embeddings + positions, then N DecoderLayers attending to the encoder output (§3.1)."""

    _can_record_outputs = {
        "hidden_states": DecoderLayer,
        "attentions": OutputRecorder(MultiHeadAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(MultiHeadAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig, embed_tokens: nn.Embedding):
        super().__init__(config)
        self.embeddings = Embeddings(config, embed_tokens)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.decoder_layers))
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `decoder_input_ids` or `decoder_inputs_embeds` to the decoder.")
        past_length = cache.get_seq_length() if cache is not None else 0
        check_inputs(
            self.config,
            input_ids,
            inputs_embeds,
            attention_mask,
            decoder=True,
            past_length=past_length,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
        )
        # As in Marian and BART, `use_cache` only asks for a new cache: a given one (a prefix, e.g. peft's
        # PrefixTuning, or the past of a continuation) is read and extended whatever it says
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        hidden_states = self.embeddings(input_ids, inputs_embeds, past=past_length)

        # Masks are built once for all layers. Self-attention: causal (§3.2.3, "masking out all values ... which
        # correspond to illegal connections") and target padding; None when sdpa can use is_causal instead.
        self_attn_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        causal_mask = create_causal_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask, cache=self_attn_cache
        )
        # Encoder-decoder attention: the source padding only.
        cross_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, so gradient checkpointing sees it
                encoder_attention_mask=cross_mask,
                cache=cache,
                **kwargs,
            )
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, cache=cache)


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """The bare encoder-decoder of Figure 1, returning the decoder's last hidden states."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:
            # one matrix for source and target tokens (§3.4); its names under the stacks are listed for save_pretrained,
            # which then stores it once, as shared.weight
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            encoder_embeddings = decoder_embeddings = self.shared
            self._tied_weights_keys = {
                "encoder.embeddings.embed_tokens.weight": "shared.weight",
                "decoder.embeddings.embed_tokens.weight": "shared.weight",
            }
            # Those names are shared.weight itself, never stored: a load reports shared.weight if it is absent, never
            # them (with the weights offloaded to disk they were left unmarked and reported missing although there)
            self._keys_to_ignore_on_load_missing = [r"(en|de)coder\.embeddings\.embed_tokens\.weight$"]
        else:
            encoder_embeddings = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            decoder_embeddings = nn.Embedding(config.decoder_vocab_size, config.d_model, config.pad_token_id)
        self.encoder = Encoder(config, encoder_embeddings)
        self.decoder = Decoder(config, decoder_embeddings)
        self.post_init()

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        # Nothing to tie: the stacks' embeddings are the module `shared` itself. Declared to the loader, its aliases
        # would mark shared.weight loaded and leave it on the meta device when a checkpoint lacks it.
        return {}

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embeddings.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        if self.config.share_encoder_decoder_embeddings:
            self.shared = value
            self.decoder.embeddings.embed_tokens = value
        self.encoder.embeddings.embed_tokens = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            if input_ids is None:
                raise ValueError(
                    "Pass `decoder_input_ids`, `decoder_inputs_embeds` or `labels` (to the model with a head): "
                    "the decoder has no input."
                )
            # like BART: without a target, the decoder reads the source shifted right
            decoder_input_ids = shift_tokens_right(
                input_ids, self.config.pad_token_id, self.config.decoder_start_token_id
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class LossKwargs(TransformersKwargs, total=False):
    """The keyword arguments of the LM head's loss, beside transformers' own.

    label_smoothing (`float`, defaults to 0.0): ε_ls, the weight of the uniform distribution mixed into the target
        ("label smoothing of value ε_ls = 0.1", §5.4); transformers' Trainer applies its ``label_smoothing_factor``
        with ``LabelSmoother`` on the logits instead, the project's trainer passes it here.
    skip_logits (`bool`, defaults to False): only the loss is wanted (a training step): the output's ``logits`` are
        None, and where ``loss_path`` allows (a plain ``lm_head`` on a CPU) the loss is computed without making them.
        The name transformers' Trainer passes for Liger kernels.
    """

    label_smoothing: float
    skip_logits: bool


# The LM head's loss_type, whose self.loss_function is then label_smoothed_cross_entropy: transformers' default for
# "ForConditionalGeneration", ForCausalLMLoss, takes no ε (and would drop it without a word)
LOSS_TYPE = "VanillaTransformerForConditionalGeneration"
LOSS_MAPPING[LOSS_TYPE] = label_smoothed_cross_entropy


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, GenerationMixin):
    """The Transformer with its pre-softmax linear projection (§3.4) for translation; returns logits, not
    probabilities. With ``labels`` it returns the mean token cross-entropy through ``self.loss_function``
    (``label_smoothed_cross_entropy``), label-smoothed by the keyword argument ``label_smoothing`` (§5.4; positions
    labelled -100 are ignored); with ``skip_logits=True`` on a CPU, computed without making the logits
    (``loss_path`` says which)."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.decoder_vocab_size, bias=False)
        self.loss_type = LOSS_TYPE  # also for a subclass of another name (as T5Gemma sets its own)
        # the pre-softmax projection is the target embedding (§3.4), tied when config.tie_word_embeddings
        target = "model.shared" if config.share_encoder_decoder_embeddings else "model.decoder.embeddings.embed_tokens"
        self._tied_weights_keys = {"lm_head.weight": f"{target}.weight"}
        self.post_init()

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if self.config.share_encoder_decoder_embeddings:
            self.config.decoder_vocab_size = self.config.vocab_size
        return embeddings

    def _reorder_cache(self, cache: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search reorders the cache after every step. The encoder-decoder keys and values are the same for all
        beams of a sentence, and beams never move between sentences, so only the self-attention cache is reordered:
        copying the cross-attention cache would change nothing."""
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)
        return cache

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs: Unpack[LossKwargs],
    ) -> Seq2SeqLMOutput:
        r"""num_items_in_batch: the number of labelled tokens in the whole (accumulated) batch, passed by Trainer, so
        that the loss summed over micro-batches is the mean over that batch whatever the accumulation.
        label_smoothing, skip_logits: the loss's keyword arguments (``LossKwargs``): label smoothing ε_ls (§5.4) and
        "only the loss is needed" (``logits=None``); the project's trainer passes both in training steps."""
        label_smoothing = kwargs.pop("label_smoothing", 0.0)
        skip_logits = kwargs.pop("skip_logits", False)
        if skip_logits and labels is None:
            raise ValueError("skip_logits=True returns only the loss, so it needs `labels`.")
        if labels is not None:
            check_inputs(self.config, decoder=True, labels=labels)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden, loss, logits = outputs.last_hidden_state, None, None
        if labels is not None and self.loss_path(skip_logits).logit_free:
            loss = linear_cross_entropy(hidden, self.lm_head.weight, labels, label_smoothing, num_items_in_batch)
        else:
            logits = self.lm_head(hidden)  # (batch, tgt_len, target vocab)
            if labels is not None:
                # as transformers' encoder-decoder models: the decoder input is already shifted right, so the labels
                # are the targets of the logits position for position (shift_labels)
                loss = self.loss_function(
                    logits=logits,
                    labels=None,
                    vocab_size=self.config.decoder_vocab_size,
                    num_items_in_batch=num_items_in_batch,
                    shift_labels=labels,
                    label_smoothing=label_smoothing,
                    **kwargs,
                )
        # the model's outputs (cache, hidden states, attentions), with the logits in place of the last hidden state
        others = {name: value for name, value in outputs.items() if name != "last_hidden_state"}
        return Seq2SeqLMOutput(loss=loss, logits=None if skip_logits else logits, **others)

    def loss_path(self, skip_logits: bool = True) -> LossPath:
        """Which loss a forward with labels computes, and why; the one place it is decided, deterministically (the
        project's trainer prints it when training starts). Without logits (``linear_cross_entropy``) only when
        ``skip_logits`` asks for the loss alone, the loss function is the model's own, and ``lm_head`` is a plain
        ``nn.Linear`` on a CPU whose weight it can read directly; else ``self.loss_function`` on the logits."""
        head = self.lm_head
        if not skip_logits:
            return LossPath(False, "the logits are asked for")
        if hasattr(self, "_loss_function") or self.loss_type != LOSS_TYPE:
            return LossPath(False, "model.loss_function was replaced: it gets the logits")
        if not isinstance(head, nn.Linear) or head.bias is not None:
            kind = f"{type(head).__module__}.{type(head).__qualname__}"
            return LossPath(False, f"lm_head is a {kind} (an adapter?), not a bias-free nn.Linear")
        if head._forward_hooks or head._forward_pre_hooks:
            return LossPath(False, "lm_head has forward hooks (an FSDP unit or another hook), which it would bypass")
        weight = head.weight
        if type(weight) not in (torch.Tensor, nn.Parameter):
            return LossPath(False, f"lm_head's weight is a {type(weight).__name__}, not a plain tensor")
        if weight.device.type not in LOGIT_FREE_DEVICES:
            return LossPath(False, f"on {weight.device.type} the loss of the logits is the default")
        return LossPath(True, f"lm_head is a plain nn.Linear on {weight.device.type}")


class VanillaTransformerClassificationHead(nn.Module):
    """A BART-style sentence classification head over the decoder state at the last end-of-sequence token."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.dropout = config.classifier_dropout
        self.out_proj = nn.Linear(config.d_model, config.num_labels)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = torch.tanh(self.dense(hidden_states))
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        return self.out_proj(hidden_states)


class VanillaTransformerForSequenceClassification(VanillaTransformerPreTrainedModel):
    """Sequence classification with the encoder-decoder (as BART does): the decoder reads the input shifted right,
    and its hidden state at each sequence's last eos token feeds a classification head."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.classification_head = VanillaTransformerClassificationHead(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqSequenceClassifierOutput:
        if input_ids is None:
            raise ValueError("Sequence classification needs `input_ids`: the eos token marks the sentence end.")
        eos_id = self.config.eos_token_id
        eos_id = eos_id[0] if isinstance(eos_id, (list, tuple)) else eos_id
        if eos_id is None:
            raise ValueError("Sequence classification needs `config.eos_token_id` to find the end of each sentence.")
        eos_mask = input_ids.eq(eos_id)
        if not eos_mask.any(dim=1).all():
            raise ValueError(f"Every sequence must contain the eos token (id {eos_id}) for classification.")
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            use_cache=False,
            **kwargs,
        )
        # index of each row's last eos: (batch,)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last_eos = torch.where(eos_mask, positions, -1).amax(dim=1)
        sentence = outputs.last_hidden_state[torch.arange(input_ids.shape[0], device=input_ids.device), last_eos]
        logits = self.classification_head(sentence)  # (batch, num_labels)
        loss = None if labels is None else self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return Seq2SeqSequenceClassifierOutput(
            loss=loss,
            logits=logits,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )


__all__ = [
    "VanillaTransformerPreTrainedModel",
    "VanillaTransformerModel",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerForSequenceClassification",
]
