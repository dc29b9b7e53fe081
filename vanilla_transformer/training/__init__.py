"""The toolkit's training side: train.py's recipe and everything it uses (and `scripts/average_checkpoints.py`).

- `recipe`: the recipe as a function (`run`, `main`) and its argument dataclasses; `presets`: model presets and their
  training defaults; `arguments`: the paper's recipe as `TranslationTrainingArguments`
- `data`: corpora, the demo corpus, tokenising; `tokenizer`: training a byte-level BPE tokenizer
- `trainer`: the trainer (it evaluates through `inference/`); `batching`: token batches; `time_budget`: the budget
- `checkpoints`: complete checkpoints, averaging; `cpu`: CPUs and threads; `device`: what the device decides by
  default (precision, TF32, token batch, translate.py's dtype)
- `preparation`: training the tokenizer and tokenising once for several processes; `sharding`: the parallelism in
  use; `workarounds/`: one module per limit of a library, and the private overrides

Nothing is imported here, so that importing one module (say `cpu` for translating) loads only what it needs.
"""
