"""A model's pass over the padded batch layout (batch.py), with the positions and the mask a policy (faults.py)
derives: the target's verify and prefill, and a draft model's drafting passes and prefill."""
from __future__ import annotations

from typing import NamedTuple

import torch

from specviz.decoding.batch import forward
from specviz.decoding.faults import Policy
from specviz.models.architecture import narrowest_window
from specviz.models.pairs import ModelPair


class Pass(NamedTuple):
    logits: torch.Tensor  # (B, q or keep, vocab)
    positions: torch.Tensor  # (B, S) the position ids the policy derived for every slot
    hidden: torch.Tensor | None  # (B, q or keep, H) the last layer's hidden states, where asked for


def run_model(pair: ModelPair, policy: Policy, role: str, tok, val, stl, q_start, cache, hidden: bool = False,
              **kw) -> Pass:
    """The pair's `role` model over slots q_start.. Roles: "target", "draft" (a drafting pass), "draft prefill"
    (the draft cache's first fill). `hidden`: return its last hidden states too."""
    pos = policy.positions(val, stl)
    if role == "draft prefill":
        model = pair.draft
    elif role == "draft":
        model, pos = pair.draft, policy.draft_positions(pos, q_start)
    elif role == "target":
        model, pos = pair.target, policy.window_positions(pos, q_start)
    else:
        raise ValueError(f"no model plays {role!r}")
    out = forward(model, tok, val, q_start, cache, pair.vocab_size, pos=pos[:, q_start:],
                  seen=policy.seen(val, stl, narrowest_window(model)), hidden=hidden, **kw)
    logits, last = out if hidden else (out, None)
    return Pass(logits, pos, last)
