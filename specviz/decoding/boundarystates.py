"""A hybrid's recurrent states at block boundaries, for prefix caching, as the engines keep them
(vLLM's Mamba prefix caching): a block in the prefix cache carries the model's recurrent states
after its last token, so that a request that hits it starts its states there.

Each pass of a hybrid over a paged cache with prefix caching is cut, in its recurrent layers, after
every position that ends a block: each row's states there are kept (pending in the pool, by
request and position, with the tokens they were fed) until the block is registered, when the
block takes them. A fresh row whose prompt hits the prefix cache keeps its hit up to the last block
that carries states, and the pass that feeds that block's last token sets the row's states to the
block's there: the tokens before still pass through the layers (their K/V are read from the
blocks), but what the row's states hold from then on is the block's.

The check: a block's states were fed exactly the tokens of its chain (`state-holds-other-tokens`),
named with the block and the request whose pass computed them, when a row takes them. A faulty
engine's slip (`Slips.state_over_drafts`, vLLM PR #57128) keeps, for a block that a verify pass
completes, the states after the pass's last token, over the drafts it then rejects.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specviz.decoding.blockpool import Saved
from specviz.models.recurrent import put_states, states


@dataclass(frozen=True)
class Keep:
    """A row's states to keep after position `position` of a pass (at the pass's slot `end`), fed
    `tokens`; and where a slipping engine takes them instead: after the row's last slot of the
    pass (`last`), fed `to_last`."""
    row: int
    request: int
    position: int
    end: int
    tokens: list[int]
    last: int
    to_last: list[int]


@dataclass
class Plan:
    """What one pass's recurrent layers do after some of its slots (counted from the pass's first,
    as the slot's end): keep rows' states, or set a row's states to a block's (row, Saved).
    `over_drafts`: the slip's."""

    keeps: list[Keep] = field(default_factory=list)
    put: dict[int, list[tuple[int, Saved]]] = field(default_factory=dict)
    over_drafts: bool = False
    made: dict = field(default_factory=dict)  # (T, kept) -> its cuts, which every layer shares

    def cuts(self, T: int, kept: int) -> dict[int, Cut]:
        """Slot end -> what to do there, in a call of T slots whose last `kept` are a verify
        window (its drafts; the slip's keeps in it move to the row's last slot); the same for
        each recurrent layer of the pass."""
        if (T, kept) in self.made:
            return self.made[T, kept]
        out = self.made[T, kept] = {end: Cut([], list(puts)) for end, puts in self.put.items()}
        for keep in self.keeps:
            slipped = self.over_drafts and keep.end > T - kept
            end, tokens = (keep.last, keep.to_last) if slipped else (keep.end, keep.tokens)
            out.setdefault(end, Cut([], [])).keeps.append(
                (keep, Saved({}, tokens, keep.request)))
        return out


@dataclass
class Cut:
    """What a pass's recurrent layers do after one of its slots: keep rows' states (each into its
    Saved, pending in the pool), and set rows' states to a block's (row, Saved)."""

    keeps: list[tuple[Keep, Saved]]
    puts: list[tuple[int, Saved]]

    def after(self, pool, layer_idx: int, layer) -> None:
        """Recurrent layer `layer_idx` (its cache layer `layer`) has fed the slots up to here."""
        for keep, saved in self.keeps:
            saved.states[layer_idx] = {key: t[keep.row].clone()
                                       for key, t in states(layer).items()}
            pool.pending[keep.request, keep.position] = saved
        for row, saved in self.puts:
            new = {key: t.clone() for key, t in states(layer).items()}
            for key, t in saved.states[layer_idx].items():
                new[key][row] = t.to(new[key].dtype)
            put_states(layer, new)


def plan(pages, index: torch.Tensor, fed: torch.Tensor, tokens: torch.Tensor,
         valid: torch.Tensor) -> Plan:
    """The plan of a pass over `pages` whose fed slots (B, q) `fed` are at positions `index`
    (B, q), of the layout's `tokens` and `valid` (B, S)."""
    size, out = pages.pool.size, Plan(over_drafts=pages.slips.state_over_drafts)
    for r, (row_tokens, row_valid) in enumerate(zip(tokens.tolist(), valid.tolist())):
        slots = fed[r].nonzero().flatten().tolist()
        if not slots:
            continue
        ids = [t for t, ok in zip(row_tokens, row_valid) if ok]
        request, at = pages.requests[r], index[r].tolist()
        last = slots[-1] + 1
        for j in slots:
            p = at[j]
            if (p + 1) % size == 0 and p >= pages.hits[r]:
                out.keeps.append(Keep(r, request, p, j + 1, ids[: p + 1], last,
                                      ids[: at[slots[-1]] + 1]))
            if request in pages.restores and p == pages.hits[r] - 1:
                out.put.setdefault(j + 1, []).append((r, pages.restores.pop(request)))
    return out


def hit_states(pages, r: int, ids: list[int]) -> None:
    """Fresh row r of `pages`, with prompt `ids`, has taken its prefix-cache hit: cut back to the
    last hit block whose recurrent states the pool keeps, whose states the row then takes."""
    pool, table, request = pages.pool, pages.tables[r], pages.requests[r]
    while table and table[-1] not in pool.saved:
        pool.release(table.pop())
        pages.chains[r].pop()
        pool.stats.hits -= 1
    if table:
        saved = pages.restores[request] = pool.saved[table[-1]]
        pool.stats.states_restored += 1
        if not _fed_exactly(pool, saved, ids[: len(table) * pool.size], table[-1], request):
            pages.misfed.add(request)


def _fed_exactly(pool, saved: Saved, ids: list[int], block: int, request: int) -> bool:
    """Whether the states a hit on `block` gives were fed exactly `ids` (the hit's tokens); if not,
    a failed paged check naming the block and the request that computed them."""
    if saved.tokens == ids:
        return True
    j = next((i for i, (a, b) in enumerate(zip(saved.tokens, ids)) if a != b),
             min(len(saved.tokens), len(ids)))
    if pool.checked:
        pool.events.append(dict(check="state-holds-other-tokens", seq=request, block=block,
                                position=j, writer=saved.writer,
                                holds=saved.tokens[j] if j < len(saved.tokens) else -1,
                                wants=ids[j] if j < len(ids) else -1))
    return False
