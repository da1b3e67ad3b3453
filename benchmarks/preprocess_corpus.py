"""The corpus and tokenizer that mf-data's and Megatron's preprocessing are compared on.

Real English: the Python documentation's help topics (``pydoc_data.topics``, about 465 KB, in
every CPython), one JSON line per topic with three keys: ``text`` (the topic), ``title`` (its
name) and ``paragraphs`` (the topic as a list of paragraphs: one sequence each, like Megatron's
sentence-split output, with empty strings where blank lines were, which tokenize to nothing).
The corpus repeats the topics ``copies`` times (in a shuffled order per copy, fixed seed) to
make it larger. The tokenizer is a byte-level BPE trained on the topics with the ``tokenizers``
library (no download), saved as a Hugging Face model directory whose eos token is ``</s>``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from pydoc_data.topics import topics

EOS = "</s>"


def write_corpus(path: Path, copies: int = 1, seed: int = 1234) -> int:
    """Write the corpus; returns its documents."""
    names = sorted(topics)
    order = random.Random(seed)
    documents = 0
    with open(path, "w", encoding="utf-8") as out:
        for _ in range(copies):
            order.shuffle(names)
            for name in names:
                text = topics[name].strip()
                out.write(json.dumps({"text": text, "title": name,
                                      "paragraphs": text.split("\n\n")}) + "\n")
                documents += 1
        out.write(json.dumps({"text": "", "title": "", "paragraphs": []}) + "\n")
    return documents + 1


def train_tokenizer(path: Path, vocab_size: int = 8000) -> Path:
    """A byte-level BPE trained on the topics, saved as ``path`` (a tokenizer.json)."""
    import tokenizers

    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    bpe.train_from_iterator(
        (topics[name] for name in sorted(topics)),
        tokenizers.trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=["<unk>", EOS],
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    bpe.save(str(path))
    return path
