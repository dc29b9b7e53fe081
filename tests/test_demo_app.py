"""The web demo (vanilla_transformer/demo/app.py, scripts/demo.py), tested as a person uses it: a headless Chromium
types a sentence into the running app and waits for the translation and the heat-map; gradio_client calls the same
app as a program would. Below them, what the app is built on: the n-best list with scores, the three attentions
of a translation and their figure, and the start-up refusals of a folder that is not a checkpoint.

Everything stays on this machine: the servers listen on 127.0.0.1, the model is a toy one trained here, and the
tests fail on any connection (of this process, or requested by the page) to another host.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import LEXICON, free_port, load_script, single_thread, tiny_model, train_toy_model, word_tokenizer
from PIL import Image

from vanilla_transformer.hub.model_card import write_model_card
from vanilla_transformer.inference.translate import translate, translate_n_best
from vanilla_transformer.plots.plotting import (
    TranslationAttention,
    attention_heads_figure,
    attention_of_translation,
    translate_with_attention,
)

SENTENCE = "the cat sat on the mat"
EXPECTED = "der katze sitzt auf der matte"
METRICS = {"predict_bleu": 97.5, "eval_bleu": 96.25, "eval_chrf": 98.125}
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# `VANILLA_DEMO_SCREENSHOT=docs/images/demo.png pytest -m slow tests/test_demo_app.py -k browser` refreshes the docs'
SCREENSHOT_ENV = "VANILLA_DEMO_SCREENSHOT"


def save_model(path: Path, model, tokenizer, metrics: dict | None = None) -> str:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if metrics is not None:
        write_model_card(str(path), metrics=metrics, source_lang="en", target_lang="de", dataset_name="toy-lexicon")
    return str(path)


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer(list(LEXICON) + list(LEXICON.values()))


@pytest.fixture(scope="module")
def untrained_dir(tmp_path_factory, tokenizer) -> str:
    """A random tiny model (2+2 layers, 4 heads), beam 4, with a model card: enough for everything but the words."""
    torch.manual_seed(0)
    model = tiny_model(vocab_size=len(tokenizer), max_position_embeddings=64)
    model.generation_config.num_beams = 4
    return save_model(tmp_path_factory.mktemp("untrained") / "random-en-de", model, tokenizer, METRICS)


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory, tokenizer) -> str:
    """The toy lexicon learned well enough to translate short sentences word for word (a few seconds)."""
    with single_thread():
        model = train_toy_model(tokenizer, steps=350)
    model.generation_config.num_beams = 4
    path = save_model(tmp_path_factory.mktemp("toy") / "toy-en-de", model, tokenizer, METRICS)
    with single_thread():
        assert translate(model, tokenizer, [SENTENCE]) == [EXPECTED], "the toy model should have learned the lexicon"
    return path


# --------------------------------------------------------------------------------------------------------------------
# What the app builds on
# --------------------------------------------------------------------------------------------------------------------


def teacher_forced_log_probability(model, source_ids: list[int], target_ids: list[int]) -> float:
    decoder_ids = [model.config.decoder_start_token_id, *target_ids[:-1]]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([source_ids]), decoder_input_ids=torch.tensor([decoder_ids])).logits
    log_probs = logits[0].log_softmax(-1)
    return float(log_probs[torch.arange(len(target_ids)), torch.tensor(target_ids)].sum())


@pytest.mark.parametrize("num_beams, length_penalty", [(4, None), (3, 0.5), (1, None)])
def test_n_best_list_holds_what_beam_search_found_with_its_scores(
    untrained_dir, tokenizer, one_thread, num_beams, length_penalty
):
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(untrained_dir).eval()
    text = "the big dog is red"
    n_best = translate_n_best(model, tokenizer, text, num_beams=num_beams, length_penalty=length_penalty)
    assert n_best.source_ids == tokenizer(text)["input_ids"] and not n_best.truncated
    assert len(n_best.hypotheses) == num_beams
    # the best is translate()'s translation, and the list is in beam search's order
    best = translate(model, tokenizer, [text], num_beams=num_beams, length_penalty=length_penalty)[0]
    assert n_best.hypotheses[0].text == best
    scores = [h.score for h in n_best.hypotheses]
    assert scores == sorted(scores, reverse=True)
    alpha = 1.0 if length_penalty is None else length_penalty
    for hypothesis in n_best.hypotheses:
        # each score is the model's own log-probability of that translation, divided by length ** length_penalty
        expected = teacher_forced_log_probability(model, n_best.source_ids, hypothesis.token_ids)
        assert math.isclose(hypothesis.log_probability, expected, rel_tol=1e-4, abs_tol=1e-4)
        assert math.isclose(hypothesis.score, expected / len(hypothesis.token_ids) ** alpha, rel_tol=1e-4)
        assert hypothesis.text == tokenizer.decode(hypothesis.token_ids, skip_special_tokens=True)
    assert len({tuple(h.token_ids) for h in n_best.hypotheses}) == num_beams


def test_n_best_list_keeps_the_output_limit_of_translate(untrained_dir, tokenizer, one_thread):
    """The n-best list comes from translate's own generate() call: at most the input's length + 50 new tokens (§6.1,
    `extra_tokens`), or `max_new_tokens`; a random model stops only there."""
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(untrained_dir).eval()
    n_best = translate_n_best(model, tokenizer, "the big dog is red", extra_tokens=2)
    assert {len(h.token_ids) for h in n_best.hypotheses} == {len(n_best.source_ids) + 2}
    n_best = translate_n_best(model, tokenizer, "the big dog is red", max_new_tokens=3)
    assert {len(h.token_ids) for h in n_best.hypotheses} == {3}


def test_n_best_list_of_a_text_longer_than_the_limit_translates_its_beginning(untrained_dir, tokenizer, one_thread):
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(untrained_dir).eval()
    n_best = translate_n_best(model, tokenizer, "the big dog is red", max_source_tokens=4)
    # three words and the end-of-sentence token: what the encoder reads of "the big dog"
    assert n_best.truncated and n_best.source_length == 6
    assert n_best.source_ids == tokenizer("the big dog")["input_ids"]
    assert n_best.hypotheses == translate_n_best(model, tokenizer, "the big dog").hypotheses
    with pytest.raises(ValueError, match="text is empty"):
        translate_n_best(model, tokenizer, "  ")
    with pytest.raises(ValueError, match="num_return_sequences=5 must be between 1 and num_beams=4"):
        translate_n_best(model, tokenizer, "the dog", num_beams=4, num_return_sequences=5)


def test_attention_of_a_translation_has_all_three_kinds_and_draws_each(untrained_dir, tokenizer, one_thread):
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(untrained_dir, attn_implementation="eager").eval()
    text = "the small cat"
    attention = translate_with_attention(model, tokenizer, text, max_new_tokens=5)
    source, target = len(attention.source_tokens), len(attention.target_tokens)
    assert attention.source_tokens == ["the", "small", "cat", "</s>"]
    assert attention.cross_attentions.shape == (2, 4, target, source)
    assert attention.encoder_attentions.shape == (2, 4, source, source)
    assert attention.decoder_attentions.shape == (2, 4, target, target)
    assert attention.decoder_input_tokens == ["<s>", *attention.target_tokens[:-1]]
    for weights in (attention.cross_attentions, attention.encoder_attentions, attention.decoder_attentions):
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    # the decoder sees no later token (§3.2.3)
    assert torch.all(attention.decoder_attentions.triu(diagonal=1) == 0)
    # the same numbers from the token ids alone, as the app reads an n-best entry
    again = attention_of_translation(
        model, tokenizer, tokenizer(text)["input_ids"], tokenizer.convert_tokens_to_ids(attention.target_tokens)
    )
    torch.testing.assert_close(again.cross_attentions, attention.cross_attentions)

    for kind, rows, columns in [
        ("cross", attention.target_tokens, attention.source_tokens),
        ("encoder", attention.source_tokens, attention.source_tokens),
        ("decoder", attention.target_tokens, attention.decoder_input_tokens),
    ]:
        figure = attention_heads_figure(attention, layer=0, kind=kind)
        panels = [axes for axes in figure.axes if axes.get_title().startswith("head ")]
        assert [axes.get_title() for axes in panels] == ["head 0", "head 1", "head 2", "head 3"]
        assert [t.get_text() for t in panels[0].get_yticklabels()] == rows
        assert [t.get_text() for t in panels[0].get_xticklabels()] == columns  # one row of 4 panels: all labelled
        assert "layer 0" in figure._suptitle.get_text()
    # a long sentence: crowded labels, but a picture a browser shows
    long = TranslationAttention(["s"] * 40, ["t"] * 40, "", torch.softmax(torch.randn(1, 4, 40, 40), dim=-1))
    assert max(attention_heads_figure(long).get_size_inches() * 100) <= 4000  # uncapped: 5,480 pixels wide
    with pytest.raises(ValueError, match="kind='self' is unknown"):
        attention_heads_figure(attention, kind="self")
    with pytest.raises(ValueError, match="layer=2 is out of range"):
        attention_heads_figure(attention, layer=2, kind="encoder")


# --------------------------------------------------------------------------------------------------------------------
# Start-up: a folder that is not a checkpoint
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", r"is not a folder \(nor a Hub model id"),
        ("hub id offline", r"is not a folder, nor a model on the Hub: "),
        ("empty", r"holds no config.json; is it a saved model\?"),
        ("no weights", r"is not a trained checkpoint: .*no file named model.safetensors"),
        ("no tokenizer", r"holds no tokenizer \(tokenizer.json\)"),
        ("broken config", r"is not a trained checkpoint: .*config.json' is not a valid JSON file"),
        ("a checkpoint, without gradio", r"The demo needs gradio, which is not installed: pip install '.*\[demo\]'"),
    ],
)
def test_a_folder_that_is_not_a_checkpoint_or_no_gradio_stops_the_demo_before_it_serves(
    untrained_dir, tmp_path, monkeypatch, case, message
):
    folder = tmp_path / "model"
    if case == "missing":
        model_dir = str(tmp_path / "no" / "such" / "folder")
    elif case == "hub id offline":
        model_dir = "someone/not-in-the-cache"
    else:
        shutil.copytree(untrained_dir, folder)
        model_dir = str(folder)
        for name in os.listdir(folder):
            if (
                case == "empty"
                or (case == "no weights" and name == "model.safetensors")
                or (case == "no tokenizer" and name.startswith("tokenizer"))
            ):
                os.remove(folder / name)
        if case == "broken config":
            (folder / "config.json").write_text('{"model_type": "vanilla_transformer", "d_model": ')
    script = load_script("demo")
    monkeypatch.setattr(script, "launch_app", lambda *args, **kwargs: pytest.fail("the server must not start"))
    monkeypatch.setitem(sys.modules, "gradio", None)  # a bad folder is refused before gradio is imported
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--model_dir", model_dir, "--port", "1"])
    error = str(exit_info.value.code)
    assert error.startswith("demo.py: error: ") and "\n" not in error, error
    assert re.search(message, error), error
    assert "Traceback" not in error


# --------------------------------------------------------------------------------------------------------------------
# The running app
# --------------------------------------------------------------------------------------------------------------------


class OutsideConnections:
    """Records every connection (and name lookup) this process makes to a host other than this machine, through an
    audit hook: the server, the model loading and gradio_client included."""

    LOCAL = {"127.0.0.1", "::1", "localhost", "0.0.0.0"}
    active: OutsideConnections | None = None

    def __init__(self):
        self.seen: list[tuple[str, object]] = []

    def __enter__(self) -> OutsideConnections:
        if not getattr(OutsideConnections, "_installed", False):
            sys.addaudithook(OutsideConnections._hook)  # cannot be removed: it records only while one is active
            OutsideConnections._installed = True
        OutsideConnections.active = self
        return self

    def __exit__(self, *exc) -> None:
        OutsideConnections.active = None

    @staticmethod
    def _hook(event: str, args: tuple) -> None:
        watcher = OutsideConnections.active
        if watcher is None or event not in ("socket.connect", "socket.getaddrinfo"):
            return
        host = args[0] if event == "socket.getaddrinfo" else args[1]
        if isinstance(host, tuple):
            host = host[0]
        if isinstance(host, bytes):
            host = host.decode()
        if isinstance(host, str) and host not in OutsideConnections.LOCAL and not host.startswith("/"):
            watcher.seen.append((event, host))


@pytest.fixture
def running_app(toy_dir, tmp_path, monkeypatch):
    """The demo of the toy model, served on 127.0.0.1 by this process; yields its URL."""
    pytest.importorskip("gradio")
    from vanilla_transformer.demo.app import build_app, launch_app

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    with OutsideConnections() as outside:
        app = build_app(toy_dir, device="cpu")
        port = free_port()
        launch_app(app, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        try:
            yield f"http://127.0.0.1:{port}/"
        finally:
            app.close()
    assert outside.seen == [], f"the app or its client reached out of this machine: {outside.seen}"


@pytest.mark.slow
def test_the_app_through_gradio_client(running_app, toy_dir, one_thread):
    from gradio_client import Client

    client = Client(running_app, verbose=False, download_files=True)
    note, translation, n_best, chosen, image = client.predict(SENTENCE, 4, "cross", 1, api_name="/translate")
    assert (note, translation) == ("", EXPECTED)
    rows = n_best["data"]
    assert chosen["value"] == 0 and chosen["choices"][0] == [f"1. {EXPECTED}", 0]  # the best, drawn
    assert [row[0] for row in rows] == [1, 2, 3, 4] and rows[0][1] == EXPECTED
    assert [row[2] for row in rows] == sorted((row[2] for row in rows), reverse=True)
    with Image.open(image) as picture:  # four heads of one layer side by side
        assert picture.format == "PNG" and picture.width > 2 * picture.height > 300

    # bad input: a message on the page, not an error
    note, translation, n_best, chosen, image = client.predict("   ", 4, "cross", 1, api_name="/translate")
    assert note == "**Type a sentence to translate.**" and (translation, image) == ("", None)
    long_text = " ".join(["the small cat is on the blue mat"] * 10)  # 81 tokens; the toy model reads 64
    note, translation, *_ = client.predict(long_text, 2, "encoder", 0, api_name="/translate")
    assert "The text is 81 tokens long, more than the 64 the model reads: only its first 63 tokens" in note
    # its beginning is translated (the toy model learned sentences of up to six words, so not more than its gist)
    assert "klein katze" in translation


def chromium(tmp_path: Path):
    """Headless Chromium from the system's packages, driven by its chromedriver, logging its network requests."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip(f"needs {CHROMIUM} and {CHROMEDRIVER} (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}",
        "--window-size=1280,1000",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def requested_urls(driver) -> list[str]:
    messages = (json.loads(entry["message"])["message"] for entry in driver.get_log("performance"))
    return [m["params"]["request"]["url"] for m in messages if m["method"] == "Network.requestWillBeSent"]


