"""Token-based batching: batches bounded by padded tokens, every pair once per epoch across ranks, a new
order each epoch, and a Seq2SeqTrainer that trains with it, with gradient accumulation, on one and on two processes.

Run as a script (``torchrun --nproc_per_node 2 tests/test_batching.py OUT``) this file is the worker of the
two-process test.
"""

import json
import os
import random
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import load_script, tiny_model, word_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.arguments import TranslationTrainingArguments
from vanilla_transformer.training.batching import (
    TokenBatchingSeq2SeqTrainer,
    TokenBatchSampler,
    pack_by_tokens,
    padding_efficiency,
    sentence_batches,
    sequence_lengths,
)
from vanilla_transformer.training.trainer import build_trainer

WORDS = [f"w{i}" for i in range(24)]


def tokenized_pairs(tokenizer, count: int, seed: int = 0) -> list[dict]:
    """`count` pairs with distinct sources of 1-14 words (so a pair is known by its input_ids); the target is the
    source reversed, sometimes with a word more."""
    rng = random.Random(seed)
    sources = set()
    while len(sources) < count:
        sources.add(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 14))))
    pairs = []
    for source in sorted(sources):
        target = " ".join(reversed(source.split())) + (" w0" if rng.random() < 0.5 else "")
        pairs.append({"input_ids": tokenizer(source)["input_ids"], "labels": tokenizer(target)["input_ids"]})
    return pairs


class RecordingCollator(DataCollatorForSeq2Seq):
    """DataCollatorForSeq2Seq that remembers the pairs (by source ids) and the padded shapes of every batch."""

    def __call__(self, features, return_tensors=None):
        batch = super().__call__(features, return_tensors)
        self.seen.append([tuple(f["input_ids"]) for f in features])
        self.shapes.append((tuple(batch["input_ids"].shape), tuple(batch["labels"].shape)))
        return batch


def recording_collator(tokenizer) -> RecordingCollator:
    collator = RecordingCollator(tokenizer, label_pad_token_id=-100)
    collator.seen, collator.shapes = [], []
    return collator


def model_for(tokenizer) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(0)
    return tiny_model(vocab_size=len(tokenizer), encoder_attention_heads=2, decoder_attention_heads=2)


def training_args(output_dir, **overrides) -> Seq2SeqTrainingArguments:
    values = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return Seq2SeqTrainingArguments(**values)


# --------------------------------------------------------------------------------------------------------------------
# The sampler
# --------------------------------------------------------------------------------------------------------------------


def padded(batch, lengths, multiple=None) -> int:
    longest = max(lengths[i] for i in batch)
    if multiple:
        longest = -(-longest // multiple) * multiple
    return len(batch) * longest


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=3, max_size=120),
    max_tokens=st.integers(48, 400),
    num_replicas=st.integers(1, 3),
    multiple=st.sampled_from([None, 8]),
    seed=st.integers(0, 3),
)
def test_every_pair_once_per_epoch_across_ranks_within_the_bound(lengths, max_tokens, num_replicas, multiple, seed):
    source, target = [s for s, _ in lengths], [t for _, t in lengths]
    packed = len(pack_by_tokens(source, target, max_tokens, seed, pad_to_multiple_of=multiple))
    # equal shares without repeats need at least as many pairs as the next multiple of num_replicas
    repeats_unavoidable = -(-packed // num_replicas) * num_replicas > len(lengths)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samplers = [
            TokenBatchSampler(
                source, target, max_tokens, seed, num_replicas=num_replicas, rank=r, pad_to_multiple_of=multiple
            )
            for r in range(num_replicas)
        ]
    assert bool(caught) == repeats_unavoidable
    for epoch in (0, 1):
        seen = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            batches = list(sampler)
            assert len(batches) == len(sampler) == len(samplers[0])  # equal counts: no rank waits for the others
            for batch in batches:
                assert batch, "empty batch"
                assert padded(batch, source, multiple) <= max_tokens
                assert padded(batch, target, multiple) <= max_tokens
            seen += [i for batch in batches for i in batch]
        if repeats_unavoidable:  # a tiny dataset: every pair still comes, fewer than num_replicas batches twice
            assert set(seen) == set(range(len(lengths)))
            assert len(samplers[0]) * num_replicas - packed < num_replicas
        else:
            assert sorted(seen) == list(range(len(lengths)))  # none lost, none twice


