"""One model's K/V blocks over a run, as a serving engine keeps them (paging.py maps rows onto
them): fixed-size blocks of one pool, handed out and given back, each held by the rows that map it;
the prefix cache of full blocks of committed tokens, keyed by the chain of their digests; and the
pool's own records of what each slot holds and which request wrote it, that the paged checks read.

Block 0 is never handed out: a slot outside every row's sequence (padding) reads its zeros. A
registered block no row holds stays until a miss needs its room (least recently let go first).

A hybrid's pool also keeps, with each registered block, its model's recurrent states after the
block's last token (`Saved`, boundarystates.py takes them), as the engines do so that a hit skips
the states' compute: what the state was fed, and by which request, are kept beside it.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import torch

from specviz.spec.strict import SpecError

ROOT = b""  # the digest before a row's first block


def _digest(parent: bytes, tokens: list[int]) -> bytes:
    return hashlib.sha256(parent + torch.tensor(tokens, dtype=torch.int64).numpy().tobytes()
                          ).digest()


@dataclass
class Saved:
    """A row's recurrent states after one position: per recurrent layer, its states (one row), the
    tokens it was fed, and the request whose pass computed it."""
    states: dict[int, dict]
    tokens: list[int]
    writer: int


@dataclass
class PoolStats:
    lookups: int = 0  # full prompt blocks a fresh row looked up in the prefix cache
    hits: int = 0  # of those, found
    copies: int = 0  # blocks copied before a write (copy-on-write)
    moved: int = 0  # slots copied into place by a realignment (a tree's accepted path)
    evicted: int = 0  # registered blocks whose room a miss took
    states_saved: int = 0  # a hybrid's: registered blocks given the recurrent states after them
    states_restored: int = 0  # fresh rows whose recurrent states a hit's block gave

    def as_dict(self) -> dict:
        return dict(vars(self))


class BlockPool:
    """Blocks of `size` slots, their storage (per attention layer: slots x kv heads x head dim), who
    holds each, and the prefix cache (where `prefix_caching`). `capacity`: blocks at most (None: it
    grows)."""

    def __init__(self, size: int, prefix_caching: bool, capacity: int | None = None,
                 checked: bool = True):
        self.size, self.prefix_caching, self.capacity = size, prefix_caching, capacity
        self.checked = checked  # its events kept (a decode that records no round asks none)
        self.refs = [1]  # rows holding each block (the null block is held forever)
        self.tokens: list[int] = [-1] * size  # the token each slot holds (-1: none yet)
        self.writers: list[int] = [-1] * size  # the request that wrote each slot (-1: none)
        self.free: list[int] = []
        self.digest_of: dict[int, bytes] = {}
        self.cached: dict[bytes, int] = {}
        self.idle: OrderedDict[int, None] = OrderedDict()  # registered blocks no row holds
        self.storage: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.saved: dict[int, Saved] = {}  # a hybrid's: registered block -> the states after it
        # a hybrid's: (request, position) -> the states after it, until its block is registered
        self.pending: dict[tuple[int, int], Saved] = {}
        self.stats = PoolStats()
        # the paged checks that failed as they happened (a write, a hit), not yet recorded
        self.events: list[dict] = []

    @property
    def blocks(self) -> int:
        return len(self.refs)

    def _add(self) -> int:
        self.refs.append(0)
        self.tokens += [-1] * self.size
        self.writers += [-1] * self.size
        return self.blocks - 1

    def reach(self, slot: int) -> None:
        """The pool made to hold `slot`, as a preallocated pool does: the blocks up to it, free. (A
        slipping engine writes past the blocks it handed out.)"""
        while self.blocks * self.size <= slot:
            self.free.insert(0, self._add())

    def allocate(self) -> int:
        if self.free:
            block = self.free.pop()
        elif self.capacity is None or self.blocks < self.capacity:
            block = self._add()
        elif self.idle:
            block, _ = self.idle.popitem(last=False)
            del self.cached[self.digest_of.pop(block)]
            self.saved.pop(block, None)
            self.stats.evicted += 1
        else:
            raise SpecError(f"the KV pool's {self.capacity} blocks are all held: a larger pool or "
                            "a smaller batch")
        self.refs[block] = 1
        span = slice(block * self.size, (block + 1) * self.size)
        self.tokens[span] = self.writers[span] = [-1] * self.size  # nothing written since
        return block

    def hold(self, block: int) -> None:
        self.refs[block] += 1
        self.idle.pop(block, None)

    def release(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            if block in self.digest_of:
                self.idle[block] = None
            else:
                self.free.append(block)

    def forget(self, request: int) -> None:
        """A request left: the recurrent states its passes kept for blocks never registered go."""
        for key in [key for key in self.pending if key[0] == request]:
            del self.pending[key]

    def shared(self, block: int) -> bool:
        """Another row holds it too, or the prefix cache keeps it: writing must copy it first."""
        return self.refs[block] > 1 or block in self.digest_of

    def held_tokens(self, block: int) -> list[int]:
        return self.tokens[block * self.size: (block + 1) * self.size]

    def register(self, block: int, parent: bytes, tokens: list[int],
                 after: tuple[int, int]) -> bytes:
        """`block`, full of these committed tokens after the chain `parent`, in the prefix cache
        (unless an equal block is already); the chain's digest through it. `after`: the (request,
        position) whose pending recurrent states (a hybrid's, if any) are the block's."""
        digest = _digest(parent, tokens)
        if self.prefix_caching and digest not in self.cached and block not in self.digest_of:
            self.cached[digest], self.digest_of[block] = block, digest
            if after in self.pending:
                self.saved[block] = self.pending[after]
                self.stats.states_saved += 1
        self.pending.pop(after, None)
        return digest

    def find(self, parent: bytes, tokens: list[int], request: int) -> tuple[int | None, bytes]:
        """The registered block holding these tokens after the chain `parent` (None: a miss), and
        the chain's digest through them. A hit on a block whose slots hold other tokens than
        its key's breaks a paged check."""
        digest = _digest(parent, tokens)
        self.stats.lookups += 1
        block = self.cached.get(digest)
        self.stats.hits += block is not None
        held = self.held_tokens(block) if self.checked and block is not None else tokens
        if held != tokens:
            j = next(i for i, (a, b) in enumerate(zip(held, tokens)) if a != b)
            self.events.append(dict(check="hit-on-other-tokens", seq=request, block=block,
                                    position=None, writer=self.writers[block * self.size + j],
                                    holds=held[j], wants=tokens[j]))
        return block, digest

    def wrote(self, slots: list[int], tokens: list[int], request: int) -> None:
        for s, t in zip(slots, tokens):
            self.tokens[s], self.writers[s] = t, request

    # ------------------------------------------------------------------------- storage, per layer

    def store(self, layer: int, slots: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor) -> None:
        """Write (n, kv heads, head dim) K/V at `slots` of `layer`."""
        if layer not in self.storage:
            self.storage[layer] = (keys.new_zeros(0, *keys.shape[1:]),
                                   values.new_zeros(0, *values.shape[1:]))
        k, v = self._grown(layer)
        at = slots.to(k.device)
        k[at], v[at] = keys.to(k.dtype), values.to(v.dtype)

    def _grown(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`layer`'s storage, grown to every block handed out."""
        k, v = self.storage[layer]
        room = self.blocks * self.size
        if k.shape[0] < room:
            grow = max(room, 2 * k.shape[0]) - k.shape[0]
            k = torch.cat([k, k.new_zeros(grow, *k.shape[1:])])
            v = torch.cat([v, v.new_zeros(grow, *v.shape[1:])])
            self.storage[layer] = (k, v)
        return k, v

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Every layer's slots `src` copied to `dst` at once (they may overlap), with what the pool
        records of them."""
        for layer in self.storage:
            k, v = self._grown(layer)
            s, d = src.to(k.device), dst.to(k.device)
            k[d], v[d] = k[s], v[s]
        records = [(self.tokens[s], self.writers[s]) for s in src.tolist()]
        for d, (t, w) in zip(dst.tolist(), records):
            self.tokens[d], self.writers[d] = t, w

    def read(self, layer: int, slot_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) of `layer` at the slots `slot_map` (B, n) maps, (B, kv heads, n, head
        dim), zeros where it maps none (-1)."""
        k, v = self._grown(layer)
        at = slot_map.clamp(min=0).to(k.device)
        return k[at].transpose(1, 2).contiguous(), v[at].transpose(1, 2).contiguous()
