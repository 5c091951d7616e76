"""Token trees: several candidates per position, verified in one target pass (SpecInfer,
EAGLE, SGLang).

A tree proposal lists each row's nodes with their parents (-1: the row's last committed token, the
root). The verify pass feeds every node after the row's slots, at the position of its depth (not its
index), under a mask that shows a node the row's real tokens and its own ancestors only. Acceptance
walks from the root along the children the target chose (greedy), or that multi-candidate
speculative sampling accepts (SpecInfer), as far as they go. The accepted path is then laid out as a
chain: the target's cache is compacted so that the slot after the root holds the path's first node,
the next its second, and so on, and every later step of the round (the emitted tokens, stops, the
layout, the record) is a chain's.

A recurrent state cannot hold a tree's branches apart, so trees are refused on hybrid models.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from specviz.decoding.sampling import ACCEPT, RESIDUAL, TARGET, Streams, inverse_cdf, sibling


class Tree(NamedTuple):
    parents: torch.Tensor  # (B, n) each node's parent node, -1 the root
    depth: torch.Tensor  # (B, n) 1 for the root's children
    ancestors: torch.Tensor  # (B, n, n) [b, i, j]: node j is node i or one of its ancestors

    @classmethod
    def of(cls, parents: torch.Tensor) -> Tree:
        B, n = parents.shape
        depth = torch.zeros_like(parents)
        ancestors = torch.zeros(B, n, n, dtype=torch.bool, device=parents.device)
        rows = torch.arange(B, device=parents.device)[:, None].expand(B, n)
        nodes = at = torch.arange(n, device=parents.device).expand(B, n)
        for _ in range(n):  # climb every node's chain to the root at once
            live = at >= 0
            ancestors[rows[live], nodes[live], at[live]] = True
            depth = depth + live
            at = torch.where(live, parents.gather(1, at.clamp(min=0)), -1)
        return cls(parents, depth, ancestors)

    @property
    def deepest(self) -> int:
        return int(self.depth.max())


def node_positions(pos: torch.Tensor, tree: Tree) -> torch.Tensor:
    """The layout's position ids with the tree's n nodes (its last n slots) at the root's position
    plus their depth."""
    n = tree.parents.shape[1]
    root = pos[:, -n - 1:-n]
    return torch.cat([pos[:, :-n], root + tree.depth], 1)


def visible_slots(seen: torch.Tensor, among: torch.Tensor) -> torch.Tensor:
    """(B, S+n, S+n) the key slots each slot may see, before causality: the row's slots `seen` (B,
    S+n) as the padding mask has them, except that a node sees only the nodes `among` (B, n, n)
    shows it."""
    B, width = seen.shape
    n = among.shape[1]
    out = seen[:, None, :].expand(B, width, width).clone()
    out[:, width - n:, width - n:] &= among
    return out


def walk(tokens: torch.Tensor, tree: Tree, offered: torch.Tensor,
         argmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy acceptance: from the root, the first child whose token is the target's argmax at its
    parent, as long as there is one. `argmax` (B, n+1): at the root, then at each node; `offered`
    (B,): a row's nodes are its first `offered`. Returns each row's path (B, deepest) of node
    indices, then the first child of its last node that the target refused, where there is one (past
    those: 0); its length (B,); and whether the refused child follows."""
    B, n = tokens.shape
    live = torch.arange(n, device=tokens.device)[None] < offered[:, None]
    at = torch.full((B,), -1, device=tokens.device)
    length = torch.zeros_like(at)
    refused = torch.zeros(B, dtype=torch.bool, device=tokens.device)
    path = []
    for j in range(tree.deepest):
        children = live & (tree.parents == at[:, None])
        chosen = children & (tokens == argmax.gather(1, (at + 1)[:, None]))
        go = chosen.any(1) & (length == j)
        stop = ~chosen.any(1) & children.any(1) & (length == j)
        path.append(torch.where(go, chosen.long().argmax(1),
                                torch.where(stop, children.long().argmax(1), 0)))
        refused |= stop
        at = torch.where(go, path[-1], at)
        length += go
    return torch.stack(path, 1), length, refused


