"""Paged KV, the memory layout of serving engines (vLLM, SGLang, TensorRT-LLM, TGI, OpenVINO GenAI):
each attention layer's K/V lives in fixed-size blocks of one pool a model keeps for a whole run
(blockpool.py), and each row maps its positions to slots through its block table. kvcache.py
presents a row's slots to attention through this map; here is only the bookkeeping, which never
touches transformers.

A row's i-th token (its position) lives at slot `table[i // size] * size + i % size`. A pass writes
each token it feeds there (`feed`); a rearranged batch (`realign`) keeps each row's own blocks,
gives back those past its last kept token (the rejected drafts' blocks), and copies into place
whatever the map moved elsewhere (a token tree's accepted path).

Prefix caching: a block full of a row's committed tokens is registered under the chain of digests
of every full block up to it; a fresh row whose prompt starts with registered blocks takes them as
they are (a hit: counted, never written again: its pass still computes the whole prompt, so a hit
saves memory, not time), and a row about to write into a block another row holds, or the prefix
cache keeps, copies it first (copy-on-write). A hybrid's blocks carry its recurrent states too, and
a hit starts from them (boundarystates.py).

The paged checks (`audit`, and the pool's events): each row's table maps each of its positions to
a slot holding that token; a pass writes only blocks its row holds alone; a prefix-cache hit finds
its key's tokens in the block. A faulty engine's slips (`Slips`) write elsewhere than the table
says; the checks name the block, and the request that wrote it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from specviz.decoding import boundarystates
from specviz.decoding.blockpool import ROOT, BlockPool, Saved
from specviz.spec.faults import FAULTS


@dataclass(frozen=True)
class KVLayout:
    """How a run's engine lays out its models' K/V: contiguous rows (block_size 0), or paged."""

    block_size: int = 0
    prefix_caching: bool = False
    blocks: int | None = None  # each pool's at most (None: it grows)

    @property
    def paged(self) -> bool:
        return self.block_size > 0


CONTIGUOUS = KVLayout()


@dataclass(frozen=True)
class Slips:
    """Where a faulty paged engine writes a pass's K/V elsewhere than its block table says (a
    fault's record names the slip it is: spec/faults.toml)."""

    # a pass's slots taken to be the slot ids after its first (TGI PR #2711)
    contiguous_slots: bool = False
    # a prefix-hit row's first pass writes past its hit blocks into the last of them, shared
    # (vLLM PR #42971)
    lookahead_in_shared: bool = False
    # a hybrid's block completed by a verify pass keeps the states after the pass's last token,
    # over the drafts it rejects (vLLM PR #57128)
    state_over_drafts: bool = False

    @classmethod
    def of(cls, faults: tuple[str, ...]) -> Slips:
        """The slips these faults make (their records name them)."""
        return cls(**{FAULTS[f].slips: True for f in faults if FAULTS[f].slips})


