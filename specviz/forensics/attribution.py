"""Which bug is this? The judge of an engine's forked rows replayed under each known mechanism.

The replays are run elsewhere (run/attribution.py: specviz's engine under each fault of the
catalogue, stopped at its first token not the engine's) and handed here as data, one Replay per
hypothesis and row.

Most of what a replay writes after the fork proves nothing: once past the fork token, any replay
that computes about right writes the target's own choices on the engine's prefix, as the engine did.
The evidence is in the engine's tokens that the correct target, teacher-forced on the engine's own
prefix, would not write (beyond the check's tolerance, or past where the reference stopped:
departing()). A mechanism is named only when its replay writes at least EVIDENCE of those more than
the correct engine replayed the same way does (all the others where the engine wrote fewer, never
fewer than MIN_EVIDENCE), and no other writes more. docs/engines.md measures the threshold on vLLM's
and llama.cpp's controls. Where none is named, the finding says so and gives what fresh float64
passes at batch size 1 establish about the fork token.

Where every departing token is the draft model's own choice on the engine's prefix (an engine that
drafts with the check's draft model), the tokens establish one thing: drafts the target rejected
were kept, where the fork is judged a bug and not rounding. Every accept rule that keeps refused
drafts writes them, and the catalogue's draft-keeping mechanisms (a bonus from the draft, a rule on
the wrong distributions) are only some of those rules. So no mechanism is named there: the finding
says what the tokens establish, that they cannot tell which rule kept the drafts, and which of the
catalogue's rules write them."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from specviz.forensics.enginenoise import truth_model
from specviz.forensics.recompute import fresh_logits
from specviz.models.pairs import ModelPair
from specviz.spec.faults import mechanism
from specviz.spec.drafters import DRAFTERS
from specviz.spec.verdicts import verdict
from specviz.trace.evidence import Attribution, Hypothesis
from specviz.trace.findings import Findings
from specviz.trace.records import SequenceRecord
from specviz.trace.schema import Trace

# Tokens a named mechanism writes that the correct target, on the engine's prefix, would not;
# never fewer than MIN_EVIDENCE (where the engine wrote fewer such tokens, all of them): one may
# be rounding's.
EVIDENCE = 4
MIN_EVIDENCE = 2


@dataclass(frozen=True)
class Replay:
    """One hypothesis replayed on one forked row: the faults planted (() for the correct engine),
    the prompts replayed beside it, and how far it wrote the engine's tokens."""

    seq: int
    faults: tuple[str, ...]
    companions: list[int]  # the other prompts of its batch, in batch order; [] when replayed alone
    explained: int  # the engine's tokens from the fork on that it wrote too
    failed_at: int | None  # its first token not the engine's (None: it wrote them all)
    replay_ids: list[int]  # its tokens, up to and including the one at failed_at
    round: int | None  # its round that wrote the fork token, and its slot in that round
    slot: int | None
    seconds: float  # its share of the replay's time


def departing(s: SequenceRecord) -> list[bool]:
    """Per engine token from the fork on: one the correct engine would not write, teacher-forced on
    the engine's own prefix: beyond the tolerance below the target's own choice (the check's gaps,
    in float64), or, where the fork is the reference's stop, every one (a correct engine writes
    nothing there). The rest, the target's own choices, any replay that reached them writes too."""
    tolerance = s.forensics.tolerance or 0.0
    gaps = s.gaps or []
    # the engine went on where the reference stopped
    past_stop = s.first_divergence >= len(s.reference_ids or [])
    return [past_stop or (j < len(gaps) and gaps[j] > tolerance)
            for j in range(s.first_divergence, len(s.engine.ids))]


def evidence(s: SequenceRecord, explained: int) -> int:
    """The departing tokens (departing()) among the first `explained` from the fork: what a replay
    that wrote them holds as evidence."""
    return sum(departing(s)[:explained])


def threshold_of(s: SequenceRecord, correct: Hypothesis) -> int:
    """The departing tokens a mechanism must write beyond those the correct engine's replay writes
    (batch-dependent rounding may tip a near-tie as the engine's did) to be named: EVIDENCE, or all
    the others where the engine wrote fewer, and never fewer than MIN_EVIDENCE."""
    return max(MIN_EVIDENCE, min(EVIDENCE, sum(departing(s)) - correct.beyond))


