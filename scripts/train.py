#!/usr/bin/env python
"""Train, evaluate and save a translation model with the paper's recipe (Vaswani et al., 2017, §5).

With no data arguments it trains the `small` preset on the built-in German->English number-words corpus and reports
test BLEU, chrF and exact match in a few minutes on a CPU:

    python scripts/train.py --output_dir outputs/demo

Your own data (JSON lines with {"translation": {"de": ..., "en": ...}}, TSV with a header of language codes, or a Hub
dataset) trains the `compact` preset by default, for as long as you give it (or 3 epochs):

    python scripts/train.py --train_file train.jsonl --validation_file dev.jsonl --test_file test.jsonl \
        --source_lang de --target_lang en --output_dir outputs/de-en --max_train_minutes 30
    python scripts/train.py --preset base --dataset_name wmt16 --dataset_config_name de-en --source_lang de \
        --target_lang en --output_dir outputs/wmt16 --max_steps 100000 --save_steps 1000 --save_total_limit 5

Several processes or GPUs (on a CPU-only machine the processes join a gloo group; FSDP2 shards on GPUs only):

    accelerate launch --multi_gpu --num_processes 2 scripts/train.py --output_dir outputs/demo-ddp
    accelerate launch --use_fsdp --fsdp_version 2 --num_processes 2 --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP \
        --fsdp_transformer_layer_cls_to_wrap EncoderLayer,DecoderLayer --fsdp_state_dict_type FULL_STATE_DICT \
        scripts/train.py --output_dir outputs/demo-fsdp

The start-up line names the parallelism in use (single process, DDP, FSDP2); docs/training.md has the details.

Every flag of transformers' Seq2SeqTrainingArguments is accepted (see --help); the paper's optimiser, schedule and label
smoothing are the defaults, and a preset supplies a learning rate, warmup and batch size unless given. When none of
--do_train/--do_eval/--do_predict is given, all three run for the splits that exist. The arguments may also come from
one JSON file: `python scripts/train.py args.json`.
"""

from vanilla_transformer.training.recipe import main

if __name__ == "__main__":
    main()
