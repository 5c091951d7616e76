"""The acceptance judge: were a greedy run's drafts the ones its draft model proposes?

A draft bug keeps the output right, since the target verifies every draft, and costs only acceptance
(SGLang PR #25015: draft positions off by one; vllm-metal PR #721: the drafter missed the target's
token). So each sequence's committed tokens go once through the draft model, fresh (batch size 1, no
cache, the run's dtype), and each round's drafts are compared with that pass's own choices on the
same prefix: the accepted drafts and the first rejected one, whose prefix the row had committed. A
correct drafter differs from the fresh pass only where rounding tips a near-tie: beyond the draft's
rounding tolerance (yardstick.py, on fresh passes of the draft), a draft is one the draft model does
not propose.

What the drafts cost: the acceptance the fresh pass's proposals would have had in the same rounds
(each round's leading drafts that equal the committed tokens), per draft slot beside the run's.
Which side went wrong is named from hypotheses tested on the same fresh pass: first drafts that
equal the draft model's choice one token earlier (it drafted without the target's last token, and
proposed it again: `draft-bug:first-token`), drafts proposed for another row of the round
(`draft-bug:rows`), drafts the draft model proposes at positions one off from the prompt's end on
(`draft-bug:positions`), else its own state (`draft-bug:cache`)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specviz.forensics.recompute import fresh_logits
from specviz.models.architecture import narrowest_window
from specviz.models.eagle3 import MISFEEDINGS
from specviz.models.head import heard_states
from specviz.spec.faults import misfeeding
from specviz.trace.evidence import Acceptance, ContextBand
from specviz.trace.schema import Trace

# a hypothesis names the side when it gives the run's own drafts at this share of the slots
EXPLAINED = 0.9
# an engine's acceptance by its counters is short beyond chance this many standard deviations below
SIGMAS = 4
# /metrics: the drafts that accepted draft position <i> (server.py)
FIRST_BAND = 32  # tokens of context: the first band of acceptance by context length, then doubling


@dataclass
class _Slot:
    round: int
    seq: int
    slot: int  # draft slot within its round
    at: int  # the output token it proposes
    draft: int
    gap: float  # the fresh pass's own choice's logit minus the draft's


# (seq, t0, m) -> the drafter's own m drafts for the round whose first draft proposes output token
# t0 (the committed tokens before each as its earlier drafts), and their logits (m, vocab)
Proposals = Callable[[int, int, int], tuple[list[int], torch.Tensor]]
# (seq, the layers heard) -> the target's states there from one fresh pass of the sequence
TargetStates = dict[tuple[int, tuple[int, ...]], torch.Tensor]


@torch.inference_mode()
def judge_acceptance(trace: Trace, draft, vocab: int,
                     tolerance: Callable[[], float | None]) -> Acceptance:
    """`draft`: the run's draft model; `tolerance()`: its rounding tolerance, asked only where a
    draft differs."""
    own: dict[int, list[int]] = {}  # seq -> the fresh pass's choice for each of its output tokens
    logits: dict[int, torch.Tensor] = {}

    def proposals(seq: int, t0: int, m: int) -> tuple[list[int], torch.Tensor]:
        if seq not in own:  # one pass a sequence: the draft model's choice at every output token
            out = trace.sequences[seq].output_ids
            logits[seq] = fresh_logits(draft, trace.prompts[seq].ids + out[:-1], len(out), vocab)
            own[seq] = logits[seq].argmax(-1).tolist()
        return own[seq][t0: t0 + m], logits[seq][t0: t0 + m]

    return _judge_rounds(
        trace, proposals, "the draft model", tolerance,
        lambda beyond, starts: _wrong_side(trace, draft, vocab, beyond, own, starts))


@torch.inference_mode()
def judge_head_acceptance(trace: Trace, target, head, vocab: int,
                          tolerance: Callable[[], float | None]) -> Acceptance:
    """A draft head's drafts (models/heads.py), against the head replayed from scratch: each
    sequence's hidden states (those the head hears) from one fresh pass of the target (batch size
    1, no cache), then for each round the head over the committed tokens, fed the target's hidden
    state at each slot before, and for each later draft its own output, over the whole sequence
    again (no cache).
    `tolerance()`: the run's draft rounding tolerance."""
    states: TargetStates = {}
    replay = head_replay(trace, target, head, vocab, states)
    return _judge_rounds(trace, replay(0), "the head", tolerance,
                         lambda beyond, starts: _head_side(trace, target, head, vocab, beyond,
                                                           starts, replay(1), states))


