"""Megatron-LM ``tools/preprocess_data.py`` flags that change nothing in ``mf-data preprocess``.

A Megatron command line should run unchanged, but no flag may be silently ignored: each flag
here either warns once (it has no effect on the output, so the run can go on) or is refused
with the reason (honouring it would need something mf-data does not do, and ignoring it would
write something else than the user asked for).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

_SPLIT = ("mf-data does not split sentences (Megatron does it with nltk); give each document "
          "as a JSON list of sentence strings: each becomes one sequence, as in Megatron's "
          "split output")
_USE_HF = ("use --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR (a directory with "
           "tokenizer.json)")
_TOKENIZER_FILES = ("mf-data reads no separate vocabulary files (Megatron's BERT and GPT-2 BPE "
                    f"types read them, or they replace a Hugging Face model's own); {_USE_HF}")
_VOCAB_SIZE = ("it sizes Megatron's Null and TikToken tokenizers, which mf-data does not have; "
               f"{_USE_HF}")

# flag: (argparse keywords, whether a given value is refused, the reason)
FLAGS: dict[str, tuple[dict[str, Any], Callable[[Any], bool], str]] = {
    "--split-sentences": ({"action": "store_true"}, bool, _SPLIT),
    "--keep-newlines": ({"action": "store_true"}, lambda value: False,
                        "it only affects --split-sentences; the text is tokenized as it is, "
                        "newlines included"),
    "--lang": ({"metavar": "LANG"}, lambda value: False,
               "it only selects the sentence splitter's language"),
    "--partitions": ({"type": int, "metavar": "N"}, lambda value: value != 1,
                     "not supported, use --workers (partitions split the input into files "
                     "that are merged at the end; --workers gives the parallelism and the "
                     "same output)"),
    "--keep-sequential-samples": ({"action": "store_true"}, lambda value: False,
                                  "documents always keep the input's order"),
    "--log-interval": ({"type": int, "metavar": "N"}, lambda value: False,
                       "progress goes to stderr every 5 seconds (--quiet turns it off)"),
    "--dataset-impl": ({"metavar": "IMPL"}, lambda value: value != "mmap",
                       "mf-data writes the mmap format (.bin/.idx) only, the one current "
                       "Megatron reads"),
    "--vocab-file": ({"metavar": "FILE"}, lambda value: True, _TOKENIZER_FILES),
    "--merge-file": ({"metavar": "FILE"}, lambda value: True, _TOKENIZER_FILES),
    "--vocab-size": ({"type": int, "metavar": "N"}, lambda value: True, _VOCAB_SIZE),
    "--rank": ({"type": int, "metavar": "N"}, lambda value: False,
               "Megatron's preprocessing does not use it either"),
    "--make-vocab-size-divisible-by": ({"type": int, "metavar": "N"}, lambda value: False,
                                       "vocabulary padding matters to the model, not to the "
                                       "token files"),
    "--tensor-model-parallel-size": ({"type": int, "metavar": "N"}, lambda value: False,
                                     "vocabulary padding matters to the model, not to the "
                                     "token files"),
}


def _dest(flag: str) -> str:
    return "megatron_" + flag.lstrip("-").replace("-", "_")


def add_megatron_flags(parser: argparse.ArgumentParser) -> None:
    """Register the flags of ``FLAGS`` in their own help group (all default to unset)."""
    group = parser.add_argument_group(
        "Megatron preprocess_data.py flags mf-data does not honour",
        "accepted so that a Megatron command runs unchanged: each warns once, or is refused "
        "with the reason when it would change the output")
    for flag, (keywords, _, reason) in FLAGS.items():
        group.add_argument(flag, dest=_dest(flag), default=None, help=reason, **keywords)


def check_megatron_flags(args: argparse.Namespace, warn: Callable[[str], None]) -> str | None:
    """Warn once for each given flag that changes nothing; the first refusal's message (None:
    every given flag can be let through)."""
    for flag, (_, refused, reason) in FLAGS.items():
        value = getattr(args, _dest(flag))
        if value is None or value is False:
            continue
        shown = flag if value is True else f"{flag} {value}"
        if refused(value):
            return f"{shown}: {reason}"
        warn(f"{shown} has no effect: {reason}")
    return None
