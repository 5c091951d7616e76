"""The engine acceptance judge: an engine's drafts by its own counters (per request, or a server's
/metrics over the run), against its drafter's own proposals replayed on the engine's committed
tokens: the check's draft model, or a published head (forensics/acceptance.py's replay). Where a
published head's engine is short, the field's wrong ways of feeding it are replayed too, and
those that accept as the engine did are named."""
from __future__ import annotations

from collections.abc import Callable

import torch

from specviz.forensics.acceptance import (SIGMAS, TargetStates, head_replay, rates_of,
                                          shown_rates)
from specviz.forensics.recompute import fresh_logits
from specviz.trace.evidence import Acceptance, Rejections
from specviz.trace.schema import Trace

PER_POSITION = "accepted_tokens_per_pos_"
# (seq, output index i, m) -> the drafter's own m drafts for output tokens i.. of sequence seq
DraftsAt = Callable[[int, int, int], list[int]]


def model_drafts(trace: Trace, draft, vocab: int) -> DraftsAt:
    """A draft model's own greedy drafts on each output's committed tokens: one fresh pass per
    output (a chain of drafts that match the output is its prefix, teacher-forced)."""
    choices: dict[int, list[int]] = {}

    def drafts(seq: int, i: int, m: int) -> list[int]:
        if seq not in choices:
            out = trace.sequences[seq].output_ids
            choices[seq] = fresh_logits(draft, trace.prompts[seq].ids + out[:-1], len(out),
                                        vocab).argmax(-1).tolist()
        return choices[seq][i: i + m]
    return drafts


def head_drafts(trace: Trace, target, head, vocab: int,
                states: TargetStates | None = None) -> DraftsAt:
    """A draft head's own greedy chains on each output's committed tokens (head_replay; `states`,
    the target's, shared with other heads' replays)."""
    proposals = head_replay(trace, target, head, vocab, states)(0)
    return lambda seq, i, m: proposals(seq, i, m)[0]


@torch.inference_mode()
def judge_engine_acceptance(trace: Trace, drafts_at: DraftsAt, whose: str, k: int,
                            decided: Rejections | None = None,
                            mistaken: dict[str, DraftsAt] | None = None) -> Acceptance | None:
    """An engine's drafts by its own counters, against its drafter's own proposals on the engine's
    output (`drafts_at`: model_drafts or head_drafts; `whose`, in words: "the draft model's"), its
    rounds replayed at k (each accepts the leading drafts equal to the output, then the target's
    token). The counters are the outputs' own where
    any carries them (drafts offered and accepted per prompt: llama.cpp's `timings`, an outputs
    file's `drafts` and `accepted`), else the run's totals from the server's /metrics
    (`settings["spec_decode"]`: vLLM counts nothing per request). Those totals count whatever else
    the server answered during the run too, so they judge a server that served the check alone. None
    where the engine counted no drafts.

    Short beyond chance when the engine accepts a smaller share of the drafts it offered than the
    replay does, by SIGMAS binomial standard deviations, and fewer drafts in all. Either alone can
    be the engine's own way: a drafter that stops at unlikely drafts (llama.cpp's p-min) offers
    fewer and loses no share; a wider k than declared offers more and accepts a smaller share of
    them, but more in all. Which side of its drafter went wrong cannot be seen from outside.
    /metrics also count the drafts accepted at each draft position: each position's acceptance, of
    the drafts that reached it, is set beside the replay's (per request there are none).

    `decided`: the rejections judge's finding on the engine's rounds, where it reports them. Drafts
    it refused that the target chose are its decisions' shortfall, not its drafter's: the drafter is
    judged on what right decisions would have accepted of its drafts.

    `mistaken`: for a published head, the field's wrong ways of feeding it (Eagle3Head.mistaken),
    each replayed the same way where the engine is short: those that accept as it did, within
    chance, are named (`matches`)."""
    per_request = [s for s in trace.sequences if s.engine and s.engine.drafts
                   and s.engine.accepted is not None and s.output_ids]
    totals = trace.manifest.engine.settings.get("spec_decode") or {}
    if per_request:
        # which hold no positions
        counted, source, positions = per_request, "its counters per request", []
        offered, accepted = (sum(s.engine.drafts for s in counted),
                             sum(s.engine.accepted for s in counted))
    elif totals.get("draft_tokens"):
        counted, source, positions = (
            [s for s in trace.sequences if s.output_ids],
            "its /metrics over the run (any other requests it served meanwhile count too)",
            _positions(totals))
        offered, accepted = round(totals["draft_tokens"]), round(totals.get("accepted_tokens", 0))
    else:
        return None
    offered_fresh, accepted_fresh, taken, reached = _replayed(counted, drafts_at, k)
    positions_fresh = rates_of(taken, reached) if positions else []
    rate, fresh = accepted / offered, accepted_fresh / max(offered_fresh, 1)
    # what its drafts were worth: the drafts right decisions would have accepted
    worth = accepted + (decided.kept - decided.accepted if decided and decided.verdict else 0)
    short = (worth < fresh * offered - SIGMAS * _spread(offered, fresh)
             and worth < accepted_fresh)
    matches, tried = ([], "")
    if short and mistaken:
        matches, tried = _mistakes(counted, mistaken, k, worth, offered)
    says = (f"By {source} the engine accepted {accepted} of the {offered} drafts it offered "
            f"({rate:.0%}); {whose} own proposals on the same outputs, in rounds of k = "
            f"{k}, would have had {accepted_fresh} of {offered_fresh} accepted ({fresh:.0%}).")
    if positions:
        says += (" By draft position, of the drafts that reached it: the engine's "
                 f"{shown_rates(positions)}, the replay's {shown_rates(positions_fresh)}.")
    if worth > accepted:
        says += (f" Its rounds show decisions that refused drafts the target chose "
                 f"({decided.verdict}): right decisions would have accepted {worth} of its "
                 "drafts, and its drafter is judged on those.")
    return Acceptance(
        compared=offered, differ=0, beyond=0, tolerance=None, accepted=accepted,
        accepted_fresh=accepted_fresh, per_position=positions, per_position_fresh=positions_fresh,
        counters=True, offered_fresh=offered_fresh, matches=matches,
        verdict="draft-bug:acceptance" if short else None,
        explanation=says + (
            f" That is short beyond chance: the engine's drafts were not {whose} own"
            + (", or its decisions refused drafts the target chose: counters cannot tell which "
               "(its rounds can, where it reports them)" if not decided else "")
            + (". " + tried if tried else ". Which side of its drafter went wrong (positions, "
               "cache, the first token) is not seen from outside")
            + "; the output is judged apart." if short
            else " Nothing short beyond chance."))


