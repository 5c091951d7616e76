"""The only module that touches transformers' cache internals.

transformers 5.x `DynamicCache` keeps one layer object per decoder layer with
`keys` and `values` of shape (batch, kv_heads, slots, head_dim). Slot j of a
row holds the K/V of that row's layout slot j (see decoding/batch.py).
Keys are stored after RoPE, so moving a row's entries to other slots is valid
only because the row's logical positions do not change when its padding does.

Every layer keeps every slot, sliding-window layers too: transformers' sliding
layers drop the slots that leave the window, which slot-indexed layouts cannot
follow. Their window is applied by the mask instead (decoding/batch.py).

`None` is the cache of a drafter that keeps none (prompt lookup): every
operation on it does nothing, so the decoders move "both caches" alike.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


def new(model) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    cache.layers = [DynamicLayer() if isinstance(lay, DynamicSlidingWindowLayer) else lay for lay in cache.layers]
    return cache


def length(cache: DynamicCache | None) -> int:
    return 0 if cache is None else cache.get_seq_length()


def crop(cache: DynamicCache | None, slots: int) -> None:
    """Keep the first `slots` slots of every row."""
    if cache is None:
        return
    extra = length(cache) - slots
    if extra > 0:
        cache.crop(-extra)


def gather(cache: DynamicCache | None, rows: torch.Tensor, src: torch.Tensor) -> None:
    """Rebuild the cache in one indexing op per layer: new row r, slot j takes
    old row rows[r], slot src[r, j]. Per-row shifts, crops, dropped rows and
    compaction are all special cases of this."""
    if cache is None:
        return
    rows = rows[:, None]
    for layer in cache.layers:
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        r, s = _on(layer, rows), _on(layer, src)
        layer.keys = layer.keys[r, :, s].transpose(1, 2).contiguous()
        layer.values = layer.values[r, :, s].transpose(1, 2).contiguous()


def zero_slots(cache: DynamicCache | None, lost: torch.Tensor) -> None:
    """Zero the K/V of the (row, slot) pairs marked in `lost` (B, slots): the
    `min-crop` fault's entries that were cropped away."""
    if cache is None:
        return
    m = lost[:, None, :, None]
    for layer in cache.layers:
        layer.keys = layer.keys.masked_fill(_on(layer, m), 0)
        layer.values = layer.values.masked_fill(_on(layer, m), 0)


def select_rows(cache: DynamicCache | None, rows: torch.Tensor) -> None:
    if cache is None:
        return
    for layer in cache.layers:
        if layer.is_initialized:
            layer.batch_select_indices(_on(layer, rows))


def _on(layer, index: torch.Tensor) -> torch.Tensor:
    """`index` on the layer's device: a target spread over GPUs keeps each layer's cache beside the layer.
    A no-op (no copy) on one device."""
    return index.to(layer.keys.device)


def layers_kv(cache: DynamicCache | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's (keys, values) as they are now: references, not copies. Each forward pass
    replaces these tensors (torch.cat) instead of writing into them, so they keep the state of this moment."""
    if cache is None:
        return []
    return [(lay.keys, lay.values) for lay in cache.layers if lay.is_initialized and lay.keys is not None]


def from_kv(kv: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A cache holding exactly these per-layer (keys, values)."""
    return DynamicCache(ddp_cache_data=kv)


def row_kv(cache: DynamicCache, layer: int, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, values) of one row in one layer: (kv_heads, slots, head_dim)."""
    lay = cache.layers[layer]
    return lay.keys[row], lay.values[row]


def split(cache: DynamicCache | None, spans: list[tuple[int, int]]) -> list[DynamicCache | None]:
    """One single-row cache per batch row, row i keeping slots spans[i] = (start, end)
    (cross-batch scheduling keeps these). Views, not copies."""
    if cache is None:
        return [None] * len(spans)
    return [
        DynamicCache(ddp_cache_data=[(lay.keys[i : i + 1, :, lo:hi], lay.values[i : i + 1, :, lo:hi])
                                     for lay in cache.layers])
        for i, (lo, hi) in enumerate(spans)
    ]


def merge(caches: list[DynamicCache | None]) -> DynamicCache | None:
    """Stack single-row caches into one batch, left-padding each to the longest
    (pad slots hold zeros and must be masked)."""
    if caches[0] is None:
        return None
    lengths = [length(c) for c in caches]
    width = max(lengths)
    data = []
    for li in range(len(caches[0].layers)):
        ks, vs = [], []
        for c, n in zip(caches, lengths):
            k, v = c.layers[li].keys, c.layers[li].values
            pad = width - n
            ks.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
            vs.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
        data.append((torch.cat(ks), torch.cat(vs)))
    return DynamicCache(ddp_cache_data=data)
