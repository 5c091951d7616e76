"""Metrics over a Trace, as defined in the UI glossary (DESIGN §5)."""
from __future__ import annotations

import math

from specviz.trace.records import first_difference
from specviz.trace.schema import Trace

PHASES = ("draft", "verify", "realign", "trace", "watch")


def acceptance_rate(trace: Trace) -> float | None:
    """Accepted draft tokens / proposed draft tokens, over active rows."""
    proposed = sum(len(r.draft_tokens) for r in trace.rows)
    return sum(r.accepted for r in trace.rows) / proposed if proposed else None


def tokens_per_round(trace: Trace) -> float | None:
    """Emitted tokens / (round, row) records: what one row gains per round, bonus included."""
    return sum(len(r.emitted) for r in trace.rows) / len(trace.rows) if trace.rows else None


def per_position_acceptance(trace: Trace) -> list[float]:
    """P(draft j accepted | drafts before j accepted, and a draft j offered), for j = 1..k: a row
    offered fewer drafts (prompt lookup, the token budget) has no draft j to accept or reject."""
    k = trace.manifest.spec.k
    reached = [sum(r.accepted >= j and len(r.draft_tokens) > j for r in trace.rows)
               for j in range(k)]
    kept = [sum(r.accepted > j for r in trace.rows) for j in range(k)]
    return [kept[j] / reached[j] if reached[j] else float("nan") for j in range(k)]


def phase_seconds(trace: Trace) -> dict[str, float]:
    return {p: sum(r.timings.get(p, 0.0) for r in trace.rounds) for p in PHASES}


def group_rate(trace: Trace) -> float | None:
    """exspec: same-length rounds / all rounds."""
    flags = [r.group for r in trace.rounds if r.group is not None]
    return sum(flags) / len(flags) if flags else None


def completion_percentiles(trace: Trace, qs=(50, 90, 99)) -> dict[str, float]:
    """Per-sequence completion time (seconds from the start of decoding), P50/P90/P99."""
    times = sorted(s.completion_seconds for s in trace.sequences
                   if s.completion_seconds is not None)
    if not times:
        return {}
    return {f"p{q}": times[min(len(times) - 1, round(q / 100 * (len(times) - 1)))] for q in qs}


def prefix_match(output: list[int], reference: list[int]) -> float:
    """Fraction of the reference's tokens produced before the first difference."""
    fork = first_difference(output, reference)
    if fork is None or not reference:
        return 1.0
    return min(fork, len(reference)) / len(reference)


def equivalence(trace: Trace) -> dict[str, float]:
    """Exact match and mean prefix match against the reference, on token ids (fractions)."""
    # answered
    seqs = [s for s in trace.sequences if s.reference_ids is not None and s.equivalent is not None]
    if not seqs:
        return {}
    return {
        "exact": sum(s.equivalent for s in seqs) / len(seqs),
        "prefix": sum(1.0 if s.equivalent else prefix_match(s.output_ids, s.reference_ids)
                      for s in seqs) / len(seqs),
        "n": len(seqs),
    }


def verdict_counts(trace: Trace) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in trace.sequences:
        if s.forensics:
            counts[s.forensics.verdict] = counts.get(s.forensics.verdict, 0) + 1
    return dict(sorted(counts.items()))


def audit_counts(trace: Trace) -> dict[str, int]:
    """Audited runs: how many sequences' target (and draft) state left rounding at some round."""
    return {"target": sum(s.audit_round is not None for s in trace.sequences),
            "draft": sum(s.audit_draft_round is not None for s in trace.sequences)}


def waste(trace: Trace) -> dict[str, float]:
    """What a layout costs beyond the real tokens: the share of verified slots'
    keys that are padding or stale, and the largest target cache."""
    if not trace.rows:
        return {}
    slots = sum(r.target_kv_before + 1 for r in trace.rows)
    real = sum(r.content_before for r in trace.rows)
    return {"overhead_slots_pct": 100 * (slots - real) / slots,
            "peak_target_kv": max(r.target_kv_before for r in trace.rows)}


