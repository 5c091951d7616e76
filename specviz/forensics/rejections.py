"""The rejections judge: did a greedy round refuse a draft that the target chose?

At temperature 0 a round keeps its drafts while each is the verify pass's argmax, and at the first
it refuses writes that argmax in its place. So a round whose refused draft is the very token it
then wrote there contradicts itself, on its tokens alone: the draft was the target's choice and was
refused. The output stays right (the target's token was written all the same), so nothing else
shows it; the cost is the draft refused and every draft after it that the target chose too. The
evidence beside the tokens: the verify pass's recorded argmax at that slot (specviz's own rounds:
a written token that is not the pass's choice is a bonus bug, not a rejection), and a fresh
batch-size-1 pass of the target on the committed tokens, which must choose the draft too (an
engine seen from outside has no recorded pass: a written token that is a refused draft the target
does not choose is its fork, judged apart).

A sequence's last round is not judged: a stop or the length cap trims it. A token tree's round
refused a draft the target chose where the token it wrote at the first depth it did not accept is
one of the tree's children there. Sampled runs are judged by their recorded draws instead
(sampledrun.py); an engine seen from outside that samples reports no draws, only its rounds' counts,
and those are judged together (judge_sampled_rejections)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.decoding.sampling import Sampling
from specviz.forensics.recompute import fresh_logits
from specviz.trace.evidence import Rejections
from specviz.trace.schema import Trace


@dataclass(frozen=True)
class Round:
    """One round of one sequence: the drafts it offered, as a tree (a chain: each the child of the
    one before), the drafts it accepted and the tokens it emitted, and the verify pass's argmax at
    each slot of the accepted path where known."""

    round: int
    seq: int
    tokens: list[int]
    parents: list[int]  # each draft's parent (-1: the row's last committed token)
    accepted: int
    emitted: int
    verified: list[int] | None = None

    def reach(self, out: list[int], t0: int) -> int:
        """How deep the drafts follow `out` from its token t0: the drafts the target's choices
        keep, where `out` is the target's. (A tree's siblings are distinct tokens: the first child
        that matches is the only one.)"""
        node, depth = -1, 0
        while t0 + depth < len(out):
            node = next((i for i, (t, p) in enumerate(zip(self.tokens, self.parents))
                         if p == node and t == out[t0 + depth]), None)
            if node is None:
                break
            depth += 1
        return depth


def _chain(n: int) -> list[int]:
    return list(range(-1, n - 1))


def run_rounds(trace: Trace) -> dict[int, list[Round]]:
    """A run's rounds per sequence, from its (round, row) records."""
    rounds: dict[int, list[Round]] = {}
    for r in sorted(trace.rows, key=lambda r: r.round):
        tokens, parents = ((r.tree.tokens, r.tree.parents) if r.tree
                           else (r.draft_tokens, _chain(len(r.draft_tokens))))
        rounds.setdefault(r.seq, []).append(Round(
            r.round, r.seq, list(tokens), list(parents), r.accepted, len(r.emitted),
            None if r.tree else list(r.target_tokens)))
    return rounds


def engine_rounds(trace: Trace) -> dict[int, list[Round]]:
    """An engine's rounds per sequence, as its outputs reported them (chains; an output given as
    text, re-tokenized, or rounds seen from outside, without their drafts, have none to judge)."""
    rounds: dict[int, list[Round]] = {}
    for s in trace.sequences:
        if (s.engine and s.engine.rounds and not s.engine.approximate
                and all(r.shown for r in s.engine.rounds)):
            rounds[s.seq] = [Round(n, s.seq, r.drafts, _chain(len(r.drafts)), r.accepted,
                                   r.accepted + 1) for n, r in enumerate(s.engine.rounds)]
    return rounds


@torch.inference_mode()
def judge_rejections(trace: Trace, rounds: dict[int, list[Round]], target, vocab: int,
                     whose: str) -> Rejections | None:
    """`rounds`: per sequence, in order (run_rounds, engine_rounds); `target`: the model whose fresh
    pass must choose a refused draft too (None: not asked, the run's choices were penalised);
    `whose`: "the run's" or "the engine's". None where no round can be judged."""
    judged = accepted = 0
    refused: list[tuple[Round, int, int]] = []  # and the output token it refused, and its reach
    for s in trace.sequences:
        out, t0 = s.output_ids, 0
        for r in rounds.get(s.seq, [])[:-1]:
            reach = r.reach(out, t0)
            judged, accepted = judged + 1, accepted + r.accepted
            at = t0 + r.accepted  # (within the output where the drafts reach past it)
            if reach > r.accepted and (r.verified is None or len(r.verified) > r.accepted
                                       and r.verified[r.accepted] == out[at]):
                refused.append((r, at, reach))
            t0 += r.emitted
    if not judged:
        return None
    if target is not None:
        choice = _fresh_choices(trace, {r.seq for r, _, _ in refused}, target, vocab)
        refused = [(r, at, reach) for r, at, reach in refused
                   if choice[r.seq][at] == trace.sequences[r.seq].output_ids[at]]
    # the drafts the target's own choices keep: a wrongly refused round's reach, else its own
    kept = accepted + sum(reach - r.accepted for r, _, reach in refused)
    cost = (f"The {judged} rounds judged accepted {accepted} drafts; the target's own choices "
            f"keep {kept} of the same drafts.")
    ev = Rejections(judged=judged, wrong=len(refused), accepted=accepted, kept=kept, verdict=None,
                    source=whose, explanation="")
    if not refused:
        ev.explanation = (f"No round refused a draft the target chose, of {whose} {judged} "
                          f"rounds judged. {cost}")
        return ev
    first = min((r for r, _, _ in refused), key=lambda r: (r.round, r.seq))
    ev.first = [first.round, first.seq, first.accepted]
    ev.verdict = "decision-bug:reject"
    ev.explanation = (
        f"{len(refused)} of {whose} {judged} rounds judged refused a draft and then wrote that "
        "same token in its place: the target's choice there"
        + ("" if target is None else ", in a fresh batch-size-1 pass too")
        + f". The first in round {first.round}, sequence {first.seq}, draft slot "
        f"{first.accepted}. The decisions were wrong, not the drafts: the output is unharmed and "
        f"the drafts are lost. {cost}")
    return ev


