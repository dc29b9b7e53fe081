"""Configuration of the "Attention Is All You Need" Transformer (Vaswani et al., 2017).

This file is copied into every saved checkpoint (``trust_remote_code``), so it imports only transformers.
"""

from transformers import PretrainedConfig

ACTIVATIONS = ("relu", "gelu", "gelu_new", "silu", "swish", "tanh")
POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned")
INIT_SCHEMES = ("normal", "xavier")

# Every config, hence every saved config.json, names all the Auto classes of the plug-in and the translation pipeline,
# so that a checkpoint loads as any of them, and translates with `pipeline("translation", trust_remote_code=True)`,
# where this package is not installed. The class names are those of the three files saved next to the weights.
HUB_AUTO_MAP = {
    "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
    "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
    "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    "AutoModelForSequenceClassification": "modeling_vanilla_transformer.VanillaTransformerForSequenceClassification",
}
HUB_CUSTOM_PIPELINES = {
    "translation": {
        "impl": "pipeline_vanilla_transformer.VanillaTransformerTranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
}


def _with_hub_defaults(kwargs: dict) -> dict:
    # Entries already in a loaded config win; fresh dicts, since transformers edits them in place.
    auto_map = {**HUB_AUTO_MAP, **(kwargs.get("auto_map") or {})}
    pipelines = kwargs.get("custom_pipelines") or HUB_CUSTOM_PIPELINES
    custom_pipelines = {task: dict(info) for task, info in pipelines.items()}
    if custom_pipelines.get("translation", {}).get("impl", "").startswith("modeling_vanilla_transformer."):
        # saved when the pipeline lived in the modeling file; it has its own file now
        custom_pipelines["translation"] = dict(HUB_CUSTOM_PIPELINES["translation"])
    return {**kwargs, "auto_map": auto_map, "custom_pipelines": custom_pipelines}


class VanillaTransformerConfig(PretrainedConfig):
    r"""Hyperparameters of the paper's encoder-decoder; the defaults are the base model of Table 3.

    Args:
        vocab_size: size of the joint source/target vocabulary (§3.4: one embedding matrix shared by encoder input,
            decoder input and the pre-softmax projection). With ``share_encoder_decoder_embeddings=False`` it is the
            source vocabulary only.
        decoder_vocab_size: size of the target vocabulary when source and target vocabularies are separate; it must
            equal ``vocab_size`` (or be left unset) when they are shared.
        d_model: width of every sub-layer output and of the embeddings (§3, d_model = 512).
        encoder_layers / decoder_layers: N, the number of identical layers in each stack (§3.1, N = 6).
        encoder_attention_heads / decoder_attention_heads: h, parallel attention heads (§3.2.2, h = 8).
        encoder_ffn_dim / decoder_ffn_dim: d_ff, the inner width of the feed-forward network (§3.3, 2048).
        dropout: P_drop applied to each sub-layer output and to the embedding + position sums (§5.4, 0.1).
        attention_dropout: dropout on the attention weights (not in the paper; 0.0).
        activation_dropout: dropout after the feed-forward activation (not in the paper; 0.0).
        activation_function: the feed-forward non-linearity (§3.3 uses ReLU).
        max_position_embeddings: rows of the learned position table, and of the precomputed sinusoid table
            (sinusoidal positions are computed on the fly beyond it).
        position_embedding_type: ``"sinusoidal"`` (§3.5) or ``"learned"`` (the variant of Table 3, row E).
        normalize_before: False is the paper's post-norm ``LayerNorm(x + Sublayer(x))`` (§3.1); True is pre-norm
            ``x + Sublayer(LayerNorm(x))`` with a final LayerNorm on each stack.
        layer_norm_eps: epsilon of every LayerNorm.
        init_scheme: how fresh weights are drawn (the paper does not say). ``"normal"`` (BART's and Marian's): every
            linear layer and embedding N(0, init_std), zero biases; the small weights start each post-norm sub-layer
            close to the identity and train far better on small data (docs/training.md). ``"xavier"``: the
            tensor2tensor/fairseq scheme, Xavier-uniform linear layers and N(0, d_model^-0.5) embeddings.
        init_std: standard deviation of the ``"normal"`` scheme (0.02).
        scale_embedding: multiply token embeddings by sqrt(d_model) (§3.4).
        share_encoder_decoder_embeddings: one vocabulary and one embedding matrix for source and target (§3.4).
        tie_word_embeddings: tie the pre-softmax projection to the target embedding (§3.4).
    """

    model_type = "vanilla_transformer"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    def __init__(
        self,
        vocab_size: int = 37000,
        decoder_vocab_size: int | None = None,
        d_model: int = 512,
        encoder_layers: int = 6,
        decoder_layers: int = 6,
        encoder_attention_heads: int = 8,
        decoder_attention_heads: int = 8,
        encoder_ffn_dim: int = 2048,
        decoder_ffn_dim: int = 2048,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        activation_function: str = "relu",
        max_position_embeddings: int = 1024,
        position_embedding_type: str = "sinusoidal",
        normalize_before: bool = False,
        layer_norm_eps: float = 1e-5,
        init_scheme: str = "normal",
        init_std: float = 0.02,
        scale_embedding: bool = True,
        share_encoder_decoder_embeddings: bool = True,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        is_encoder_decoder: bool = True,
        pad_token_id: int | None = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int | None = 2,
        decoder_start_token_id: int | None = 1,
        classifier_dropout: float = 0.0,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.decoder_vocab_size = decoder_vocab_size if decoder_vocab_size is not None else vocab_size
        self.d_model = d_model
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers
        self.encoder_attention_heads = encoder_attention_heads
        self.decoder_attention_heads = decoder_attention_heads
        self.encoder_ffn_dim = encoder_ffn_dim
        self.decoder_ffn_dim = decoder_ffn_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.activation_function = activation_function
        self.max_position_embeddings = max_position_embeddings
        self.position_embedding_type = position_embedding_type
        self.normalize_before = normalize_before
        self.layer_norm_eps = layer_norm_eps
        self.init_scheme = init_scheme
        self.init_std = init_std
        self.scale_embedding = scale_embedding
        self.share_encoder_decoder_embeddings = share_encoder_decoder_embeddings
        self.tie_word_embeddings = tie_word_embeddings
        self.use_cache = use_cache
        self.classifier_dropout = classifier_dropout
        # transformers 5 no longer declares these on the base config.
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.decoder_start_token_id = decoder_start_token_id
        kwargs = _with_hub_defaults(kwargs)  # auto_map and custom_pipelines, for the Hub
        super().__init__(is_encoder_decoder=is_encoder_decoder, **kwargs)
        self._validate()

    def _validate(self) -> None:
        def fail(field: str, value, allowed: str):
            raise ValueError(f"VanillaTransformerConfig: `{field}`={value!r} is invalid; {allowed}.")

        for field in (
            "vocab_size",
            "decoder_vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                fail(field, value, "it must be a positive integer")
        for heads in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % getattr(self, heads) != 0:
                fail(heads, getattr(self, heads), f"d_model={self.d_model} must be divisible by it")
        if self.position_embedding_type == "sinusoidal" and self.d_model % 2 != 0:
            fail("d_model", self.d_model, "sinusoidal positions need an even d_model (sin and cos pairs, §3.5)")
        for field in ("dropout", "attention_dropout", "activation_dropout", "classifier_dropout"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                fail(field, value, "it must be a probability in [0, 1)")
        for field in ("layer_norm_eps", "init_std"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                fail(field, value, "it must be a positive number")
        if self.activation_function not in ACTIVATIONS:
            fail("activation_function", self.activation_function, f"allowed: {', '.join(ACTIVATIONS)}")
        if self.init_scheme not in INIT_SCHEMES:
            fail("init_scheme", self.init_scheme, f"allowed: {', '.join(INIT_SCHEMES)}")
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            fail("position_embedding_type", self.position_embedding_type, f"allowed: {POSITION_EMBEDDING_TYPES}")
        if self.share_encoder_decoder_embeddings and self.decoder_vocab_size != self.vocab_size:
            fail(
                "decoder_vocab_size",
                self.decoder_vocab_size,
                f"with share_encoder_decoder_embeddings=True it must equal vocab_size={self.vocab_size}",
            )
        # Source-side ids live in the source vocabulary; target-side ids in the target vocabulary.
        token_ids = {
            "pad_token_id": min(self.vocab_size, self.decoder_vocab_size),
            "bos_token_id": self.decoder_vocab_size,
            "eos_token_id": min(self.vocab_size, self.decoder_vocab_size),
            "decoder_start_token_id": self.decoder_vocab_size,
        }
        for field, size in token_ids.items():
            value = getattr(self, field)
            ids = value if isinstance(value, (list, tuple)) else [value]
            for token_id in ids:
                if token_id is None:
                    continue
                if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < size:
                    fail(field, value, f"it must be None or an id in [0, {size})")


__all__ = ["VanillaTransformerConfig"]