def judge_replays(trace: Trace, replays: list[Replay], skipped: dict[str, str], pair: ModelPair,
                  prompt_ids: list[list[int]]) -> Findings:
    """Each replayed row's `attribution`, from every replay of it (a later replay of the same
    hypothesis stands for it); `skipped`: the faults not tried, and why."""
    by_seq: dict[int, list[Replay]] = defaultdict(list)
    for r in replays:
        by_seq[r.seq].append(r)
    found = Findings()
    for seq, mine in by_seq.items():
        s = trace.sequences[seq]
        best = {r.faults: _hypothesis(s, r) for r in mine}
        found.of(seq)["attribution"] = _judged(trace, seq, best, skipped, len(mine),
                                               sum(r.seconds for r in mine), pair, prompt_ids)
    return found


def _hypothesis(s: SequenceRecord, r: Replay) -> Hypothesis:
    return Hypothesis(faults=r.faults, companions=r.companions, explained=r.explained,
                      beyond=evidence(s, r.explained), failed_at=r.failed_at,
                      replay_ids=r.replay_ids, round=r.round, slot=r.slot)


def _judged(trace: Trace, seq: int, best: dict[tuple[str, ...], Hypothesis],
            skipped: dict[str, str], replays: int, seconds: float, pair: ModelPair,
            prompt_ids: list[list[int]]) -> Attribution:
    """One forked row's attribution from each hypothesis's best replay: ranked, and named beyond
    the threshold."""
    s = trace.sequences[seq]
    best = dict(best)
    correct = best.pop(())
    # a pair is a hypothesis only where it writes more than each of its faults alone
    best = {faults: h for faults, h in best.items() if len(faults) < 2 or
            all(h.beyond > best[(f,)].beyond for f in faults if (f,) in best)}
    fork, tokens = s.first_divergence, len(s.engine.ids) - s.first_divergence
    threshold = threshold_of(s, correct)
    ranked = sorted(best.values(),
                    key=lambda h: (-h.beyond, -h.explained, len(h.companions), len(h.faults)))
    top = ranked[0].beyond if ranked else 0
    out = s.engine.ids
    # the draft model's own choice at each of the engine's tokens, on the engine's prefix
    drafted = fresh_logits(pair.draft, prompt_ids[seq] + out[:-1], len(out),
                           pair.vocab_size).argmax(-1).tolist()
    departed = [fork + j for j, d in enumerate(departing(s)) if d]
    # Every departing token the draft's: where the engine drafts with the check's draft model, and
    # not past the reference's stop (every token departs there, the target's own choices too).
    drafter = DRAFTERS.get(trace.manifest.engine.settings.get("drafter"))
    drafts = (drafter is not None and drafter.draft_model and bool(departed)
              and fork < len(s.reference_ids or []) and all(out[i] == drafted[i] for i in departed))
    for h in ranked:
        h.named = not drafts and h.beyond == top and h.beyond - correct.beyond >= threshold
    named = [h for h in ranked if h.named]
    facts = [] if named else _facts(trace, seq, pair, prompt_ids[seq], drafted[fork])
    judged_bug = verdict(s.forensics.verdict).bug
    # the fork judged a bug: its departures are not rounding's, so the drafts were rejected ones
    a = Attribution(fork=fork, tokens=tokens, departing=departed, threshold=threshold,
                    correct=correct, hypotheses=ranked, skipped=skipped, replays=replays,
                    seconds=seconds, explanation="", facts=facts,
                    rejected_draft_kept=drafts and judged_bug)
    a.explanation = (_drafts_kept(a, judged_bug) if drafts
                     else _explanation(a, named, judged_bug))
    return a


