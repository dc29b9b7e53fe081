"""Export a saved model to CTranslate2 (a C++ inference engine: int8 on CPU, several times generate()'s speed) and
translate with the exported folder.

    from vanilla_transformer.inference.ctranslate2 import export_ctranslate2, load_ctranslate2_translator

    export_ctranslate2("outputs/demo", "outputs/demo-ct2", quantization="int8")
    translator = load_ctranslate2_translator("outputs/demo-ct2")
    translator.translate(["dreihundertzweiundvierzig", "siebzehn"])  # ["three hundred and forty-two", "seventeen"]

The export goes through CTranslate2's own transformers converter, with a loader registered for
``VanillaTransformerConfig`` that fills a ``TransformerSpec`` field by field. CTranslate2 computes every layer the way
this model does (post-norm or pre-norm with a final LayerNorm per stack, Q·Kᵀ/√d_k, fused QKV and KV projections, the
pre-softmax projection without bias), with two exceptions that the loader takes care of:

  * its built-in sinusoidal table is not the paper's (concatenated sin|cos halves, not interleaved), so the model's own
    position table is written into the spec, with ``max_positions`` rows (default ``max_position_embeddings``): the
    longest source the folder accepts, and the longest translation it produces. A longer source is refused with an
    error rather than decoded with positions the model never had;
  * its vocabulary is a list of token strings, one per embedding row: the tokenizer's tokens in id order, padded
    with unused placeholder tokens up to the number of rows.

The folder holds CTranslate2's ``model.bin``, ``config.json`` and vocabulary, the tokenizer files, the generation
config renamed ``generation_config.json`` and ``vanilla_transformer_ctranslate2.json`` (what the loader needs to know:
the position-table size and the quantization), so that it translates on its own.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from huggingface_hub.errors import StrictDataclassError

from .translate import EXTRA_TOKENS, translate_in_batches

INSTALL_HINT = "CTranslate2 is not installed; install it with: pip install 'vanilla-transformer[ctranslate2]'"
QUANTIZATIONS = ("int8", "int8_float32", "int16", "float32", "float16", "bfloat16")
COMPUTE_TYPES = ("default", "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16")
COMPUTE_TYPES += ("float32", "float16", "bfloat16")
EXPORT_INFO = "vanilla_transformer_ctranslate2.json"
_PLACEHOLDER = "<unused{}>"  # vocabulary entries for embedding rows the tokenizer has no token for

logger = logging.getLogger(__name__)


def require_ctranslate2():
    """Import ctranslate2, or raise an ImportError whose message says how to install it (one line)."""
    try:
        import ctranslate2
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return ctranslate2


def position_table(model, stack: str, rows: int) -> torch.Tensor:
    """The (rows, d_model) positional encodings that `model`'s encoder or decoder (`stack`) adds to positions
    0 … rows-1: computed by the model's own sinusoid module, or its learned table. (The export writes it into the
    CTranslate2 model; scripts/plot_attention.py draws it.)"""
    embeddings = getattr(model.model, stack).embeddings
    config = model.config
    if config.position_embedding_type == "learned":
        if rows > config.max_position_embeddings:
            raise ValueError(
                f"{rows} positions exceed the learned position table of {config.max_position_embeddings} rows "
                "(max_position_embeddings)."
            )
        return embeddings.embed_positions.weight[:rows].detach().float()
    with torch.no_grad():
        return embeddings.embed_positions(torch.arange(rows)).float()


def vocabulary(tokenizer, rows: int) -> list[str]:
    """One token string per embedding row: the tokenizer's tokens in id order, then unused placeholders."""
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    if len(by_id) > rows or (by_id and max(by_id) >= rows):
        raise ValueError(f"the tokenizer has {len(by_id)} tokens but the model's vocabulary holds only {rows}.")
    missing = [i for i in range(len(by_id)) if i not in by_id]
    if missing:
        raise ValueError(f"the tokenizer's ids are not contiguous: no token has id {missing[0]}.")
    taken = set(by_id.values())
    tokens = [by_id[i] for i in range(len(by_id))]
    for i in range(len(tokens), rows):
        placeholder = _PLACEHOLDER.format(i)
        if placeholder in taken:
            raise ValueError(f"the tokenizer already has a token {placeholder!r}, which the export needs as a filler.")
        tokens.append(placeholder)
    return tokens