def speedup(trace: Trace) -> dict | None:
    """The run's tokens/s against the batch-size-1 reference's, both from the trace's manifest
    (decode_seconds, reference_seconds); None where there is no reference time to compare with (a
    sampled run, the reference itself, an engine check, a trace without one)."""
    m = trace.manifest
    if m.engine is not None or m.spec.method == "reference" or not trace.sequences:
        return None
    if any(s.reference_ids is None for s in trace.sequences):
        return None
    seconds, ref_seconds = m.decode_seconds, m.reference_seconds
    if not all(x is not None and math.isfinite(x) and x > 0 for x in (seconds, ref_seconds)):
        return None
    tokens = sum(len(s.output_ids) for s in trace.sequences)
    ref_tokens = sum(len(s.reference_ids) for s in trace.sequences)
    if not tokens or not ref_tokens:
        return None
    tps, ref_tps = tokens / seconds, ref_tokens / ref_seconds
    return {"ratio": tps / ref_tps, "tokens": tokens, "seconds": seconds, "tokens_per_second": tps,
            "reference_tokens": ref_tokens, "reference_seconds": ref_seconds,
            "reference_tokens_per_second": ref_tps}


def percent(value: float | None) -> str:
    """A percentage for a table; "-" where there is none."""
    return "-" if value is None else f"{value:.1f}"


def engine_summary(trace: Trace) -> list[dict]:
    """Table-1 rows of an engine check: the engine, then its control run when given. A sampled check
    has no exact or prefix match (None): its verdict is on its distribution."""
    rows = []
    for role, info in (("engine", trace.manifest.engine), ("control", trace.manifest.control)):
        if info is None:
            continue
        answers = [(getattr(s, role), s) for s in trace.sequences]
        answered = [(o, s) for o, s in answers if not o.error]
        # a sampled check: no token reference, a verdict on the distribution
        if trace.distribution is not None:
            exact = prefix = []
        elif role == "engine":
            exact = [bool(s.equivalent) for _, s in answered]
            prefix = [1.0 if s.equivalent else prefix_match(o.ids, s.reference_ids)
                      for o, s in answered]
        else:
            exact = [o.ids == s.reference_ids for o, s in answered]
            prefix = [prefix_match(o.ids, s.reference_ids) for o, s in answered]
        tokens = sum(len(o.ids) for o, _ in answered)
        rows.append({
            "engine": " ".join(x
                               for x in (info.name, info.version,
                                         "(control, no speculation)" * (role == "control")) if x),
            "role": role, "n": len(answered), "errors": len(answers) - len(answered),
            "exact_pct": 100 * sum(exact) / len(exact) if exact else None,
            "prefix_pct": 100 * sum(prefix) / len(prefix) if prefix else None,
            "tokens_per_second": tokens / info.seconds if info.seconds else None,
            "verdicts": (verdict_counts(trace) if trace.distribution is None
                         else {trace.distribution.verdict: 1})
            if role == "engine" else {},
        })
    return rows


# ---------------------------------------------------------------- sampled runs


def sampled(trace: Trace) -> bool:
    """A run that samples (temperature > 0, in some request): no token-by-token reference; judged by
    its distribution instead."""
    return not trace.manifest.spec.greedy


def mismatched(r) -> list[int]:
    """A sampled row's draft slots whose recorded decision does not follow its recorded draw:
    accepted iff u * q < p, as the engine computes it, for the drafts that were decided (those
    accepted and the first rejected one). The recorded values are the engine's float64 ones: a
    correct engine re-derives exactly."""
    if r.accept_draws is None:
        return []
    return [j for j in range(min(r.accepted + 1, len(r.draft_tokens)))
            if (r.accept_draws[j] * r.draft_probs[j] < r.target_draft_probs[j]) != (j < r.accepted)]


