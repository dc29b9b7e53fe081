"""A web demo of a trained model, built with Gradio: a text box, the translation by beam search, the n-best list with
scores, and the attention behind the chosen translation drawn as heat-maps (encoder-decoder attention by layer and
head, encoder and decoder self-attention) labelled with the tokens; beside it, the model's size and the metrics of
its model card.

    app = build_app("outputs/demo")  # a saved model folder, or a Hub model id
    launch_app(app)                  # http://127.0.0.1:7860

Everything stays offline: no analytics, and the page uses the system's fonts, so that neither the server nor the
browser fetches anything from the network. Bad input gets a message on the page, never a stack trace.
"""

from __future__ import annotations

import io
import logging
import os
import re
from dataclasses import dataclass

from huggingface_hub import ModelCard, snapshot_download
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError

# What the app builds on: the package's own translating and plotting, imported here and nowhere else in the demo.
from ..inference.loading import load_translator
from ..inference.translate import NBestList, translate_n_best
from ..plots.plotting import attention_heads_figure, attention_of_translation

logger = logging.getLogger(__name__)

DEMO_EXTRA_HINT = "pip install 'vanilla-transformer[demo]'"
ATTENTION_KINDS = [
    ("encoder-decoder attention", "cross"),
    ("encoder self-attention", "encoder"),
    ("decoder self-attention", "decoder"),
]
# what loading a Hub model skips: Trainer leftovers and a CTranslate2 export (push_to_hub.py's upload skips the same)
HUB_IGNORE_PATTERNS = ["checkpoint-*", "*.pt", "*.pth", "ctranslate2/*"]
MAX_BEAMS = 8
# system fonts: the default theme's fonts would be fetched (from Google Fonts in older Gradio releases)
SANS = ["ui-sans-serif", "system-ui", "Segoe UI", "Roboto", "Helvetica", "Arial", "sans-serif"]
MONO = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]


@dataclass
class DemoModel:
    """A model loaded for the demo (eager attention: the implementation that returns the weights)."""

    model: object
    tokenizer: object
    name: str  # the Hub id, or the folder's name
    folder: str  # where its files are
    max_source_tokens: int  # the longest input it reads; longer text is cut

    @property
    def num_beams(self) -> int:
        return min(self.model.generation_config.num_beams or 1, MAX_BEAMS)


def load_demo_model(model_dir: str, device: str | None = None) -> DemoModel:
    """Load a saved model folder, or a model on the Hub by id, for the demo. A folder or id that is not a trained
    checkpoint raises ValueError with one line that names the problem."""
    folder = model_dir
    try:
        if not os.path.isdir(model_dir):
            if re.fullmatch(r"[\w.-]+/[\w.-]+", model_dir) is None:
                raise ValueError(f"--model_dir {model_dir!r} is not a folder (nor a Hub model id, namespace/name).")
            try:
                folder = snapshot_download(model_dir, ignore_patterns=HUB_IGNORE_PATTERNS)
            except OSError as error:  # includes the Hub's HTTP errors and offline mode
                problem = _one_line(error)
                raise ValueError(
                    f"--model_dir {model_dir!r} is not a folder, nor a model on the Hub: {problem}"
                ) from None
        model, tokenizer = load_translator(folder, device=device)
    except (OSError, ValueError, SafetensorError, StrictDataclassError) as error:
        message = _one_line(error)
        if "--model_dir" not in message:  # load_translator's own messages name the folder already
            message = f"--model_dir {model_dir!r} is not a trained checkpoint: {message}"
        raise ValueError(message) from None
    model.set_attn_implementation("eager")
    limit = min(tokenizer.model_max_length, model.config.max_position_embeddings)
    name = model_dir if folder != model_dir else os.path.basename(os.path.abspath(model_dir))
    return DemoModel(model, tokenizer, name, folder, max_source_tokens=limit)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _one_line(error: BaseException, limit: int = 300) -> str:
    """The whole message on one line (a library's first line may end in "one of:"), cut to `limit` characters."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def model_facts(loaded: DemoModel) -> str:
    """Markdown: the model's size and shape, and the metrics its model card reports."""
    config = loaded.model.config
    parameters = sum(p.numel() for p in loaded.model.parameters())  # tied matrices once
    lines = [
        f"### {loaded.name}\n",
        f"- **{parameters:,}** parameters",
        f"- {config.encoder_layers} + {config.decoder_layers} layers (encoder + decoder)",
        f"- d_model {config.d_model}, d_ff {config.encoder_ffn_dim}, {config.encoder_attention_heads} heads",
        f"- {config.vocab_size:,} tokens in the vocabulary, {config.position_embedding_type} positions",
        f"- inputs up to {loaded.max_source_tokens:,} tokens",
        "\n### Metrics (model card)\n",
    ]
    metrics = card_metrics(loaded.folder)
    if metrics is None:
        lines.append("The folder has no model card (README.md).")
    elif not metrics:
        lines.append("The model card reports no metrics.")
    else:
        lines += ["| metric | value |", "|---|---:|", *(f"| {name} | {value:.2f} |" for name, value in metrics)]
    return "\n".join(lines)