def walk_sampled(tokens: torch.Tensor, tree: Tree, offered: torch.Tensor, P: torch.Tensor,
                 Q: torch.Tensor, room: torch.Tensor, stream: Streams, have: torch.Tensor,
                 accept: Callable):
    """SpecInfer's multi-candidate speculative sampling (Miao et al., 2024): at each node, its
    children in turn, each accepted with probability min(1, p(c)/q(c)) against the target's
    distribution p there, which every rejection replaces by the residual max(0, p - q), normalised;
    the first accepted child is the next node, and a node where none is (or none remains, or the
    row's `room` ends) draws the row's next token from what p has become. Lossless when each child
    was drawn independently from its own q (B, n, V, `Q`). `P` (B, n+1, V): the target's
    distributions at the root and at each node; `accept(p, q, u)`: the accept rule (faults.Policy).
    Returns each row's path as `walk` does, then its length, whether a refused child follows, the
    token drawn after the path, and what was drawn: p and u of each of the path's slots (the child
    accepted, or the first one refused) and the final draw."""
    B, n = tokens.shape
    rows, deepest = torch.arange(B, device=tokens.device), tree.deepest
    live = torch.arange(n, device=tokens.device)[None] < offered[:, None]
    at = torch.full((B,), -1, device=tokens.device)
    length, own = torch.zeros_like(at), torch.zeros_like(at)
    refused, done = (torch.zeros(B, dtype=torch.bool, device=tokens.device) for _ in range(2))
    path = torch.zeros(B, deepest, dtype=torch.long, device=tokens.device)
    p_used, u_used = (torch.ones(B, deepest, dtype=torch.float64, device=tokens.device)
                      for _ in range(2))
    pick = torch.zeros(B, dtype=torch.float64, device=tokens.device)
    for j in range(deepest + 1):
        p = P[rows, at + 1].double()
        children = live & (tree.parents == at[:, None]) & ~done[:, None] & (j < room)[:, None]
        took = torch.zeros_like(done)
        for s in range(int(children.sum(1).max())):
            has = (children.sum(1) > s) & ~took
            child = (children & (children.long().cumsum(1) == s + 1)).long().argmax(1)
            token = tokens[rows, child]
            q = Q[rows, child].double()
            u = stream.draw(have + j, sibling(ACCEPT, s))
            p_c, q_c = p.gather(1, token[:, None])[:, 0], q.gather(1, token[:, None])[:, 0]
            ok = has & accept(p_c, q_c, u)
            # the slot records the child accepted, or else the first one refused
            shown = ok | has & (s == 0)
            path[:, j] = torch.where(shown, child, path[:, j])
            p_used[:, j] = torch.where(shown, p_c, p_used[:, j])
            u_used[:, j] = torch.where(shown, u, u_used[:, j])
            took |= ok
            rest = (p - q).clamp(min=0)
            total = rest.sum(1, keepdim=True)
            p = torch.where((has & ~ok)[:, None] & (total > 0), rest / total.clamp(min=1e-300), p)
        ending = ~done & ~took
        tried = children.any(1)
        v = stream.draw(have + j, torch.where(tried, RESIDUAL, TARGET))
        own = torch.where(ending, inverse_cdf(p, v), own)
        pick = torch.where(ending, v, pick)
        refused |= ending & tried
        done |= ending
        if j < deepest:
            at = torch.where(took, path[:, j], at)
        length += took
        if bool(done.all()):
            break
    return path, length, refused, own, {"target_draft_probs": p_used, "accept_draws": u_used,
                                        "pick_draws": pick[:, None]}


def slots(path: torch.Tensor, S: int) -> torch.Tensor:
    """(B, S + deepest) the verify layout's slot each slot of the path's chain layout takes: the
    row's own slots, then its path's nodes."""
    B = path.shape[0]
    return torch.cat([torch.arange(S, device=path.device).expand(B, S), S + path], 1)


def main_line(depths: int, width: int, device) -> torch.Tensor:
    """(deepest + deepest*(width-1),) the parents of a drafter's tree grown from its chain: the
    chain's drafts first (each the child of the one before), then at each depth width-1 alternatives
    to the chain's draft there, children of the chain's draft one depth up."""
    chain = torch.arange(depths, device=device) - 1
    return torch.cat([chain, chain.repeat_interleave(width - 1)])
