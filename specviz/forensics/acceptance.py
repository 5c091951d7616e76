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
from specviz.models.head import heard_states
from specviz.trace.evidence import Acceptance, ContextBand, Rejections
from specviz.trace.schema import Trace

# a hypothesis names the side when it gives the run's own drafts at this share of the slots
EXPLAINED = 0.9
# an engine's acceptance by its counters is short beyond chance this many standard deviations below
SIGMAS = 4
# /metrics: the drafts that accepted draft position <i> (server.py)
PER_POSITION = "accepted_tokens_per_pos_"
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
# (seq, output index i, m) -> the drafter's own m drafts for output tokens i.. of sequence seq
DraftsAt = Callable[[int, int, int], list[int]]


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
    replay = head_replay(trace, target, head, vocab)
    return _judge_rounds(trace, replay(0), "the head", tolerance,
                         lambda beyond, starts: _head_side(beyond, starts, replay(1)))


def head_replay(trace: Trace, target, head, vocab: int) -> Callable[[int], Proposals]:
    """(shift) -> a draft head's own proposals from scratch on the trace's committed tokens: the
    hidden states it hears from one fresh pass of the target per sequence (batch size 1, no
    cache), each slot fed the state `shift` + 1 slots before, then the head over the whole
    sequence again for each draft, fed its own output after the first."""
    hidden: dict[int, torch.Tensor] = {}

    def replay(shift: int) -> Proposals:
        def proposals(seq: int, t0: int, m: int) -> tuple[list[int], torch.Tensor]:
            ids = trace.prompts[seq].ids + trace.sequences[seq].output_ids
            if seq not in hidden:
                out = target(input_ids=torch.tensor([ids], device=target.device),
                             output_hidden_states=True)
                hidden[seq] = head.from_target(heard_states(out.hidden_states, head.heard)[0])
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
                    per_position=_rates(taken, reached),
                    per_position_fresh=_rates(taken_fresh, reached_fresh),
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


def _head_side(beyond: list[_Slot], starts: dict[tuple[int, int], int],
               shifted: Proposals) -> tuple[str, str]:
    """The side of a head that went wrong: the hidden states one slot off give its drafts, or its
    own state."""
    explained = 0
    for d in beyond:
        t0 = starts[d.round, d.seq]
        choice, _ = shifted(d.seq, t0, d.slot + 1)
        explained += d.draft == choice[d.slot]
    if explained >= EXPLAINED * len(beyond):
        return "draft-bug:hidden", (
            "The head replayed from the target's hidden states one slot earlier proposes "
            f"{explained} of them: it was fed each slot's hidden state off by one.")
    return "draft-bug:cache", ("The target's hidden states one slot off do not give them: the "
                               "head's own state (its cache, or what it was fed) was wrong.")


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


def head_drafts(trace: Trace, target, head, vocab: int) -> DraftsAt:
    """A draft head's own greedy chains on each output's committed tokens (head_replay)."""
    proposals = head_replay(trace, target, head, vocab)(0)
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
    positions_fresh = _rates(taken, reached) if positions else []
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
                 f"{_shown(positions)}, the replay's {_shown(positions_fresh)}.")
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
    return _rates(taken, [totals["drafts"], *taken[:-1]])


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


def _shown(rates: list[float | None]) -> str:
    return " ".join("-" if r is None else f"{r:.2f}" for r in rates)


def _rates(taken: list[int], reached: list[int]) -> list[float | None]:
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