@dataclass
class Pages:
    """A batch's rows in one model's pool: each row's block table, the request it serves, and the
    slot each of its cache slots reads (-1: none, zeros)."""

    pool: BlockPool
    requests: list[int]
    slips: Slips = Slips()
    tables: list[list[int]] = field(default_factory=list)
    slot_map: torch.Tensor | None = None  # (B, cache slots)
    # the latest pass: the slots its tokens are written to, which of them it writes, and the
    # slots the cache held before it
    writes: tuple[torch.Tensor, torch.Tensor] | None = None
    chains: list[list[bytes]] = field(default_factory=list)  # each row's full blocks' digests
    hits: list[int] = field(default_factory=list)  # each row's positions the prefix cache gave
    # the cache's last slots its model recomputes next round (a head re-feeds its accepted drafts,
    # computed from its own guesses): never registered until they are
    unsettled: int = 0
    before: int = 0
    # a hybrid's (boundarystates.py): the states a fresh row's hit gives, by request, until its
    # pass feeds the hit's last token; the latest pass's plan of its states at block boundaries
    recurrent: bool = False
    prompts: list[list[int]] = field(default_factory=list)  # a fresh batch's rows' prompts
    restores: dict[int, Saved] = field(default_factory=dict)
    misfed: set[int] = field(default_factory=set)  # requests given states fed other tokens
    plan: boundarystates.Plan | None = None

    def __post_init__(self):
        B = len(self.requests)
        self.tables = self.tables or [[] for _ in range(B)]
        self.chains = self.chains or [[] for _ in range(B)]
        self.hits = self.hits or [0] * B
        if self.slot_map is None:
            self.slot_map = torch.empty(B, 0, dtype=torch.long)
        self.before = self.width

    @property
    def width(self) -> int:
        return self.slot_map.shape[1]

    def _slots(self, r: int, n: int) -> torch.Tensor:
        """The slots of row r's first n positions, by its table."""
        size, at = self.pool.size, torch.arange(n)
        return torch.tensor(self.tables[r], dtype=torch.long)[at // size] * size + at % size

    def _writable(self, r: int, b: int) -> int:
        """Row r's b-th block, copied first if another row or the prefix cache holds it."""
        block = self.tables[r][b]
        if self.pool.shared(block):
            mine = self.pool.allocate()
            size = self.pool.size
            self.pool.copy(torch.arange(block * size, (block + 1) * size),
                           torch.arange(mine * size, (mine + 1) * size))
            self.pool.release(block)
            self.tables[r][b] = mine
            self.slot_map[r] = torch.where(self.slot_map[r] // size == block,
                                           mine * size + self.slot_map[r] % size, self.slot_map[r])
            self.pool.stats.copies += 1
        return self.tables[r][b]

    def take_prefixes(self, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """A fresh batch's rows, laid out with their prompts (`tokens`, `valid`): each takes the
        prefix cache's blocks its prompt starts with, which its passes never write."""
        self.prompts = [[t for t, ok in zip(row_tokens, row_valid) if ok]
                        for row_tokens, row_valid in zip(tokens.tolist(), valid.tolist())]
        for r, ids in enumerate(self.prompts):
            self._take_prefix(r, ids)

    def start_states(self) -> None:
        """A hybrid's fresh rows (its model keeps recurrent states): each keeps its hit up to the
        last block whose states the pool keeps, and starts from them (boundarystates.py)."""
        self.recurrent = True
        for r, ids in enumerate(self.prompts):
            if self.tables[r]:
                boundarystates.hit_states(self, r, ids)
                self.hits[r] = len(self.tables[r]) * self.pool.size

    def feed(self, tokens: torch.Tensor, valid: torch.Tensor, q_start: int) -> None:
        """Map the slots q_start.. of the layout a pass feeds (each row's cache holds the slots
        before): each real token to its position's slot, allocating blocks as rows grow; the
        positions the prefix cache gave are read, never written."""
        if q_start != self.width:
            raise ValueError(f"a pass from slot {q_start} on a paged cache of {self.width}")
        size = self.pool.size
        index = (valid.long().cumsum(1) - 1)[:, q_start:].cpu()
        fed = valid[:, q_start:].cpu()
        mapped = torch.full(fed.shape, -1, dtype=torch.long)  # where each slot is read from
        written = torch.full(fed.shape, -1, dtype=torch.long)  # where its K/V goes (-1: nowhere)
        for r, (row_tokens, row_valid) in enumerate(zip(tokens.tolist(), valid.tolist())):
            if not bool(fed[r].any()):
                continue
            ids = [t for t, ok in zip(row_tokens, row_valid) if ok]
            hit = self.hits[r]
            at = index[r][fed[r]]
            first, last = int(at[0]), int(at[-1])
            while len(self.tables[r]) * size <= last:
                self.tables[r].append(self.pool.allocate())
            for b in range(max(first, hit) // size, last // size + 1):
                self._writable(r, b)
            table = torch.tensor(self.tables[r])
            mapped[r, fed[r]] = table[at // size] * size + at % size
            dest = torch.where(at >= hit, self._slipped(r, at, mapped[r, fed[r]], hit, q_start),
                               -1)
            written[r, fed[r]] = dest
            own = dest >= 0
            self._check_writes(r, at[own], dest[own], [ids[i] for i in at[own].tolist()])
        if self.recurrent and self.pool.prefix_caching:
            self.plan = boundarystates.plan(self, index, fed, tokens, valid)
        self.writes, self.before = (written, written >= 0), self.width
        self.slot_map = torch.cat([self.slot_map, mapped], 1)

    def _slipped(self, r: int, at: torch.Tensor, mapped: torch.Tensor, hit: int,
                 q_start: int) -> torch.Tensor:
        """Where the engine writes row r's positions `at` (their table's slots `mapped`) in a pass
        from slot `q_start`."""
        size, fresh = self.pool.size, at >= hit
        if self.slips.contiguous_slots and bool(fresh.any()):
            i = int(fresh.long().argmax())
            return mapped[i] + (at - at[i])
        if self.slips.lookahead_in_shared and hit and q_start == 0:  # the row's first pass
            return torch.where(fresh, self.tables[r][hit // size - 1] * size + at % size, mapped)
        return mapped

    def _check_writes(self, r: int, positions: torch.Tensor, slots: torch.Tensor,
                      ids: list[int]) -> None:
        """Row r writes these tokens at these slots: a block not in its table, or one it shares
        (with another row or the prefix cache), written breaks a paged check."""
        size, request = self.pool.size, self.requests[r]
        self.pool.reach(int(slots.max()) if len(slots) else 0)
        for i, s, t in zip(positions.tolist(), slots.tolist(), ids):
            block = s // size
            check = ("foreign-block-written" if block not in self.tables[r]
                     else "shared-block-written" if self.pool.shared(block) else None)
            if check and self.pool.checked:
                self.pool.events.append(dict(check=check, seq=request, block=block, position=i,
                                             writer=self.pool.writers[s],
                                             holds=self.pool.tokens[s], wants=t))
                break
        self.pool.wrote(slots.tolist(), ids, request)

    def _take_prefix(self, r: int, ids: list[int]) -> None:
        """A fresh row's prompt's leading full blocks, from the prefix cache."""
        if self.tables[r] or not self.pool.prefix_caching:
            return
        size, parent = self.pool.size, ROOT
        for b in range(len(ids) // size):
            block, digest = self.pool.find(parent, ids[b * size: (b + 1) * size],
                                           self.requests[r])
            if block is None:
                break
            self.pool.hold(block)
            self.tables[r].append(block)
            self.chains[r].append(digest)
            parent = digest
        self.hits[r] = len(self.tables[r]) * size

    def realign(self, rows: torch.Tensor, src: torch.Tensor | None, valid: torch.Tensor | None,
                slots: int | None = None) -> None:
        """The batch laid out again: new row i is old row rows[i], its new slot j old slot src[i, j]
        (None: the same slot, the first `slots` kept). With `valid` (the new rows' real cache
        slots), each row's tokens are put at their positions' slots (copied there where a pass
        wrote them elsewhere), the blocks past its last given back, and its full blocks
        registered; without it, only the map moves (a tree's path, before the realignment)."""
        rows = rows.cpu()
        rows_list = rows.tolist()
        for r in set(range(len(self.tables))) - set(rows_list):
            self._let_go(r)
        old = self.slot_map[rows]
        self.slot_map = old[:, :slots] if src is None else old.gather(1, src.cpu())
        self.tables = [self.tables[r] for r in rows_list]
        self.chains = [self.chains[r] for r in rows_list]
        self.hits = [self.hits[r] for r in rows_list]
        self.requests = [self.requests[r] for r in rows_list]
        self.before = self.width
        if valid is not None:  # (a cache not filled yet is narrower than its slots)
            valid = valid[:, :self.width].cpu()
            self.slot_map = self.slot_map.masked_fill(~valid, -1)
            for r in range(len(rows_list)):
                self._settle(r, valid[r])

    def _let_go(self, r: int) -> None:
        for block in self.tables[r]:
            self.pool.release(block)
        self.tables[r] = []
        self.pool.forget(self.requests[r])

    def _settle(self, r: int, valid: torch.Tensor) -> None:
        """Row r keeps the `valid` slots of its cache: each at its position's slot (copied there
        from where the map moved it), the blocks past them given back (after the copies, which
        may read them), its full settled blocks registered."""
        size = self.pool.size
        places = valid.nonzero().flatten()
        n = len(places)
        want = self._slots(r, n)
        have = self.slot_map[r, places]
        moved = (have != want).nonzero().flatten()
        if len(moved):
            for b in sorted({int(i) // size for i in moved}):
                self._writable(r, b)
            want = self._slots(r, n)
            self.pool.copy(have[moved].clamp(min=0), want[moved])
            self.pool.stats.moved += len(moved)
        self.slot_map[r, places] = want
        given = self.hits[r] // size  # (a cache that lags its prompt keeps the blocks it hit)
        blocks = max(-(-n // size), given)
        for block in self.tables[r][blocks:]:
            self.pool.release(block)
        del self.tables[r][blocks:]
        settled = max(max(0, n - self.unsettled) // size, given)
        del self.chains[r][settled:]
        while len(self.chains[r]) < settled:
            b = len(self.chains[r])
            parent = self.chains[r][-1] if self.chains[r] else ROOT
            ids = [self.pool.tokens[s] for s in want[b * size: (b + 1) * size].tolist()]
            self.chains[r].append(self.pool.register(self.tables[r][b], parent, ids,
                                                     (self.requests[r], (b + 1) * size - 1)))

    def block_tables(self) -> list[tuple[list[int], list[bool]]]:
        """Each row's block table, and which of its blocks are shared."""
        return [(list(t), [self.pool.shared(b) for b in t]) for t in self.tables]

    def drop(self, lost: torch.Tensor) -> None:
        """The (row, slot) pairs marked in `lost` read nothing any more (a fault threw their
        K/V away)."""
        self.slot_map = self.slot_map.masked_fill(lost.cpu(), -1)

    def write(self, layer: int, keys: torch.Tensor,
              values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The latest pass in `layer`: its (B, kv heads, q, head dim) K/V written, then every
        row's slots read: the cache's from the pool, the pass's own as it computed them (as an
        engine's prefill attends its chunk), but where a prefix hit left them in the pool."""
        slots, write = self.writes
        mask = write.to(keys.device)
        self.pool.store(layer, slots[write], keys.transpose(1, 2)[mask],
                        values.transpose(1, 2)[mask])
        k, v = self.read(layer)
        own, q = mask[:, None, :, None], keys.shape[2]
        k[:, :, -q:] = torch.where(own, keys.to(k.dtype), k[:, :, -q:])
        v[:, :, -q:] = torch.where(own, values.to(v.dtype), v[:, :, -q:])
        return k, v

    def read(self, layer: int, slots: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) of every row's cache slots in `layer` (its first `slots`), (B, kv heads,
        slots, head dim), zeros where a slot reads none."""
        return self.pool.read(layer, self.slot_map[:, :slots])

    def audit(self, tokens: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, list[dict]]:
        """Each row's cache slots against the layout's `tokens` there (`valid`: its real ones):
        whether its table maps each of its positions to a slot holding that token (B,), and the
        paged checks broken since the last audit, each naming its block (a row's first wrong
        position; the pool's events)."""
        n, size = min(self.width, tokens.shape[1]), self.pool.size  # (a drafter's drafts: past)
        slots = self.slot_map[:, :n]
        held = torch.tensor(self.pool.tokens)[slots.clamp(min=0)]
        mine = valid[:, :n].cpu()
        wrong = mine & ((held != tokens[:, :n].cpu()) | (slots < 0))
        found, self.pool.events = self.pool.events, []
        for r in wrong.any(1).nonzero().flatten().tolist():
            j = int(wrong[r].long().argmax())
            s = int(self.slot_map[r, j])
            found.append(dict(check="holds-another-token", seq=self.requests[r],
                              block=max(s, 0) // size, position=int(mine[r, :j].sum()),
                              writer=self.pool.writers[s] if s >= 0 else -1,
                              holds=int(held[r, j]) if s >= 0 else -1,
                              wants=int(tokens[r, j])))
        return ~wrong.any(1), found

    def split(self, spans: list[tuple[int, int]], valid: torch.Tensor) -> list[Pages]:
        """One single-row share per row, row i keeping slots spans[i] (`valid`: which are real);
        the blocks pass to them, but those past a row's last kept slot."""
        parts = []
        for i, (lo, hi) in enumerate(spans):
            part = Pages(self.pool, [self.requests[i]], self.slips, [self.tables[i]],
                         self.slot_map[i: i + 1, lo:hi], None, [self.chains[i]],
                         [self.hits[i]], self.unsettled, recurrent=self.recurrent,
                         restores=self.restores, misfed=self.misfed)
            part.realign(torch.zeros(1, dtype=torch.long), None, valid[i: i + 1, lo:hi])
            parts.append(part)
        return parts

    @staticmethod
    def merge(parts: list[Pages]) -> Pages:
        """Single-row shares stacked, left-padded to the widest."""
        width = max(p.width for p in parts)
        return Pages(parts[0].pool, [r for p in parts for r in p.requests], parts[0].slips,
                     [t for p in parts for t in p.tables],
                     torch.cat([torch.nn.functional.pad(p.slot_map, (width - p.width, 0), value=-1)
                                for p in parts]), None, [c for p in parts for c in p.chains],
                     [h for p in parts for h in p.hits], parts[0].unsettled,
                     recurrent=parts[0].recurrent,
                     restores={q: s for p in parts for q, s in p.restores.items()},
                     misfed=set().union(*(p.misfed for p in parts)))


class Memory:
    """A decode's K/V layout and, when paged, each model's block pool (kept across its batches,
    so that a later batch hits what an earlier one left in the prefix cache)."""

    def __init__(self, layout: KVLayout = CONTIGUOUS, slips: Slips = Slips(),
                 checked: bool = True):
        """`checked`: the paged checks' events kept for the rounds' audits (a decode that records
        no round keeps none)."""
        self.layout, self.slips, self.checked = layout, slips, checked
        self.pools: dict[str, BlockPool] = {}

    def pages(self, requests: list[int], role: str, tokens: torch.Tensor, valid: torch.Tensor,
              unsettled: int = 0) -> Pages | None:
        """The pages of a fresh batch of `requests`, laid out with their prompts (`tokens`,
        `valid`), in the pool of the model playing `role` (target or draft), each row holding the
        prefix cache's blocks its prompt starts with; None where the layout is contiguous.
        `unsettled`: as Pages'."""
        if not self.layout.paged:
            return None
        if role not in self.pools:
            self.pools[role] = BlockPool(self.layout.block_size, self.layout.prefix_caching,
                                         self.layout.blocks, self.checked)
        # (the slip of vLLM PR #57128 is its target's: the drafter's pool keeps its states right)
        slips = self.slips if role == "target" else replace(self.slips, state_over_drafts=False)
        pages = Pages(self.pools[role], list(requests), slips, unsettled=unsettled)
        pages.take_prefixes(tokens, valid)
        return pages

    def stats(self) -> dict | None:
        """Per pool: the blocks it handed out, and its prefix cache's counts (None: contiguous)."""
        if not self.layout.paged:
            return None
        return {"block_size": self.layout.block_size,
                "prefix_caching": self.layout.prefix_caching,
                "pools": [{"model": role, "blocks": p.blocks - 1, **p.stats.as_dict()}
                          for role, p in self.pools.items()]}
