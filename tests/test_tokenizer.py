"""The joint BPE tokenizer: special-token ids, saving/loading, text_target, lossless round trips."""

import json

import pytest
from conftest import load_script, run_script, tiny_config
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from vanilla_transformer.training.data import demo_corpus
from vanilla_transformer.training.tokenizer import (
    check_tokenizer_matches_config,
    iterate_texts,
    train_tokenizer,
)

CORPUS = [
    "Die Donaudampfschifffahrtsgesellschaft fährt über den Fluss.",
    "The steamship company sails across the river.",
    "Grüße aus Köln: Straße, Mädchen, Äpfel, Öl, Übermut!",
    "Greetings from Cologne: street, girl, apples, oil, high spirits!",
    "dreihundertzweiundvierzig",
    "three hundred forty-two",
    "Er sagte: »Das ist schön«, und ging.",
    "He said, 'that's nice', and left.",
]
ROUND_TRIPS = [
    "Die Donaudampfschifffahrtsgesellschaft fährt über den Fluss.",
    "Grüße aus Köln: Straße, Mädchen, Äpfel, Öl, Übermut!",
    "Kraftfahrzeughaftpflichtversicherung",  # a compound never seen whole
    "dreihundertzweiundvierzig",
    "He said, 'that's nice', and left.",
    "  two  spaces, a tab\tand trailing space ",
    "Crème brûlée à São Paulo — naïve café 🙂",  # characters never seen in training: bytes, not <unk>
]


@pytest.fixture(scope="module")
def saved_tokenizer(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tokenizer"))
    train_tokenizer(CORPUS * 10, vocab_size=400).save_pretrained(path)
    return path


def test_special_tokens_match_the_model_config(saved_tokenizer):
    tokenizer = AutoTokenizer.from_pretrained(saved_tokenizer)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    config = tiny_config(vocab_size=len(tokenizer))
    ids = (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id)
    assert ids == (config.pad_token_id, config.bos_token_id, config.eos_token_id, 3) == (0, 1, 2, 3)
    assert config.decoder_start_token_id == tokenizer.bos_token_id
    check_tokenizer_matches_config(tokenizer, config)


@pytest.mark.parametrize("sentence", ROUND_TRIPS)
def test_decode_encode_is_lossless(saved_tokenizer, sentence):
    tokenizer = AutoTokenizer.from_pretrained(saved_tokenizer)
    ids = tokenizer(sentence)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == sentence


def test_source_and_target_end_with_eos_and_no_bos(saved_tokenizer):
    tokenizer = AutoTokenizer.from_pretrained(saved_tokenizer)
    batch = tokenizer(["Grüße aus Köln", "dreihundertzweiundvierzig"], text_target=["greetings", "three hundred"])
    for ids in batch["input_ids"] + batch["labels"]:
        assert ids[-1] == tokenizer.eos_token_id and tokenizer.bos_token_id not in ids
    assert tokenizer.decode(batch["labels"][1], skip_special_tokens=True) == "three hundred"
    # the vocabulary is joint: German compounds are split into learned pieces, not bytes
    assert len(tokenizer.tokenize("dreihundertzweiundvierzig")) < len("dreihundertzweiundvierzig") / 3


def test_a_mismatched_tokenizer_is_refused(saved_tokenizer):
    tokenizer = AutoTokenizer.from_pretrained(saved_tokenizer)
    with pytest.raises(ValueError, match="pad_token_id=0 but the model config has pad_token_id=5"):
        check_tokenizer_matches_config(tokenizer, tiny_config(vocab_size=len(tokenizer), pad_token_id=5))
    with pytest.raises(ValueError, match="vocabulary holds only 64"):
        check_tokenizer_matches_config(tokenizer, tiny_config(vocab_size=64))
    # a config may list several eos ids: the tokenizer's eos must be among them
    check_tokenizer_matches_config(tokenizer, tiny_config(vocab_size=len(tokenizer), eos_token_id=[2, 4]))
    with pytest.raises(ValueError, match=r"eos_token_id=2 but the model config has eos_token_id=\[3, 4\]"):
        check_tokenizer_matches_config(tokenizer, tiny_config(vocab_size=len(tokenizer), eos_token_id=[3, 4]))
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer(CORPUS, vocab_size=100)


@pytest.mark.slow
def test_train_tokenizer_script(tmp_path):
    data = tmp_path / "train.jsonl"
    rows = demo_corpus()["train"]["translation"][:300]
    data.write_text("".join(json.dumps({"translation": row}, ensure_ascii=False) + "\n" for row in rows))
    out = tmp_path / "tok"
    result = run_script(
        "train_tokenizer",
        ["--train_file", str(data), "--source_lang", "de", "--target_lang", "en", "--vocab_size", "320"]
        + ["--output_dir", str(out)],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert len(tokenizer) <= 320 and tokenizer.eos_token_id == 2
    assert tokenizer.decode(tokenizer("siebenhundertelf")["input_ids"], skip_special_tokens=True) == "siebenhundertelf"
    # the same data through the library gives the same vocabulary: training is deterministic
    again = train_tokenizer(iterate_texts(demo_corpus()["train"].select(range(300)), "de", "en"), vocab_size=320)
    assert again.get_vocab() == tokenizer.get_vocab()

    script = load_script("train_tokenizer")
    with pytest.raises(SystemExit) as info:
        script.main(
            [
                "--train_file",
                str(tmp_path / "nope.jsonl"),
                "--source_lang",
                "de",
                "--target_lang",
                "en",
                "--output_dir",
                "x",
            ]
        )
    assert (
        str(info.value.code) == f"train_tokenizer.py: error: --train_file '{tmp_path / 'nope.jsonl'}' does not exist."
    )
    with pytest.raises(SystemExit, match="--validation_file is not used: the tokenizer learns from the training split"):
        script.main(["--train_file", str(data), "--validation_file", str(data), "--output_dir", "x"])
