"""A small Qwen3 and its two pipeline parts: the model the pipeline-part and Hugging Face
streaming tests (test_model_parts.py, test_hf_streaming.py) build, whole or one stage's part."""

from __future__ import annotations

from mf_config import ModelConfig
from mf_train.models import ModelPart, build_model

SIZES = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
         "max_position_embeddings": 16, "tie_word_embeddings": True}
"""4 layers, 4 heads of 8, 2 key/value heads, tied embeddings."""
PARTS = [ModelPart((0, 2), embedding=True, head=False), ModelPart((1, 3), embedding=False,
                                                                  head=True)]
"""Two stages of two virtual stages each: layers 0 and 2 with the embedding, 1 and 3 with the
head."""


def qwen3_model(part: ModelPart | None = None, seed: int = 7):
    """The `SIZES` Qwen3 with weights from `seed`: whole, or only `part` of it."""
    return build_model(ModelConfig(model_type="qwen3", extras=SIZES), seed=seed, part=part)
