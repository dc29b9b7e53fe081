"""Attention, positional-encoding and training-curve pictures: files are written, are PNGs of a sensible
size, and hold what they claim (attention rows are distributions; the table is the paper's formula)."""

import glob
import json
import math
import os
import sys

import pytest
import torch
from conftest import load_script, single_thread, tiny_model, word_tokenizer
from PIL import Image
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast, Seq2SeqTrainer, Seq2SeqTrainingArguments

from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.inference.ctranslate2 import position_table
from vanilla_transformer.plots.plotting import (
    attention_matrix,
    find_trainer_state,
    plot_cross_attention,
    plot_cross_attention_heads,
    plot_training_curves,
    translate_with_attention,
)

WORDS = "eins zwei drei vier fünf sechs sieben acht neun zehn one two three four five six seven eight nine ten".split()


def assert_png(path: str, min_side: int = 300) -> tuple[int, int]:
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        width, height = image.size
    assert min(width, height) >= min_side and max(width, height) <= 6000, (path, width, height)
    return width, height


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    tokenizer = word_tokenizer(WORDS)
    model = tiny_model(vocab_size=len(tokenizer))
    model.generation_config.max_length = 12
    path = tmp_path_factory.mktemp("model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.slow
def test_plot_attention_script_writes_readable_pngs(model_dir, tmp_path):
    out = tmp_path / "plots"
    paths = load_script("plot_attention").main(
        ["--model_dir", model_dir, "--text", "drei zehn sieben eins", "--layer", "0", "--output_dir", str(out)]
    )
    assert set(paths) == {"attention", "heads", "positional encoding"}
    assert os.path.basename(paths["attention"]) == "cross_attention_layer0.png"
    for path in paths.values():
        assert_png(path)

    with_head = load_script("plot_attention").main(
        ["--model_dir", model_dir, "--text", "drei", "--head", "-1", "--output_dir", str(out)]
    )
    assert os.path.basename(with_head["attention"]) == "cross_attention_layer1_head3.png"  # 2 layers, 4 heads
    assert_png(with_head["attention"])


@pytest.mark.parametrize("head", [None, 2])
def test_plotted_attention_rows_are_distributions_over_the_source(model_dir, tmp_path, head):
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir, attn_implementation="eager")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    attention = translate_with_attention(model, tokenizer, "zwei neun vier", max_new_tokens=6)
    # "zwei neun vier </s>" on one axis; every generated token, eos included, on the other
    assert attention.source_tokens == ["zwei", "neun", "vier", "</s>"]
    generated = len(attention.target_tokens)
    assert 1 <= generated <= 6
    assert attention.cross_attentions.shape == (2, 4, generated, 4)

    matrix = plot_cross_attention(attention, str(tmp_path / "a.png"), layer=-1, head=head)
    assert_png(str(tmp_path / "a.png"))
    assert matrix.shape == (generated, 4)
    torch.testing.assert_close(matrix.sum(dim=-1), torch.ones(generated))
    expected = attention.cross_attentions[-1].mean(0) if head is None else attention.cross_attentions[-1, head]
    torch.testing.assert_close(matrix, expected)
    if head is None:
        heads = plot_cross_attention_heads(attention, str(tmp_path / "heads.png"), layer=0)
        assert_png(str(tmp_path / "heads.png"))
        assert heads.shape == (4, generated, 4)
        torch.testing.assert_close(heads.sum(dim=-1), torch.ones(4, generated))

    # the teacher-forced pass reproduces what generation computed step by step
    generated_ids = model.generate(**tokenizer("zwei neun vier", return_tensors="pt"), max_new_tokens=6)[0]
    assert tokenizer.decode(generated_ids, skip_special_tokens=True) == attention.translation


def test_attention_needs_eager_and_valid_indices(model_dir):
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir, attn_implementation="sdpa")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    with pytest.raises(ValueError, match="eager"):
        translate_with_attention(model, tokenizer, "drei", max_new_tokens=3)
    model.set_attn_implementation("eager")
    attention = translate_with_attention(model, tokenizer, "drei", max_new_tokens=3)
    with pytest.raises(ValueError, match="layer=2 is out of range"):
        attention_matrix(attention, layer=2)
    with pytest.raises(ValueError, match="head=4 is out of range"):
        attention_matrix(attention, head=4)
    with pytest.raises(SystemExit):
        load_script("plot_attention").main(["--model_dir", model_dir, "--text", "drei", "--layer", "5"])


def test_positional_encoding_table_is_the_papers_formula(tmp_path):
    """The table plot_attention.py draws (the one the CTranslate2 export writes): what the encoder adds."""
    table = position_table(tiny_model(), "encoder", 200)  # sinusoids reach past max_position_embeddings=128
    pos, i = 137, 3
    assert table.shape == (200, 32)
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 32)), abs=1e-5)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 32)), abs=1e-5)
    learned = tiny_model(position_embedding_type="learned")
    weight = learned.model.encoder.embeddings.embed_positions.weight
    assert torch.equal(position_table(learned, "encoder", 50), weight[:50].detach())
    with pytest.raises(ValueError, match="129 positions exceed the learned position table of 128 rows"):
        position_table(learned, "encoder", 129)


