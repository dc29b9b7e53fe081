"""The model learns: overfitting, Seq2SeqTrainer, and the classic from-scratch demos."""

import pytest
import torch
from conftest import tiny_config, word_tokenizer
from datasets import Dataset
from transformers import (
    DataCollatorForSeq2Seq,
    GenerationConfig,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerForSequenceClassification,
)

PAD, BOS, EOS = 0, 1, 2


def reverse_task(n: int = 64, vocab: int = 20, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n made-up pairs: a random sequence of 4-7 symbols and its reverse, each ending in eos, right-padded."""
    generator = torch.Generator().manual_seed(seed)
    sources, targets = [], []
    for _ in range(n):
        length = int(torch.randint(4, 8, (1,), generator=generator))
        symbols = torch.randint(3, vocab, (length,), generator=generator).tolist()
        sources.append(symbols + [EOS])
        targets.append(symbols[::-1] + [EOS])

    def pad(rows: list[list[int]], value: int) -> torch.Tensor:
        width = max(map(len, rows))
        return torch.tensor([row + [value] * (width - len(row)) for row in rows])

    return pad(sources, PAD), pad(targets, -100)


@pytest.mark.slow
def test_tiny_model_overfits_64_pairs_to_exact_match():
    torch.manual_seed(0)
    src, labels = reverse_task()
    config = tiny_config(vocab_size=20, d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, dropout=0.0)
    model = VanillaTransformerForConditionalGeneration(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    mask = src.ne(PAD).long()
    model.train()
    for step in range(400):
        loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 25 == 24 and loss.item() < 0.02:
            break
    model.eval()
    generated = model.generate(input_ids=src, attention_mask=mask, max_new_tokens=labels.shape[1], num_beams=1)
    exact = 0
    for row, target in zip(generated[:, 1:].tolist(), labels.tolist()):
        target = [t for t in target if t != -100]
        exact += row[: len(target)] == target
    assert exact == 64, f"only {exact}/64 reversed exactly (loss {loss.item():.4f})"


@pytest.mark.slow
def test_seq2seq_trainer_with_label_smoothing_accumulation_and_generation(tmp_path):
    words = [str(i) for i in range(10)]
    tokenizer = word_tokenizer(words)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(48):
        seq = [str(int(x)) for x in torch.randint(0, 10, (5,), generator=generator)]
        rows.append({"src": " ".join(seq), "tgt": " ".join(seq[::-1])})
    dataset = Dataset.from_list(rows).map(
        lambda b: tokenizer(b["src"], text_target=b["tgt"]), batched=True, remove_columns=["src", "tgt"]
    )
    config = tiny_config(vocab_size=len(tokenizer))
    model = VanillaTransformerForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, max_new_tokens=8, num_beams=2
    )
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        gradient_accumulation_steps=2,
        label_smoothing_factor=0.1,
        learning_rate=3e-3,
        max_steps=6,
        predict_with_generate=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    batch = collator([dataset[0], dataset[1]])
    assert batch["decoder_input_ids"][0, 0] == BOS  # built from the labels by the model
    trainer = Seq2SeqTrainer(
        model=model, args=args, train_dataset=dataset, eval_dataset=dataset.select(range(16)), data_collator=collator
    )
    before = model.lm_head.weight.detach().clone()
    result = trainer.train()
    assert result.global_step == 6 and torch.isfinite(torch.tensor(result.training_loss))
    assert not torch.equal(before, model.lm_head.weight)
    predictions = trainer.predict(dataset.select(range(16)))
    assert predictions.predictions.shape[0] == 16
    assert "test_loss" in predictions.metrics


def test_classic_demo_separate_vocabularies_shapes():
    """The blog posts' setting: source vocab 8500, target vocab 8000, batch 64, lengths 62 and 26."""
    config = VanillaTransformerConfig(
        vocab_size=8500,
        decoder_vocab_size=8000,
        share_encoder_decoder_embeddings=False,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
    )
    model = VanillaTransformerForConditionalGeneration(config).eval()
    src = torch.randint(3, 8500, (64, 62))
    tgt = torch.randint(3, 8000, (64, 26))
    with torch.no_grad():
        logits = model(input_ids=src, decoder_input_ids=tgt).logits
    assert logits.shape == (64, 26, 8000)
    assert model.lm_head.weight is model.model.decoder.embeddings.embed_tokens.weight
    assert model.model.encoder.embeddings.embed_tokens.weight.shape == (8500, 64)


@pytest.mark.slow
def test_pre_norm_variant_trains():
    torch.manual_seed(0)
    src, labels = reverse_task(32)
    model = VanillaTransformerForConditionalGeneration(tiny_config(vocab_size=20, normalize_before=True))
    assert model.model.encoder.layer_norm is not None and model.model.decoder.layer_norm is not None
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(100):
        loss = model(input_ids=src, attention_mask=src.ne(PAD).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


@pytest.mark.slow
def test_classification_head_learns_a_two_class_toy_task():
    """The "moth" demo: is the token sequence mostly 'a' words (class 1) or mostly 'b' words (class 0)?"""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    n, length = 64, 8
    labels = torch.randint(0, 2, (n,), generator=generator)
    # class 1 draws tokens from [3, 8), class 0 from [8, 13); 25% noise tokens from the other class
    own = torch.where(labels[:, None] == 1, 3, 8) + torch.randint(0, 5, (n, length), generator=generator)
    other = torch.where(labels[:, None] == 1, 8, 3) + torch.randint(0, 5, (n, length), generator=generator)
    ids = torch.where(torch.rand(n, length, generator=generator) < 0.25, other, own)
    ids[:, -1] = EOS
    config = tiny_config(vocab_size=16, num_labels=2)
    model = VanillaTransformerForSequenceClassification(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    for step in range(100):
        out = model(input_ids=ids, labels=labels)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        if step % 10 == 9:
            model.eval()
            with torch.no_grad():
                accuracy = (model(input_ids=ids).logits.argmax(-1) == labels).float().mean().item()
            model.train()
            if accuracy == 1.0:
                break
    assert model.config.problem_type == "single_label_classification"
    assert accuracy == 1.0
