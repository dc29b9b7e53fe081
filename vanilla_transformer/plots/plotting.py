"""Pictures of what the model learned: encoder-decoder attention, the positional encoding, training curves.

matplotlib is an optional extra (``pip install 'vanilla-transformer[plot]'``), imported only when a picture is drawn.
Figures are drawn on matplotlib's Agg canvas directly, without pyplot: nothing needs a display, and the pyplot
backend a notebook or another library has chosen is left alone.

Each ``plot_*`` function writes a PNG and returns the numbers it drew, so that they can be checked;
``attention_heads_figure`` returns the Figure itself (for an app or a notebook).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch
from transformers.trainer_utils import sort_checkpoints

PLOT_EXTRA_HINT = "pip install 'vanilla-transformer[plot]' (or pip install matplotlib)"


def _new_figure(width: float, height: float, dpi: int = 100):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(f"Plotting needs matplotlib, which is not installed: {PLOT_EXTRA_HINT}.") from error
    figure = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: str) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    figure.savefig(path, format="png", bbox_inches="tight")
    return path


# --------------------------------------------------------------------------------------------------------------------
# Encoder-decoder attention
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class TranslationAttention:
    """A translation and the attention that produced it.

    ``cross_attentions[layer, head, i, j]`` is how much the decoder, when it produced ``target_tokens[i]``, attended
    to ``source_tokens[j]``; each row sums to 1 over the source (a softmax, §3.2.1). ``encoder_attentions[layer, head,
    i, j]``: source token i to source token j; ``decoder_attentions[layer, head, i, j]``: the step that produced
    ``target_tokens[i]`` to the decoder input ``decoder_input_tokens[j]`` (the start token, then the tokens produced
    so far; zero above the diagonal, the mask of §3.2.3).
    """

    source_tokens: list[str]
    target_tokens: list[str]
    translation: str
    cross_attentions: torch.Tensor  # (layers, heads, target length, source length), float32 on the CPU
    encoder_attentions: torch.Tensor | None = None  # (encoder layers, heads, source length, source length)
    decoder_attentions: torch.Tensor | None = None  # (layers, heads, target length, target length)
    decoder_input_tokens: list[str] | None = None

    @property
    def num_layers(self) -> int:
        return self.cross_attentions.shape[0]

    @property
    def num_heads(self) -> int:
        return self.cross_attentions.shape[1]


def _token_labels(tokenizer, ids: list[int]) -> list[str]:
    # decoding one id at a time turns byte-level BPE symbols (Ġ for a space, bytes of ü or ß) back into text
    labels = []
    for token_id in ids:
        text = tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        labels.append(text.strip() or repr(text))
    return labels


@torch.no_grad()
def translate_with_attention(
    model, tokenizer, text: str, num_beams: int = 1, max_new_tokens: int | None = None
) -> TranslationAttention:
    """Translate ``text``, then read the attention of every layer and head (``attention_of_translation``).

    The model must use the eager attention (``attn_implementation="eager"``), the only one that returns weights.
    """
    if not text or not text.strip():
        raise ValueError("text is empty; give a sentence to translate.")
    _check_eager(model)
    model.eval()
    device = model.device
    encoded = tokenizer(text, return_tensors="pt")
    input_ids = encoded["input_ids"].to(device)
    attention_mask = encoded["attention_mask"].to(device)
    generate_kwargs = {"num_beams": num_beams, "do_sample": False}
    if max_new_tokens is not None:
        generate_kwargs["max_new_tokens"] = max_new_tokens
    generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, **generate_kwargs)[0]
    # batch of one: nothing after eos but possible padding from beam search
    pad_id = model.config.pad_token_id
    length = len(generated)
    while length > 2 and pad_id is not None and int(generated[length - 1]) == pad_id:
        length -= 1
    return attention_of_translation(model, tokenizer, input_ids[0].tolist(), generated[1:length].tolist())


def _check_eager(model) -> None:
    if model.config._attn_implementation != "eager":
        raise ValueError(
            f"the attention weights need the eager attention, which returns them; this model uses "
            f"attn_implementation={model.config._attn_implementation!r}. Load it with attn_implementation='eager' or "
            "call model.set_attn_implementation('eager')."
        )


@torch.no_grad()
def attention_of_translation(model, tokenizer, source_ids: list[int], target_ids: list[int]) -> TranslationAttention:
    """The encoder, decoder and encoder-decoder attention of every layer and head behind one translation:
    ``target_ids`` (the tokens the decoder produced after its start token, eos included, e.g. from generate() or an
    n-best list) of the source ``source_ids``. One teacher-forced forward pass returns the attention of all steps at
    once; it equals what the decoder computed step by step, since the decoder is causal. Needs the eager attention.
    """
    _check_eager(model)
    model.eval()
    device = model.device
    input_ids = torch.tensor([source_ids], device=device)
    decoder_ids = [model.config.decoder_start_token_id, *target_ids]
    # decoder position i reads decoder_ids[i] and produces target_ids[i]
    outputs = model(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        decoder_input_ids=torch.tensor([decoder_ids[:-1]], device=device),
        output_attentions=True,
        use_cache=False,
    )

    def stacked(layers) -> torch.Tensor:
        return torch.stack([layer[0] for layer in layers]).float().cpu()

    return TranslationAttention(
        source_tokens=_token_labels(tokenizer, source_ids),
        target_tokens=_token_labels(tokenizer, target_ids),
        translation=tokenizer.decode(target_ids, skip_special_tokens=True),
        cross_attentions=stacked(outputs.cross_attentions),
        encoder_attentions=stacked(outputs.encoder_attentions),
        decoder_attentions=stacked(outputs.decoder_attentions),
        decoder_input_tokens=_token_labels(tokenizer, decoder_ids[:-1]),
    )


def _check_index(name: str, value: int, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -size <= value < size:
        raise ValueError(
            f"{name}={value!r} is out of range; the model has {size} (use 0..{size - 1} or -1 for the last)."
        )
    return value % size


def attention_matrix(attention: TranslationAttention, layer: int = -1, head: int | None = None) -> torch.Tensor:
    """The (target, source) matrix of one layer: one head, or the mean over heads when ``head`` is None."""
    layer = _check_index("layer", layer, attention.num_layers)
    weights = attention.cross_attentions[layer]
    if head is None:
        return weights.mean(dim=0)
    return weights[_check_index("head", head, attention.num_heads)]


def _heatmap(axes, matrix, source_tokens, target_tokens, show_x=True, show_y=True, annotate=False, vmax=None):
    vmax = max(float(matrix.max()), 1e-6) if vmax is None else vmax
    image = axes.imshow(matrix, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
    axes.set_xticks(range(len(source_tokens)))
    axes.set_yticks(range(len(target_tokens)))
    axes.set_xticklabels(source_tokens if show_x else [], rotation=60, ha="right", rotation_mode="anchor")
    axes.set_yticklabels(target_tokens if show_y else [])
    if annotate:
        for i in range(matrix.shape[0]):
            for j in range(matrix.shape[1]):
                value = float(matrix[i, j])
                color = "black" if value > 0.6 * float(matrix.max()) else "white"
                axes.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=color)
    return image


def plot_cross_attention(
    attention: TranslationAttention, path: str, layer: int = -1, head: int | None = None
) -> torch.Tensor:
    """Write a heatmap of one layer's encoder-decoder attention (heads averaged, or ``head``); returns the matrix."""
    matrix = attention_matrix(attention, layer, head)
    rows, columns = matrix.shape
    figure = _new_figure(max(5.0, 0.45 * columns + 2.5), max(4.0, 0.4 * rows + 2.0))
    axes = figure.add_subplot()
    image = _heatmap(
        axes, matrix.numpy(), attention.source_tokens, attention.target_tokens, annotate=rows * columns <= 150
    )
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04, label="attention weight")
    layer_index = layer % attention.num_layers
    which = "mean of all heads" if head is None else f"head {head % attention.num_heads}"
    axes.set_title(f"Encoder-decoder attention, layer {layer_index} ({which})")
    axes.set_xlabel("source tokens")
    axes.set_ylabel("generated tokens")
    _save(figure, path)
    return matrix


