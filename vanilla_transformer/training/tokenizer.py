"""One joint source+target BPE vocabulary (§5.1 of the paper shares it between the languages), trained with `tokenizers`
and wrapped as a `PreTrainedTokenizerFast`.

Byte-level BPE: the pre-tokenizer maps every byte to a printable symbol and the decoder maps it back, so
`decode(encode(s)) == s` for any string (accents, German compounds, several spaces), and no character is ever
unknown because the 256 byte symbols are always in the vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from ..inference.loading import check_tokenizer_matches_config  # noqa: F401  (moved there; imported from here too)

# In id order: the ids match VanillaTransformerConfig's defaults (pad 0, bos = decoder start 1, eos 2) and unk is 3.
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
SPECIAL_TOKEN_IDS = {"pad_token": 0, "bos_token": 1, "eos_token": 2, "unk_token": 3}


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2, model_max_length: int = 1024
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` (source and target sentences together).

    The encoder input and the target both end with `</s>`; the decoder's start token `<s>` is prepended by the model
    when it shifts the labels right, so the tokenizer does not add it.
    """
    minimum = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < minimum:
        raise ValueError(f"vocab_size={vocab_size} is too small; byte-level BPE needs at least {minimum} entries.")
    if min_frequency < 1:
        raise ValueError(f"min_frequency={min_frequency} must be at least 1.")

    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    # add_prefix_space=False: a sentence's first word is encoded as written, so decoding adds no leading space
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    eos = SPECIAL_TOKENS["eos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A {eos} $B {eos}", special_tokens=[(eos, tokenizer.token_to_id(eos))]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,  # the clean-up would rewrite " ," and " 's" and break round trips
        **SPECIAL_TOKENS,
    )
    check_special_tokens(wrapped)
    return wrapped


def check_special_tokens(tokenizer, expected: dict[str, int] | None = None, where: str = "the tokenizer") -> None:
    """Raise a one-line ValueError unless the tokenizer's special-token ids are `expected` (default: 0, 1, 2, 3)."""
    expected = SPECIAL_TOKEN_IDS if expected is None else expected
    for name, want in expected.items():
        have = getattr(tokenizer, f"{name}_id", None)
        if have != want:
            raise ValueError(f"{where} has {name}_id={have}, but {want} is required.")


def iterate_texts(dataset, source_lang: str, target_lang: str, batch_size: int = 1000) -> Iterator[list[str]]:
    """Batches of sentences of both languages from a `datasets.Dataset`, for `train_tokenizer`."""
    from .data import sentence_pairs

    for start in range(0, len(dataset), batch_size):
        sources, targets = sentence_pairs(dataset[start : start + batch_size], source_lang, target_lang)
        yield [s for s in sources if s] + [t for t in targets if t]