def check_exportable(config, max_positions: int | None = None) -> int:
    """Raise a one-line ValueError for a config CTranslate2 cannot run exactly; return the position-table size."""
    from ctranslate2.converters.transformers import _SUPPORTED_ACTIVATIONS

    if getattr(config, "model_type", None) != "vanilla_transformer":
        raise ValueError(
            f"the model is a {getattr(config, 'model_type', type(config).__name__)!r} model, not a vanilla_transformer "
            "one; for other transformers models use ct2-transformers-converter."
        )
    if config.activation_function not in _SUPPORTED_ACTIVATIONS:
        raise ValueError(
            f"activation_function={config.activation_function!r} has no CTranslate2 equivalent; supported: "
            f"{', '.join(name for name in _SUPPORTED_ACTIVATIONS if name in ('relu', 'gelu', 'gelu_new', 'silu'))}."
        )
    if config.d_model % config.encoder_attention_heads or config.d_model % config.decoder_attention_heads:
        raise ValueError("d_model must be divisible by the number of attention heads.")
    if config.encoder_attention_heads != config.decoder_attention_heads:
        raise ValueError(
            f"encoder_attention_heads={config.encoder_attention_heads} and decoder_attention_heads="
            f"{config.decoder_attention_heads} differ; CTranslate2's TransformerSpec has one head count for both."
        )
    rows = config.max_position_embeddings if max_positions is None else max_positions
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 2:
        raise ValueError(f"max_positions={max_positions!r} is invalid; it must be an integer of at least 2.")
    if config.position_embedding_type == "learned" and rows > config.max_position_embeddings:
        raise ValueError(
            f"max_positions={rows} exceeds the learned position table of {config.max_position_embeddings} rows."
        )
    return rows