def test_two_ranks_get_distinct_batches_and_pairs_are_grouped_by_length():
    rng = random.Random(1)
    source = [rng.randint(1, 60) for _ in range(500)]
    target = [max(1, s + rng.randint(-5, 5)) for s in source]
    ranks = [TokenBatchSampler(source, target, 600, seed=3, num_replicas=2, rank=r) for r in (0, 1)]
    batches = [list(sampler) for sampler in ranks]
    assert len(batches[0]) == len(batches[1]) > 10
    assert not {tuple(b) for b in batches[0]} & {tuple(b) for b in batches[1]}
    # length grouping: within a batch, sources differ by little (they would span ~60 tokens at random)
    spreads = [max(source[i] for i in b) - min(source[i] for i in b) for b in batches[0] + batches[1]]
    assert sum(spreads) / len(spreads) < 3


def test_order_changes_each_epoch_and_the_seed_reproduces_it():
    rng = random.Random(2)
    source = [rng.randint(1, 30) for _ in range(300)]
    target = [rng.randint(1, 30) for _ in range(300)]

    def epoch_batches(seed, epoch):
        sampler = TokenBatchSampler(source, target, 200, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    first, second = epoch_batches(0, 0), epoch_batches(0, 1)
    assert first != second
    assert sorted(first) == sorted(second)  # same batches (as in fairseq), in a new order
    assert epoch_batches(0, 1) == second  # same seed and epoch: same order, in any process
    assert epoch_batches(1, 0) != first
    unshuffled = TokenBatchSampler(source, target, 200, shuffle=False)
    unshuffled.set_epoch(5)
    assert [max(source[i] for i in b) for b in unshuffled] == sorted(max(source[i] for i in b) for b in unshuffled)


def test_padding_efficiency_counts_real_over_padded_tokens():
    # one batch of source lengths 2 and 4 pads to 2 x 4 = 8 tokens holding 6 real ones
    assert padding_efficiency([[0, 1]], [2, 4]) == {"source": 0.75, "total": 0.75}
    result = padding_efficiency([[0, 1], [2]], [2, 4, 3], [5, 5, 1], pad_to_multiple_of=4)
    assert result["source"] == pytest.approx(9 / (8 + 4))
    assert result["target"] == pytest.approx(11 / (16 + 4))  # 5 rounds up to 8
    assert result["total"] == pytest.approx(20 / 32)

    rng = random.Random(0)
    source = [rng.choice([2, 3, 5, 8, 13, 21, 34]) for _ in range(2000)]
    target = [max(1, s + rng.randint(-3, 3)) for s in source]
    token = padding_efficiency(pack_by_tokens(source, target, 1024), source, target)["total"]
    sentence = padding_efficiency(sentence_batches(len(source), 64), source, target)["total"]
    assert token > 0.9 and sentence < 0.5


def test_lengths_are_read_through_a_selection_of_the_dataset():
    import datasets

    rows = {"input_ids": [[5] * n for n in (3, 1, 4, 1, 5)], "labels": [[6] * n for n in (2, 7, 1, 8, 2)]}
    dataset = datasets.Dataset.from_dict(rows).select([4, 0, 2])  # an indices mapping, as filter() leaves
    assert sequence_lengths(dataset) == ([5, 3, 4], [2, 2, 1])
    assert sequence_lengths(dataset.remove_columns("labels")) == ([5, 3, 4], None)
    assert sequence_lengths([{"input_ids": [1, 2]}, {"input_ids": [3]}]) == ([2, 1], None)


def test_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="Sentence pair 1 has 30 source and 3 target tokens.*max_tokens=20"):
        TokenBatchSampler([3, 30], [3, 3], max_tokens=20)
    with pytest.raises(ValueError, match="padded to 24"):
        TokenBatchSampler([3, 17], [3, 3], max_tokens=20, pad_to_multiple_of=8)
    with pytest.raises(ValueError, match="max_tokens=0 is invalid"):
        TokenBatchSampler([3], [3], max_tokens=0)
    with pytest.raises(ValueError, match="target_lengths has 1 entries but source_lengths has 2"):
        TokenBatchSampler([3, 4], [3], max_tokens=20)
    with pytest.warns(UserWarning, match="2 sentence pairs make 1 batches.*among 3 processes.*2 batch"):
        ranks = [TokenBatchSampler([3, 4], [3, 4], max_tokens=20, num_replicas=3, rank=r) for r in range(3)]
    assert [list(sampler) for sampler in ranks] == [[[0, 1]]] * 3  # every rank still gets a batch
    with pytest.raises(ValueError, match="rank=2 is invalid"):
        TokenBatchSampler([3, 4], [3, 4], max_tokens=20, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="max_tokens_per_batch=-5 is invalid"):
        TokenBatchingSeq2SeqTrainer(max_tokens_per_batch=-5)