# the chance, under a correct accept rule, of accepting as few drafts as a sampled engine did, below
# which its decisions are named (one test a check: no correction)
SAMPLED_ALPHA = 1e-3


@torch.inference_mode()
def judge_sampled_rejections(trace: Trace, rounds: dict[int, list[Round]], pair,
                             sampling: Sampling) -> Rejections | None:
    """A sampled engine's rounds, from their counts alone: each decided draft (each accepted one,
    and the first refused) is kept by speculative sampling with chance min(1, p/q), p the target's
    and q the draft model's distribution on the committed tokens, fresh at batch size 1 under the
    check's settings (`sampling`). The drafts accepted are a sum of those
    chances' Bernoulli trials; far fewer than they allow (their exact lower tail below
    SAMPLED_ALPHA) is `decision-bug:reject`. None where no round can be judged, or where a draft
    is not one the draft model can draw (not its drafts: the chances do not apply)."""
    chances, kept, judged = [], [], 0
    for s in trace.sequences:
        mine = rounds.get(s.seq, [])[:-1]
        if not mine:
            continue
        ids = trace.prompts[s.seq].ids + s.output_ids
        n = len(s.output_ids)
        settings = sampling.row(s.seq)
        p = settings.target.probs(fresh_logits(pair.target, ids[:-1], n, pair.vocab_size))
        q = settings.draft.probs(fresh_logits(pair.draft, ids[:-1], n, pair.vocab_size))
        t0 = 0
        for r in mine:
            judged += 1
            for j, d in enumerate(r.tokens[:r.accepted + 1]):
                if t0 + j >= n or q[t0 + j, d] <= 0:
                    return None
                chances.append(min(1.0, float(p[t0 + j, d] / q[t0 + j, d])))
                kept.append(j < r.accepted)
            t0 += r.emitted
    if not judged:
        return None
    accepted, expected = sum(kept), sum(chances)
    tail = _lower_tail(chances, accepted)
    ev = Rejections(judged=judged, wrong=0, accepted=accepted, kept=round(expected), verdict=None,
                    source="the engine's", explanation="", expected=expected, tail=tail)
    said = (f"The engine's {judged} rounds judged (every sequence's but its last) accepted "
            f"{accepted} of their {len(kept)} decided drafts; speculative sampling's rule, "
            f"min(1, p/q) under the target's and the draft model's fresh distributions, keeps "
            f"{expected:.1f} of them on average, and as few as {accepted} with chance {tail:.2g}.")
    if tail >= SAMPLED_ALPHA:
        ev.explanation = said + " Its decisions are consistent with the rule."
        return ev
    ev.verdict = "decision-bug:reject"
    ev.explanation = (said + f" Below {SAMPLED_ALPHA:g}: the rounds refused drafts the rule "
                      "keeps. The draws are not reported, so no single round is named; the "
                      "drafts were the draft model's, and the decisions lost them.")
    return ev


def _lower_tail(chances: list[float], x: int) -> float:
    """P(X <= x) for X the number of successes of independent trials with these chances (exact:
    the Poisson-binomial distribution, one trial at a time)."""
    dist = torch.zeros(x + 2, dtype=torch.float64)
    dist[0] = 1.0
    for c in chances:  # only the counts up to x + 1 matter; the rest pile into the last
        moved = dist * c
        dist = dist * (1 - c)
        dist[1:] += moved[:-1]
        dist[-1] += moved[-1]
    return float(dist[:x + 1].sum().clamp(max=1.0))


def _fresh_choices(trace: Trace, seqs: set[int], target, vocab: int) -> dict[int, list[int]]:
    """The target's own choice at each output token of `seqs`: one fresh pass each, on the
    committed tokens."""
    choices = {}
    for seq in seqs:
        out = trace.sequences[seq].output_ids
        choices[seq] = fresh_logits(target, trace.prompts[seq].ids + out[:-1], len(out),
                                    vocab).argmax(-1).tolist()
    return choices