def _make_loader(max_positions: int | None):
    """A ctranslate2 ModelLoader for VanillaTransformerConfig (defined here: ctranslate2 is an optional import)."""
    from ctranslate2.converters.transformers import _SUPPORTED_ACTIVATIONS, ModelLoader
    from ctranslate2.specs import transformer_spec

    class VanillaTransformerLoader(ModelLoader):
        @property
        def architecture_name(self) -> str:
            return "AutoModelForSeq2SeqLM"  # with our package imported, it builds our model from the config

        def get_model_spec(self, model):
            config = model.config
            rows = check_exportable(config, max_positions)
            spec = transformer_spec.TransformerSpec.from_config(
                (config.encoder_layers, config.decoder_layers),
                config.encoder_attention_heads,
                pre_norm=config.normalize_before,  # pre-norm: a LayerNorm before each sub-layer and after each stack
                activation=_SUPPORTED_ACTIVATIONS[config.activation_function],
                layernorm_embedding=False,
            )
            for stack in ("encoder", "decoder"):
                module, stack_spec = getattr(model.model, stack), getattr(spec, stack)
                embeddings = module.embeddings
                stack_spec.scale_embeddings = embeddings.scale  # √d_model or 1.0
                stack_spec.position_encodings.encodings = position_table(model, stack, rows)
                token_spec = stack_spec.embeddings[0] if isinstance(stack_spec.embeddings, list) else None
                self.set_embeddings(token_spec or stack_spec.embeddings, embeddings.embed_tokens)
                if config.normalize_before:
                    self.set_layer_norm(stack_spec.layer_norm, module.layer_norm)
                for layer_spec, layer in zip(stack_spec.layer, module.layers):
                    # fused [Q; K; V] rows, as CTranslate2 stores self-attention
                    self.set_linear(layer_spec.self_attention.linear[0], layer.self_attn.qkv_proj)
                    self.set_linear(layer_spec.self_attention.linear[1], layer.self_attn.out_proj)
                    self.set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_norm.layer_norm)
                    if stack == "decoder":  # encoder-decoder attention: Q, then fused [K; V]
                        self.set_linear(layer_spec.attention.linear[0], layer.encoder_attn.q_proj)
                        self.set_linear(layer_spec.attention.linear[1], layer.encoder_attn.kv_proj)
                        self.set_linear(layer_spec.attention.linear[2], layer.encoder_attn.out_proj)
                        self.set_layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_norm.layer_norm)
                    self.set_linear(layer_spec.ffn.linear_0, layer.feed_forward.fc1)
                    self.set_linear(layer_spec.ffn.linear_1, layer.feed_forward.fc2)
                    self.set_layer_norm(layer_spec.ffn.layer_norm, layer.feed_forward_norm.layer_norm)
            self.set_linear(spec.decoder.projection, model.lm_head)  # tied or not, no bias
            return spec

        def get_vocabulary(self, model, tokenizer):
            return tokenizer

        def set_vocabulary(self, spec, tokenizer):
            # one token per embedding row, for each side (the sizes differ when the vocabularies are separate)
            spec.register_source_vocabulary(vocabulary(tokenizer, spec.encoder.embeddings[0].weight.shape[0]))
            spec.register_target_vocabulary(vocabulary(tokenizer, spec.decoder.embeddings.weight.shape[0]))

        def set_config(self, config, model, tokenizer):
            from .loading import check_tokenizer_matches_config

            check_tokenizer_matches_config(tokenizer, model.config)
            config.bos_token = tokenizer.bos_token
            config.eos_token = tokenizer.eos_token
            config.unk_token = tokenizer.unk_token
            config.decoder_start_token = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)
            config.layer_norm_epsilon = float(model.config.layer_norm_eps)

    return VanillaTransformerLoader


