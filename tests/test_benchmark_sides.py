"""The end-to-end benchmark's four sides (benchmarks/end_to_end.py): Marian with and without transformers' stock
length grouping, train.py with and without length chunks, and the tokens-per-second figure."""

import json

import pytest
from conftest import load_script
from transformers import HfArgumentParser, Seq2SeqTrainingArguments

end_to_end = load_script("end_to_end", folder="benchmarks")


def test_each_side_asks_for_its_batching(tmp_path):
    args = end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--run_translation", __file__])
    assert args.sides == list(end_to_end.SIDES)
    train = load_script("train")
    chunks = {None: None, False: False, True: True}
    for given, expected in chunks.items():
        command = end_to_end.ours_command(args, str(tmp_path / "run"), length_chunks=given)
        assert train.parse_arguments(command[2:])[2].length_chunks is expected
    for grouped, strategy in ((False, "random"), (True, "group_by_length")):
        command = end_to_end.run_translation_command(args, str(tmp_path / "run"), group_by_length=grouped)
        parsed = HfArgumentParser(Seq2SeqTrainingArguments).parse_args_into_dataclasses(
            command[2:], return_remaining_strings=True
        )[0]
        assert parsed.train_sampling_strategy == strategy
    chosen = end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--sides", "marian-grouped, vanilla"])
    assert chosen.sides == ["marian-grouped", "vanilla"]
    with pytest.raises(SystemExit):
        end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--sides", "marian,ours"])


def test_tokens_per_second_counts_the_targets_as_trained(tmp_path):
    from vanilla_transformer.training.tokenizer import train_tokenizer

    pairs = [{"en": f"number {i}", "fr": "nombre " + " ".join(["un"] * (i % 7))} for i in range(30)]
    args = end_to_end.parse_arguments(["--data_dir", str(tmp_path), "--output_dir", str(tmp_path / "out")])
    tokenizer = train_tokenizer((t for p in pairs for t in p.values()), vocab_size=300)
    tokenizer.save_pretrained(tmp_path / "out" / "tokenizer")
    expected = sum(len(tokenizer(text_target=p["fr"])["input_ids"]) for p in pairs) / len(pairs)
    assert end_to_end.mean_target_tokens(args, json.loads(json.dumps(pairs))) == pytest.approx(expected)
    assert expected > 2  # eos included, and targets of several tokens
