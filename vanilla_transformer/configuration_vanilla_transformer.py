"""Configuration of the "Attention Is All You Need" Transformer (Vaswani et al., 2017). Copied into every checkpoint
(``trust_remote_code``), so it imports only transformers and huggingface_hub (a dependency of transformers)."""

from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from .pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline

SIZES = ("vocab_size", "decoder_vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads")
SIZES += ("decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings")
# Every config.json names the Auto classes and the pipeline of the files saved with the weights, for trust_remote_code.
HUB_AUTO_MAP = {
    "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
    "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
    "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    "AutoModelForSequenceClassification": "modeling_vanilla_transformer.VanillaTransformerForSequenceClassification",
}
# The pipeline is imported here, by the file that declares it: transformers saves (and pushes) with a checkpoint's code
# every file that code imports, so the pipeline's file travels with each checkpoint as the modeling file does.
PIPELINE = f"pipeline_vanilla_transformer.{VanillaTransformerTranslationPipeline.__name__}"
HUB_CUSTOM_PIPELINES = {"translation": {"impl": PIPELINE, "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}}


@strict
class VanillaTransformerConfig(PreTrainedConfig):
    """Hyperparameters of the paper's encoder-decoder; the defaults are the base model of Table 3."""

    model_type = "vanilla_transformer"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }
    vocab_size: int = 37000  # §3.4: one vocabulary and embedding matrix for encoder, decoder and pre-softmax layer
    decoder_vocab_size: int | None = None  # the target vocabulary when not shared; default: vocab_size
    share_encoder_decoder_embeddings: bool = True
    tie_word_embeddings: bool = True  # the pre-softmax projection is the target embedding (§3.4)
    scale_embedding: bool = True  # token embeddings times sqrt(d_model) (§3.4)
    d_model: int = 512  # §3
    encoder_layers: int = 6  # N, §3.1
    decoder_layers: int = 6
    encoder_attention_heads: int = 8  # h, §3.2.2
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048  # d_ff, §3.3
    decoder_ffn_dim: int = 2048
    activation_function: Literal["relu", "gelu", "gelu_new", "silu", "swish", "tanh"] = "relu"  # §3.3: ReLU
    dropout: float | int = 0.1  # P_drop on each sub-layer output and embedding + position sum (§5.4)
    attention_dropout: float | int = 0.0  # this and the next two are not in the paper
    activation_dropout: float | int = 0.0
    classifier_dropout: float | int = 0.0
    position_embedding_type: Literal["sinusoidal", "learned"] = "sinusoidal"  # §3.5; "learned": Table 3, row E
    max_position_embeddings: int = 1024  # rows of the learned position table (sinusoids extend to any length)
    normalize_before: bool = False  # False: post-norm LayerNorm(x + Sublayer(x)) (§3.1); True: pre-norm
    layer_norm_eps: float | int = 1e-5
    init_scheme: Literal["normal", "xavier"] = "normal"  # not in the paper; "normal" is BART's, "xavier" fairseq's
    init_std: float | int = 0.02  # of the "normal" scheme
    use_cache: bool = True
    is_encoder_decoder: bool = True
    pad_token_id: int | None = 0  # source-side ids lie in both vocabularies, target-side ids in the target's
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1

    def __post_init__(self, **kwargs):
        self.decoder_vocab_size = self.vocab_size if self.decoder_vocab_size is None else self.decoder_vocab_size
        kwargs["auto_map"] = {**HUB_AUTO_MAP, **(kwargs.get("auto_map") or {})}  # a loaded config's entries win
        pipelines = kwargs.get("custom_pipelines") or HUB_CUSTOM_PIPELINES  # copied: transformers edits them
        kwargs["custom_pipelines"] = pipelines = {task: dict(info) for task, info in pipelines.items()}
        if pipelines.get("translation", {}).get("impl", "").startswith("modeling_vanilla_transformer."):
            pipelines["translation"] = dict(HUB_CUSTOM_PIPELINES["translation"])  # the pipeline has its own file now
        super().__post_init__(**kwargs)

    def _require(self, ok: bool, field: str, allowed: str):
        if not ok:
            raise ValueError(f"`{field}`={getattr(self, field)!r} is invalid; {allowed}.")

    def validate_architecture(self):  # positive sizes, heads that divide d_model, probabilities, one shared vocabulary
        for field in (*SIZES, "layer_norm_eps", "init_std"):
            self._require(getattr(self, field) > 0, field, "it must be positive")
        for h in ("encoder_attention_heads", "decoder_attention_heads"):
            self._require(self.d_model % getattr(self, h) == 0, h, f"d_model={self.d_model} must be divisible by it")
        even = self.position_embedding_type != "sinusoidal" or self.d_model % 2 == 0
        self._require(even, "d_model", "sinusoidal positions need an even d_model (sin and cos pairs, §3.5)")
        for field in ("dropout", "attention_dropout", "activation_dropout", "classifier_dropout"):
            self._require(0 <= getattr(self, field) < 1, field, "it must be a probability in [0, 1)")
        shared = not self.share_encoder_decoder_embeddings or self.decoder_vocab_size == self.vocab_size
        allowed = f"with share_encoder_decoder_embeddings=True it must equal vocab_size={self.vocab_size}"
        self._require(shared, "decoder_vocab_size", allowed)

    def validate_token_ids(self):  # source-side ids lie in both vocabularies, target-side ones in the target's
        both, target = min(self.vocab_size, self.decoder_vocab_size), self.decoder_vocab_size
        sizes = {"pad_token_id": both, "bos_token_id": target, "eos_token_id": both, "decoder_start_token_id": target}
        for field, size in sizes.items():
            ids = getattr(self, field) if isinstance(getattr(self, field), list) else [getattr(self, field)]
            self._require(all(i is None or 0 <= i < size for i in ids), field, f"it must be None or in [0, {size})")


__all__ = ["VanillaTransformerConfig"]