def card_metrics(folder: str) -> list[tuple[str, float]] | None:
    """(name, value) of each result in the model card's metadata (model-index), e.g. ("Test BLEU", 99.9); None when
    there is no model card."""
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return None
    results = ModelCard.load(path).data.eval_results or []
    return [(result.metric_name or result.metric_type, float(result.metric_value)) for result in results]


def attention_image(loaded: DemoModel, n_best: NBestList, choice: int, kind: str, layer: int):
    """The heat-maps of one layer's heads, for translation `choice` of the n-best list, as a PIL image."""
    from PIL import Image

    hypothesis = n_best.hypotheses[choice]
    attention = attention_of_translation(loaded.model, loaded.tokenizer, n_best.source_ids, hypothesis.token_ids)
    figure = attention_heads_figure(attention, layer=layer, kind=kind)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    buffer.seek(0)
    return Image.open(buffer)


def layers_of(loaded: DemoModel, kind: str) -> int:
    config = loaded.model.config
    return config.encoder_layers if kind == "encoder" else config.decoder_layers


def build_app(model_dir: str, device: str | None = None):
    """The Gradio app (a `gr.Blocks`) for the model in `model_dir`: a saved folder or a Hub model id. The model is
    loaded first: a folder that is not a trained checkpoint raises ValueError (one line) before any app exists, and
    before gradio is imported (seconds)."""
    loaded = load_demo_model(model_dir, device=device)
    try:
        import gradio as gr
    except ImportError as error:
        raise ImportError(f"The demo needs gradio, which is not installed: {DEMO_EXTRA_HINT}.") from error
    last_layer = layers_of(loaded, "cross") - 1

    def translate(text: str, beams: int, kind: str, layer: int):
        empty = ("", [], gr.Dropdown(choices=[], value=None), None, None)
        if not text or not text.strip():
            return ("**Type a sentence to translate.**", *empty)
        try:
            n_best = translate_n_best(
                loaded.model, loaded.tokenizer, text, num_beams=int(beams), max_source_tokens=loaded.max_source_tokens
            )
            image = attention_image(loaded, n_best, 0, kind, int(layer))
        except Exception as error:  # a message on the page, the traceback in the server's log
            logger.exception("translating %r failed", text)
            return (f"**Could not translate:** {_first_line(error)}", *empty)
        note = ""
        if n_best.truncated:
            note = (
                f"**The text is {n_best.source_length:,} tokens long, more than the {loaded.max_source_tokens:,} the "
                f"model reads: only its first {len(n_best.source_ids) - 1:,} tokens were translated.**"
            )
        rows = [
            [rank, h.text, round(h.score, 4), round(h.log_probability, 4)]
            for rank, h in enumerate(n_best.hypotheses, start=1)
        ]
        choices = [(f"{rank}. {h.text}", rank - 1) for rank, h in enumerate(n_best.hypotheses, start=1)]
        best = n_best.hypotheses[0].text
        return note, best, rows, gr.Dropdown(choices=choices, value=0), n_best, image

    def draw(n_best: NBestList | None, choice: int | None, kind: str, layer: int):
        if n_best is None or choice is None:
            return None
        try:
            return attention_image(loaded, n_best, int(choice), kind, int(layer))
        except Exception as error:
            logger.exception("drawing the attention failed")
            raise gr.Error(f"Could not draw the attention: {_first_line(error)}") from None

    def change_kind(n_best: NBestList | None, choice: int | None, kind: str, layer: int):
        layer = min(int(layer), layers_of(loaded, kind) - 1)
        layers = gr.Dropdown(choices=list(range(layers_of(loaded, kind))), value=layer)
        return layers, draw(n_best, choice, kind, layer)

    with gr.Blocks(title=f"vanilla-transformer: {loaded.name}", analytics_enabled=False) as app:
        gr.Markdown(
            f"# Translate with `{loaded.name}`\n"
            "The Transformer of *Attention Is All You Need*: type a sentence, and see the translations beam search "
            "found and where the model looked to produce them."
        )
        n_best_state = gr.State(None)
        with gr.Row():
            with gr.Column(scale=3):
                source = gr.Textbox(
                    label="Source text", lines=2, placeholder="A sentence to translate", elem_id="source"
                )
                with gr.Row():
                    beams = gr.Slider(1, MAX_BEAMS, value=loaded.num_beams, step=1, label="beams")
                    button = gr.Button("Translate", variant="primary", elem_id="translate")
                note = gr.Markdown(elem_id="note")
                translation = gr.Textbox(label="Translation", interactive=False, elem_id="translation")
                n_best_table = gr.Dataframe(
                    headers=["#", "translation", "score", "log-probability"],
                    datatype=["number", "str", "number", "number"],
                    label="n-best list (score: log-probability / length ** length_penalty, what beam search ranks by)",
                    interactive=False,
                    elem_id="n_best",
                )
                with gr.Row():
                    chosen = gr.Dropdown(choices=[], label="attention of the translation", elem_id="chosen")
                    kind = gr.Radio(
                        ATTENTION_KINDS, value="cross", label="attention (queries down, keys across)", elem_id="kind"
                    )
                    layer = gr.Dropdown(
                        choices=list(range(last_layer + 1)), value=last_layer, label="layer", elem_id="layer"
                    )
                heat_map = gr.Image(
                    label="attention by head", show_label=False, type="pil", format="png", elem_id="heat_map"
                )
            with gr.Column(scale=1):
                gr.Markdown(model_facts(loaded), elem_id="model_facts")

        outputs = [note, translation, n_best_table, chosen, n_best_state, heat_map]
        inputs = [source, beams, kind, layer]
        button.click(translate, inputs, outputs, api_name="translate")
        source.submit(translate, inputs, outputs, api_visibility="private")
        chosen.input(draw, [n_best_state, chosen, kind, layer], heat_map, api_visibility="private")
        layer.input(draw, [n_best_state, chosen, kind, layer], heat_map, api_visibility="private")
        kind.input(change_kind, [n_best_state, chosen, kind, layer], [layer, heat_map], api_visibility="private")
    return app


def launch_app(app, **kwargs):
    """`app.launch(**kwargs)` with the demo's offline look: the system's fonts instead of downloaded ones, and
    server-side rendering off (it would need Node.js)."""
    import gradio as gr

    theme = gr.themes.Default(font=SANS, font_mono=MONO)
    return app.launch(theme=theme, ssr_mode=False, **kwargs)


__all__ = ["DemoModel", "attention_image", "build_app", "card_metrics", "launch_app", "load_demo_model", "model_facts"]