def _replayed(counted: list, drafts_at: DraftsAt, k: int) -> tuple[int, int, list[int], list[int]]:
    """Rounds of k replayed on each output: (drafts offered, accepted, and per draft slot the
    rounds that accepted it and that reached it). A round before the last token offers up to k
    drafts, accepts the leading ones equal to the output, then the target's token."""
    offered = accepted = 0
    reached, taken = [0] * k, [0] * k
    for s in counted:
        out = s.output_ids
        i = 0
        while i < len(out) - 1:
            m = min(k, len(out) - 1 - i)
            choice = drafts_at(s.seq, i, m)
            a = next((j for j in range(m) if choice[j] != out[i + j]), m)
            for j in range(m):
                reached[j] += j <= a
                taken[j] += j < a
            offered, accepted, i = offered + m, accepted + a, i + a + 1
    return offered, accepted, taken, reached


def _spread(offered: int, rate: float) -> float:
    """A binomial count's standard deviation (+1: a drafter that agrees every time has none)."""
    return (offered * rate * (1 - rate) + 1) ** 0.5


def _mistakes(counted: list, mistaken: dict[str, DraftsAt], k: int, worth: int,
              offered: int) -> tuple[list[str], str]:
    """(the mistaken feedings whose replays accept what the engine did, within chance; that
    finding in words): each of the field's wrong ways of feeding a head replayed like the head."""
    rates, matches = {}, []
    for name, drafts_at in mistaken.items():
        tried, taken, _, _ = _replayed(counted, drafts_at, k)
        rates[name] = taken / max(tried, 1)
        if abs(worth - rates[name] * offered) <= SIGMAS * _spread(offered, rates[name]):
            matches.append(name)
    each = "; ".join(f"{name}, {rate:.0%}" for name, rate in rates.items())
    if not matches:
        return [], (f"No known way of feeding the head wrongly accepts as it did ({each}): "
                    "unexplained from outside")
    return matches, (f"Its counters match the head fed {' or '.join(matches)}: replayed so, it "
                     f"accepts as the engine did, within chance ({each})")


def _positions(totals: dict[str, float]) -> list[float | None]:
    """The engine's acceptance at each draft position from its /metrics, of the drafts that reached
    it: every draft reaches position 0, and position i those that accepted position i - 1 (accepted
    drafts are a prefix)."""
    taken = [n for _, n in sorted((int(key.removeprefix(PER_POSITION)), n)
                                  for key, n in totals.items()
                                  if key.startswith(PER_POSITION))]
    if not taken or not totals.get("drafts"):
        return []
    return rates_of(taken, [totals["drafts"], *taken[:-1]])