# --------------------------------------------------------------------------------------------------------------------
# With Seq2SeqTrainer
# --------------------------------------------------------------------------------------------------------------------


def test_trainer_trains_on_token_batches_with_gradient_accumulation(tmp_path, one_thread):
    import datasets

    tokenizer = word_tokenizer(WORDS)
    pairs = tokenized_pairs(tokenizer, 70)
    collator = recording_collator(tokenizer)
    max_tokens = 48
    trainer = TokenBatchingSeq2SeqTrainer(
        model=model_for(tokenizer),
        args=training_args(tmp_path, gradient_accumulation_steps=2, num_train_epochs=2),
        train_dataset=datasets.Dataset.from_list(pairs),
        data_collator=collator,
        max_tokens_per_batch=max_tokens,
    )
    batches_per_epoch = len(trainer.get_train_dataloader())
    result = trainer.train()

    assert trainer.state.global_step == 2 * -(-batches_per_epoch // 2)  # ceil: the last step may take one batch
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert len(collator.seen) == 2 * batches_per_epoch
    # what the model was fed: padded tensors within the bound on both sides
    for source_shape, target_shape in collator.shapes:
        assert source_shape[0] * source_shape[1] <= max_tokens and target_shape[0] * target_shape[1] <= max_tokens
    everyone = sorted(tuple(p["input_ids"]) for p in pairs)
    epochs = [collator.seen[:batches_per_epoch], collator.seen[batches_per_epoch:]]
    for epoch in epochs:
        assert sorted(source for batch in epoch for source in batch) == everyone
    assert epochs[0] != epochs[1]  # shuffled by batch each epoch
    # more pairs per batch than the 4 of per_device_train_batch_size where sentences are short
    assert max(len(batch) for batch in collator.seen) > 4

    # without max_tokens_per_batch it is the plain Seq2SeqTrainer
    plain = TokenBatchingSeq2SeqTrainer(
        model=model_for(tokenizer), args=training_args(tmp_path), train_dataset=pairs, data_collator=collator
    )
    assert len(plain.get_train_dataloader()) == -(-len(pairs) // 4)


def test_the_budget_reaches_the_sampler_by_one_route(tmp_path):
    """The trainer's keyword alone decides the token budget: build_trainer passes the arguments'
    --max_tokens_per_batch to it, and the training arguments are not read a second time."""
    tokenizer = word_tokenizer(WORDS)
    pairs = tokenized_pairs(tokenizer, 30)
    args = TranslationTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_tokens_per_batch=32)
    trainer = build_trainer(model_for(tokenizer), args, tokenizer, train_dataset=pairs)
    assert trainer.max_tokens_per_batch == 32
    loader = trainer.get_train_dataloader()
    assert isinstance(loader.batch_sampler, TokenBatchSampler) and loader.batch_sampler.max_tokens == 32
    plain = TokenBatchingSeq2SeqTrainer(model=model_for(tokenizer), args=args, train_dataset=pairs)
    assert plain.max_tokens_per_batch is None  # without the keyword: sentence batches
    with pytest.raises(ValueError, match="max_tokens_per_batch=0 is invalid"):
        TokenBatchingSeq2SeqTrainer(model=model_for(tokenizer), args=args, train_dataset=pairs, max_tokens_per_batch=0)


def test_token_batching_pads_less_than_sentence_batching_on_the_demo_corpus():
    # the validation split (500 pairs) keeps this quick; docs/training.md's figures are from the training split
    script = load_script("padding_efficiency")
    rows = script.main(["--split", "validation", "--batch_size", "32", "64", "--max_tokens_per_batch", "256", "512"])
    sentence = [row for row in rows if row["batching"].startswith("sentences")]
    token = [row for row in rows if row["batching"].startswith("tokens")]
    assert len(sentence) == len(token) == 2
    assert min(row["total"] for row in token) > max(row["total"] for row in sentence)
    assert min(row["total"] for row in token) > 0.9


@pytest.mark.distributed
def test_two_processes_see_every_pair_once_per_epoch(tmp_path):
    """A real 2-process run (torchrun, gloo on CPU): accelerate prepares the loader, our sampler takes over its
    sharding, and both ranks train with gradient accumulation."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    completed = subprocess.run(
        [*command, os.path.abspath(__file__), str(tmp_path)], env=env, capture_output=True, text=True, timeout=180
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    per_rank = ranks[0]["batches_per_epoch"]
    assert per_rank == ranks[1]["batches_per_epoch"] > 1
    assert ranks[0]["packed"] % 2 == 1 and 2 * per_rank == ranks[0]["packed"] + 1  # evened out by one halving
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 2 * -(-per_rank // 2)
    everyone = sorted(tuple(ids) for ids in ranks[0]["all_sources"])
    for epoch in (0, 1):
        batches = [r["seen"][epoch * per_rank : (epoch + 1) * per_rank] for r in ranks]
        assert all(len(b) == per_rank for b in batches)
        seen = [tuple(source) for rank_batches in batches for batch in rank_batches for source in batch]
        assert sorted(seen) == everyone  # every pair once per epoch, on one of the two ranks
        assert not {tuple(map(tuple, b)) for b in batches[0]} & {tuple(map(tuple, b)) for b in batches[1]}
    for r in ranks:
        assert all(s * t <= 40 and u * v <= 40 for (s, t), (u, v) in r["shapes"])
        assert r["resumed_epoch"] == 3 and r["resumed_batches"] == r["epoch3_batches"][1:]


def _distributed_worker(output_dir: str) -> None:
    from accelerate import skip_first_batches

    tokenizer = word_tokenizer(WORDS)
    pairs = tokenized_pairs(tokenizer, 63)  # they pack into 19 batches: one must be halved for 2 equal shares
    collator = recording_collator(tokenizer)
    trainer = TokenBatchingSeq2SeqTrainer(
        model=model_for(tokenizer),
        args=training_args(output_dir, gradient_accumulation_steps=2, num_train_epochs=2, ddp_timeout=30),
        train_dataset=pairs,
        data_collator=collator,
        max_tokens_per_batch=40,
    )
    trainer.train()
    seen, shapes = collator.seen, collator.shapes

    # resuming mid-epoch: Trainer skips the first batches, then sets the epoch as _run_epoch does
    loader = trainer.get_train_dataloader()
    sampler = loader.batch_sampler.batch_sampler  # accelerate's BatchSamplerShard wraps ours
    sampler.set_epoch(3)
    epoch3 = list(sampler)
    sampler.set_epoch(0)
    resumed = skip_first_batches(loader, 1)
    resumed.set_epoch(3)
    underlying = getattr(getattr(resumed, "batch_sampler", None), "batch_sampler", None)
    if hasattr(underlying, "set_epoch"):
        underlying.set_epoch(3)
    collator.seen = []
    for _ in resumed:
        pass
    index = {tuple(p["input_ids"]): i for i, p in enumerate(pairs)}
    resumed_batches = [[index[source] for source in batch] for batch in collator.seen]

    rank = trainer.args.process_index
    record = {
        "world_size": trainer.args.world_size,
        "global_step": trainer.state.global_step,
        "batches_per_epoch": len(loader),
        "seen": seen,
        "shapes": shapes,
        "all_sources": [p["input_ids"] for p in pairs],
        "packed": len(pack_by_tokens(*sequence_lengths(pairs), max_tokens=40, seed=trainer.args.seed)),
        "resumed_epoch": sampler.epoch,
        "resumed_batches": resumed_batches,
        "epoch3_batches": epoch3,
    }
    with open(os.path.join(output_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    _distributed_worker(sys.argv[1])