def head_replay(trace: Trace, target, head, vocab: int,
                states: TargetStates | None = None) -> Callable[[int], Proposals]:
    """(shift) -> a draft head's own proposals from scratch on the trace's committed tokens: the
    hidden states it hears from one fresh pass of the target per sequence (batch size 1, no
    cache; kept in `states`, which replays of heads that hear the same layers share), each slot
    fed the state `shift` + 1 slots before, then the head over the whole sequence again for each
    draft, fed its own output after the first."""
    states = {} if states is None else states
    hidden: dict[int, torch.Tensor] = {}

    def replay(shift: int) -> Proposals:
        def proposals(seq: int, t0: int, m: int) -> tuple[list[int], torch.Tensor]:
            ids = trace.prompts[seq].ids + trace.sequences[seq].output_ids
            if (seq, head.heard) not in states:
                out = target(input_ids=torch.tensor([ids], device=target.device),
                             output_hidden_states=True)
                states[seq, head.heard] = heard_states(out.hidden_states, head.heard)[0]
            if seq not in hidden:
                hidden[seq] = head.from_target(states[seq, head.heard])
            h, at = hidden[seq], len(trace.prompts[seq].ids) + t0
            fed = torch.cat([torch.zeros_like(h[: 1 + shift]), h[: at - 1 - shift]])[:at]
            rows = []
            for j in range(m):
                y = head.fresh(torch.tensor(ids[: at + j], device=h.device), fed)
                rows.append(head.logits(y[-1])[:vocab].double().cpu())
                # the head's guess of the target's hidden state, for its next draft
                fed = torch.cat([fed, y[-1:]])
            z = torch.stack(rows) if rows else torch.zeros(0, vocab, dtype=torch.float64)
            return z.argmax(-1).tolist(), z
        return proposals
    return replay