def plot_cross_attention_heads(attention: TranslationAttention, path: str, layer: int = -1) -> torch.Tensor:
    """Write a grid with one heatmap per head of ``layer``; returns the (heads, target, source) weights drawn."""
    weights = attention.cross_attentions[_check_index("layer", layer, attention.num_layers)]
    _save(attention_heads_figure(attention, layer), path)
    return weights


ATTENTION_KINDS = {
    # kind: (weights field, query labels field, key labels field, title)
    "cross": ("cross_attentions", "target_tokens", "source_tokens", "Encoder-decoder attention"),
    "encoder": ("encoder_attentions", "source_tokens", "source_tokens", "Encoder self-attention"),
    "decoder": ("decoder_attentions", "target_tokens", "decoder_input_tokens", "Decoder self-attention (masked)"),
}


def attention_heads_figure(attention: TranslationAttention, layer: int = -1, kind: str = "cross"):
    """A matplotlib Figure with one heatmap per head of ``layer``: the encoder-decoder attention (``kind="cross"``),
    the encoder's self-attention ("encoder") or the decoder's ("decoder"). Keys across, queries down, labelled with
    their tokens, on one colour scale (0 to 1) so that heads compare."""
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"kind={kind!r} is unknown; allowed: {', '.join(ATTENTION_KINDS)}.")
    field, rows_field, columns_field, title = ATTENTION_KINDS[kind]
    stack = getattr(attention, field)
    if stack is None:
        raise ValueError(f"this TranslationAttention holds no {field}; make it with attention_of_translation.")
    layer_index = _check_index("layer", layer, stack.shape[0])
    weights = stack[layer_index]
    heads, rows, columns = weights.shape
    row_labels, column_labels = getattr(attention, rows_field), getattr(attention, columns_field)
    ncols = min(heads, 4)
    nrows = math.ceil(heads / ncols)
    # at most 8 inches a panel: a long sentence gets crowded labels, not a picture tens of thousands of pixels wide
    panel_width, panel_height = min(8.0, max(3.0, 0.3 * columns + 1.5)), min(8.0, max(2.5, 0.28 * rows + 1.2))
    figure = _new_figure(panel_width * ncols + 0.8, panel_height * nrows + 0.6)
    panels = []
    for h in range(heads):
        axes = figure.add_subplot(nrows, ncols, h + 1)
        panels.append(axes)
        row, column = divmod(h, ncols)
        # token labels on the outer panels only; one colour scale (0 to 1) so that heads compare
        image = _heatmap(
            axes,
            weights[h].numpy(),
            column_labels,
            row_labels,
            show_x=row == nrows - 1 or h + ncols >= heads,
            show_y=column == 0,
            vmax=1.0,
        )
        axes.set_title(f"head {h}", fontsize=10)
    figure.suptitle(f"{title} per head, layer {layer_index}")
    figure.tight_layout()
    figure.colorbar(image, ax=panels, fraction=0.02, pad=0.02, label="attention weight")
    return figure


