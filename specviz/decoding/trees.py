"""Token trees: several candidates per position, verified in one target pass (SpecInfer, EAGLE, SGLang).

A tree proposal lists each row's nodes with their parents (-1: the row's last committed token, the root). The
verify pass feeds every node after the row's slots, at the position of its depth (not its index), under a mask
that shows a node the row's real tokens and its own ancestors only. Acceptance walks from the root along the
children the target chose, as far as they go. The accepted path is then laid out as a chain: the target's cache
is compacted so that the slot after the root holds the path's first node, the next its second, and so on, and
every later step of the round (the emitted tokens, stops, the layout, the record) is a chain's.

Greedy only: at temperature > 0 a tree needs multi-candidate rejection sampling (SpecInfer), not built here. A
recurrent state cannot hold a tree's branches apart, so trees are refused on hybrid models.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


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


def positions(pos: torch.Tensor, tree: Tree) -> torch.Tensor:
    """The layout's position ids with the tree's n nodes (its last n slots) at the root's position plus their
    depth."""
    n = tree.parents.shape[1]
    root = pos[:, -n - 1:-n]
    return torch.cat([pos[:, :-n], root + tree.depth], 1)


def visible(seen: torch.Tensor, among: torch.Tensor) -> torch.Tensor:
    """(B, S+n, S+n) the key slots each slot may see, before causality: the row's slots `seen` (B, S+n) as the
    padding mask has them, except that a node sees only the nodes `among` (B, n, n) shows it."""
    B, width = seen.shape
    n = among.shape[1]
    out = seen[:, None, :].expand(B, width, width).clone()
    out[:, width - n:, width - n:] &= among
    return out


def walk(tokens: torch.Tensor, tree: Tree, offered: torch.Tensor,
         argmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy acceptance: from the root, the first child whose token is the target's argmax at its parent, as long
    as there is one. `argmax` (B, n+1): at the root, then at each node; `offered` (B,): a row's nodes are its first
    `offered`. Returns each row's path (B, deepest) of node indices, then the first child of its last node that the
    target refused, where there is one (past those: 0); its length (B,); and whether the refused child follows."""
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
        path.append(torch.where(go, chosen.long().argmax(1), torch.where(stop, children.long().argmax(1), 0)))
        refused |= stop
        at = torch.where(go, path[-1], at)
        length += go
    return torch.stack(path, 1), length, refused


def slots(path: torch.Tensor, S: int) -> torch.Tensor:
    """(B, S + deepest) the verify layout's slot each slot of the path's chain layout takes: the row's own slots,
    then its path's nodes."""
    B = path.shape[0]
    return torch.cat([torch.arange(S, device=path.device).expand(B, S), S + path], 1)


def main_line(depths: int, width: int, device) -> torch.Tensor:
    """(deepest + deepest*(width-1),) the parents of a drafter's tree grown from its chain: the chain's drafts
    first (each the child of the one before), then at each depth width-1 alternatives to the chain's draft there,
    children of the chain's draft one depth up."""
    chain = torch.arange(depths, device=device) - 1
    return torch.cat([chain, chain.repeat_interleave(width - 1)])
