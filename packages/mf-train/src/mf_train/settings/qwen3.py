"""The `model` section of a Qwen3 run: Hugging Face `Qwen3Config` names, checked.

The keys are Hugging Face's `config.json` keys, so a Qwen3 `config.json` maps straight over;
keys that select behaviour the model does not have (sliding windows, rope scaling, attention
dropout, other activations) are rejected, and keys that only matter to inference or to the
tokenizer are accepted and, when written, reported once as having no effect (`no_effect`).

No `from __future__ import annotations` here: cattrs reads the field types at run time.
"""

from typing import Any, Literal

from mf_config.errors import Path
from mf_config.model_shape import ModelSettings, ModelShape, ulysses_heads_problem
from mf_config.sections import MAX_DIMENSION, Dtype, TrainConfig, section, setting

TOKENIZER = "token ids belong to the tokenizer and the data"
LAYER_MODULES = frozenset({
    "input_norm", "attention", "attention.qkv", "attention.q_norm", "attention.k_norm",
    "attention.out", "attention.exchange", "post_norm", "mlp", "mlp.gate_up", "mlp.down"})
"""The sub-modules of a decoder layer, as module lists name them (tests/train/test_qwen3.py
checks them against a built model)."""
DTYPES = "compute_dtype and params_dtype decide"