def test_plot_attention_refuses_more_positions_than_a_learned_table(tmp_path, capsys):
    tokenizer = word_tokenizer(WORDS)
    tiny_model(vocab_size=len(tokenizer), position_embedding_type="learned").save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    argv = ["--model_dir", str(tmp_path), "--text", "drei", "--output_dir", str(tmp_path / "plots")]
    with pytest.raises(SystemExit):
        load_script("plot_attention").main([*argv, "--positions", "129"])
    assert "--positions 129: 129 positions exceed the learned position table of 128 rows" in capsys.readouterr().err
    assert not (tmp_path / "plots").exists()  # refused before anything was drawn


def log_history() -> list[dict]:
    history = [{"step": s, "loss": 5.0 / s, "epoch": s / 10} for s in range(1, 31)]
    for s in (10, 20, 30):
        history.append({"step": s, "eval_loss": 4.0 / s, "eval_bleu": 3.0 * s, "epoch": s / 10})
    history.append({"step": 30, "train_loss": 1.0, "train_runtime": 3.0, "epoch": 3.0})
    return history


def test_plot_training_script_reads_a_run_folder(tmp_path):
    # the output folder has no trainer_state.json of its own: the latest checkpoint's is used
    for step, history in ((10, log_history()[:11]), (30, log_history())):
        checkpoint = tmp_path / "run" / f"checkpoint-{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": history}))
    assert find_trainer_state(str(tmp_path / "run")).endswith(os.path.join("checkpoint-30", "trainer_state.json"))

    output = tmp_path / "curves.png"
    curves = load_script("plot_training").main(["--trainer_state", str(tmp_path / "run"), "--output", str(output)])
    assert_png(str(output))
    assert curves["train loss"][0] == list(range(1, 31))
    assert curves["validation loss"] == ([10, 20, 30], [0.4, 0.2, 4.0 / 30])
    assert curves["validation BLEU"] == ([10, 20, 30], [30.0, 60.0, 90.0])


def test_plot_training_rejects_what_is_not_a_run(tmp_path):
    script = load_script("plot_training")
    with pytest.raises(SystemExit):
        script.main(["--trainer_state", str(tmp_path / "missing"), "--output", str(tmp_path / "x.png")])
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "epoch": 0.1}]}))
    with pytest.raises(SystemExit):
        script.main(["--trainer_state", str(tmp_path), "--output", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


def test_a_missing_matplotlib_is_explained(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without the plot extra looks like
    monkeypatch.delitem(sys.modules, "matplotlib.figure", raising=False)
    monkeypatch.delitem(sys.modules, "matplotlib.backends.backend_agg", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'vanilla-transformer\[plot\]'"):
        plot_training_curves(log_history(), str(tmp_path / "x.png"))


def test_a_real_run_logs_to_tensorboard_and_its_state_plots(tmp_path, model_dir):
    """Seq2SeqTrainer with report_to=["tensorboard"] (the flag train.py passes through) writes event files, and the
    trainer_state.json it saves has the loss, eval_loss and eval_bleu that plot_training.py draws."""
    import sacrebleu

    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir)
    sources = ["eins zwei", "drei vier fünf", "sechs", "sieben acht neun zehn"] * 4
    rows = [{"input_ids": tokenizer(s)["input_ids"], "labels": tokenizer(s)["input_ids"]} for s in sources]

    def compute_metrics(prediction):
        predictions = [[t for t in row if t >= 0] for row in prediction.predictions]
        hypotheses = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        return {"bleu": sacrebleu.corpus_bleu(hypotheses, [sources[: len(hypotheses)]]).score}

    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "run"),
        use_cpu=True,
        max_steps=4,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        learning_rate=1e-3,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        predict_with_generate=True,
        generation_max_length=8,
        save_strategy="no",
        report_to=["tensorboard"],
        disable_tqdm=True,
    )
    with single_thread():
        trainer = Seq2SeqTrainer(
            model=model,
            args=args,
            train_dataset=rows,
            eval_dataset=rows[:8],
            data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100),
            compute_metrics=compute_metrics,
        )
        trainer.train()
        trainer.save_state()

    events = glob.glob(str(tmp_path / "run" / "runs" / "*" / "events.out.tfevents.*"))
    assert events, "no TensorBoard event file under output_dir/runs"
    logged = b"".join(open(path, "rb").read() for path in events)
    assert b"train/loss" in logged and b"eval/bleu" in logged

    output = tmp_path / "curves.png"
    curves = load_script("plot_training").main(["--trainer_state", str(tmp_path / "run"), "--output", str(output)])
    assert_png(str(output))
    assert curves["train loss"][0] == [1, 2, 3, 4]
    assert curves["validation loss"][0] == curves["validation BLEU"][0] == [2, 4]
    assert all(0.0 <= bleu <= 100.0 for bleu in curves["validation BLEU"][1])