def export_ctranslate2(
    model_dir: str,
    output_dir: str,
    quantization: str = "float32",
    max_positions: int | None = None,
    force: bool = False,
) -> str:
    """Convert the saved model in `model_dir` to a CTranslate2 folder `output_dir` (see the module docstring).

    `quantization`: the weights' type on disk (int8, int8_float32, int16, float32, float16, bfloat16); CTranslate2
    can still run them in another compute type. `max_positions`: rows of the position table (default: the config's
    max_position_embeddings). Raises ValueError (one line) for a folder that is not a vanilla-transformer model, an
    option CTranslate2 cannot run, an existing `output_dir` without `force`; ImportError without ctranslate2."""
    require_ctranslate2()
    from ctranslate2.converters import transformers as ct2_transformers
    from transformers import AutoConfig, AutoTokenizer

    from .loading import load_trained_model

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r} is not supported; allowed: {', '.join(QUANTIZATIONS)}.")
    if not os.path.isdir(model_dir) or not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"{model_dir!r} is not a saved model folder (no config.json).")
    if os.path.exists(os.path.join(model_dir, EXPORT_INFO)):
        raise ValueError(f"{model_dir!r} is already a CTranslate2 export; export the saved transformers model.")
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except StrictDataclassError as error:  # a value the config refuses: the field and why
        raise ValueError(f"{model_dir!r} holds an invalid model config: {' '.join(str(error).split())}") from None
    except (ValueError, OSError, KeyError) as error:
        raise ValueError(f"{model_dir!r} holds no readable model config: {str(error).splitlines()[0]}") from None
    rows = check_exportable(config, max_positions)
    if os.path.exists(output_dir) and not force:
        raise ValueError(f"--output_dir {output_dir!r} already exists; remove it or pass --force.")
    if os.path.abspath(output_dir) == os.path.abspath(model_dir):
        raise ValueError("--output_dir must differ from --model_dir: the export would overwrite the model.")

    class Converter(ct2_transformers.TransformersConverter):
        def load_model(self, model_class, model_name_or_path, **kwargs):
            kwargs.pop("dtype", None)
            return load_trained_model(model_name_or_path, **kwargs).float().eval()

    # CTranslate2 picks the loader by the config's class name
    ct2_transformers.register_loader(type(config).__name__)(_make_loader(rows))
    Converter(model_dir).convert(output_dir, quantization=quantization, force=True)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.save_pretrained(output_dir)
    generation_config = os.path.join(model_dir, "generation_config.json")
    if os.path.isfile(generation_config):
        shutil.copy(generation_config, output_dir)
    info = {
        "model_type": "vanilla_transformer",
        "max_positions": rows,
        "quantization": quantization,
        "position_embedding_type": config.position_embedding_type,
        "source_vocab_size": config.vocab_size,
        "target_vocab_size": config.decoder_vocab_size,
    }
    with open(os.path.join(output_dir, EXPORT_INFO), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    return output_dir


def is_ctranslate2_export(path: str) -> bool:
    return os.path.isfile(os.path.join(path, EXPORT_INFO)) and os.path.isfile(os.path.join(path, "model.bin"))


@dataclass
class GenerationDefaults:
    """What the saved generation config says, as far as CTranslate2 can follow it.

    `patience`: CTranslate2 ends a beam search once num_beams × patience hypotheses have ended. generate() with
    ``early_stopping=False`` (ours) goes on while a running beam can still beat the finished ones; patience 1 is
    ``early_stopping=True``, which returns short, broken hypotheses (on the demo test set, 200 of 500 beam-4
    translations identical to generate()'s), and patience 2 gives generate()'s translations (500 of 500)."""

    num_beams: int = 4
    length_penalty: float = 1.0
    patience: float = 2.0


def _generation_defaults(folder: str) -> GenerationDefaults:
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        return GenerationDefaults()
    with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    return GenerationDefaults(
        num_beams=int(saved.get("num_beams") or 1),
        length_penalty=float(saved.get("length_penalty", 1.0)),
        patience=1.0 if saved.get("early_stopping") is True else 2.0,
    )


class CTranslate2Translator:
    """A CTranslate2 export (from `export_ctranslate2`) and its tokenizer: `translate(sentences)` returns strings.

    Load with `load_ctranslate2_translator`. `translator` is the ``ctranslate2.Translator``, `tokenizer` the
    transformers tokenizer saved with the export, `max_positions` the longest source in tokens (eos included)."""

    def __init__(self, translator, tokenizer, max_positions: int, defaults: GenerationDefaults):
        self.translator = translator
        self.tokenizer = tokenizer
        self.max_positions = max_positions
        self.defaults = defaults

    def encode(self, sentence: str) -> list[str]:
        """The source tokens of `sentence`, as the model reads them (eos included)."""
        return self.tokenizer.convert_ids_to_tokens(self.tokenizer(sentence)["input_ids"])

    def translate_tokens(
        self,
        sources: Sequence[Sequence[str]],
        *,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        patience: float | None = None,
        max_new_tokens: int | None = None,
        extra_tokens: int = EXTRA_TOKENS,
        asynchronous: bool = False,
    ) -> list[str] | Callable[[], list[str]]:
        """Translate one batch of tokenized sources (see `encode`); returns decoded strings. Without `max_new_tokens`
        a translation may have the longest source's length + `extra_tokens` tokens, as `inference.translate` does.
        `asynchronous`: return at once a function that waits for the strings (another worker translates)."""
        longest = max((len(tokens) for tokens in sources), default=0)
        if longest > self.max_positions:
            raise ValueError(
                f"a sentence has {longest} tokens but the CTranslate2 export accepts at most {self.max_positions} "
                "(its position table; export with a larger max_positions)."
            )
        limit = max_new_tokens if max_new_tokens is not None else longest + extra_tokens
        # token k of a translation is predicted from the decoder input at position k - 1 (the start token at 0)
        limit = max(0, min(limit, self.max_positions))
        results = self.translator.translate_batch(
            [list(tokens) for tokens in sources],
            beam_size=num_beams if num_beams is not None else self.defaults.num_beams,
            length_penalty=length_penalty if length_penalty is not None else self.defaults.length_penalty,
            patience=patience if patience is not None else self.defaults.patience,
            max_decoding_length=limit,
            min_decoding_length=0,  # like generate(): the end token may come first
            max_input_length=0,  # never truncate silently: too long was refused above
            asynchronous=asynchronous,
        )

        def decode() -> list[str]:
            hypotheses = [(r.result() if asynchronous else r).hypotheses[0] for r in results]
            ids = [self.tokenizer.convert_tokens_to_ids(tokens) for tokens in hypotheses]
            return [text.strip() for text in self.tokenizer.batch_decode(ids, skip_special_tokens=True)]

        return decode if asynchronous else decode()

    def translate(
        self,
        sentences: Sequence[str],
        *,
        batch_size: int = 32,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        patience: float | None = None,
        max_new_tokens: int | None = None,
        extra_tokens: int = EXTRA_TOKENS,
        progress: bool | None = None,
    ) -> list[str]:
        """Translate `sentences` in batches of similar length, returning translations in input order; empty lines
        translate to empty lines. Beam size, length penalty and patience default to the saved generation config's
        (see `GenerationDefaults`). With several CTranslate2 workers (`inter_threads`), as many batches are
        translated at once."""
        if num_beams is not None and num_beams < 1:
            raise ValueError(f"num_beams={num_beams} must be at least 1.")
        encoded = [self.encode(s) if s.strip() else None for s in sentences]
        too_long = [i for i, tokens in enumerate(encoded) if tokens is not None and len(tokens) > self.max_positions]
        if too_long:
            i = too_long[0]
            raise ValueError(
                f"sentence {i + 1} has {len(encoded[i])} tokens but the CTranslate2 export accepts at most "
                f"{self.max_positions} (its position table; export with a larger max_positions)."
            )

        workers = self.translator.num_translators

        def run(batch: list[list[str]]) -> list[str] | Callable[[], list[str]]:
            return self.translate_tokens(
                batch,
                num_beams=num_beams,
                length_penalty=length_penalty,
                patience=patience,
                max_new_tokens=max_new_tokens,
                extra_tokens=extra_tokens,
                asynchronous=workers > 1,
            )

        lookahead = 2 * workers - 1 if workers > 1 else 0  # keeps every worker busy
        return translate_in_batches(encoded, run, batch_size=batch_size, progress=progress, lookahead=lookahead)


def load_ctranslate2_translator(
    path: str,
    *,
    device: str = "cpu",
    compute_type: str = "default",
    threads: int | None = None,
    inter_threads: int = 1,
    quantization: str = "float32",
) -> CTranslate2Translator:
    """A `CTranslate2Translator` for an exported folder, or for a saved transformers model folder, which is then
    exported to a temporary folder with `quantization` first. `device`: cpu, cuda, or auto (a GPU where CTranslate2
    sees one and its CUDA libraries load, else the CPU, with a one-line warning saying why). `compute_type`:
    CTranslate2's type for computing (default: the exported one; one the device cannot run is a ValueError naming
    those it can); `threads`: CPU threads per batch (default: CTranslate2's, one per core);
    `inter_threads`: batches translated at once, each on `threads` threads (threads × inter_threads should not exceed
    the idle cores; measurements in docs/performance.md)."""
    ctranslate2 = require_ctranslate2()
    from transformers import AutoTokenizer

    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute_type={compute_type!r} is not supported; allowed: {', '.join(COMPUTE_TYPES)}.")
    for name, value in (("threads", threads), ("inter_threads", inter_threads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name}={value!r} is invalid; it must be a positive number of threads.")
    if not os.path.isdir(path):
        raise ValueError(f"{path!r} is not a folder.")
    if not is_ctranslate2_export(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(
                f"{path!r} is neither a CTranslate2 export (scripts/export_ctranslate2.py) nor a saved model."
            )
        with tempfile.TemporaryDirectory() as tmp:
            exported = export_ctranslate2(path, os.path.join(tmp, "ct2"), quantization=quantization)
            return load_ctranslate2_translator(
                exported, device=device, compute_type=compute_type, threads=threads, inter_threads=inter_threads
            )
    with open(os.path.join(path, EXPORT_INFO), encoding="utf-8") as f:
        info = json.load(f)
    tokenizer = AutoTokenizer.from_pretrained(path)
    options = dict(compute_type=compute_type, intra_threads=threads or 0, inter_threads=inter_threads)
    translator = _translator(ctranslate2, path, device, [tokenizer.eos_token], options)
    return CTranslate2Translator(translator, tokenizer, int(info["max_positions"]), _generation_defaults(path))


def check_compute_type(ctranslate2, device: str, compute_type: str) -> None:
    """Raise a one-line ValueError when CTranslate2 cannot compute in `compute_type` on `device` on this machine (e.g.
    int16 on CUDA), naming the types it can (``ctranslate2.get_supported_compute_types``). "default" and "auto" always
    do. Raises RuntimeError where CTranslate2 cannot query a CUDA device at all."""
    if compute_type in ("default", "auto"):
        return
    supported = ctranslate2.get_supported_compute_types(device)
    if compute_type not in supported:
        raise ValueError(
            f"compute_type={compute_type!r} is not supported on {device} by CTranslate2 on this machine; supported "
            f"there: {', '.join(sorted(supported))}, or default (the exported type) or auto."
        )


def _translator(ctranslate2, path: str, device: str, probe: list[str], options: dict):
    """The ``ctranslate2.Translator`` of `path` on `device`; "auto": on a GPU where CTranslate2 sees one and can
    translate on it, else on the CPU, saying why in one line."""
    if device != "auto":
        try:
            return _translator_on(ctranslate2, path, device, probe, options)
        except (RuntimeError, OSError) as error:
            if device == "cpu":
                raise
            raise RuntimeError(f"CTranslate2 cannot translate on {device}: {_first_line(error)}") from None
    try:
        gpus = ctranslate2.get_cuda_device_count()
    except RuntimeError:  # a CUDA runtime the driver cannot run
        gpus = 0
    if gpus:
        try:
            return _translator_on(ctranslate2, path, "cuda", probe, options)
        except (RuntimeError, OSError) as error:
            logger.warning("CTranslate2: CUDA libraries did not load (%s); translating on the CPU", _first_line(error))
    return _translator_on(ctranslate2, path, "cpu", probe, options)


def _translator_on(ctranslate2, path: str, device: str, probe: list[str], options: dict):
    check_compute_type(ctranslate2, device, options["compute_type"])
    translator = ctranslate2.Translator(path, device=device, **options)
    if device != "cpu":
        # CTranslate2 loads its CUDA libraries (cuBLAS, ...) at the first translation, so a wheel built for another
        # CUDA than the machine's fails there, not here: one token now, instead of a traceback at the first batch
        translator.translate_batch([probe], beam_size=1, max_decoding_length=1)
    return translator


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


__all__ = [
    "COMPUTE_TYPES",
    "CTranslate2Translator",
    "INSTALL_HINT",
    "QUANTIZATIONS",
    "check_compute_type",
    "export_ctranslate2",
    "is_ctranslate2_export",
    "load_ctranslate2_translator",
    "require_ctranslate2",
]
