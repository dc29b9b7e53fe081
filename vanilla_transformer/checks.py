"""The validation helpers the scripts share, in one place to import from.

Each check raises a one-line ValueError naming the problem before any work is done:

- ``check_tokenizer_matches_config(tokenizer, config)``: the tokenizer's pad, bos (= decoder start) and eos ids equal
  the config's and all its ids fit the embedding (a mismatch trains and generates without error, but wrongly);
- ``check_checkpoint(folder)`` / ``last_complete_checkpoint(output_dir)``: a training checkpoint was completely
  written before it is resumed from.
"""

from .checkpointing import check_checkpoint, checkpoint_problem, last_complete_checkpoint
from .tokenizer import check_tokenizer_matches_config

__all__ = ["check_checkpoint", "check_tokenizer_matches_config", "checkpoint_problem", "last_complete_checkpoint"]
