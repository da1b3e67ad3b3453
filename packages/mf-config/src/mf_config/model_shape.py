"""The numbers of a model that the rest of the stack plans with, and the settings that give them.

A model's `model` section is open: its keys belong to the model class `model_type` /
`architectures` selects. That class declares them as a `ModelSettings` (a `Section` with the
model's own names, defaults and bounds) in a module that imports neither MindSpore nor numpy,
and publishes it through an entry point (see `components`). Everything else reads the model
through the `ModelShape` those settings compute: the rules (layer specs, pipeline stages,
expert divisibility), mf-parallel's plan, mf-memory's estimate, and the model class itself
builds from the same settings. So a default such as `head_dim = hidden_size /
num_attention_heads` is written once, where the model is defined.

Pure Python: attrs only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from .errors import Path
from .section_base import Section

if TYPE_CHECKING:
    from .sections import TrainConfig


@attrs.frozen(kw_only=True)
class ExpertShape:
    """The mixture-of-experts numbers of a model (DeepSeek-V3's names in brackets)."""

    routed_experts: int
    """Routed experts per MoE layer (`n_routed_experts`)."""
    experts_per_token: int
    """Routed experts each token goes to, top k (`num_experts_per_tok`)."""
    expert_intermediate_size: int
    """SwiGLU width of one expert (`moe_intermediate_size`)."""
    shared_experts: int
    """Always-active experts, fused into one SwiGLU this many times as wide
    (`n_shared_experts`)."""
    first_dense_layers: int
    """Leading layers with a dense MLP of `intermediate_size` (`first_k_dense_replace`)."""
    balance_loss: bool = False
    """Whether a sequence-wise balance loss is computed (`aux_loss_alpha` > 0)."""


@attrs.frozen(kw_only=True)
class LatentAttentionShape:
    """The multi-head latent attention numbers of a model (DeepSeek-V3's names)."""

    kv_lora_rank: int
    q_lora_rank: int | None
    """None: a plain q_proj, no query compression."""
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@attrs.frozen(kw_only=True)
class ModelShape:
    """Structure numbers of a decoder language model (Hugging Face meanings)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    """Decoder layers (the ones pipeline stages hold)."""
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    """Width of one query/key head (for multi-head latent attention: nope + rope part)."""
    intermediate_size: int
    """Inner width of a dense MLP."""
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    """RMSNorm over each query and key head (Qwen3)."""
    seq_length: int | None = None
    """The training sequence length, when the model section gives it."""
    mtp_layers: int = 0
    """Multi-token-prediction layers after the decoder (layer specs may name them)."""
    routed_experts: int | None = None
    """Routed experts of a mixture-of-experts model; None for a dense one."""
    latent_attention: bool = False
    """Multi-head latent attention (DeepSeek's compressed keys and values)."""
    experts: ExpertShape | None = None
    """The mixture-of-experts numbers (None for a dense model or one that does not give them)."""
    latent: LatentAttentionShape | None = None
    """The latent-attention numbers (None without latent attention)."""
    params_dtype: str = "float32"
    compute_dtype: str = "float32"
    use_flash_attention: bool = False

    @property
    def layer_count(self) -> int:
        """Every layer a layer spec may name: decoder plus multi-token-prediction layers."""
        return self.num_layers + self.mtp_layers


class ModelSettings(Section):
    """Base of a model's typed settings (the keys of the `model` section).

    A subclass is a `Section` made with `section` and `setting`; besides `shape()` it may
    define the optional hooks every component's settings may have (`components`):
    `problems(path)` for checks within the section and `config_problems(config, path)` for
    checks against other sections (a width that tensor parallelism must divide).
    """

    __slots__ = ()

    def shape(self) -> ModelShape:
        """The model's structure numbers, with the model's own defaults applied."""
        raise NotImplementedError(f"{type(self).__name__} does not give its shape")

    def layer_modules(self, layer: int) -> frozenset[str] | None:
        """The sub-modules of decoder layer `layer` (global index), as the dotted paths the
        module lists name (`recompute.select_module`, `recompute_comm.select_module`,
        `swap.op_swap[].op_name`): `attention`, `attention.qkv`, ... as the model builds them
        on one rank. Tensor and context parallelism may add communication cells inside a
        module that has no sub-module here; paths below such a module are not checked.
        None (the default) when the model does not declare them: nothing is checked."""
        return None

    def problems(self, path: Path) -> list[tuple[Path, str]]:
        """Problems within the model's settings (none by default)."""
        return []

    def config_problems(self, config: TrainConfig, path: Path) -> list[tuple[Path, str]]:
        """Problems of these settings together with the rest of `config` (none by default)."""
        return []


def ulysses_heads_problem(heads: int, tp: int, ulysses: int) -> str:
    """Why `heads` attention heads cannot be swapped over `ulysses` context ranks after `tp`
    tensor ranks took their share (the models' pre-launch check of context parallelism)."""
    over = f"tensor_parallel ({tp}) x " if tp > 1 else ""
    return (f"{heads} heads are not divisible by {over}the Ulysses degree ({ulysses}: "
            "context_parallel with context_parallel_method 'ulysses', ulysses_degree_in_cp "
            "with 'hybrid'): Ulysses gives each context rank whole heads; use 'colossal' or "
            "a degree that divides the heads")