def save_screenshot(driver, path: Path) -> None:
    """The whole page, below the window's height too, as a small PNG (256 colours)."""
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    with Image.open(io.BytesIO(base64.b64decode(shot["data"]))) as picture:
        picture.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


@pytest.mark.slow
def test_a_person_translates_in_a_headless_browser(running_app, tmp_path, one_thread):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver = chromium(tmp_path)
    try:
        driver.get(running_app)
        wait = WebDriverWait(driver, 60)
        box = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#source textarea"))
        box.send_keys(SENTENCE)
        driver.find_element(By.CSS_SELECTOR, "#translate").click()
        output = driver.find_element(By.CSS_SELECTOR, "#translation textarea")
        wait.until(lambda d: output.get_attribute("value"))
        assert output.get_attribute("value") == EXPECTED

        def heat_map(d):  # the picture's address and size once it has loaded
            return d.execute_script(
                "const i = document.querySelector('#heat_map img');"
                "return i && i.complete && i.naturalWidth > 0 ? [i.src, i.naturalWidth, i.naturalHeight] : null"
            )

        src, width, height = wait.until(heat_map)
        assert width > 2 * height > 300
        assert EXPECTED.split()[1] in driver.find_element(By.CSS_SELECTOR, "#n_best").text
        assert "Test BLEU" in driver.find_element(By.CSS_SELECTOR, "#model_facts").text

        screenshot = tmp_path / "demo.png"
        save_screenshot(driver, screenshot)
        if os.environ.get(SCREENSHOT_ENV):
            shutil.copyfile(screenshot, os.environ[SCREENSHOT_ENV])
        with Image.open(screenshot) as picture:
            assert picture.width > 1200 and picture.height > 1000  # the whole page, not the window

        # another kind of attention: a new picture
        driver.find_element(By.XPATH, "//*[@id='kind']//label[contains(., 'decoder self-attention')]").click()
        wait.until(lambda d: (heat_map(d) or [src])[0] != src)

        # everything the page asked for came from the app (or from the browser itself), nothing from the network
        local = ("data:", "blob:", "chrome:", "about:", running_app.rstrip("/"), running_app.replace("http", "ws", 1))
        outside = sorted({url for url in requested_urls(driver) if not url.startswith(local)})
        assert outside == [], f"the page fetched from outside this machine: {outside}"
    finally:
        driver.quit()
