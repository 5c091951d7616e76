"""A token tree's walk: the one stage of a round (round.py) that knows a tree, in the place
of acceptance.

The verify pass scored every node of each row's tree (trees.py). The walk follows the path each row
accepts (trees.walk: the target's choices; trees.walk_sampled: SpecInfer's multi-candidate
speculative sampling, which decides the row's tokens as it goes), and hands the round on as the
chain of that path, followed by the first child the target refused: the pass's slots, logits and
hidden states taken along it, the target's cache compacted (through the policy) so that its slots
hold the chain's, and the chain's drafts. It returns what a chain's acceptance returns; from there
on the round is a chain's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from specviz.decoding import kvcache, trees
from specviz.decoding.batch import positions
from specviz.decoding.proposal import Proposal
from specviz.decoding.stages import Accepted, Batch, Decoding, Drafted, Verified
from specviz.decoding.trees import walk, walk_sampled

AcceptChain = Callable[[Decoding, Batch, Drafted, Verified], Accepted]


def accept_tree(d: Decoding, b: Batch, drafted: Drafted, v: Verified,
                accept_chain: AcceptChain) -> Accepted:
    """What each row accepts of its tree (`drafted.tree`), as the chain of its path. A greedy path
    is then accepted as a chain is (`accept_chain`, round.accept): through the policy, as far as the
    row's room; a sampled one as walk_sampled decided it."""
    policy, prop, tree, have = d.policy, drafted.proposal, drafted.tree, drafted.have
    S, (B, n) = b.tokens.shape[1], drafted.tokens.shape
    if d.sampling.greedy:
        path, length, refused = walk(drafted.tokens, tree, prop.counts, v.argmax)
    else:
        P = policy.verify_samplers([d.sampling.row(i) for i in b.seqs]).probs(v.logits)
        path, length, refused, own, drawn = walk_sampled(
            drafted.tokens, tree, prop.counts, P, prop.probs[:, :n],
            (d.max_new_tokens - 1 - have).clamp(min=0), drafted.stream, have, policy.accept)
    along = trees.slots(path, S)
    kvcache.gather(b.target.cache, torch.arange(B, device=path.device),
                   trees.slots(policy.compacted(path), S))
    # each chain slot's place in the verify pass
    fed_at = torch.cat([torch.zeros_like(path[:, :1]), 1 + path], 1)
    bonus = policy.bonus_node(path, length)  # where the token after the path is chosen
    at = fed_at.scatter(1, length[:, None], torch.where(length > 0, 1 + bonus, 0)[:, None])
    logits = v.logits.gather(1, at[..., None].expand(-1, -1, v.logits.shape[-1]))
    hidden = v.hidden
    if hidden is not None:  # the last q of the S+n slots fed
        skip = S + n - hidden.shape[1]
        index = (along[:, skip:] - skip)[..., None].expand(-1, -1, hidden.shape[-1])
        hidden = hidden.gather(1, index)
    chain_v = Verified(v.tokens.gather(1, along), v.valid.gather(1, along),
                       v.stale.gather(1, along), v.positions.gather(1, along), logits,
                       logits.argmax(-1), hidden)
    chain_prop = Proposal(prop.tokens.gather(1, path), length + refused, None,
                          prop.confidence.gather(1, path), prop.fed)
    chain = replace(drafted, proposal=chain_prop, width=path.shape[1], tree=None)
    if d.sampling.greedy:
        acc = accept_chain(d, b, chain, chain_v)
    else:
        acc = Accepted(chain_v, chain_prop, chain.room(d.max_new_tokens), length, own, drawn)
    live = torch.arange(n, device=path.device)[None] < prop.counts[:, None]
    tree_positions = trees.node_positions(positions(v.valid), tree)[:, S:]
    checks = {  # over every node offered, as the padding mask's check is over every slot
        "positions": ((v.positions[:, S:] == tree_positions) | ~live).all(1),
        "mask": ((policy.tree_among(tree) == tree.ancestors) | ~live[:, :, None]).all(2).all(1),
    }
    record = {"tree_tokens": drafted.tokens, "tree_parents": tree.parents, "tree_path": path,
              "tree_offered": prop.counts}
    filler = torch.arange(fed_at.shape[1], device=path.device) > (length + refused)[:, None]
    return replace(acc, along=fed_at.masked_fill(filler, -1), checks=checks, record=record)