def _judge_rounds(trace: Trace, proposals: Proposals, whose: str,
                  tolerance: Callable[[], float | None], side) -> Acceptance:
    """Each round's drafts against the drafter's own `proposals`: the accepted drafts and the first
    rejected one, whose prefix the row had committed. `side(beyond, starts)` names the side that
    went wrong."""
    rows_of: dict[int, list] = {}
    for r in sorted(trace.rows, key=lambda r: r.round):
        rows_of.setdefault(r.seq, []).append(r)
    compared, differing = 0, []
    accepted = accepted_fresh = 0
    width = max((len(r.draft_tokens) for r in trace.rows), default=0)
    reached, taken, reached_fresh, taken_fresh = ([0] * width for _ in range(4))
    # (round, seq) -> the output token its round's first draft proposes
    starts: dict[tuple[int, int], int] = {}
    bands: dict[int, list[int]] = {}  # band -> [offered, accepted, accepted fresh]
    for s in trace.sequences:
        out = s.output_ids
        if not out or s.seq not in rows_of:
            continue
        t0 = 0
        for r in rows_of[s.seq]:
            starts[r.round, s.seq] = t0
            m = min(len(r.draft_tokens), len(out) - t0)
            choice, z = proposals(s.seq, t0, m) if m else ([], None)
            # a token tree's drafts (decoding/trees.py): the drafter's own candidate of each
            # draft's rank
            a, a_fresh = (min(r.accepted, m),
                          next((j for j in range(m) if choice[j] != out[t0 + j]), m))
            if r.tree and a_fresh < m and out[t0 + a_fresh] in z[a_fresh].topk(
                    trace.manifest.spec.tree_width).indices:
                a_fresh += 1  # a fresh tree's other candidate beside its chain's draft there
            rank = r.tree.ranks(m) if r.tree else [1] * m
            choice = [c if n == 1 else int(z[j].topk(n).indices[-1])
                      for j, (c, n) in enumerate(zip(choice, rank))]
            accepted, accepted_fresh = accepted + a, accepted_fresh + a_fresh
            band = bands.setdefault(_band(len(trace.prompts[s.seq].ids) + t0), [0, 0, 0])
            band[:] = band[0] + m, band[1] + a, band[2] + a_fresh
            for j in range(m):
                reached[j] += j <= a
                taken[j] += j < a
                reached_fresh[j] += j <= a_fresh
                taken_fresh[j] += j < a_fresh
            for j in range(min(a + 1, m)):
                compared += 1
                d = r.draft_tokens[j]
                if d != choice[j]:
                    differing.append(_Slot(r.round, s.seq, j, t0 + j, d,
                                           abs(float(z[j, choice[j]] - z[j, d]))))
            t0 += len(r.emitted)
    ev = Acceptance(compared=compared, differ=len(differing), beyond=0, tolerance=None,
                    accepted=accepted, accepted_fresh=accepted_fresh,
                    per_position=rates_of(taken, reached),
                    per_position_fresh=rates_of(taken_fresh, reached_fresh),
                    by_context=[ContextBand(start=_edge(b), end=_edge(b + 1), offered=n,
                                            accepted=a, accepted_fresh=f)
                                for b, (n, a, f) in sorted(bands.items())],
                    verdict=None, explanation="")
    cost = (f"The run accepted {accepted} drafts; {whose}'s own proposals, computed fresh on the "
            f"same committed tokens, would have had {accepted_fresh} accepted in the same rounds."
            + _by_context(ev.by_context))
    if differing:
        ev.tolerance = tolerance()
    beyond = sorted((d for d in differing if ev.tolerance is not None and d.gap > ev.tolerance),
                    key=lambda d: (d.round, d.seq, d.slot))
    ev.beyond = len(beyond)
    if differing and ev.tolerance is None:
        ev.verdict = "unexplained"
        ev.explanation = (f"{len(differing)} of {compared} drafts are not {whose}'s own choice "
                          "on their prefix, but its rounding is not measured (no float64 copy), so "
                          f"a near-tie cannot be told from a bug. {cost}")
    elif not beyond:
        ev.explanation = (f"Every one of the {compared} drafts compared is {whose}'s own choice on "
                          "its prefix"
                          + (f", {len(differing)} within its rounding" if differing else "")
                          + f". {cost}")
    else:
        first = beyond[0]
        ev.first = [first.round, first.seq, first.slot]
        ev.verdict, why = side(beyond, starts)
        harm = ("The output is unharmed (the target verified every draft); the drafts are wasted."
                if all(s.equivalent is not False for s in trace.sequences) else
                "Outputs forked as well (their own verdicts say why): the drafts were wrong "
                "besides.")
        ev.explanation = (f"{len(beyond)} of {compared} drafts are not {whose}'s own choice on "
                          f"their prefix, beyond its rounding ({ev.tolerance:.3g}); the first in "
                          f"round {first.round}, sequence {first.seq}, draft slot {first.slot}. "
                          f"{why} {harm} {cost}")
    return ev


def _head_side(trace: Trace, target, head, vocab: int, beyond: list[_Slot],
               starts: dict[tuple[int, int], int], shifted: Proposals,
               states: TargetStates) -> tuple[str, str]:
    """The side of a head that went wrong: the hidden states one slot off give its drafts, or the
    head fed one of the field's wrong ways (a published head's `mistaken`: its fault's verdict),
    else its own state."""
    def explains(proposals: Proposals) -> int:
        return sum(d.draft == proposals(d.seq, starts[d.round, d.seq], d.slot + 1)[0][d.slot]
                   for d in beyond)

    explained = explains(shifted)
    if explained >= EXPLAINED * len(beyond):
        return "draft-bug:hidden", (
            "The head replayed from the target's hidden states one slot earlier proposes "
            f"{explained} of them: it was fed each slot's hidden state off by one.")
    for way, fed in head.mistaken().items():
        explained = explains(head_replay(trace, target, fed, vocab, states)(0))
        if explained >= EXPLAINED * len(beyond):
            return misfeeding(way).acceptance, (
                f"The head replayed with {MISFEEDINGS[way]} proposes {explained} of them.")
    return "draft-bug:cache", ("Neither the target's hidden states one slot off nor a known "
                               "wrong way of feeding the head gives them: the head's own state "
                               "(its cache, or what it was fed) was wrong.")


