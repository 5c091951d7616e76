"""A model's pass over the padded batch layout (batch.py), with the positions and the mask a policy
(faults.py) derives: the target's verify and prefill, a draft model's drafting passes and prefill,
and a draft head's."""
from __future__ import annotations

from typing import NamedTuple

import torch

from specviz.decoding import kvcache, trees
from specviz.decoding.batch import attention_masks, forward
from specviz.decoding.faults import Policy
from specviz.decoding.trees import Tree
from specviz.models.architecture import narrowest_window
from specviz.models.pairs import ModelPair


class Pass(NamedTuple):
    logits: torch.Tensor  # (B, q or keep, vocab)
    positions: torch.Tensor  # (B, S) the position ids the policy derived for every slot
    # (B, q, n·H) the hidden states asked for at every slot fed (a head's; a head's own last)
    hidden: torch.Tensor | None


def run_model(pair: ModelPair, policy: Policy, role: str, tok, val, stl, q_start, cache,
              hidden: tuple[int, ...] = (), tree: Tree | None = None, **kw) -> Pass:
    """The pair's `role` model over slots q_start.. Roles: "target", "draft" (a drafting pass),
    "draft prefill" (the draft cache's first fill). `hidden`: return those of its hidden states
    too (batch.forward). `tree`: the last slots are a tree's nodes (trees.py), placed and masked
    as the policy places them."""
    pos = policy.positions(val, stl)
    among = None
    if tree is not None:
        pos, among = policy.tree_positions(pos, tree), policy.tree_among(tree)
    if role == "draft prefill":
        model = pair.draft
    elif role == "draft":
        model, pos = pair.draft, policy.draft_positions(pos, q_start)
    elif role == "target":
        model, pos = pair.target, policy.window_positions(pos, kw.get("keep", 1))
    else:
        raise ValueError(f"no model plays {role!r}")
    seen = policy.seen(val, stl, narrowest_window(model))
    out = forward(model, tok, val, q_start, cache, pair.vocab_size, pos=pos[:, q_start:],
                  seen=seen,
                  among=None if among is None else (trees.visible_slots(seen, among), pos),
                  hidden=hidden, windowed=(policy.target_windowed(q_start) if role == "target"
                                           else policy.draft_windowed), **kw)
    logits, last = out if hidden else (out, None)
    return Pass(logits, pos, last)


def run_head(pair: ModelPair, head, policy: Policy, tok, val, stl, features: torch.Tensor,
             q_start: int, cache, keep: int) -> Pass:
    """A draft head (models/heads.py) over slots q_start.., fed each slot's token and `features` (B,
    q, H), the hidden state it drafts from there: its logits at the last `keep` slots, the
    positions, and its own last hidden states (what it feeds itself next)."""
    pos = policy.draft_positions(policy.positions(val, stl), q_start)
    seen = policy.seen(val, stl, narrowest_window(head.body))
    kvcache.feeding(cache, tok, val, q_start)
    out = head.body(inputs_embeds=head.inputs(tok[:, q_start:], features),
                    position_ids=pos[:, q_start:],
                    attention_mask=attention_masks(head.body, seen, q_start), cache=cache,
                    use_cache=True)
    hidden = out.last_hidden_state
    logits = head.logits(hidden[:, -keep:])[..., :pair.vocab_size].to(tok.device)
    return Pass(logits if logits.dtype == torch.float64 else logits.float(), pos, hidden)
