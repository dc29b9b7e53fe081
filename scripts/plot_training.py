#!/usr/bin/env python
"""Draw a run's training loss, validation loss and validation BLEU against optimizer steps.

    python scripts/plot_training.py --trainer_state outputs/demo --output outputs/demo/training_curves.png

--trainer_state takes a trainer_state.json, a checkpoint-N folder, or a run's output folder (its trainer_state.json,
else its latest checkpoint's). For live curves, train with --report_to tensorboard and run
`tensorboard --logdir OUTPUT_DIR/runs`. Needs matplotlib: pip install 'vanilla-transformer[plot]'.
"""

import argparse
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from vanilla_transformer.plots.plotting import find_trainer_state, load_log_history, plot_training_curves


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


@dataclass
class PlotTrainingArguments:
    trainer_state: str = field(
        metadata={"help": "A trainer_state.json, a checkpoint-N folder, or the run's output folder."}
    )
    output: str = field(
        default="outputs/training_curves.png", metadata={"help": "The PNG to write; folders are created."}
    )


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser(PlotTrainingArguments, description=__doc__, formatter_class=HelpFormatter)
    (args,) = parser.parse_args_into_dataclasses(args=argv)
    try:
        state_path = find_trainer_state(args.trainer_state)
        curves = plot_training_curves(load_log_history(state_path), args.output)
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))

    print(f"read {state_path}")
    print(f"{'curve':<16} {'points':>6} {'last step':>9} {'last':>8} {'best':>8}")
    for name, (steps, values) in curves.items():
        if steps:
            best = max(values) if "BLEU" in name else min(values)
            print(f"{name:<16} {len(steps):>6} {steps[-1]:>9} {values[-1]:>8.3f} {best:>8.3f}")
        else:
            print(f"{name:<16} {0:>6} {'-':>9} {'-':>8} {'-':>8}")
    print(f"wrote {args.output}")
    return curves


if __name__ == "__main__":
    main()
