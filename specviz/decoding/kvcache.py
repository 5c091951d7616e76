"""With models/recurrent.py (a recurrent layer's state read and set) and pagedlayer.py (a paged
attention layer), the only module that touches transformers' cache internals: the KV cache of
attention layers, and the state of recurrent layers (Gated DeltaNet, Mamba, short convolutions) in a
hybrid model.

transformers 5.x `DynamicCache` keeps one layer object per decoder layer. An attention layer holds
`keys` and `values` of shape (batch, kv_heads, slots, head_dim): slot j of a row holds the K/V of
that row's layout slot j (see decoding/batch.py). Keys are stored after RoPE, so moving a row's
entries to other slots is valid only because the row's logical positions do not change when its
padding does. Every attention layer keeps every slot, sliding-window layers too: transformers'
sliding layers drop the slots that leave the window, which slot-indexed layouts cannot follow. Their
window is applied by the mask instead (decoding/batch.py).

A recurrent layer holds a state per row instead (a convolution's last inputs, a scan's state), which
has no slots: it follows the rows when the batch is rearranged, and nothing of a rejected draft can
be cropped out of it. So while drafts are fed (`keeping`), each recurrent layer runs those positions
one at a time, through its own single-token (decode) algorithm, and keeps its state after each; once
the round's decisions are made, each row takes the state at its own accepted count (`roll_back`).
The tokens fed before them (a prefill) run in one call, through the layer's chunked algorithm, as
the model runs a prompt alone.

transformers masks padding out of a recurrent layer only in batches of two rows or more: in a batch
of one, the row's leading pads are not fed to its recurrent layers at all (their outputs there are
zeros, which only pad slots read).

`None` is the cache of a drafter that keeps none (prompt lookup): every operation on it does
nothing, so the decoders move "both caches" alike.

A paged cache (`new` given a batch's `Pages`, paging.py) keeps its attention layers' K/V in a
block pool instead: a pass maps the slots it feeds first (`feeding`), writes there, and reads every
row's slots through the map; a rearrangement moves the map, not the K/V. Its recurrent layers are
as above.
"""
from __future__ import annotations

import contextlib
import copy
import weakref
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import (DynamicLayer, DynamicSlidingWindowLayer,
                                      LinearAttentionCacheLayerMixin)

from specviz.decoding.pagedlayer import PagedCache, PagedLayer, paged
from specviz.decoding.paging import Pages

from specviz.models.recurrent import (State, Wrapped, holds_state, put_states, states,
                                     where_rows)


def new(model, pages: Pages | None = None) -> DynamicCache:
    """An empty cache for `model` (paged over `pages` where given); its recurrent layers, if any,
    are made ready to keep per-position states."""
    STEPWISE.swap(model)
    cache = DynamicCache(config=model.config)
    cache.layers = [DynamicLayer()
                    if isinstance(lay, DynamicSlidingWindowLayer) and not holds_state(lay) else lay
                    for lay in cache.layers]
    if pages is None:
        return cache
    if recurrent(cache):  # its states kept at block boundaries too
        pages.start_states()
    return paged(cache, pages)


def _pages(cache) -> Pages | None:
    return cache.pages if isinstance(cache, PagedCache) else None


def feeding(cache, tokens: torch.Tensor, valid: torch.Tensor, q_start: int) -> None:
    """Before a pass over slots q_start.. of the layout: a paged cache maps them to slots."""
    if _pages(cache) is not None:
        cache.pages.feed(tokens, valid, q_start)


def _layers(cache: DynamicCache | None) -> list:
    return [] if cache is None else cache.layers


def _kv(layer) -> bool:
    """The layer holds K/V slots."""
    return isinstance(layer, DynamicLayer) and layer.is_initialized and layer.keys is not None \
        and layer.keys.numel() > 0


def recurrent(cache: DynamicCache | None) -> bool:
    """Some layer of `cache` carries a recurrent state."""
    return any(holds_state(lay) for lay in _layers(cache))


def held_by(cache: DynamicCache | None, held: torch.Tensor) -> torch.Tensor:
    """`held` (B,: the row's tokens its recurrent states hold), -1 where a prefix-cache hit set
    them to states fed other tokens (boundarystates.py)."""
    pages = _pages(cache)
    if pages is None or not pages.misfed:
        return held
    return held.masked_fill(torch.tensor([q in pages.misfed for q in pages.requests],
                                         device=held.device), -1)


def length(cache: DynamicCache | None) -> int:
    if _pages(cache) is not None:
        return cache.pages.width
    return 0 if cache is None else cache.get_seq_length()