# --------------------------------------------------------------------------------------------------------------------
# Positional encoding
# --------------------------------------------------------------------------------------------------------------------


def plot_positional_encoding(
    path: str, table: torch.Tensor, kind: str = "sinusoidal", curves: tuple[int, ...] | None = None
) -> torch.Tensor:
    """Write the position × dimension heatmap, and beside it a few dimensions as curves over the positions.

    By default the curves are the sine dimensions 0, d/16, d/8 and d/4, whose wavelengths 2π · 10000^(i/d) are
    2π, about 11, 20 and 63 positions whatever d_model: the wavelengths form a geometric progression (§3.5).
    """
    num_positions, d_model = table.shape
    if curves is None:
        curves = tuple(sorted({2 * (d_model // k // 2) for k in (16, 8, 4)} | {0}))
    figure = _new_figure(13.0, 5.0)
    heatmap, lines = figure.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    limit = max(1.0, float(table.abs().max())) if kind == "sinusoidal" else float(table.abs().max())
    image = heatmap.imshow(table.numpy(), cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
    figure.colorbar(image, ax=heatmap, fraction=0.046, pad=0.04)
    heatmap.set_xlabel("dimension i")
    heatmap.set_ylabel("position")
    title = f"{kind.capitalize()} positional encoding, d_model={d_model}"
    if kind == "sinusoidal":
        title += "\nPE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(…)"
    heatmap.set_title(title, fontsize=10)
    for dimension in (d for d in curves if d < d_model):
        lines.plot(range(num_positions), table[:, dimension].numpy(), label=f"dim {dimension}")
    lines.set_xlabel("position")
    lines.set_ylabel("value")
    lines.set_title("a few dimensions: the wavelength grows with i")
    lines.legend(loc="upper right", fontsize=8)
    lines.grid(alpha=0.3)
    figure.tight_layout()
    _save(figure, path)
    return table


# --------------------------------------------------------------------------------------------------------------------
# Training curves
# --------------------------------------------------------------------------------------------------------------------


def find_trainer_state(path: str) -> str:
    """The trainer_state.json for ``path``: the file itself, a checkpoint folder, or an output folder (its own
    trainer_state.json, else that of its latest checkpoint-N)."""
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--trainer_state {path!r} does not exist; give a trainer_state.json or a run folder.")
    state = os.path.join(path, "trainer_state.json")
    if os.path.isfile(state):
        return state
    for checkpoint in reversed(sort_checkpoints(path)):  # the Trainer's checkpoint-<step> folders, newest first
        state = os.path.join(checkpoint, "trainer_state.json")
        if os.path.isfile(state):
            return state
    raise FileNotFoundError(
        f"{path!r} has no trainer_state.json and no checkpoint-N/trainer_state.json; give the run's output folder."
    )


def load_log_history(path: str) -> list[dict]:
    """The ``log_history`` list of a run's trainer_state.json (see ``find_trainer_state`` for ``path``)."""
    state_path = find_trainer_state(path)
    try:
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
    except json.JSONDecodeError as error:
        raise ValueError(f"{state_path!r} is not valid JSON: {error}") from error
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise ValueError(f"{state_path!r} has no `log_history` list; is it a Trainer's trainer_state.json?")
    return state["log_history"]


def training_curves(log_history: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """(steps, values) of the training loss, validation loss and validation BLEU logged by Trainer."""
    keys = {"train loss": "loss", "validation loss": "eval_loss", "validation BLEU": "eval_bleu"}
    curves = {}
    for name, key in keys.items():
        points = [(entry["step"], entry[key]) for entry in log_history if key in entry and "step" in entry]
        curves[name] = ([step for step, _ in points], [value for _, value in points])
    return curves


def plot_training_curves(log_history: list[dict], path: str) -> dict[str, tuple[list[int], list[float]]]:
    """Write losses (left) and BLEU (right) against optimizer steps; returns the curves drawn."""
    curves = training_curves(log_history)
    if not any(steps for steps, _ in curves.values()):
        raise ValueError(
            "The log history has no loss, eval_loss or eval_bleu entries; train with logging_steps and eval_strategy "
            "set so that Trainer logs them."
        )
    figure = _new_figure(12.0, 4.5)
    from matplotlib.ticker import MaxNLocator  # after _new_figure, which explains a missing matplotlib

    loss_axes, bleu_axes = figure.subplots(1, 2)
    for name, style in (("train loss", "-"), ("validation loss", "o-")):
        steps, values = curves[name]
        if steps:
            loss_axes.plot(steps, values, style, label=name, markersize=4)
    loss_axes.set_xlabel("step")
    loss_axes.set_ylabel("loss per target token")
    loss_axes.set_title("Loss")
    loss_axes.grid(alpha=0.3)
    loss_axes.legend()
    steps, values = curves["validation BLEU"]
    if steps:
        bleu_axes.plot(steps, values, "o-", color="tab:green", markersize=4)
        best = max(range(len(values)), key=values.__getitem__)
        bleu_axes.annotate(
            f"best {values[best]:.1f}",
            (steps[best], values[best]),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
        )
    else:
        bleu_axes.text(0.5, 0.5, "no eval_bleu in the log", ha="center", va="center", transform=bleu_axes.transAxes)
    bleu_axes.margins(y=0.15)  # room for the "best" label
    bleu_axes.set_xlabel("step")
    bleu_axes.set_ylabel("BLEU")
    bleu_axes.set_title("Validation BLEU")
    bleu_axes.grid(alpha=0.3)
    for axes in (loss_axes, bleu_axes):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.tight_layout()
    _save(figure, path)
    return curves


__all__ = [
    "ATTENTION_KINDS",
    "TranslationAttention",
    "attention_heads_figure",
    "attention_matrix",
    "attention_of_translation",
    "find_trainer_state",
    "load_log_history",
    "plot_cross_attention",
    "plot_cross_attention_heads",
    "plot_positional_encoding",
    "plot_training_curves",
    "training_curves",
    "translate_with_attention",
]
