#!/usr/bin/env python
"""Try a trained model in the browser: a local web app that translates what you type by beam search, lists the n best
translations with their scores, and draws the attention behind the chosen one, beside the model's size and the
metrics of its model card.

    python scripts/demo.py --model_dir outputs/demo        # then open http://127.0.0.1:7860
    python scripts/demo.py --model_dir your-name/vanilla-transformer-en-de --port 8000

--model_dir is a saved model folder (scripts/train.py's --output_dir) or a model on the Hub. Nothing is sent anywhere:
Gradio's analytics are off and the page uses the system's fonts. Needs the demo extra: pip install -e ".[demo]".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser

import vanilla_transformer  # noqa: F401  (registers the model with the Auto classes)
from vanilla_transformer.demo.app import build_app, launch_app
from vanilla_transformer.training.cpu import set_cpu_threads


@dataclass
class DemoArguments:
    model_dir: str = field(metadata={"help": "A saved model folder (scripts/train.py's --output_dir) or a Hub id."})
    host: str = field(
        default="127.0.0.1", metadata={"help": "Address to serve on (0.0.0.0: reachable from other machines)."}
    )
    port: int = field(default=7860, metadata={"help": "Port to serve on."})
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, ... (default: a GPU if there is one)."})
    threads: int | None = field(
        default=None, metadata={"help": "CPU threads (default: one per physical core that is idle at start)."}
    )


def main(argv: list[str] | None = None) -> None:
    (args,) = HfArgumentParser(DemoArguments).parse_args_into_dataclasses(args=argv)
    set_cpu_threads(args.threads)
    try:
        app = build_app(args.model_dir, device=args.device)  # a folder that is no checkpoint fails here, not later
    except (ValueError, ImportError) as error:
        raise SystemExit(f"demo.py: error: {str(error).strip().splitlines()[0]}") from None
    print(f"serving {args.model_dir} on http://{args.host}:{args.port} (Ctrl+C stops)", flush=True)
    try:
        launch_app(app, server_name=args.host, server_port=args.port, quiet=True)
    except OSError as error:  # e.g. the port is taken
        raise SystemExit(f"demo.py: error: {str(error).strip().splitlines()[0]}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