def mean_pit(s) -> float | None:
    """A sequence's mean PIT over its possible tokens (0.5 expected under a correct sampler)."""
    values = [u for u in s.pit or () if u is not None]
    return sum(values) / len(values) if values else None


def impossible(s) -> int:
    """A sequence's tokens the target gives probability 0 (recomputed at batch size 1)."""
    return sum(u is None for u in s.pit or ())


def distribution_summary(trace: Trace) -> dict | None:
    """A sampled run's verdict in one row: the PIT test and the decision audit (None: not a judged
    sampled run)."""
    d = trace.distribution
    if d is None:
        return None
    audit = trace.decisions
    worst = min((s.p for s in d.splits), default=None)
    return {"verdict": d.verdict, "p": d.p, "alpha": d.alpha, "failing": d.failing,
            "tokens": d.tokens,
            # the PIT test alone
            "splits_p": None if worst is None else min(1.0, worst * len(d.splits)),
            "impossible": d.impossible, "splits": len(d.splits), "skipped": len(d.skipped),
            "checked": audit.checked if audit else None,
            "mismatches": audit.mismatches if audit else None,
            "first": list(audit.first) if audit else []}


def sampled_verdict(trace: Trace) -> tuple[str, str] | None:
    """Which kind of fault a judged sampled run of ours shows, and why, as its judge found it when
    the run was judged (forensics/sampledrun.py). None where there is no such run: greedy, not
    judged, or without rounds (reference decoders, engines seen from outside)."""
    v = trace.sampled_verdict
    return None if v is None else (v.verdict, v.explanation)


def engine_drafts(trace: Trace) -> tuple[int, int]:
    """(accepted, offered): the draft tokens an engine said it offered and accepted, summed over its
    answers (0, 0 when it says nothing of them)."""
    answers = [s.engine for s in trace.sequences if s.engine is not None]
    return sum(o.accepted or 0 for o in answers), sum(o.drafts or 0 for o in answers)


def engine_rounds_seen(trace: Trace) -> str | None:
    """An engine's rounds as reported per request, in a sentence: how many, the drafts they
    accepted, the tokens a round emitted (None where it reports none)."""
    answers = [s.engine for s in trace.sequences if s.engine and s.engine.rounds]
    if not answers:
        return None
    rounds = [r for o in answers for r in o.rounds[1:]]  # (the first: the prefill's token)
    tokens = sum(len(o.ids) for o in answers) - len(answers)
    unseen = any(not r.shown for r in rounds)
    return (f"{len(rounds)} rounds over {len(answers)} requests"
            + (", seen from outside (the drafts not shown)" if unseen else "")
            + f": {sum(r.accepted for r in rounds)} drafts accepted, "
            + f"{tokens / max(len(rounds), 1):.2f} tokens a round after the first token")


def reference_proofs(trace: Trace) -> str | None:
    """How the references of a check were obtained, in a sentence (None: every one decoded
    from its prompt)."""
    proofs = [s.reference_proof for s in trace.sequences if s.reference_proof]
    if not proofs:
        return None
    whole = sum(p.decoded == 0 for p in proofs)
    proved, decoded = sum(p.proved for p in proofs), sum(p.decoded for p in proofs)
    margins = [p.smallest_margin for p in proofs if p.smallest_margin is not None]
    return (f"{whole} of {len(trace.sequences)} references proved whole by teacher forcing, no "
            f"decode; {proved} tokens proved (every one the float64 argmax by more than the "
            f"tolerance, {proofs[0].tolerance:.3g} logits"
            + (f"; the smallest margin {min(margins):.3g}" if margins else "")
            + f"), {decoded} decoded one at a time from a fork, a near-tie or an output's end")


def ratio_text(h) -> str:
    """A rule's log-likelihood ratio over the correct rule (trace.evidence.RuleHypothesis),
    in nats."""
    if h.log_ratio is not None:
        return f"{h.log_ratio:+.1f} nats"
    return ("+∞ (only the correct rule makes a token impossible)" if h.possible
            else "−∞ (it makes a token impossible)")
