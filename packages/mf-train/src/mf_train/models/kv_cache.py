"""What a decoding model keeps per attention layer, so that a new token costs one position's
forward (`mf-train generate`, `mf_train.export.generation`).

Each layer's entry holds, for every position run so far, what its attention needs of that
position again: Qwen3's rotated keys and its values (`[positions, batch, kv_heads, head_dim]`),
DeepSeek-V3's MLA compressed cache (the normed latent, `kv_lora_rank` numbers, and the rotated
one-head rope key, `qk_rope_head_dim`); `append` adds the new positions and returns
everything up to them.
`causal_mask` is the attention mask of `count` new positions after `start` cached ones.
"""

from __future__ import annotations

import numpy as np
from mindspore import Tensor, ops


class LayerCache:
    """One attention layer's cached tensors, each `[positions, batch, ...]`: Qwen3's rotated
    keys and its values; MLA's normed compressed latent and its rotated rope key."""

    def __init__(self) -> None:
        self.parts: tuple[Tensor, ...] | None = None

    def append(self, *new: Tensor) -> tuple[Tensor, ...]:
        """Add the new positions' tensors (in the same order each time); all of them,
        cached and new, in position order."""
        if self.parts is None:
            self.parts = new
        else:
            self.parts = tuple(ops.cat((old, part), 0)
                               for old, part in zip(self.parts, new, strict=True))
        return self.parts


class KVCache:
    """Every layer's `LayerCache` and how many positions they hold."""

    def __init__(self) -> None:
        self.length = 0
        self.layers: dict[int, LayerCache] = {}

    def layer(self, index: int) -> LayerCache:
        """The cache of decoder layer `index` (created empty on first use)."""
        return self.layers.setdefault(index, LayerCache())


def causal_mask(start: int, count: int) -> Tensor:
    """Bool `[1, 1, count, start + count]`, True where new position `start + i` may not see
    key `j` (`j > start + i`): `AttentionCore`'s mask."""
    keys = np.arange(start + count)
    queries = np.arange(start, start + count)
    return Tensor(keys[None, :] > queries[:, None]).reshape(1, 1, count, start + count)