def crop(cache: DynamicCache | None, slots: int, valid: torch.Tensor | None = None) -> None:
    """Keep the first `slots` slots of every row (a recurrent state has none: it stays). `valid`:
    the real ones among them, where known (a paged cache gives back the blocks past them)."""
    if _pages(cache) is not None:
        cache.pages.realign(torch.arange(len(cache.pages.requests)), None, valid, slots)
        return
    for lay in _layers(cache):
        if _kv(lay) and lay.keys.shape[-2] > slots:
            lay.keys, lay.values = lay.keys[..., :slots, :], lay.values[..., :slots, :]


def gather(cache: DynamicCache | None, rows: torch.Tensor, src: torch.Tensor,
           valid: torch.Tensor | None = None) -> None:
    """Rebuild the cache in one indexing op per layer: new row r, slot j takes old row rows[r], slot
    src[r, j]; a recurrent state follows its row. Per-row shifts, crops, dropped rows and compaction
    are all special cases. A paged cache moves its map instead (`valid`: as crop's)."""
    if cache is None:
        return
    if _pages(cache) is not None:
        cache.pages.realign(rows, src, valid)
    for lay in cache.layers:
        if _kv(lay):
            r, s = _on(lay.keys, rows[:, None]), _on(lay.keys, src)
            lay.keys = lay.keys[r, :, s].transpose(1, 2).contiguous()
            lay.values = lay.values[r, :, s].transpose(1, 2).contiguous()
    _select_states(cache, rows)


def zero_slots(cache: DynamicCache | None, lost: torch.Tensor) -> None:
    """Zero the K/V of the (row, slot) pairs marked in `lost` (B, slots): the
    `min-crop` fault's entries that were cropped away (a paged cache's read nothing)."""
    if _pages(cache) is not None:
        cache.pages.drop(lost)
    for lay in _layers(cache):
        if _kv(lay):
            m = _on(lay.keys, lost[:, None, :, None])
            lay.keys, lay.values = lay.keys.masked_fill(m, 0), lay.values.masked_fill(m, 0)


def select_rows(cache: DynamicCache | None, rows: torch.Tensor) -> None:
    if cache is None:
        return
    if _pages(cache) is not None:
        cache.pages.realign(rows, None, None)
    for lay in cache.layers:
        if _kv(lay):
            lay.keys, lay.values = lay.keys[_on(lay.keys, rows)], lay.values[_on(lay.keys, rows)]
    _select_states(cache, rows)


def _select_states(cache: DynamicCache, rows: torch.Tensor) -> None:
    for lay in cache.layers:
        put_states(lay, {key: t[_on(t, rows)] for key, t in states(lay).items()})
    journal = _JOURNALS.get(cache)
    if journal is not None:
        journal.stale = {i: {key: t[_on(t, rows)] for key, t in s.items()}
                         for i, s in journal.stale.items()}


