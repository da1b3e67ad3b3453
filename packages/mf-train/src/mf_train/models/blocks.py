"""Building blocks shared by the decoder models (Qwen3, DeepSeek-V3), on ops that exist on the
backend in use (shared/reference/mindspore-cpu.md: no `ops.rms_norm`, `mint` cross-entropy or
flash attention on CPU).

Layout: activations are `[sequence, batch, ...]` (Megatron's layout) in every model, with or
without tensor parallelism, so one code path serves both: mf-parallel's sequence parallelism
splits dim 0. Attention works on `[batch, heads, sequence, head_dim]`.

Weights are created from numpy arrays in Hugging Face's `[out_features, in_features]` layout,
whole: the cells here are one process's. `mf_train.parallelize` replaces the linear layers
and the embedding with mf-parallel's tensor-parallel ones and gives the model its groups; the
loss then takes the model's `tensor_group` and `context_group` (None: nothing communicates).

Dtypes: parameters are kept in `params_dtype`; activations run in the compute dtype, the
linear layers cast their weight to the activation's dtype, and RMSNorm, softmax and the loss
compute in float32 (as Hugging Face's Qwen3 does).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

from mf_config.component_settings import settings_error
from mf_parallel.runtime.tensor_parallel import linear_rows, vocab_parallel_cross_entropy

from .gathered_heads import SwiGLUActivation, swiglu_activation

log = logging.getLogger("mf_train.models")

DTYPES = {"float32": ms.float32, "bfloat16": ms.bfloat16, "float16": ms.float16}


# --- dtypes -------------------------------------------------------------------------------

def resolve_compute_dtype(name: str, device_target: str,
                          key: str = "model.compute_dtype") -> ms.Type:
    """The MindSpore dtype to compute in for the configured `name` on `device_target`.

    On CPU only float32 is computed: MindSpore 2.10 has no bfloat16 CPU kernels for MatMul,
    Softmax, Exp or Sum, and float16 training diverged there (mindspore-cpu.md). A bfloat16
    or float16 request on CPU therefore falls back to float32 with one warning naming `key`,
    instead of failing later inside a kernel. Other backends get what was asked.
    """
    if name not in DTYPES:
        raise settings_error([(tuple(key.split(".")),
                               f"must be one of {', '.join(map(repr, DTYPES))}, got {name!r}")])
    if device_target == "CPU" and name != "float32":
        log.warning("%s: %s is not computed on the CPU backend (MindSpore 2.10 lacks its "
                    "kernels); using float32 instead", key, name)
        return ms.float32
    return DTYPES[name]


# --- initialisation ------------------------------------------------------------------------

DRAW_BLOCK = 1 << 20
"""Values `ParamInit.normal` draws at a time (8 MiB of float64)."""


class ParamInit:
    """Seeded initial values, one independent stream per parameter name.

    Hugging Face's `_init_weights`: linear and embedding weights ~ normal(0,
    `initializer_range`), biases zero, norm weights one. Each name's values come from
    `numpy.random.default_rng([seed, crc32(name)])`, so a weight does not depend on the order
    of construction, on how many layers are built (a pipeline stage's layer 5 equals the full
    model's), on MindSpore's seed, or on the tensor-parallel size (every rank draws the full
    weight and keeps its shard). Names are the Hugging Face names, so the rule is the same for
    every model.
    """

    def __init__(self, seed: int, std: float):
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.seed = seed
        self.std = std

    def normal(self, name: str, shape: Sequence[int]) -> np.ndarray:
        """`name`'s values: float32 draws of normal(0, std), made a block of rows at a time
        (numpy's generator gives the same stream however the draws are split), so the only
        whole-size array is the float32 result, not float64 draws and their product (five
        times the tensor: 655 MB for a 131 MB embedding table)."""
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        out = np.empty(tuple(shape), np.float32)
        flat = out.reshape(-1)
        for start in range(0, flat.size, DRAW_BLOCK):
            block = rng.standard_normal(min(DRAW_BLOCK, flat.size - start))
            block *= self.std
            flat[start:start + block.size] = block
        return out

    @staticmethod
    def zeros(shape: Sequence[int]) -> np.ndarray:
        return np.zeros(tuple(shape), np.float32)

    @staticmethod
    def ones(shape: Sequence[int]) -> np.ndarray:
        return np.ones(tuple(shape), np.float32)


# --- tensor parallelism (set on a model from outside, `mf_train.parallelize`) -------------

def tensor_size(group: Any) -> int:
    """Tensor-parallel degree of a model's `tensor_group`; 1 without one."""
    return 1 if group is None else group.size


def is_sequence_parallel(group: Any) -> bool:
    """Whether activations outside the tensor-parallel regions are split along the sequence."""
    return tensor_size(group) > 1 and bool(group.sequence_parallel)


def fuse_rows(parts: Sequence[np.ndarray], shards: int = 1) -> np.ndarray:
    """Stack `parts` along rows so that each of `shards` equal row blocks is
    `[part0_r; part1_r; ...]`: a column-parallel split of the result then hands rank r its own
    rows of every part (for `shards == 1`, plain concatenation `[part0; part1; ...]`)."""
    for part in parts:
        if part.shape[0] % shards:
            raise ValueError(f"{part.shape[0]} rows cannot be split over {shards} "
                             "tensor-parallel ranks")
    chunks = [np.split(part, shards, axis=0) for part in parts]
    return np.concatenate([chunk[r] for r in range(shards) for chunk in chunks], axis=0)


def split_rows(fused: np.ndarray, rows: Sequence[int], shards: int = 1) -> list[np.ndarray]:
    """Inverse of `fuse_rows`: the parts (full row counts `rows`) of a fused array."""
    if fused.shape[0] != sum(rows):
        raise ValueError(f"fused array has {fused.shape[0]} rows, parts need {sum(rows)}")
    local = [count // shards for count in rows]
    pieces: list[list[np.ndarray]] = [[] for _ in rows]
    start = 0
    for _ in range(shards):
        for index, count in enumerate(local):
            pieces[index].append(fused[start:start + count])
            start += count
    return [np.concatenate(piece, axis=0) for piece in pieces]


# --- layers --------------------------------------------------------------------------------

class Linear(nn.Cell):
    """`y = x W^T (+ b)`, W `[out, in]`; the weight is cast to the input's (compute) dtype."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None = None):
        super().__init__()
        self.weight = Parameter(Tensor(weight), name="weight")
        self.bias = None if bias is None else Parameter(Tensor(bias), name="bias")

    def construct(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`x W^T (+ b)` for `x` `[..., in]`, `weight` `[out, in]`, as one 2-D matmul
    (mf-parallel's `linear_rows`, which says why); the weight and bias are cast to the
    activation's dtype only when they differ from it."""
    return linear_rows(x, same_dtype(weight, x.dtype),
                       None if bias is None else same_dtype(bias, x.dtype))


def same_dtype(t: Tensor, dtype: ms.Type) -> Tensor:
    """`t` in `dtype`, without a cast operation when it already is."""
    return t if t.dtype == dtype else t.astype(dtype)


def expand(t: Tensor, shape: Sequence[int], tile: bool) -> Tensor:
    """`t` repeated to `shape` (numpy's broadcasting rules) when `tile` (`tiles_broadcasts()`,
    decided when a cell is built, outside any compiled region).

    Why: MindSpore 2.10's CPU kernels for element-wise operations between tensors of
    different shapes (`x * rsqrt(mean)` with `mean` `[s, b, 1]`, `x * cos` with `cos`
    `[s, d]`, and their gradients) run about 10x slower than on equal shapes, while
    `ops.tile` costs about one equal-shape operation (benchmarks/README.md, "Speed of a
    step"). Other backends broadcast natively: there `t` is returned unchanged.
    """
    if not tile:
        return t
    lead = len(shape) - t.ndim
    multiples = tuple(shape[:lead])  # written for both PyNative and `mindspore.jit` graphs
    for index in range(t.ndim):
        multiples = (*multiples, shape[lead + index] // t.shape[index])
    if multiples == (1,) * len(shape):
        return t
    return ops.tile(t, multiples)


def tiles_broadcasts() -> bool:
    """Whether `expand` repeats tensors (the CPU backend) rather than relying on broadcasts."""
    return ms.get_context("device_target") == "CPU"


class Embedding(nn.Cell):
    """Row lookup in a `[vocab, hidden]` table (`mint.nn.Embedding` has no CPU kernel)."""

    def __init__(self, table: np.ndarray):
        super().__init__()
        self.weight = Parameter(Tensor(table), name="weight")

    def construct(self, ids: Tensor) -> Tensor:
        return ops.gather(self.weight, ids, 0)


class RMSNorm(nn.Cell):
    """`weight * x / sqrt(mean(x^2) + eps)` over the last dimension, computed in float32 and
    cast back to the input dtype before the weight (Hugging Face's Qwen3RMSNorm)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(size, np.float32)), name="weight")
        self.eps = eps
        self.tile = tiles_broadcasts()

    def construct(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = same_dtype(x, ms.float32)
        scale = mint.rsqrt(mint.mean(x * x, -1, True) + self.eps)
        x = same_dtype(x * expand(scale, x.shape, self.tile), dtype)
        return expand(same_dtype(self.weight, dtype), x.shape, self.tile) * x


class RotaryEmbedding:
    """Rotary position tables, Hugging Face's rotate-half convention.

    `inv_freq_i = 1 / theta^(2i/d)` (i < d/2); the angle of position p is `p * inv_freq`,
    duplicated as `[angles, angles]` over the head dimension, so that
    `rope(x) = x * cos + rotate_half(x) * sin` with `rotate_half([x1, x2]) = [-x2, x1]`.
    A model with another frequency rule (YaRN) passes its own `inv_freq` and
    `attention_scaling` (cos and sin are multiplied by it, as HF's `attention_scaling`).
    Tables are built per sequence length on first use and cached.
    """

    def __init__(self, dim: int, theta: float, max_position: int,
                 inv_freq: np.ndarray | None = None, attention_scaling: float = 1.0):
        if dim % 2:
            raise ValueError(f"rotary dimension must be even, got {dim}")
        self.dim = dim
        self.max_position = max_position
        self.inv_freq = (1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
                         if inv_freq is None else np.asarray(inv_freq, np.float64))
        self.attention_scaling = attention_scaling
        self.tile = tiles_broadcasts()
        self._tables: dict[int, tuple[Tensor, Tensor]] = {}
        self._placed: dict[tuple[int, bytes], tuple[Tensor, Tensor]] = {}
        self._heads: tuple[Tensor, dict[tuple[int, ...], tuple[Tensor, Tensor]]] | None = None

    def tables(self, seq: int) -> tuple[Tensor, Tensor]:
        """(cos, sin), each float32 `[seq, dim]`, for positions 0..seq-1."""
        if seq > self.max_position:
            raise ValueError(f"sequence of {seq} tokens is longer than "
                             f"model.max_position_embeddings ({self.max_position})")
        if seq not in self._tables:
            self._tables[seq] = self._cos_sin(np.arange(seq))
        return self._tables[seq]

    def at(self, positions: np.ndarray) -> tuple[Tensor, Tensor]:
        """(cos, sin) of these positions for activations `[seq, batch, heads, dim]`:
        `[seq, 1, 1, dim]` for positions `[seq]` (every sample alike), `[seq, batch, 1, dim]`
        for positions `[batch, seq]` (documents restarting inside packed samples)."""
        if positions.size and int(positions.max()) >= self.max_position:
            raise ValueError(f"position {int(positions.max())} is past "
                             f"model.max_position_embeddings ({self.max_position})")
        if positions.ndim == 1:
            key = (len(positions), positions.tobytes())
            if key not in self._placed:
                cos, sin = self._cos_sin(positions)
                self._placed = {key: (cos.reshape(len(positions), 1, 1, self.dim),
                                      sin.reshape(len(positions), 1, 1, self.dim))}
            return self._placed[key]
        cos, sin = self._cos_sin(positions.T)
        batch_last = (positions.shape[1], positions.shape[0], 1, self.dim)
        return cos.reshape(batch_last), sin.reshape(batch_last)

    def head_tables(self, cos: Tensor, sin: Tensor,
                    shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        """`at`'s tables `[s, b or 1, 1, d]` for `[b, heads, s, d]` activations (`shape`),
        repeated to it, the sine's first half negated (for `gathered_heads.rotate_half`).
        Kept per shape for the last `cos`: every layer of a forward pass asks for the same."""
        if self._heads is None or self._heads[0] is not cos:
            self._heads = (cos, {})
        built = self._heads[1]
        if tuple(shape) not in built:
            half, times = self.dim // 2, (shape[0] // cos.shape[1], shape[1], 1, 1)
            sin_h = sin.transpose(1, 2, 0, 3)
            built[tuple(shape)] = (
                ops.tile(cos.transpose(1, 2, 0, 3), times),
                ops.tile(ops.cat((-sin_h[..., :half], sin_h[..., half:]), -1), times))
        return built[tuple(shape)]

    def _cos_sin(self, positions: np.ndarray) -> tuple[Tensor, Tensor]:
        angles = positions.astype(np.float64)[..., None] * self.inv_freq
        angles = np.concatenate([angles, angles], axis=-1)
        scale = self.attention_scaling
        return (Tensor((np.cos(angles) * scale).astype(np.float32)),
                Tensor((np.sin(angles) * scale).astype(np.float32)))


def rotate_half(x: Tensor) -> Tensor:
    """`[x1, x2] -> [-x2, x1]` over the last dimension."""
    # slices, here and for the fused q/k/v and gate/up outputs: `mint.split` got wrong
    # gradients in MindSpore 2.10 on a transposed view and on q/k/v under sequence parallelism
    half = x.shape[-1] // 2
    return ops.cat((-x[..., half:], x[..., :half]), -1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, tile: bool = False) -> Tensor:
    """Rotate `x` by tables that broadcast to it (`[seq, dim]` for `[..., seq, dim]`, or
    `RotaryEmbedding.at`'s for `[seq, batch, heads, dim]`), cast to x's dtype and repeated
    to x's shape when `tile` (see `expand`)."""
    cos = expand(same_dtype(cos, x.dtype), x.shape, tile)
    sin = expand(same_dtype(sin, x.dtype), x.shape, tile)
    return x * cos + rotate_half(x) * sin


_BATCH_MATMUL_TRANSPOSED = ops.BatchMatMul(transpose_b=True)
"""`q @ k^T` without a transposed copy of k: `mint.matmul(q, k.swapaxes(-1, -2))` made k
contiguous first, 6.9 ms against 2.1 ms for `[1, 8, 512, 64]` on CPU."""


_HIDDEN = -1e30
"""The score of a masked key in `AttentionCore.partial` (exp underflows to 0 in float32)."""


_BATCH_MATMUL = ops.BatchMatMul()
_BATCH_MATMUL_TRANSPOSED_A = ops.BatchMatMul(transpose_a=True)


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, hidden: Tensor,
                      scale: float, tracks: bool = False) -> tuple[Tensor, ...]:
    """`softmax(q k^T * scale, masked to -inf where hidden) @ v` on `[b, h, s, d]` (k and v
    with q's heads): the output and the float32 probabilities; with `tracks`, also each
    head's largest logit (`q k^T * scale` over the keys it sees, `[h]`, no gradient)."""
    scores = same_dtype(_BATCH_MATMUL_TRANSPOSED(q * scale, k), ms.float32)
    scores = ops.masked_fill(scores, hidden, float("-inf"))
    probs = mint.nn.functional.softmax(scores, dim=-1)
    out = _BATCH_MATMUL(same_dtype(probs, v.dtype), v)
    if not tracks:
        return out, probs
    return out, probs, ops.amax(ops.stop_gradient(scores), (0, 2, 3))


class SoftmaxAttention(nn.Cell):
    """`softmax(q k^T * scale, masked to -inf) @ v` on `[b, h, s, d]`, k and v with `h / g`
    query heads per key/value head (head i uses kv head `i // (h / g)`), returning the
    output and the float32 probabilities, with its backward written out: autograd's
    transposes `k`, `v` and the probabilities into strided views, which MindSpore 2.10
    copies with its slow generic kernel on CPU before each batched matmul; here the matmuls
    take the transposes as flags, and k and v are kept unrepeated (repeated again in the
    backward). About 2x faster forward + backward for the 28M model's `[1, 8, 512, 64]`
    (49 against 24 ms), the same gradients.

    The backward: dv = P^T dO, dP = dO v^T, dS = P * (dP - rowsum(dP * P)) (softmax's),
    dq = dS k * scale, dk = dS^T (q * scale), each kv head's gradient summed over its copies.
    """

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale
        self.tracks = False
        """Return each head's largest logit too (`softmax_attention`'s `tracks`)."""
        self.tile = tiles_broadcasts()
        self._indices: dict[tuple[int, int], tuple[Tensor, list[Tensor]]] = {}

    def _copies(self, heads: int, kv_heads: int) -> tuple[Tensor, list[Tensor]]:
        """The kv head of each query head, and per copy j the query heads of copy j."""
        key = (heads, kv_heads)
        if key not in self._indices:
            group = heads // kv_heads
            self._indices[key] = (
                Tensor(np.repeat(np.arange(kv_heads), group).astype(np.int32)),
                [Tensor((np.arange(kv_heads) * group + j).astype(np.int32))
                 for j in range(group)])
        return self._indices[key]

    def _repeated(self, x: Tensor, heads: int) -> Tensor:
        if x.shape[1] == heads:
            return x
        return ops.gather(x, self._copies(heads, x.shape[1])[0], 1)

    def _summed(self, grad: Tensor, kv_heads: int) -> Tensor:
        if grad.shape[1] == kv_heads:
            return grad
        copies = self._copies(grad.shape[1], kv_heads)[1]
        total = ops.gather(grad, copies[0], 1)
        for index in copies[1:]:
            total = total + ops.gather(grad, index, 1)
        return total

    def construct(self, q: Tensor, k: Tensor, v: Tensor,
                  hidden: Tensor) -> tuple[Tensor, ...]:
        heads = q.shape[1]
        return softmax_attention(q, self._repeated(k, heads), self._repeated(v, heads),
                                 hidden, self.scale, self.tracks)

    def bprop(self, q: Tensor, k: Tensor, v: Tensor, hidden: Tensor, out: tuple,
              dout: tuple) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        heads, kv_heads = q.shape[1], k.shape[1]
        k_all, v_all = self._repeated(k, heads), self._repeated(v, heads)
        probs, d_out = out[1], dout[0]
        d_v = _BATCH_MATMUL_TRANSPOSED_A(same_dtype(probs, v.dtype), d_out)
        d_probs = same_dtype(_BATCH_MATMUL_TRANSPOSED(d_out, v_all), ms.float32)
        row = (d_probs * probs).sum(-1, keepdims=True)
        d_scores = same_dtype(probs * (d_probs - expand(row, d_probs.shape, self.tile)),
                              q.dtype)
        d_q = _BATCH_MATMUL(d_scores, k_all) * self.scale
        d_k = _BATCH_MATMUL_TRANSPOSED_A(d_scores, q * self.scale)
        return (d_q, self._summed(d_k, kv_heads), self._summed(d_v, kv_heads),
                ops.zeros_like(hidden))


class AttentionCore:
    """Softmax attention: q `[b, nq, sq, d]`, k `[b, nkv, sk, d]`, v `[b, nkv, sk, dv]`
    -> `[b, nq, sq, dv]`; grouped-query heads share kv head `i // (nq / nkv)` (HF's repeat_kv).

    `mask` (bool, True = masked, broadcasting to `[b, nq, sq, sk]`: `[b or 1, 1, sq, sk]`) says
    which keys each query may not see: documents packed in one sample, or the causal rule by
    global token index when the sequence is split over context ranks
    (`attention_inputs.AttentionPlaces`). None is the causal mask of one whole sequence.

    Plain path: `softmax(q k^T * scale, masked to -inf)` in float32, then `@ v`. With
    `use_flash_attention`, `ops.flash_attention_score` is used where it has a kernel (Ascend,
    float16/bfloat16: `sparse_mode=2` with the 2048x2048 causal mask, or the given mask with
    `sparse_mode=0`); elsewhere the plain path runs and one log line says so.

    `track_max_logits` makes the plain PyNative path record each head's largest logit over
    every forward until `take_max_logits` (QK-clip reads them after each step): one maximum
    over the scores it computes anyway. The fused kernel, compiled graphs and the partial
    attention of context parallelism do not record them (QK-clip is refused there).
    """

    def __init__(self, scale: float, use_flash_attention: bool = False,
                 compute_dtype: ms.Type = ms.float32):
        self.scale = scale
        self.flash = use_flash_attention and flash_attention_available(compute_dtype)
        self.tile = tiles_broadcasts()
        self.graph = False
        self._softmax_attention = SoftmaxAttention(scale)
        self._masks: dict[tuple[int, ...], Tensor] = {}
        self.max_logits: Tensor | None = None
        """Each head's largest logit since `take_max_logits` (`[h]`), when tracked."""

    def track_max_logits(self) -> None:
        """Record each head's largest logit from now on (the plain PyNative path only)."""
        self._softmax_attention.tracks = True

    def take_max_logits(self) -> Tensor | None:
        """Each head's largest logit over the forwards since the last call (None if none
        ran), and start again."""
        taken, self.max_logits = self.max_logits, None
        return taken

    def prepare_for_graph(self, dynamic: bool = False) -> None:
        """Before a layer using this core is compiled: autograd's own backward (a graph
        transposes without the strided copies `SoftmaxAttention` avoids)."""
        self.graph = True

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                 lengths: tuple[int, ...] | None = None) -> Tensor:
        """`lengths`: documents' cumulative ends over the batch's tokens, for the fused
        variable-length kernel (`attention_inputs.cumulative_lengths`); only with `flash`."""
        if (self.flash or lengths is not None) and self._softmax_attention.tracks:
            raise RuntimeError("the fused attention kernel does not give the logits QK-clip "
                               "needs")
        if self.flash:
            if lengths is not None:
                return self._flash_varlen(q, k, v, lengths)
            return self._flash(q, k, v, mask)
        if lengths is not None:
            raise ValueError("document lengths need the flash kernel; the plain path takes "
                             "the mask (AttentionPlaces builds it when varlen is off)")
        return self._plain(q, k, v, mask)

    def _plain(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        shape = (*q.shape[:-1], k.shape[2])
        hidden = self._future(shape) if mask is None else expand(mask, shape, self.tile)
        tracks = self._softmax_attention.tracks
        if not self.graph:
            outputs = self._softmax_attention(q, k, v, hidden)
            if tracks:
                self.max_logits = outputs[2] if self.max_logits is None \
                    else ops.maximum(self.max_logits, outputs[2])
            return outputs[0]
        if tracks:
            raise RuntimeError("the largest logits are not recorded in compiled graphs "
                               "(QK-clip keeps the decoder layers in PyNative)")
        group = q.shape[1] // k.shape[1]
        if group > 1:
            k, v = ops.repeat_interleave(k, group, 1), ops.repeat_interleave(v, group, 1)
        return softmax_attention(q, k, v, hidden, self.scale)[0]

    def partial(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Attention over some of the keys, for merging with the rest
        (`context_attention.merge_partials`): the plain path's output normalised over these
        keys, and the log-sum-exp of their scores `[b, nq, sq, 1]` (float32). Masked scores
        are a large finite negative, not -inf, so a query that sees none of these keys gets a
        finite log-sum-exp far below the other part's and weighs nothing in the merge."""
        if self._softmax_attention.tracks:
            raise RuntimeError("the largest logits are not recorded under context parallelism")
        group = q.shape[1] // k.shape[1]
        if group > 1:
            k, v = ops.repeat_interleave(k, group, 1), ops.repeat_interleave(v, group, 1)
        scores = same_dtype(_BATCH_MATMUL_TRANSPOSED(q * self.scale, k), ms.float32)
        scores = ops.masked_fill(scores, expand(mask, scores.shape, self.tile), _HIDDEN)
        probs = mint.nn.functional.softmax(scores, dim=-1)
        # log-sum-exp = s_j - log p_j for any key j; at the top score p_j >= 1 / keys, so the
        # log is exact enough, and its gradient is softmax's. 4x faster than ops.logsumexp
        # here (a [1, 4, 1024, 2048] forward + backward: 40 ms over the softmax's, not 500).
        top = ops.stop_gradient(ops.argmax(scores, -1, keepdim=True))
        lse = ops.gather_elements(scores, -1, top) - ops.log(ops.gather_elements(probs, -1, top))
        return mint.matmul(same_dtype(probs, v.dtype), v), lse

    def _future(self, shape: tuple[int, ...]) -> Tensor:
        """The causal mask (True above the diagonal), repeated to the scores' shape where
        `expand` repeats (cached per shape)."""
        key = tuple(shape) if self.tile else tuple(shape[-2:])
        if key not in self._masks:
            seq = shape[-1]
            future = np.triu(np.ones((seq, seq), np.bool_), k=1)
            self._masks[key] = Tensor(np.ascontiguousarray(np.broadcast_to(future, key)))
        return self._masks[key]

    def _flash(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        if mask is not None:
            return ops.flash_attention_score(q, k, v, q.shape[1], attn_mask=mask.astype(ms.uint8),
                                             scalar_value=self.scale, input_layout="BNSD",
                                             sparse_mode=0)
        return ops.flash_attention_score(q, k, v, q.shape[1], attn_mask=self._compressed(),
                                         scalar_value=self.scale, input_layout="BNSD",
                                         sparse_mode=2)

    def _flash_varlen(self, q: Tensor, k: Tensor, v: Tensor,
                      lengths: tuple[int, ...]) -> Tensor:
        """Each document causal on its own: the batch's tokens laid end to end (TND layout)
        with the documents' cumulative ends, `sparse_mode=3` (causal within each sequence,
        the compressed 2048 x 2048 mask), as MindFormers passes `actual_seq_len`."""
        b, n, s = q.shape[:3]
        tokens = [x.transpose(0, 2, 1, 3).reshape(b * s, x.shape[1], x.shape[3])
                  for x in (q, k, v)]
        out = ops.flash_attention_score(*tokens, n, attn_mask=self._compressed(),
                                        actual_seq_qlen=lengths, actual_seq_kvlen=lengths,
                                        scalar_value=self.scale, input_layout="TND",
                                        sparse_mode=3)
        return out.reshape(b, s, n, out.shape[-1]).transpose(0, 2, 1, 3)

    def _compressed(self) -> Tensor:
        """The compressed causal mask the kernel's sparse modes 2 and 3 take."""
        if () not in self._masks:
            self._masks[()] = Tensor(np.triu(np.ones((2048, 2048), np.uint8), k=1))
        return self._masks[()]


_flash_notes: set[str] = set()


def flash_attention_available(compute_dtype: ms.Type) -> bool:
    """Whether `ops.flash_attention_score` can run here; logs once per reason when not."""
    target = ms.get_context("device_target")
    reason = None
    if target != "Ascend" or not hasattr(ops, "flash_attention_score"):
        reason = f"ops.flash_attention_score has no {target} kernel (it runs on Ascend)"
    elif compute_dtype not in (ms.float16, ms.bfloat16):
        reason = "ops.flash_attention_score takes float16 or bfloat16 only"
    if reason is None:
        return True
    if reason not in _flash_notes:
        _flash_notes.add(reason)
        log.warning("model.use_flash_attention: %s; using the plain softmax attention", reason)
    return False


class SwiGLU(nn.Cell):
    """`down(silu(gate) * up)` with gate and up from one fused linear `gate_up` (rows
    `[gate; up]`, per tensor-parallel rank `[gate_r; up_r]`, see `fuse_rows`); `local` gate
    rows (`tensor_counts`: a tensor-parallel rank's share)."""

    tensor_counts = ("local",)

    def __init__(self, gate: np.ndarray, up: np.ndarray, down: np.ndarray):
        super().__init__()
        self.local = gate.shape[0]
        self.gate_up = Linear(fuse_rows([gate, up]))
        self.down = Linear(down)
        self.activations: dict[tuple[int, int], SwiGLUActivation] | None = (
            {} if tiles_broadcasts() else None)

    def prepare_for_graph(self, dynamic: bool = False) -> None:
        """Before this block is compiled for inputs of any shape (`dynamic`): slices. A
        graph of fixed shapes keeps the activation cell built for its shape (`gathered_heads`;
        a compiled 28M step 0.93 -> 0.84 s), which a graph of unknown shapes cannot build."""
        if dynamic:
            self.activations = None

    def construct(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up(x)
        if self.activations is not None:
            return self.down(swiglu_activation(self.activations, gate_up))
        gate, up = gate_up[..., :self.local], gate_up[..., self.local:]
        return self.down(mint.nn.functional.silu(gate) * up)


# --- loss ----------------------------------------------------------------------------------

def token_cross_entropy(logits: Tensor, labels: Tensor,
                        group: Any = None) -> Tensor:
    """Per-token `logsumexp(logits) - logits[label]` in float32; `logits` `[..., V]` (this
    rank's vocabulary slice over a tensor group), `labels` `[...]` in [0, V)."""
    logits = logits.astype(ms.float32)
    if tensor_size(group) > 1:
        return vocab_parallel_cross_entropy(logits, labels, group)
    log_probs = ops.log_softmax(logits, -1)
    return -ops.gather_elements(log_probs, -1, labels.expand_dims(-1)).squeeze(-1)


def causal_lm_loss(logits: Tensor, labels: Tensor, loss_mask: Tensor | None = None,
                   group: Any = None,
                   context: Any = None) -> Tensor:
    """`sum(ce * mask) / max(sum(mask), 1)`, a float32 scalar (MindFormers' masked mean).

    `labels` are the targets at each position (already shifted: the data gives
    `labels[t] = tokens[t + 1]`). A negative label (Hugging Face's -100) counts as masked.

    Over a context group each rank holds part of the tokens: the mask is counted over the
    group, and the rank's sum is multiplied by the group size, so that the mean over the
    data x context ranks (what the step layouts take) is the loss of the whole sequences.
    """
    return masked_token_mean(lambda targets: token_cross_entropy(logits, targets, group),
                             labels, loss_mask, context)


def masked_token_mean(cross_entropy: Callable[[Tensor], Tensor], labels: Tensor,
                      loss_mask: Tensor | None = None,
                      context: Any = None) -> Tensor:
    """`causal_lm_loss` from a per-token cross-entropy: `cross_entropy(targets)` gives each
    token's loss for `targets` in [0, V) (the labels with the masked ones set to 0)."""
    valid = labels >= 0
    mask = valid.astype(ms.float32)
    if loss_mask is not None:
        mask = mask * loss_mask.astype(ms.float32)
    ce = cross_entropy(ops.masked_fill(labels, ops.logical_not(valid), 0))
    count = mask.sum()
    if context is None or context.size == 1:
        return (ce * mask).sum() / ops.maximum(count, 1.0)
    count = ops.stop_gradient(context.all_reduce(count))
    return (ce * mask).sum() * context.size / ops.maximum(count, 1.0)


def check_input_ids(input_ids: Tensor, seq_length: int | None,
                    max_position_embeddings: int, group: Any = None,
                    context_size: int = 1) -> int:
    """The sequence length of `input_ids` ([batch, seq], this rank's `seq / context_size`
    tokens of each sample); `ValueError` when the shape is wrong, the sequence is longer than
    `model.seq_length` (else `max_position_embeddings`), or this rank's part does not divide
    over the tensor group that sequence parallelism splits it over."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {input_ids.shape}")
    seq = input_ids.shape[1] * context_size
    limit, key = ((seq_length, "seq_length") if seq_length is not None
                  else (max_position_embeddings, "max_position_embeddings"))
    if seq > limit:
        raise ValueError(f"input of {seq} tokens is longer than model.{key} ({limit})")
    shards = tensor_size(group)
    if is_sequence_parallel(group) and input_ids.shape[1] % shards:
        raise ValueError(f"sequence parallelism splits the sequence over "
                         f"tensor_parallel ({shards}) ranks: {input_ids.shape[1]} tokens do "
                         "not divide")
    return seq
