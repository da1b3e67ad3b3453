"""The keys and values a decoding model keeps per layer, so that a new token costs one
position's forward (`mf-train generate`, `mf_train.generation`).

Each layer's entry holds `[positions, batch, kv_heads, head_dim]` keys (rotated) and values of
every position run so far; `append` adds the new positions and returns everything up to them.
`causal_mask` is the attention mask of `count` new positions after `start` cached ones.
"""

from __future__ import annotations

import numpy as np
from mindspore import Tensor, ops


class LayerCache:
    """One attention layer's cached keys and values."""

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new positions' keys and values (`[new, batch, heads, dim]`); all of them,
        cached and new, in position order."""
        if self.keys is None or self.values is None:
            self.keys, self.values = keys, values
        else:
            self.keys = ops.cat((self.keys, keys), 0)
            self.values = ops.cat((self.values, values), 0)
        return self.keys, self.values


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