def _facts(trace: Trace, seq: int, pair: ModelPair, prompt: list[int], drafted: int) -> list[str]:
    """What fresh passes at batch size 1 (the target in float64 where it has a float64 copy, the
    draft in its own dtype) establish about a fork no hypothesis explains: which context, or which
    model or row, the engine's fork token is the choice of (`drafted`: the draft model's own
    choice on the engine's prefix)."""
    s = trace.sequences[seq]
    out, f = s.engine.ids, s.first_divergence
    token = out[f]
    model, truth = truth_model(pair)
    found = []
    if f > 0 and int(fresh_logits(model, prompt + out[: f - 1], 1,
                                  pair.vocab_size)[0].argmax()) == token:
        found.append(f"The fork token {token} is the target's choice ({truth}) over a context "
                     f"missing the token before it ({out[f - 1]}): as if the last accepted token "
                     "had not been fed.")
    if drafted == token:
        found.append(f"The fork token {token} is the draft model's own choice on the same "
                     "prefix: a draft written where the target's token belongs.")
    others = [o.seq for o in trace.sequences if o.seq != seq and o.reference_ids
              and len(o.reference_ids) > f and o.reference_ids[f] == token]
    if others:
        rows = ", ".join(map(str, others))
        found.append(f"The fork token {token} is the reference's token {f} of "
                     f"prompt{'s' * (len(others) > 1)} {rows}: another row's.")
    return found or [f"The fork token {token} is not the target's choice over the context missing "
                     "the token before it, nor the draft model's, nor another prompt's at the same "
                     "index."]


def _drafts_kept(a: Attribution, judged_bug: bool) -> str:
    """A fork whose departing tokens are all the draft model's own choices, in words: what they
    establish (drafts kept that the target rejected, where the fork was judged a bug), and which of
    the catalogue's mechanisms write them all."""
    mine = (f"each of the {len(a.departing)} tokens from the fork on that the target itself would "
            "not write on the engine's prefix is the draft model's own choice there")
    kept = ("The engine kept drafts the target rejected: decisions it got wrong" if judged_bug
            else "If they are not rounding (the verdict above says what would decide it), the "
                 "engine kept drafts the target rejected")
    fits = [h for h in a.hypotheses
            if h.beyond == len(a.departing) and h.beyond - a.correct.beyond >= a.threshold]
    which = (f"Of the catalogue's mechanisms, {', '.join('+'.join(h.faults) for h in fits)} "
             f"write{'s' * (len(fits) == 1)} them all, as would any accept rule that keeps the "
             "same drafts" if fits else "No mechanism of the catalogue writes them all")
    return (f"What the tokens establish: {mine}. {kept}. They cannot tell which accept rule kept "
            f"them. {which} (the correct engine, replayed the same way, writes "
            f"{a.correct.beyond} of them).")


def _explanation(a: Attribution, named: list[Hypothesis], judged_bug: bool) -> str:
    """The finding in words (`judged_bug`: the black-box judge called the fork a bug; else it could
    not decide)."""
    correct = f"the correct engine, replayed the same way, writes {a.correct.beyond} of them"
    departing = f"the {len(a.departing)} the target itself would not write on the engine's prefix"
    if named:
        h = named[0]
        beside = ", ".join(map(str, h.companions))
        where = f"beside prompts {beside}" if h.companions else "alone"
        rest = "all of them" if h.failed_at is None else f"first failing token {h.failed_at}"
        alike = ", ".join("+".join(x.faults) for x in named[1:])
        also = f" Indistinguishable by these tokens: {alike}." if len(named) > 1 else ""
        return (f"{mechanism(h.faults)}. Replayed {where}, it writes the engine's tokens "
                f"{a.fork}-{a.fork + h.explained - 1} ({h.explained} of the {a.tokens} after the "
                f"fork, {rest}), {h.beyond} of {departing}; {correct}.{also}")
    tried = f"{len(a.hypotheses)} mechanisms of the catalogue tried in {a.replays} replays"
    best = a.hypotheses[0] if a.hypotheses else None
    if best and best.beyond > a.correct.beyond:
        closest = "+".join(best.faults)
        return (f"Too little evidence to name a mechanism: the closest, {closest}, writes "
                f"{best.beyond} of {departing}, and naming one needs {a.threshold} more than the "
                f"correct engine's ({tried}; {correct}). Missing evidence: more of the engine's "
                "tokens after the fork (a larger token budget), or more prompts that fork.")
    if judged_bug:
        return ("A bug outside the casebook: no mechanism writes the engine's departing tokens "
                f"({tried}; {correct}).")
    return ("No mechanism of the catalogue writes the engine's departing tokens "
            f"({tried}; {correct}): if this fork is a bug, it is one outside the casebook; the "
            "verdict above says what is missing to decide whether it is one.")
