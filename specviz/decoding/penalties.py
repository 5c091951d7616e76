"""Repetition and presence penalties: the target's logits changed by the tokens a sequence already
holds, and the log-probability of each token a run emits.

- repetition (transformers' `RepetitionPenaltyLogitsProcessor`, vLLM's `repetition_penalty`): every
  token of the prompt or the output so far has its logit divided by the penalty where positive,
  multiplied where negative;
- presence (OpenAI's and vLLM's `presence_penalty`): the penalty is subtracted from the logit of
  every token the output so far holds.

Repetition first, then presence, as vLLM applies them. Under speculation the history of a verify
slot is the sequence so far plus the drafts before that slot: scoring draft n is scoring P(x_n |
prefix, x_1..x_{n-1}) (cadedaniel, vLLM #6718). The penalty runs in the logits' own dtype,
elementwise, so that the engine's batched logits and the reference's one row at a time are penalised
bit for bit alike. Only the target's logits are penalised: the drafter proposes from its own, as
vLLM's drafters do (speculative sampling stays exact for any draft distribution, and the acceptance
judge recomputes the drafts from the draft model alone).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Penalties:
    repetition: float = 1.0  # 1: off
    presence: float = 0.0  # 0: off

    def __bool__(self) -> bool:
        return self.repetition != 1.0 or self.presence != 0.0

    def apply(self, logits: torch.Tensor, prompt: torch.Tensor, output: torch.Tensor,
              drafts: torch.Tensor) -> torch.Tensor:
        """`logits` (B, n, V) penalised: slot j's history is the row's `prompt` and `output` tokens
        ((B, V) masks, `held`) and `drafts[:, :j]` ((B, n-1) ids)."""
        said = output[:, None] | _drafted(drafts, logits.shape[1], logits.shape[-1])
        z = logits
        if self.repetition != 1.0:
            z = torch.where(prompt[:, None] | said,
                            torch.where(z < 0, z * self.repetition, z / self.repetition), z)
        if self.presence != 0.0:
            z = z - self.presence * said.to(z.dtype)
        return z

    def along(self, logits: torch.Tensor, prompt: list[int], output: list[int]) -> torch.Tensor:
        """One sequence's logits (n, V) penalised, its history given as ids: slot j's is the prompt
        and output[:len(output) - n + 1 + j] (its last n - 1 tokens are drafts, or tokens
        teacher-forced, that only the later slots have seen)."""
        n, vocab = logits.shape
        cut = len(output) - n + 1
        prompt_ids, said, drafts = (torch.tensor([ids], dtype=torch.long, device=logits.device)
                                    for ids in (prompt, output[:cut], output[cut:]))
        return self.apply(logits[None], held(prompt_ids, vocab), held(said, vocab), drafts)[0]


def penalties_of(spec) -> Penalties:
    """The penalties a RunSpec sets."""
    return Penalties(spec.repetition_penalty, spec.presence_penalty)


def history(tokens: torch.Tensor, valid: torch.Tensor, outputs: torch.Tensor,
            vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (B, V) masks of a padded batch's prompt tokens and output tokens: of each row's real
    slots, the last `outputs` (B,) are its output."""
    later = valid.flip(1).long().cumsum(1).flip(1)  # real slots from each slot to the row's end
    said = valid & (later <= outputs[:, None])
    return held(tokens, vocab, valid & ~said), held(tokens, vocab, said)


def held(ids: torch.Tensor, vocab: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """(B, V): which tokens each row of `ids` (B, L) holds, counting only the slots `keep` (B, L)
    lets through."""
    mask = torch.zeros(ids.shape[0], vocab, dtype=torch.bool, device=ids.device)
    if keep is None:
        return mask.scatter_(1, ids, True)
    mask.scatter_(1, ids.masked_fill(~keep, 0), True)
    mask[:, 0] = ((ids == 0) & keep).any(1)  # id 0 stood in for the slots left out
    return mask


def _drafted(drafts: torch.Tensor, n: int, vocab: int) -> torch.Tensor:
    """(B, n, V): whether slot j's earlier drafts, drafts[:, :j], hold each token."""
    B, k = drafts.shape
    out = torch.zeros(B, n, vocab, dtype=torch.uint8, device=drafts.device)
    if k:
        before = (torch.arange(k, device=drafts.device)[None]
                  < torch.arange(n, device=drafts.device)[:, None])
        out.scatter_reduce_(2, drafts[:, None, :].expand(B, n, k),
                            before.to(torch.uint8).expand(B, n, k), "amax")
    return out.bool()


def logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """Each token's log-probability (...,) under the distribution of its `logits` (..., V) at
    `temperature` (0: the greedy run's untempered one), no top-k or top-p: at least float32 (a
    bfloat16 logit is too coarse for it)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature > 0:
        z = z / temperature
    return z.gather(-1, tokens[..., None])[..., 0] - z.logsumexp(-1)