def _band(context: int) -> int:
    """The band of a context length: [0, 32), [32, 64), [64, 128), ..."""
    return 0 if context < FIRST_BAND else (context // FIRST_BAND).bit_length()


def _edge(band: int) -> int:
    return 0 if band == 0 else FIRST_BAND << (band - 1)


def _by_context(bands: list[ContextBand]) -> str:
    if len(bands) < 2:
        return ""
    return " By context length at the round's start: " + "; ".join(
        f"{b.start}–{b.end - 1} tokens, {b.accepted} of {b.offered} accepted "
        f"({b.accepted_fresh} fresh)" for b in bands) + "."


def shown_rates(rates: list[float | None]) -> str:
    return " ".join("-" if r is None else f"{r:.2f}" for r in rates)


def rates_of(taken: list[int], reached: list[int]) -> list[float | None]:
    """Each draft slot's acceptance, of the rounds that reached it (None: none did)."""
    return [round(t / n, 4) if n else None for t, n in zip(taken, reached)]


def _wrong_side(trace: Trace, draft, vocab: int, beyond: list[_Slot], own: dict[int, list[int]],
                starts: dict[tuple[int, int], int]) -> tuple[str, str]:
    """The side of the drafter that went wrong, from the hypothesis that gives its drafts."""
    out = {s.seq: s.output_ids for s in trace.sequences}
    enough = EXPLAINED * len(beyond)
    repeated = sum(d.slot == 0 and d.at > 0 and d.draft == own[d.seq][d.at - 1] for d in beyond)
    if repeated >= enough:
        return "draft-bug:first-token", (
            f"{repeated} of them are the first draft of a round and equal the draft model's own "
            "choice one token earlier: the drafter drafted without the token the target wrote last "
            "round, and proposed it again.")
    others = sum(any(d.draft == own[seq][t + d.slot] for (r, seq), t in starts.items()
                     if r == d.round and seq != d.seq and seq in own and t + d.slot < len(own[seq]))
                 for d in beyond)
    if others >= enough:
        return "draft-bug:rows", (f"{others} of them are what the draft model proposes for another "
                                  "row of the same round: "
                                  "the rows were handed each other's drafts.")
    def proposed(**hypothesis) -> int:
        """How many of the drafts a fresh pass of the draft model under `hypothesis` (fresh_logits'
        arguments) proposes."""
        explained = 0
        for seq in {d.seq for d in beyond}:
            prompt = trace.prompts[seq].ids
            z = fresh_logits(draft, prompt + out[seq][:-1], len(out[seq]), vocab,
                             **{"shift_from": len(prompt), **hypothesis})
            explained += sum(d.draft == int(z[d.at].argmax()) for d in beyond if d.seq == seq)
        return explained

    # Positions one off from the prompt's end on, where drafting began (rotary positions are
    # relative: only a shift against the prefilled prompt shows).
    for shift in (1, -1):
        if (explained := proposed(shift=shift)) >= enough:
            return "draft-bug:positions", (
                f"The draft model fed positions {shift:+d} from where drafting began proposes "
                f"{explained} of them: the drafter's position ids were off by one against "
                "its prefill's.")
    if narrowest_window(draft) is not None and (explained := proposed(windowed=False)) >= enough:
        return "draft-bug:window", (
            f"The draft model run with its sliding window removed proposes {explained} of them: "
            "its sliding-window layers attended to the whole context (see the acceptance by "
            "context length).")
    return "draft-bug:cache", ("Neither the target's last token missing, another row's drafts, "
                               "positions one off, nor a window removed gives them: the drafter's "
                               "own state (its cache, or what it was fed) was wrong.")