def _on(like: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`index` on the device of `like`: a target spread over GPUs keeps each layer's cache beside
    the layer. A no-op (no copy) on one device."""
    return index.to(like.device)


def layers_kv(cache: DynamicCache | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every attention layer's (keys, values) as they are now: references, not copies. Each forward
    pass replaces these tensors (torch.cat) instead of writing into them, so they keep the state of
    this moment. A paged cache's are read out through its map as it was before the pass under
    way (copies, for the pool is written in place): the tap asks as a pass starts."""
    if _pages(cache) is not None:
        return [cache.pages.read(lay.index, cache.pages.before)
                for lay in cache.layers if isinstance(lay, PagedLayer) and lay.is_initialized]
    return [(lay.keys, lay.values) for lay in _layers(cache) if _kv(lay)]


def layers_states(cache: DynamicCache | None) -> list[State]:
    """Every recurrent layer's states as they are now: copies, since a forward pass writes them
    in place."""
    return [{key: t.clone() for key, t in states(lay).items()} for lay in _layers(cache)
            if holds_state(lay)]


def row_kv(cache: DynamicCache, layer: int, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, values) of one row in one layer: (kv_heads, slots, head_dim)."""
    lay = cache.layers[layer]
    return lay.keys[row], lay.values[row]


def _rebuilt_cache(cache: DynamicCache, part, pages: Pages | None = None) -> DynamicCache:
    """A cache of `cache`'s layer kinds, each layer's tensors `part(index, layer)`: (keys, values)
    or None, and a recurrent layer's states; a paged one's layers over `pages`."""
    out = copy.copy(cache)
    out.layers = []
    if pages is not None:
        out.pages = pages
    for i, lay in enumerate(cache.layers):
        new = copy.copy(lay)
        if isinstance(lay, PagedLayer):
            new.pages = pages
        kv, state = part(i, lay)
        if isinstance(lay, DynamicLayer):
            new.keys, new.values = kv if kv is not None else (None, None)
            new.is_initialized = kv is not None
        if holds_state(lay):
            LinearAttentionCacheLayerMixin.__init__(new, number_of_states=lay.number_of_states)
            put_states(new, state)
        out.layers.append(new)
    return out


def split(cache: DynamicCache | None, spans: list[tuple[int, int]],
          valid: torch.Tensor | None = None) -> list[DynamicCache | None]:
    """One single-row cache per batch row, row i keeping slots spans[i] = (start, end) and its
    states (cross-batch scheduling keeps these). Views, not copies. `valid`: the real slots
    (a paged cache needs them: it gives back the blocks past each row's last)."""
    if cache is None:
        return [None] * len(spans)
    pages = (cache.pages.split(spans, valid) if _pages(cache) is not None
             else [None] * len(spans))
    return [_rebuilt_cache(cache, lambda _, lay, i=i, lo=lo, hi=hi: (
        (lay.keys[i: i + 1, :, lo:hi], lay.values[i: i + 1, :, lo:hi]) if _kv(lay) else None,
        {key: t[i: i + 1] for key, t in states(lay).items()}), part_pages)
            for i, ((lo, hi), part_pages) in enumerate(zip(spans, pages))]


def audit_pages(cache, tokens: torch.Tensor,
                valid: torch.Tensor) -> tuple[torch.Tensor, list[dict]] | None:
    """A paged cache's own checks against the layout (paging.Pages.audit); None: not paged."""
    return cache.pages.audit(tokens, valid) if _pages(cache) is not None else None


def block_tables(cache) -> list[tuple[list[int], list[bool]]] | None:
    """A paged cache's rows' block tables, each block's sharing beside it; None: not paged."""
    return cache.pages.block_tables() if _pages(cache) is not None else None


def let_go(cache: DynamicCache | None) -> None:
    """A cache whose rows left: a paged one gives its blocks back to the pool."""
    if _pages(cache) is not None:
        cache.pages.realign(torch.arange(0), None, None)


def merge(caches: list[DynamicCache | None]) -> DynamicCache | None:
    """Stack single-row caches into one batch, left-padding each to the longest (pad slots hold
    zeros and must be masked); their states stack as they are."""
    if caches[0] is None:
        return None
    width = max(length(c) for c in caches)

    def part(i, lay):
        layers = [c.layers[i] for c in caches]
        kv = None
        if _kv(lay):
            pad = [(0, 0, width - la.keys.shape[-2], 0) for la in layers]
            kv = (torch.cat([torch.nn.functional.pad(la.keys, p) for la, p in zip(layers, pad)]),
                  torch.cat([torch.nn.functional.pad(la.values, p) for la, p in zip(layers, pad)]))
        return kv, {key: torch.cat([states(la)[key] for la in layers]) for key in states(lay)}
    pages = (Pages.merge([c.pages for c in caches]) if _pages(caches[0]) is not None else None)
    return _rebuilt_cache(caches[0], part, pages)


def assembled(model, kv: list[tuple[torch.Tensor, torch.Tensor]],
              state: list[State]) -> DynamicCache:
    """A cache for `model` holding exactly these K/V (one pair per attention layer, in order) and
    recurrent states (one per recurrent layer, as layers_states lists them)."""
    cache, kv, state = new(model), iter(kv), iter(state)
    for lay in cache.layers:
        if isinstance(lay, DynamicLayer):
            lay.keys, lay.values = next(kv)
            lay.is_initialized, lay.device, lay.dtype = True, lay.keys.device, lay.keys.dtype
        if holds_state(lay):
            put_states(lay, next(state))
    return cache


# ------------------------------------------------------- recurrent states at every drafted position


@dataclass
class _Journal:
    """A cache's recurrent states kept during a round: per recurrent layer, the state after each
    position fed while `keeping` (in order, over every call of the round); and, after a roll back,
    each row's state after the round's first position (what a faulty engine
    reads, `state-after-zero-draft`)."""

    keep: int = 0  # positions of the call under way whose states are kept (its last ones)
    kept: dict[int, list[State]] = field(default_factory=dict)
    stale: dict[int, State] = field(default_factory=dict)


_JOURNALS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def keeping(cache: DynamicCache | None, positions: int):
    """Within: the recurrent layers of `cache` run the last `positions` tokens fed to them one at a
    time and keep their state after each (what `roll_back` chooses from). A cache without recurrent
    layers is untouched."""
    if not recurrent(cache):
        yield
        return
    journal = _JOURNALS.setdefault(cache, _Journal())
    journal.keep = positions
    try:
        yield
    finally:
        journal.keep = 0


def kept(cache: DynamicCache | None) -> int:
    """How many positions' states the cache keeps now (0 without recurrent layers)."""
    journal = _JOURNALS.get(cache) if cache is not None else None
    return len(next(iter(journal.kept.values()), [])) if journal else 0


def roll_back(cache: DynamicCache | None, index: torch.Tensor,
              conv_index: torch.Tensor | None = None) -> None:
    """Each row's recurrent states become those kept after its `index`-th kept position (its
    convolution's after `conv_index`, the same by default); the kept states are let go."""
    journal = _JOURNALS.get(cache) if cache is not None else None
    if not journal or not journal.kept:
        return
    rows = torch.arange(len(index), device=index.device)
    for i, kept_states in journal.kept.items():
        chosen = {}
        # a position before any state has none: zeros
        for key in {key: None for s in kept_states for key in s}:
            like = next(s[key] for s in kept_states if key in s)
            stacked = torch.stack([s.get(key, torch.zeros_like(like)) for s in kept_states])
            at = conv_index if key[0] == "conv" and conv_index is not None else index
            chosen[key] = stacked[_on(stacked, at), _on(stacked, rows)]
        put_states(cache.layers[i], chosen)
        journal.stale[i] = kept_states[0]
    journal.kept = {}


def read_stale(cache: DynamicCache | None, rows: torch.Tensor) -> None:
    """The `state-after-zero-draft` fault: the rows marked in `rows` (B,) take the state they had
    after the last round's first position, as if its accepted drafts had never reached the state."""
    journal = _JOURNALS.get(cache) if cache is not None else None
    if not journal or not journal.stale or not bool(rows.any()):
        return
    for i, stale in journal.stale.items():
        lay = cache.layers[i]
        now = states(lay)
        put_states(lay, {key: where_rows(rows, stale[key], t) for key, t in now.items()})


def _stepwise_forward(cls: type):
    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        journal = _JOURNALS.get(cache) if cache is not None else None
        T = hidden_states.shape[1]
        n = min(journal.keep, T) if journal else 0
        pages = _pages(cache)
        plan = pages.plan if pages is not None else None
        # the kept positions one at a time, what came before them in one call; cut after the
        # slots where a paged hybrid keeps or sets its states (boundarystates.py)
        cuts = plan.cuts(T, n) if plan else {}
        if not n and not cuts:
            return _unpadded(cls, self, hidden_states, cache, attention_mask, kwargs)
        outs, at, layer = [], 0, cache.layers[self.layer_idx]
        for end in sorted(set(range(T - n + 1, T + 1)) | set(cuts) | {T}):
            mask = None if attention_mask is None else attention_mask[:, at: end]
            outs.append(_unpadded(cls, self, hidden_states[:, at: end], cache, mask, kwargs))
            if end in cuts:  # (before the journal: a state set there is the row's from then)
                cuts[end].after(pages.pool, self.layer_idx, layer)
            if end > T - n:
                journal.kept.setdefault(self.layer_idx, []).append(
                    {key: t.clone() for key, t in states(layer).items()})
            at = end
        return torch.cat(outs, 1)
    return forward


def _unpadded(cls: type, mixer, hidden_states, cache, mask, kwargs):
    """The mixer's own forward; a batch of one row leaves its leading pads out (transformers masks
    pads only in batches of two or more)."""
    if (hidden_states.shape[0] == 1 and mask is not None and mask.dim() == 2
            and not bool(mask.all())):
        lead = int((mask[0] == 0).long().cumprod(0).sum())
        if lead == hidden_states.shape[1]:  # nothing but pads: the state stays as it was (none yet)
            return hidden_states.new_zeros(hidden_states.shape)
        out = cls.forward(mixer, hidden_states[:, lead:], cache=cache, attention_mask=None,
                          **kwargs)
        return torch.cat([out.new_zeros(1, lead, out.shape[-1]), out], 1)
    return cls.forward(mixer, hidden_states, cache=cache, attention_mask=mask, **kwargs)


# Each recurrent mixer keeps per-position states when its cache asks (`keeping`).
STEPWISE = Wrapped("Stepwise", _stepwise_forward)
