"""The toolkit's training side: everything `scripts/train.py` and `scripts/average_checkpoints.py` use.

- `presets`: model presets and their training defaults; `arguments`: the recipe as `TranslationTrainingArguments`
- `data`: corpora, the demo corpus, tokenising; `tokenizer`: training a byte-level BPE tokenizer
- `trainer`: the trainer and its metrics; `batching`: token batches; `time_budget`: --max_train_minutes
- `checkpoints`: complete checkpoints, loading a trained model, averaging; `cpu`: CPUs and threads
- `sharding`: FSDP and DDP on CPU processes; `workarounds/`: one module per limit of a library

Nothing is imported here, so that importing one module (say `cpu` for translating) loads only what it needs.
"""
