#!/usr/bin/env python
"""Train one joint source+target byte-level BPE tokenizer on the training split and save it as a
PreTrainedTokenizerFast (`AutoTokenizer.from_pretrained(output_dir)` loads it). Special tokens: <pad>=0, <s>=1, </s>=2,
<unk>=3, the ids of VanillaTransformerConfig's defaults.

    python scripts/train_tokenizer.py --train_file train.jsonl --source_lang de --target_lang en \
        --vocab_size 37000 --output_dir tokenizers/de-en

With no data arguments it trains on the built-in German->English demo corpus. scripts/train.py trains one itself
when given no --tokenizer_name; this script is for sharing one tokenizer between runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from vanilla_transformer.training.data import DataArguments, DataError, select_samples
from vanilla_transformer.training.tokenizer import iterate_texts, train_tokenizer

# Data flags that name other splits: the tokenizer learns from the training split only
NOT_USED = ("validation_file", "test_file", "max_eval_samples", "max_predict_samples")


@dataclass
class TokenizerArguments:
    output_dir: str = field(metadata={"help": "Where to save the tokenizer (tokenizer.json, tokenizer_config.json)."})
    vocab_size: int = field(
        default=37000, metadata={"help": "Vocabulary size, special tokens and 256 bytes included (the paper: 37000)."}
    )
    min_frequency: int = field(default=2, metadata={"help": "Merge only pairs seen at least this often."})
    model_max_length: int = field(default=1024, metadata={"help": "The tokenizer's model_max_length."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where `datasets` caches downloaded data."})


def main(argv: list[str] | None = None) -> None:
    args, data_args = HfArgumentParser((TokenizerArguments, DataArguments)).parse_args_into_dataclasses(argv)
    try:
        if unused := [name for name in NOT_USED if getattr(data_args, name) is not None]:
            raise DataError(f"--{unused[0]} is not used: the tokenizer learns from the training split only.")
        raw, source_lang, target_lang = data_args.load(cache_dir=args.cache_dir)
        if "train" not in raw:
            raise DataError(f"the data has no train split (only {list(raw)}).")
        train = select_samples(raw, {"train": data_args.max_train_samples})["train"]
        tokenizer = train_tokenizer(
            iterate_texts(train, source_lang, target_lang),
            vocab_size=args.vocab_size,
            min_frequency=args.min_frequency,
            model_max_length=args.model_max_length,
        )
    except (DataError, ValueError, OSError) as error:
        raise SystemExit(f"train_tokenizer.py: error: {str(error).strip().splitlines()[0]}") from None
    tokenizer.save_pretrained(args.output_dir)
    example = train[0]["translation"][source_lang] if "translation" in train.column_names else train[0][source_lang]
    print(f"trained a {len(tokenizer)}-token BPE tokenizer on {len(train)} {source_lang}-{target_lang} pairs")
    print(f"example: {example!r} -> {tokenizer.tokenize(example)}")
    print(f"saved in {args.output_dir}")


if __name__ == "__main__":
    main(sys.argv[1:])
