"""`mf-train generate --checkpoint DIR (--prompt TEXT | --prompt-file FILE | --prompt-ids IDS)
[--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tokenizer PATH]
[--no-cache] [--config FILE] [--set KEY=VALUE ...]`: text (or token ids) from a checkpoint's
model on this process (`generation`). A text prompt is encoded with the tokenizer (a Hugging
Face `tokenizer.json` or a directory holding one; by default the byte-level tokenizer the demo
corpus is made with) and the completion printed as text after it; `--prompt-ids` prints the
new ids. Bad input exits with status 2 and one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

COMMAND = "generate"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"mf-train {COMMAND}", description="Continue a prompt with the model of an mf "
        "checkpoint or a Hugging Face directory, on this process.")
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="an mf save root (its newest complete iteration), one "
                             "iteration_XXXXXXXX directory, or a Hugging Face directory")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", help="the text to continue")
    prompt.add_argument("--prompt-file", metavar="FILE", help="a UTF-8 file holding the text")
    prompt.add_argument("--prompt-ids", metavar="IDS",
                        help="token ids to continue, comma- or space-separated; the new "
                             "ids are printed")
    parser.add_argument("--max-new-tokens", type=int, default=32, metavar="N",
                        help="at most this many new tokens (default 32)")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T",
                        help="0 (default): greedy; above 0: sample at this temperature")
    parser.add_argument("--top-k", type=int, default=0, metavar="K",
                        help="sample from the K most likely tokens (default 0: all)")
    parser.add_argument("--top-p", type=float, default=1.0, metavar="P",
                        help="sample from the most likely tokens whose probability reaches "
                             "P (default 1: all)")
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed (default 0)")
    parser.add_argument("--tokenizer", default=None, metavar="PATH",
                        help="a Hugging Face tokenizer.json or a directory holding one "
                             "(default: the byte-level tokenizer, end of document 256)")
    parser.add_argument("--eod", type=int, default=None, metavar="ID",
                        help="stop at this id (default: the tokenizer's end of document)")
    parser.add_argument("--no-cache", action="store_true",
                        help="run the whole sequence for every token (no key/value cache)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="an mf checkpoint's train.yaml (default: the one saved with it)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a value of that configuration")
    return parser


def _prompt_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"--prompt-ids {text!r}: give integers separated by commas or "
                         "spaces") from None


def main(argv: Sequence[str]) -> int:
    """Entry point of `mf-train generate`."""
    args = _parser().parse_args(argv)
    from mf_data.errors import DataError
    from mf_data.text_tokenizer import load_tokenizer

    from ..export.generation import GenerateError, Sampling  # MindSpore

    sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
    problems = sampling.problems() + ([f"--max-new-tokens must be >= 1, got "
                                       f"{args.max_new_tokens}"]
                                      if args.max_new_tokens < 1 else [])
    try:
        if problems:
            raise GenerateError(problems[0])
        tokenizer = load_tokenizer(args.tokenizer)
        if args.prompt_ids is not None:
            prompt = _prompt_ids(args.prompt_ids)
        else:
            text = (args.prompt if args.prompt is not None
                    else Path(args.prompt_file).read_text(encoding="utf-8"))
            prompt = tokenizer.encode(text)
        return _generate(args, prompt, sampling, tokenizer)
    except (GenerateError, DataError, ValueError, OSError) as exc:
        print(f"mf-train {COMMAND}: {exc}", file=sys.stderr)
        return 2


def _generate(args: argparse.Namespace, prompt: list[int], sampling, tokenizer) -> int:
    import mindspore as ms

    from ..export.generation import caches, generate, load_model

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.runtime.launch_blocking()  # faster on CPU (trainer.launch_synchronously_on_cpu)
    model = load_model(args.checkpoint, args.config, args.overrides)
    if not args.no_cache and not caches(model):
        print(f"mf-train {COMMAND}: {type(model).__name__} has no key/value cache here; each "
              "token runs the whole sequence", file=sys.stderr)
    if model.settings.vocab_size < tokenizer.vocab_size and args.prompt_ids is None:
        raise ValueError(f"the tokenizer ({tokenizer.name}) has {tokenizer.vocab_size} ids, "
                         f"more than the model's vocabulary ({model.settings.vocab_size}): "
                         "give the tokenizer the model was trained with (--tokenizer)")
    eod = tokenizer.eod if args.eod is None else args.eod
    new = generate(model, prompt, args.max_new_tokens, sampling, eod,
                   use_cache=not args.no_cache)
    if args.prompt_ids is not None:
        print(" ".join(map(str, new)))
    else:
        print(tokenizer.decode(prompt) + tokenizer.decode(new))
    return 0