@section
class Qwen3Settings(ModelSettings):
    """The `model` section of a Qwen3 run: Hugging Face `Qwen3Config` names."""

    vocab_size: int = setting(None, "Vocabulary size (required).", gt=0, le=MAX_DIMENSION)
    hidden_size: int = setting(None, "Model width (required).", gt=0, le=MAX_DIMENSION)
    intermediate_size: int = setting(None, "MLP inner width (required).", gt=0,
                                     le=MAX_DIMENSION)
    num_hidden_layers: int = setting(None, "Decoder layers (required).", gt=0, le=MAX_DIMENSION)
    num_attention_heads: int = setting(None, "Query heads (required).", gt=0, le=MAX_DIMENSION)
    num_key_value_heads: int | None = setting(
        None, "Key/value heads (grouped-query attention); default num_attention_heads.", gt=0,
        le=MAX_DIMENSION)
    head_dim: int | None = setting(
        None, "Width of one head; default hidden_size / num_attention_heads.", gt=0,
        le=MAX_DIMENSION)
    rms_norm_eps: float = setting(1e-6, "Epsilon inside the RMSNorm square root.", gt=0)
    rope_theta: float = setting(10000.0, "Rotary embedding base.", gt=0)
    tie_word_embeddings: bool = setting(False, "Use the embedding table as the output head.")
    max_position_embeddings: int = setting(32768, "Longest sequence the model accepts.", gt=0,
                                           le=MAX_DIMENSION)
    initializer_range: float = setting(0.02, "Std of the normal initial weights.", ge=0)
    attention_bias: bool = setting(False, "Biases on the q/k/v/o projections.")
    seq_length: int | None = setting(None, "Training sequence length (at most "
                                           "max_position_embeddings); inputs may be shorter.",
                                     gt=0, le=MAX_DIMENSION)
    use_flash_attention: bool = setting(
        False, "Use ops.flash_attention_score where the backend has it (Ascend).")
    compute_dtype: Dtype = setting("float32", "Dtype of the activations and matmuls "
                                              "(float32 on CPU, with a warning otherwise).")
    params_dtype: Dtype = setting("float32", "Dtype the parameters are kept in.")
    # Hugging Face config.json keys: accepted; values this model does not implement rejected.
    hidden_act: Literal["silu"] = setting("silu", "MLP activation; only silu (SwiGLU).")
    attention_dropout: float = setting(0.0, "Only 0.0 (no attention dropout).", ge=0)
    rope_scaling: dict[str, Any] | None = setting(
        None, "Only null (or rope_type 'default'): no rope scaling.")
    use_sliding_window: bool = setting(False, "Only false: full causal attention.")
    sliding_window: int | None = setting(None, "Window of sliding-window attention.",
                                         no_effect="use_sliding_window is false")
    max_window_layers: int | None = setting(None, "Layers with sliding-window attention.",
                                            no_effect="use_sliding_window is false")
    layer_types: list[str] | None = setting(None, "Only 'full_attention' entries.")
    torch_dtype: str | None = setting(None, "Hugging Face's dtype.", no_effect=DTYPES)
    dtype: str | None = setting(None, "Hugging Face's dtype.", no_effect=DTYPES)
    bos_token_id: int | list[int] | None = setting(None, "Begin-of-sequence id.",
                                                   no_effect=TOKENIZER)
    eos_token_id: int | list[int] | None = setting(None, "End-of-sequence id(s).",
                                                   no_effect=TOKENIZER)
    pad_token_id: int | None = setting(None, "Padding id.", no_effect=TOKENIZER)
    use_cache: bool = setting(True, "Key/value cache of generation.",
                              no_effect="training keeps no key/value cache")
    transformers_version: str | None = setting(None, "Version that wrote config.json.",
                                               no_effect="Hugging Face bookkeeping")

    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def shape(self) -> ModelShape:
        return ModelShape(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                          num_layers=self.num_hidden_layers,
                          num_attention_heads=self.num_attention_heads,
                          num_key_value_heads=self.kv_heads(), head_dim=self.head_size(),
                          intermediate_size=self.intermediate_size,
                          tie_word_embeddings=self.tie_word_embeddings, qk_norm=True,
                          seq_length=self.seq_length, params_dtype=self.params_dtype,
                          compute_dtype=self.compute_dtype,
                          use_flash_attention=self.use_flash_attention)

    def layer_modules(self, layer: int) -> frozenset[str]:
        """Every layer's modules (`models.qwen3.Qwen3DecoderLayer`)."""
        return LAYER_MODULES

    def problems(self, path: Path) -> list[tuple[Path, str]]:
        missing = [((*path, name), "required: a positive integer") for name in REQUIRED
                   if getattr(self, name) is None]
        if missing or not self._positive():
            return missing  # an out-of-bounds size is reported by its bound already
        found = []
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            found.append(((*path, "hidden_size"), f"{self.hidden_size} is not divisible by "
                          f"num_attention_heads ({self.num_attention_heads}); give head_dim"))
        elif self.head_size() % 2:
            found.append(((*path, "head_dim"), f"must be even (rotary embedding), got "
                                               f"{self.head_size()}"))
        if self.num_attention_heads % self.kv_heads():
            found.append(((*path, "num_key_value_heads"), f"{self.kv_heads()} does not divide "
                          f"num_attention_heads ({self.num_attention_heads})"))
        found += self._unsupported(path)
        if self.seq_length is not None and self.seq_length > self.max_position_embeddings:
            found.append(((*path, "seq_length"), f"{self.seq_length} exceeds "
                          f"max_position_embeddings ({self.max_position_embeddings})"))
        return found

    def _positive(self) -> bool:
        sizes = [getattr(self, name) for name in REQUIRED]
        sizes += [self.num_key_value_heads or 1, self.head_dim or 1]
        return all(size > 0 for size in sizes)

    def config_problems(self, config: TrainConfig, path: Path) -> list[tuple[Path, str]]:
        tp = config.parallelism.tensor_parallel
        return (self.tensor_parallel_problems(tp, path)
                + self.context_parallel_problems(tp, config.parallelism.ulysses_degree(), path))

    def tensor_parallel_problems(self, tp: int, path: Path = ("model",),
                                 ) -> list[tuple[Path, str]]:
        """Widths that `tp` tensor-parallel ranks must split evenly and do not."""
        found = []
        if tp == 1:
            return found
        for name in ("vocab_size", "num_attention_heads", "intermediate_size"):
            if getattr(self, name) % tp:
                found.append(((*path, name), f"{getattr(self, name)} is not divisible by "
                              f"parallelism.tensor_parallel ({tp})"))
        if self.kv_heads() % tp:
            found.append(((*path, "num_key_value_heads"), f"{self.kv_heads()} is not "
                          f"divisible by parallelism.tensor_parallel ({tp}) (key/value heads "
                          "are split, not replicated)"))
        return found

    def context_parallel_problems(self, tp: int, ulysses: int, path: Path = ("model",),
                                  ) -> list[tuple[Path, str]]:
        """Head counts that the Ulysses all-to-all (`ulysses` ranks, after `tp` tensor ranks
        took their share) must split evenly and do not."""
        if ulysses == 1:
            return []
        found = []
        for name, heads in (("num_attention_heads", self.num_attention_heads),
                            ("num_key_value_heads", self.kv_heads())):
            if heads % (tp * ulysses):
                found.append(((*path, name), ulysses_heads_problem(heads, tp, ulysses)))
        return found

    def _unsupported(self, path: Path) -> list[tuple[Path, str]]:
        found = []
        if self.attention_dropout != 0.0:
            found.append(((*path, "attention_dropout"), f"only 0.0 is implemented (no attention "
                                                        f"dropout), got {self.attention_dropout}"))
        rope = self.rope_scaling or {}
        rope_type = rope.get("rope_type", rope.get("type"))
        if self.rope_scaling is not None and (rope_type != "default" or len(rope) != 1):
            found.append(((*path, "rope_scaling"), f"only null is implemented (no rope "
                                                   f"scaling), got {self.rope_scaling}"))
        if self.use_sliding_window:
            found.append(((*path, "use_sliding_window"), "only false is implemented (full "
                                                         "causal attention)"))
        others = sorted({t for t in self.layer_types or [] if t != "full_attention"})
        if others:
            found.append(((*path, "layer_types"), f"only 'full_attention' is implemented, got "
                                                  f"{', '.join(map(repr, others))}"))
        return found


REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads")

