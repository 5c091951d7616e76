"""What the page shows, built from a Trace alone (no model, no gradio).

Every view is linked to one focus: a sequence and one of its rounds. HTML
views carry `data-seq` / `data-round` on whatever can be clicked, so the page
turns a click into a new focus.
"""
from __future__ import annotations

import html
import re
from collections import defaultdict
from dataclasses import dataclass

import pandas as pd

from . import metrics, text
from .forensics import span
from .trace import RowRecord, SequenceRecord, Trace

CHECK_TEXT = {
    "rectangular": "I1 rectangular: pad + content = batch width",
    "positions": "I2 positions follow the mask (cumsum(mask) − 1)",
    "mask": "mask: exactly the real slots are visible",
    "kv": "I3 target KV: one entry per real token, at its own position",
    "draft_kv": "I3 draft KV: the same for the draft's cache",
    "bonus": "I4 the non-draft token is the target's own (its argmax; when sampling, its draw)",
}
SOURCE_TEXT = {"draft": "accepted draft", "correction": "target correction", "bonus": "bonus (target, all drafts accepted)"}
# A sampled round's non-draft token: the distribution it was drawn from (trace.PickFrom).
PICK_TEXT = {
    "target": "drawn from the target's p (every draft accepted: the bonus)",
    "residual": "drawn from the residual norm(max(0, p − q)) after the draft was rejected",
    "draft": "the draft's own token, not drawn from the target at all (a fault)",
}


@dataclass(frozen=True)
class Focus:
    seq: int
    round: int | None  # a global round index the sequence took part in; None for non-speculative traces


def rows_by_seq(trace: Trace) -> dict[int, list[RowRecord]]:
    out: dict[int, list[RowRecord]] = defaultdict(list)
    for r in trace.rows:
        out[r.seq].append(r)
    return out


def round_widths(trace: Trace) -> dict[int, int]:
    """Each round's width: the most drafts any of its rows was offered (what its verify pass checked). A row may
    be offered fewer, or none (prompt lookup found no match; the token budget ends the row)."""
    out: dict[int, int] = defaultdict(int)
    for r in trace.rows:
        out[r.round] = max(out[r.round], len(r.draft_tokens))
    return out


def no_drafts(trace: Trace, have: int) -> str:
    """A row offered no drafts, that already had `have` tokens: why, and what it emitted instead."""
    spec = trace.manifest.spec
    if spec.max_new_tokens - 1 - have <= 0:
        why = "its token budget left room for one token only"
    elif spec.drafter == "lookup":
        why = f"prompt lookup found no earlier occurrence of its last n-gram, n {drafter_ngrams(spec)}"
    else:
        why = "its drafter proposed nothing"
    return f"{NO_DRAFTS} ({why}): the target's own token alone"


def drafter_ngrams(spec) -> str:
    return str(spec.ngram_min) if spec.ngram_min == spec.ngram_max else f"{spec.ngram_min}–{spec.ngram_max}"


NO_DRAFTS = "no drafts offered"


def fork_round(trace: Trace, seq: int, rows: list[RowRecord]) -> int | None:
    """The round that emitted the sequence's first divergent token."""
    fork = trace.sequences[seq].first_divergence
    if fork is None:
        return None
    seen = 0
    for r in rows:
        seen += len(r.emitted)
        if fork < seen:
            return r.round
    return rows[-1].round if rows else None


def resolve(trace: Trace, seq: int | None = None, round: int | None = None) -> tuple[Focus, str]:
    """A valid focus near the one asked for, and a note when it had to move.

    No sequence asked: the first divergent one (else 0). No valid round: the
    round of its divergence (else its first round).
    """
    note = ""
    n = len(trace.sequences)
    if seq is not None and not 0 <= seq < n:
        note = f"sequence {seq} is not in this run (it has {n}); showing another. "
        seq = None
    by_seq = rows_by_seq(trace)
    if seq is None:
        seq = next((s.seq for s in trace.sequences if s.equivalent is False), None)
    if seq is None:  # a sampled run: the first sequence with an impossible token, else a wrong decision
        seq = next((s.seq for s in trace.sequences if metrics.impossible(s)), None)
    if seq is None:
        seq = next((r.seq for r in trace.rows if metrics.mismatched(r)), 0)
    rows = by_seq.get(seq, [])
    rounds = [r.round for r in rows]
    if round is not None and round not in rounds:
        if rows:
            note += f"sequence {seq} took no part in round {round}; showing another. "
        round = None
    if round is None and rows:
        round = fork_round(trace, seq, rows)
        round = evidence_round(trace, seq, rows) if round is None else round
        round = rounds[0] if round is None else round
    return Focus(seq, round), note


def evidence_round(trace: Trace, seq: int, rows: list[RowRecord]) -> int | None:
    """A sampled sequence's round to open on: the one that emitted its first impossible token, else its first
    round with a decision that does not follow its draw."""
    s = trace.sequences[seq]
    first = next((i for i, u in enumerate(s.pit or ()) if u is None), None)
    if first is not None:
        seen = 0
        for r in rows:
            seen += len(r.emitted)
            if first < seen:
                return r.round
    return next((r.round for r in rows if metrics.mismatched(r)), None)


# ---------------------------------------------------------------- text helpers
# Every string in a trace or a link was written by a stranger: it is escaped wherever it becomes HTML
# (html.escape) or Markdown (md), and token texts are shown as whole characters (text.py).

PART = "…"  # a token holding only part of a character: the character shows on the token that completes it
_MD_PUNCTUATION = re.compile(r"[!-/:-@\[-`{-~]")


def md(stranger: str) -> str:
    """Text as inert Markdown: every ASCII punctuation mark backslash-escaped (CommonMark allows it for each),
    so no link, image, HTML tag, code span or emphasis can start, and lines joined, so no block can either."""
    return _MD_PUNCTUATION.sub(r"\\\g<0>", " ".join(stranger.splitlines()))


def visible(piece: str | None) -> str:
    """A token's text with invisible characters made visible (not escaped)."""
    if piece is None:
        return PART
    if piece == "":
        return "∅"
    return piece.replace("\n", "↵").replace("\t", "⇥")


def _show(piece: str | None) -> str:
    return html.escape(visible(piece))


def _own(trace: Trace, tok: int) -> str | None:
    """A token's own text; None when it holds only part of a character (alone, it decodes to U+FFFD)."""
    piece = trace.vocab.get(tok, f"<{tok}>")
    return None if text.REPLACEMENT in piece else piece


def _says(piece: str | None) -> str:
    """A token's text for a tooltip."""
    return "part of a character split across tokens" if piece is None else repr(piece)


def reads(pieces: list[str | None], i: int) -> str:
    """What token i of a sequence reads as, for a tooltip: a partial token names the character it starts."""
    if pieces[i] is not None:
        return repr(pieces[i])
    end = text.character_at(pieces, i)[1]
    return f"the first bytes of {pieces[end - 1]!r}, which token #{end - 1} completes"


# ---------------------------------------------------------------- views


def headline(trace: Trace, note: str = "", timing: str | None = None) -> str:
    """One markdown paragraph: what ran and how it went, `note` (our own words) at its end; then the speed-up
    over the batch-size-1 reference (speed_md, `timing` its word on where the times come from), and a table for
    engine checks and sampled runs."""
    m = trace.manifest
    s = m.spec
    if m.engine is not None:
        return engine_headline(trace, note)
    tokens = sum(len(q.output_ids) for q in trace.sequences)
    faults = md(" + " + ", ".join(s.faults)) if s.faults else ""
    sampling = f", **sampled** at {md(sampling_text(s))}" if metrics.sampled(trace) else ""
    models = (f"{md(s.target)}, drafts by **{md(drafter_text(s))}**" if s.drafter == "lookup"
              else f"{md(s.target)} / {md(s.draft)}")
    parts = [(f"**{md(s.method)}**{faults} on {models}, "
              f"{len(trace.sequences)} prompts, batch size {s.batch_size}, k {s.k}, {md(s.dtype)} on {md(m.device)}"
              f"{sampling}: {tokens} tokens in {m.decode_seconds:.1f} s")]
    if trace.rows:
        acceptance = metrics.acceptance_rate(trace)  # None: no row was offered a draft (prompt lookup found nothing)
        parts.append(("no drafts offered" if acceptance is None else f"acceptance {acceptance:.2f}")
                     + f", {metrics.tokens_per_round(trace):.2f} tokens/round")
    if (g := metrics.group_rate(trace)) is not None:
        parts.append(f"group rate {g:.0%}")
    eq = metrics.equivalence(trace)
    if eq:
        parts.append(f"**{eq['exact']:.0%} of sequences equal the batch-size-1 reference** "
                     f"(prefix match {eq['prefix']:.1%})")
        verdicts = metrics.verdict_counts(trace)
        if verdicts:
            parts.append("divergences: " + ", ".join(f"{md(v)} × {c}" for v, c in verdicts.items()))
    text = "; ".join(parts) + f". Fingerprint `{m.fingerprint}`.{note}"  # 16 hex digits: the schema's pattern
    if speed := speed_md(trace, timing):
        text += "\n\n" + speed
    if metrics.sampled(trace):
        text += "\n\n" + distribution_row(trace)
    return text


def drafter_text(spec) -> str:
    """What proposed a run's drafts, in words: the draft model, or prompt lookup with its n-gram sizes."""
    if spec.drafter != "lookup":
        return "the draft model"
    return f"prompt lookup (n-grams {drafter_ngrams(spec)}, no draft model)"


# Where the page came by a run's times (serving.py knows; a trace file alone does not).
TIMING_TEXT = {
    "now": "both measured on this machine in this run",
    "reused": ("the run's measured on this machine in this run; the reference's when this process first decoded "
               "it for the same pair, prompts and budget (reused here, not timed again)"),
    "cached": ("measured on this machine when this process first ran this spec, at {created} (the run is served "
               "from its cache; the reference's time is from then or from an earlier run of the same prompts)"),
}
FILE_TIMING = ("measured on {device} when this trace was made, at {created}; the reference is decoded once per "
               "process for the same pair, prompts and budget, so its time may come from an earlier run there")


def speed_md(trace: Trace, timing: str | None = None) -> str:
    """The run's tokens/s against the batch-size-1 reference's (metrics.speedup), and where both times come
    from: `timing` one of TIMING_TEXT's keys, None when only the trace is known. Empty without a reference time."""
    sp = metrics.speedup(trace)
    if sp is None:
        return ""
    m, s = trace.manifest, trace.manifest.spec
    r = sp["ratio"]
    head = f"**Speed-up: {r:.2f}×** " + ("the batch-size-1 reference's tokens/s" if f"{r:.2f}" == "1.00" else
                                          "— faster than the batch-size-1 reference" if r > 1 else
                                          "— slower than the batch-size-1 reference")
    device = m.device if m.device_name in ("", m.device) else f"{m.device} ({m.device_name})"
    where = TIMING_TEXT.get(timing, FILE_TIMING).format(created=m.created, device=device)
    out = (f"{head}: {sp['tokens_per_second']:.1f} tokens/s ({sp['tokens']} tokens in {sp['seconds']:.2f} s) "
           f"against {sp['reference_tokens_per_second']:.1f} ({sp['reference_tokens']} tokens in "
           f"{sp['reference_seconds']:.2f} s), {md(where)}.")
    if timing in TIMING_TEXT:
        out += f" Device: {md(device)}."
    if s.batch_size > 1:
        out += (f" The run decodes up to {s.batch_size} prompts at once, the reference one at a time: batching is "
                "part of this ratio.")
    traced = sum(metrics.phase_seconds(trace)[p] for p in ("trace", "watch"))
    if traced >= 0.005:
        out += f" The run's time includes {traced:.2f} s of recording its trace and watching for forks."
    return out


def sampling_text(spec) -> str:
    """A sampled run's settings in words: the target's, then the draft's own where it has any."""
    def words(t: float, k: int, p: float) -> str:
        return ", ".join([f"temperature {t:g}", *([f"top-k {k}"] if k else []), *([f"top-p {p:g}"] if p < 1 else [])])

    out = words(spec.temperature, spec.top_k, spec.top_p)
    own = (spec.draft_temperature, spec.draft_top_k, spec.draft_top_p)
    if any(x is not None for x in own):
        t, k, p = (mine if o is None else o for mine, o in zip((spec.temperature, spec.top_k, spec.top_p), own))
        out += "; the draft at " + words(t, k, p)
    return out


def _p(p: float | None) -> str:
    return "—" if p is None else f"{p:.3g}"


def _places(first: list[list[int]]) -> str:
    return ", ".join(f"[{', '.join(map(str, x))}]" for x in first)


def distribution_row(trace: Trace) -> str:
    """A sampled run's summary row (markdown): in place of the exact and prefix match of a greedy run."""
    d = metrics.distribution_summary(trace)
    head = ("| sampled run | verdict | p | failing split | tokens tested | impossible tokens | decision mismatches |\n"
            "|---|---|---:|---|---:|---:|---:|\n")
    if d is None:
        return head + "| distribution | not judged (no distribution in this trace) | — | — | — | — | — |"
    mismatches = "—" if d["checked"] is None else f"{d['mismatches']} of {d['checked']}"
    if d["mismatches"]:
        mismatches = f"**{mismatches}**"
    return head + (f"| distribution | **{md(d['verdict'])}** | {_p(d['p'])} | {md(d['failing'] or '—')} | "
                   f"{d['tokens']} | {d['impossible']} | {mismatches} |")


def distribution_md(trace: Trace | None) -> str:
    """The PIT panel's verdict: the test, its p, the failing split, and the decision audit, in a few lines."""
    if trace is None:
        return ("A sampled run (temperature above 0) is judged here: each token's randomized PIT under the target, "
                "recomputed at batch size 1, must be uniform in every split; every accept/reject decision is "
                "re-derived from its recorded p, q and draw.")
    if not metrics.sampled(trace):
        return ("**Greedy run** (temperature 0): checked token by token against the batch-size-1 reference (the "
                "sequence table and the forensic panel). The distribution test is for sampled runs.")
    d = metrics.distribution_summary(trace)
    if d is None:
        return "**Not judged:** this sampled run's trace holds no distribution test (it was run without one)."
    ok = d["verdict"] == "consistent"
    splits = f"{d['splits']} split" + ("s" if d["splits"] != 1 else "")
    if d["impossible"]:
        test = (f"p = {_p(d['p'])}: an impossible token rejects alone" + (
            "" if d["splits_p"] is None else
            f" (the PIT splits alone: p = {_p(d['splits_p'])}, the smallest split's p × {splits} tested)"))
    elif d["p"] is None:
        test = "too few tokens to test (a split needs 50)"
    else:
        test = (f"p = {_p(d['p'])} (the smallest split's p × {splits} tested, Bonferroni) "
                + ("≥" if ok else "<") + f" α = {d['alpha']:g}")
    lines = [f"**Verdict: {md(d['verdict'])}** — {test}"
             + ("" if ok or d["failing"] is None else f"; failing: **{md(d['failing'])}**") + "."]
    lines.append(f"{d['tokens']} tokens tested; **{d['impossible']} impossible** (probability 0 under the target: "
                 "no correct sampler emits one)" if d["impossible"] else
                 f"{d['tokens']} tokens tested; no impossible token")
    if d["skipped"]:
        lines[-1] += f"; {d['skipped']} splits too small to test"
    lines[-1] += "."
    if d["checked"] is not None:
        audit = (f"Decision audit: {d['checked']} accept/reject decisions re-derived from their recorded p, q and "
                 f"draw u (accepted iff u < p/q): ")
        if d["mismatches"]:
            shown = d["first"][:5]
            audit += (f"**{d['mismatches']} do not follow their draw**; the first at (round, row, slot) "
                      f"{md(_places(shown))}" + (", …" if d["mismatches"] > len(shown) else "") + ". "
                      + ("The engine does not sample as it records, whatever the PIT test can see yet."
                         if ok else ""))
        else:
            audit += "all follow their draw."
        lines.append(audit)
    return "\n\n".join(lines)


def engine_headline(trace: Trace, note: str = "") -> str:
    """An engine check: the engine as it described itself (a stranger's words), and a Table-1 row per run."""
    m, s = trace.manifest, trace.manifest.spec
    e = m.engine
    head = (f"**engine check** of {md(' '.join(x for x in (e.name, e.version) if x))} ({md(e.source)}) against the "
            f"batch-size-1 reference of {md(s.target)} in {md(s.dtype)}, {len(trace.sequences)} prompts, "
            f"up to {s.max_new_tokens} new tokens. Fingerprint `{m.fingerprint}`.{note}")
    rows = ["| run | answered | no answer | exact % | prefix % | tok/s | verdicts |", "|---|---:|---:|---:|---:|---:|---|"]
    for r in metrics.engine_summary(trace):
        tps = "-" if r["tokens_per_second"] is None else f"{r['tokens_per_second']:.1f}"
        verdicts = ", ".join(f"{md(v)} × {c}" for v, c in r["verdicts"].items()) or "-"
        rows.append(f"| {md(r['engine'])} | {r['n']} | {r['errors']} | {metrics.percent(r['exact_pct'])} | "
                    f"{metrics.percent(r['prefix_pct'])} | {tps} | {verdicts} |")
    return head + "\n\n" + "\n".join(rows)


def summary_frame(trace: Trace) -> pd.DataFrame:
    """One line per sequence. A sampled run has no reference to diverge from: its lines say how its tokens
    score under the target instead (mean PIT, impossible tokens) and whether its decisions follow their draws."""
    by_seq = rows_by_seq(trace)
    sampled = metrics.sampled(trace)
    records = []
    for s, p in zip(trace.sequences, trace.prompts):
        rows = by_seq.get(s.seq, [])
        proposed = sum(len(r.draft_tokens) for r in rows)
        record = {"seq": s.seq, "prompt": text.clip(p.text, 48), "tokens": len(s.output_ids)}
        if sampled:
            mean = metrics.mean_pit(s)
            record.update({
                "mean PIT": "—" if mean is None else f"{mean:.3f}",
                "impossible tokens": "—" if s.pit is None else str(metrics.impossible(s)),
                "decision mismatches": str(sum(len(metrics.mismatched(r)) for r in rows)) if rows else "—",
            })
        else:
            record.update({
                "equal": {True: "yes", False: "NO", None: "-"}[s.equivalent],
                "diverges at": "" if s.first_divergence is None else str(s.first_divergence),
                "verdict": s.forensics.verdict if s.forensics else "",
            })
        record.update({
            "acceptance": f"{sum(r.accepted for r in rows) / proposed:.2f}" if proposed else "",
            "tokens a round": f"{sum(len(r.emitted) for r in rows) / len(rows):.2f}" if rows else "",
        })
        records.append(record)
    return pd.DataFrame.from_records(records)


PROMPT_COLUMN_PX = 200  # the prompt wraps (the table's cells do): the other columns fit beside it at 1280 px


def column_widths(frame: pd.DataFrame) -> list[str]:
    """The sequence table's column widths: none so narrow that a header breaks inside a word (Gradio sizes
    columns from their cells alone, and wrapped "equivalent" letter by letter), and no wider than its longest
    word or cell. About 8 px a header character and 8 a cell's (monospace), plus the cell's padding."""
    def width(column: str) -> int:
        longest_cell = max((len(str(v)) for v in frame[column]), default=0)
        return max(max(len(w) for w in column.split()) * 8 + 28, longest_cell * 8 + 24)
    return [f"{PROMPT_COLUMN_PX}px" if c == "prompt" else f"{width(c)}px" for c in frame.columns]


def timeline_html(trace: Trace, focus: Focus) -> str:
    """The focused sequence's tokens as chips, grouped by round, coloured by origin."""
    seq = trace.sequences[focus.seq]
    rows = rows_by_seq(trace).get(focus.seq, [])
    out = [f'<div class="sv-timeline" data-seq="{focus.seq}">']
    if not rows and seq.gaps is not None:  # an engine check: each token against the target's own choice
        out.append('<div class="sv-round">')
        for i, tok in enumerate(seq.output_ids):
            out.append(_engine_chip(trace, seq, i, tok))
        out.append("</div>")
    elif not rows:  # a non-speculative method: tokens only
        out.append('<div class="sv-round">')
        drawn = " · sampled from the target's p" if metrics.sampled(trace) else " · from the target"
        for i, tok in enumerate(seq.output_ids):
            out.append(_chip(seq, i, "sv-target", f"#{i} · id {tok} · {reads(seq.output_pieces, i)}{drawn}"))
        out.append("</div>")
    i = 0
    widths = round_widths(trace)
    for r in rows:
        sel = " sv-sel" if r.round == focus.round else ""
        k = len(r.draft_tokens)
        sampled = r.accept_draws is not None
        wrong = metrics.mismatched(r)
        if k:
            offered = f"accepted {r.accepted} of its {k} drafts" + (
                f" (others in this round were offered up to {widths[r.round]})" if k < widths[r.round] else "")
        else:
            offered = no_drafts(trace, i)
        out.append(f'<div class="sv-round{sel}{"" if k else " sv-nodrafts"}" data-seq="{focus.seq}" '
                   f'data-round="{r.round}" title="round {r.round} · batch row {r.row} · {html.escape(offered)}'
                   + (f" · {len(wrong)} decision(s) do not follow their draw" if wrong else "") + '">'
                   f'<span class="sv-rn">{r.round}</span>')
        if not k:
            out.append(f'<span class="sv-nodraft" title="{html.escape(offered)}">no drafts</span>')
        for j, (tok, src) in enumerate(zip(r.emitted, r.sources)):
            tip = [f"#{i} · id {tok} · {reads(seq.output_pieces, i)}",
                   SOURCE_TEXT[src] if k else "the target's own token (no drafts were offered this round)"]
            if sampled:
                if src == "draft":
                    tip.append(decision_text(r, j))
                elif not k and r.pick_from == "target":
                    tip.append("drawn from the target's p" + ("" if r.pick_draw is None else
                                                              f", with draw v {r.pick_draw:.4g}"))
                else:
                    tip.append(PICK_TEXT.get(r.pick_from, "drawn from an unknown distribution")
                               + ("" if r.pick_draw is None else f", with draw v {r.pick_draw:.4g}"))
                    if j < k:
                        tip.append(f"the draft proposed {_says(_own(trace, r.draft_tokens[j]))}: {decision_text(r, j)}")
                tip.append(f"target top-2 margin {r.target_margins[j]:.2f} (logits)")
            else:
                if src == "draft":
                    tip.append(f"draft p {r.draft_probs[j]:.3f}")
                elif j < k:
                    tip.append(f"the draft proposed {_says(_own(trace, r.draft_tokens[j]))} (p {r.draft_probs[j]:.3f})")
                tip.append(f"target p {r.target_probs[j]:.3f} · top-2 margin {r.target_margins[j]:.2f}")
            tip.append(f"round {r.round} · target KV {r.target_kv_before + 1 + j}")
            out.append(_chip(seq, i, f"sv-{src}" + (" sv-mismatch" if src == "draft" and j in wrong else ""),
                             " · ".join(tip)))
            i += 1
        for j in range(r.accepted, k):  # the first rejected draft, then those that came after it
            tok = r.draft_tokens[j]
            piece = _own(trace, tok)
            if sampled:
                tip = f"rejected draft: id {tok} · {_says(piece)} · {decision_text(r, j)}"
            else:
                why = (f"the target chose {_says(_own(trace, r.target_tokens[j]))}" if j == r.accepted
                       else "it followed a rejected draft")
                tip = f"rejected draft: id {tok} · {_says(piece)} · draft p {r.draft_probs[j]:.3f} · {why}"
            cls = " sv-part" if piece is None else ""
            cls += " sv-mismatch" if j in wrong else ""
            out.append(f'<span class="sv-tok sv-rejected{cls}" title="{html.escape(tip)}">{_show(piece)}</span>')
        out.append("</div>")
    out.append("</div>")
    return "".join(out)


def decision_text(r: RowRecord, j: int) -> str:
    """Draft j of a sampled row, for a tooltip: q, p, the accept probability min(1, p/q), the draw u and the
    decision, and whether the decision follows the draw (u · q < p, as distribution.decisions re-derives it)."""
    q, p, u = r.draft_probs[j], r.target_draft_probs[j], r.accept_draws[j]
    ratio = min(1.0, p / q) if q > 0 else 1.0
    text_ = f"draft q {q:.4g} · target p {p:.4g} · accept probability min(1, p/q) {ratio:.4g} · draw u {u:.4g}"
    if j > r.accepted:
        return text_ + " · not decided: it followed a rejected draft"
    accepted, rule = j < r.accepted, u * q < p
    text_ += " · " + ("ACCEPTED" if accepted else "REJECTED")
    if accepted == rule:
        return text_ + (" (u < p/q)" if rule else " (u ≥ p/q)")
    return text_ + f", yet u {'<' if rule else '≥'} p/q: this decision does not follow its draw"


def _engine_chip(trace: Trace, s: SequenceRecord, i: int, tok: int) -> str:
    """An engine's output token, coloured by the reference's surprise at it: the target's own choice (up to
    numerics), or how far below the target's choice it sits on the engine's own prefix."""
    tolerance = engine_tolerance(trace)
    gap = s.gaps[i]
    tip = [f"#{i} · id {tok} · {reads(s.output_pieces, i)}"]
    if gap <= tolerance:
        cls = "sv-own"
        tip.append("the target's own choice here" + (f" (up to numerics: {gap:.3g} logits below)" if gap else ""))
    else:
        cls = "sv-surprise"
        tip.append(f"{gap:.3g} logits below the target's choice on this prefix: the target would not write it")
    if s.engine and s.engine.logprobs and i < len(s.engine.logprobs):
        tip.append(f"the engine's log-probability {s.engine.logprobs[i]:.3f}")
    return _chip(s, i, cls, " · ".join(tip))


def engine_tolerance(trace: Trace) -> float:
    """The largest gap an engine check puts down to the engine's rounding (its yardstick's; as its forensics did)."""
    f = next((s.forensics for s in trace.sequences if s.forensics and s.forensics.tolerance is not None), None)
    ys = trace.manifest.yardstick
    if f is not None:
        return f.tolerance
    if ys is not None and ys.engine is not None:
        return ys.engine.tolerance
    return ys.target.tolerance if ys is not None and ys.target is not None else 0.0


def _chip(s: SequenceRecord, i: int, cls: str, tip: str) -> str:
    """Output token i of sequence s: its whole characters, or PART when it only starts one."""
    fork = s.first_divergence
    if fork is not None and i == fork:
        cls += " sv-fork"
        tip += (f" · FIRST DIVERGENCE: the reference has {reads(s.reference_pieces, i)}" if i < len(s.reference_ids)
                else " · FIRST DIVERGENCE: the reference had ended")
    elif fork is not None and i > fork:
        cls += " sv-after"
    if s.pit is not None and i < len(s.pit):
        if s.pit[i] is None:
            cls += " sv-impossible"
            tip += " · IMPOSSIBLE under the target: probability 0 at batch size 1 (no correct sampler emits it)"
        else:
            tip += f" · PIT {s.pit[i]:.3f} under the target"
    piece = s.output_pieces[i]
    cls += " sv-part" if piece is None else ""
    return f'<span class="sv-tok {cls}" data-index="{i}" title="{html.escape(tip)}">{_show(piece)}</span>'


def grid_html(trace: Trace, focus: Focus) -> str:
    """Sequences × their rounds; each cell the accepted count out of the drafts that row was offered (its own k,
    which prompt lookup and the token budget make differ between rows), or a "no drafts" cell."""
    by_seq = rows_by_seq(trace)
    if not by_seq:
        return '<p class="sv-empty">No rounds: this method does not speculate.</p>'
    width = max(len(v) for v in by_seq.values())
    widths = round_widths(trace)
    out = ['<div class="sv-grid-wrap"><table class="sv-grid"><thead><tr><th>seq</th>']
    out += [f"<th>{n + 1}</th>" for n in range(width)]
    out.append("</tr></thead><tbody>")
    for s in trace.sequences:
        rows = by_seq.get(s.seq, [])
        fr = fork_round(trace, s.seq, rows)
        mark = {True: "✓", False: "✗", None: "⚠" if metrics.impossible(s) else ""}[s.equivalent]
        out.append(f'<tr><th class="sv-seq" data-seq="{s.seq}" data-round="{rows[0].round if rows else ""}">'
                   f"{s.seq} {mark}</th>")
        start = 0
        for n, r in enumerate(rows):
            k = len(r.draft_tokens)
            hue = 120 * r.accepted / k if k else 0
            bad = sum(u is None for u in (s.pit or [])[start:start + len(r.emitted)])
            start += len(r.emitted)
            wrong = metrics.mismatched(r)
            cls = "sv-cell" + (" sv-fork" if r.round == fr else "") + (
                " sv-sel" if (s.seq, r.round) == (focus.seq, focus.round) else "") + (
                " sv-audit" if r.round in (s.audit_round, s.audit_draft_round) else "") + (
                " sv-impossible" if bad else "") + (" sv-mismatch" if wrong else "") + ("" if k else " sv-nodraft")
            if k:
                offered = f"accepted {r.accepted} of its {k} drafts" + (
                    f" (the round's widest row was offered {widths[r.round]})" if k < widths[r.round] else "")
            else:
                offered = no_drafts(trace, start - len(r.emitted))
            tip = (f"seq {s.seq} · round {r.round} (its {n + 1}.) · {offered} · "
                   f"emitted {len(r.emitted)}" + (" · first divergence" if r.round == fr else "")
                   + (" · audit: the target's state left rounding here" if r.round == s.audit_round else "")
                   + (" · audit: the draft's state left rounding here" if r.round == s.audit_draft_round else "")
                   + (f" · {bad} token(s) impossible under the target" if bad else "")
                   + (f" · {len(wrong)} decision(s) do not follow their draw" if wrong else ""))
            # background-color alone: the corners (audit, impossible) and the no-drafts stripes are background images
            colour = f"hsl({hue:.0f},65%,72%)" if k else "#ececec"
            out.append(f'<td class="{cls}" data-seq="{s.seq}" data-round="{r.round}" '
                       f'style="background-color:{colour}" title="{html.escape(tip)}">'
                       f'{f"{r.accepted}/{k}" if k else "—"}</td>')
        out.append("<td></td>" * (width - len(rows)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def compare_html(trace: Trace, focus: Focus) -> str:
    """Reference and speculative text side by side, the divergence highlighted."""
    s = trace.sequences[focus.seq]
    fork = s.first_divergence

    def column(title: str, pieces: list[str | None]) -> str:
        if fork is None:
            body = html.escape(text.joined(pieces))
        else:  # mark the whole character the first divergent token belongs to
            a, b = text.character_at(pieces, fork) if fork < len(pieces) else (fork, fork)
            body = (html.escape(text.joined(pieces[:a])) + '<mark class="sv-fork">' + html.escape(text.joined(pieces[a:b]))
                    + "</mark>" + '<span class="sv-after">' + html.escape(text.joined(pieces[b:])) + "</span>")
        return f'<div class="sv-col"><h4>{html.escape(title)}</h4><div class="sv-text">{body}</div></div>'

    if s.reference_ids is None and metrics.sampled(trace):
        note = ("a sampled run has no token-by-token reference: this text is one draw, and the distribution "
                "panel judges whether the run's draws come from the target's distribution")
        return (f'<div class="sv-compare" data-seq="{focus.seq}"><p class="sv-note">sequence {focus.seq}: {note}</p>'
                + column(f"{trace.manifest.spec.method}, sampled at {sampling_text(trace.manifest.spec)}",
                         s.output_pieces) + "</div>")
    if s.reference_ids is None:
        return '<p class="sv-empty">No reference was decoded for this trace.</p>'
    note = ("identical token ids" if fork is None else f"first divergence at token {fork}")
    return (f'<div class="sv-compare" data-seq="{focus.seq}"><p class="sv-note">sequence {focus.seq}: {note}</p>'
            + column("reference (target alone, batch size 1)", s.reference_pieces)
            + column(f"{trace.manifest.spec.method}", s.output_pieces) + "</div>")


def forensics_html(trace: Trace, focus: Focus) -> str:
    """The focused sequence's verdict with its evidence, and the focused round's state and checks."""
    s = trace.sequences[focus.seq]
    out = [f'<div class="sv-forensics" data-seq="{focus.seq}" data-round="{"" if focus.round is None else focus.round}">']
    f = s.forensics
    if s.equivalent:
        out.append(f'<p class="sv-verdict sv-ok">Sequence {s.seq} equals the reference, token for token.</p>')
    elif f is None and metrics.sampled(trace):
        out.append(_sampled_verdict(trace, s))
    elif f is None:
        out.append(f'<p class="sv-verdict">Sequence {s.seq}: no reference to compare with.</p>')
    else:
        kind = html.escape(f.verdict.split(":")[0])
        out.append(f'<p class="sv-verdict sv-{kind}">Sequence {s.seq}: <b>{html.escape(f.verdict)}</b> — '
                   f"{html.escape(f.explanation)}</p>")
        out.append(_table(_evidence(trace, f)))
    if s.audit_round is not None or s.audit_draft_round is not None:
        out.append(_table([("audit: first round the target's state left rounding", s.audit_round),
                           ("audit: the same for the draft", s.audit_draft_round)]))
    row = next((r for r in rows_by_seq(trace).get(focus.seq, []) if r.round == focus.round), None)
    if row is not None:
        k = len(row.draft_tokens)
        widest = round_widths(trace)[row.round]
        have = sum(len(r.emitted) for r in rows_by_seq(trace)[focus.seq] if r.round < row.round)
        lookup = trace.manifest.spec.drafter == "lookup"
        out.append(f"<h4>Round {row.round}, batch row {row.row}</h4>")
        out.append(_table([
            ("drafts offered to this row", f"{k}" + (f" (the round's widest row: {widest})" if k < widest else "")
             + (f" — {no_drafts(trace, have)}" if not k else "")),
            ("accepted", f"{row.accepted} of {k}" if k else "—"),
            ("emitted", " ".join(f"{visible(_own(trace, t))} ({src})" for t, src in zip(row.emitted, row.sources))),
            ("padding before → after", f"{row.pad_before} → {_opt(row.pad_after)}"),
            ("content before → after", f"{row.content_before} → {_opt(row.content_after)}"),
            ("positions fed to verify", f"{row.pos_first} … {row.pos_last}"),
            ("mask sum (slots visible to the first verified token)", row.mask_sum),
            ("target KV before → after", f"{row.target_kv_before} → {_opt(row.target_kv_after)}"),
            ("draft KV before → after", "— (prompt lookup keeps no draft cache)" if lookup else
             f"{row.draft_kv_before} → {_opt(row.draft_kv_after)}"),
            ("realignment shift (delta)", row.delta),
        ]))
        if row.accept_draws is not None:
            out.append(_draws_table(trace, row))
        out.append('<table class="sv-checks"><tr><th>invariant</th><th>held</th></tr>')
        for name, held in row.checks.items():
            says = CHECK_TEXT.get(name, name) if not (lookup and name == "draft_kv") else \
                "I3 draft KV: nothing to check (prompt lookup keeps no draft cache)"
            out.append(f'<tr class="{"sv-held" if held else "sv-broken"}"><td>{html.escape(says)}'
                       f"</td><td>{'✓' if held else '✗'}</td></tr>")
        out.append("</table>")
    out.append("</div>")
    return "".join(out)


def _sampled_verdict(trace: Trace, s: SequenceRecord) -> str:
    """A sampled sequence has no reference to diverge from: how its tokens score under the target instead."""
    spec = trace.manifest.spec
    head = f"Sequence {s.seq} was sampled at {html.escape(sampling_text(spec))}: no token-by-token reference"
    if s.pit is None:
        return f'<p class="sv-verdict">{head}; its tokens were not scored under the target.</p>'
    bad = metrics.impossible(s)
    wrong = sum(len(metrics.mismatched(r)) for r in rows_by_seq(trace).get(s.seq, []))
    mean = metrics.mean_pit(s)
    facts = [f"{len(s.pit)} tokens", f"mean PIT {'—' if mean is None else f'{mean:.3f}'} (0.5 expected)"]
    if bad:
        first = next(i for i, u in enumerate(s.pit) if u is None)
        facts.append(f"<b>{bad} impossible under the target</b> (probability 0; the first is token #{first})")
    if wrong:
        facts.append(f"<b>{wrong} decision(s) that do not follow their draw</b>")
    cls = " sv-sync-bug" if bad or wrong else ""
    return (f'<p class="sv-verdict{cls}">{head}; its tokens are judged with the whole run\'s, by their randomized '
            f"PIT under the target recomputed at batch size 1 (the distribution panel): {'; '.join(facts)}.</p>")


def _draws_table(trace: Trace, row: RowRecord) -> str:
    """A sampled round's draws for one row: each draft's q, p, min(1, p/q), u and decision, then the non-draft
    token and where it was drawn from. A decision that does not follow its draw is marked."""
    wrong = metrics.mismatched(row)
    out = [('<table class="sv-checks"><tr><th>slot</th><th>draft token</th><th>q (draft)</th><th>p (target)</th>'
            "<th>min(1, p/q)</th><th>draw u</th><th>decision</th></tr>")]
    for j, tok in enumerate(row.draft_tokens):
        q, p, u = row.draft_probs[j], row.target_draft_probs[j], row.accept_draws[j]
        decision = "accepted" if j < row.accepted else "rejected" if j == row.accepted else "not decided"
        if j in wrong:
            decision += " — does not follow u < p/q"
        cells = (j, f"{visible(_own(trace, tok))} (id {tok})", f"{q:.4g}", f"{p:.4g}",
                 f"{min(1.0, p / q) if q > 0 else 1.0:.4g}", f"{u:.4g}", decision)
        out.append(f'<tr class="{"sv-broken" if j in wrong else "sv-held"}">'
                   + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    a = row.accepted
    if a < len(row.emitted):
        tok = row.emitted[a]
        where = PICK_TEXT.get(row.pick_from, "drawn from an unknown distribution")
        draw = "" if row.pick_draw is None else f", with draw v {row.pick_draw:.4g}"
        out.append(_table([(f"slot {a}: {visible(_own(trace, tok))} (id {tok})", where + draw)]))
    return "".join(out)


def _evidence(trace: Trace, f) -> list[tuple[str, object]]:
    """The verdict's evidence, in the order forensics weighs it (forensics.py)."""
    ys = trace.manifest.yardstick
    rounding = ys.target if ys else None
    engine = ys.engine if ys else None

    def beyond(diff: float | None) -> str | None:
        if diff is None or rounding is None or not rounding.tolerance:  # a stranger's tolerance may be 0
            return _num(diff)
        return (f"{diff:.3g} logits = {diff / rounding.tolerance:.3g} × the rounding tolerance, beyond twice the "
                f"rounding of {rounding.place(diff):.0%} of measured positions")

    return [
        ("first divergent token", f.fork),
        ("emitted in round / batch row", f"{f.round} / {f.row}" if f.round is not None else None),
        ("engine's token" if trace.manifest.engine else "speculative token", _tok(trace, f.output_token)),
        ("reference token", _tok(trace, f.reference_token)),
        ("judged against", f.yardstick),
        ("rounding tolerance (two correct computations differ by more with probability α)", None if rounding is None
         or engine is not None else f"{rounding.tolerance:.3g} logits in {rounding.dtype}, α = "
         + ("not stated" if rounding.alpha is None else f"{rounding.alpha:.2g}")),
        ("rounding yardstick suspect", rounding.anomaly if rounding else None),
        ("state check: emitting pass vs fresh batch-size-1 recomputation", beyond(f.state_diff)),
        ("first token fed is the sequence's own last token", None if f.tokens_fed_ok is None else
         ("yes" if f.tokens_fed_ok else "NO")),
        ("positions fed / where its tokens sit", None if f.positions_fed is None else
         f"{span(f.positions_fed)} / {span(f.positions_expected)}"),
        ("key slots visible / real tokens", None if f.visible is None else f"{span(f.visible)} / {span(f.visible_expected)}"),
        ("the same pass rebuilt from correct inputs, vs fresh", beyond(f.kernel_diff)),
        ("the same, rebuilt in float64, vs fresh float64", None if f.kernel_diff_float64 is None else
         f"{f.kernel_diff_float64:.3g} logits (float64's rounding tolerance: "
         + ("?" if rounding is None or rounding.float64_tolerance is None else f"{rounding.float64_tolerance:.2g}") + ")"),
        ("cache replayed alone with true positions, vs fresh", _num(f.kv_diff)),
        ("cache entries computed at another position", ", ".join(
            f"position {i} at {at}" if at >= 0 else f"position {i}: another token's" for i, at in f.written_at) or None),
        ("the emitting pass's own choice", _tok(trace, f.emitting_argmax)),
        ("top-1 − top-2 margin, batch size 1", _num(f.margin_reference)),
        ("the same in the emitting pass", _num(f.margin_batched)),
        ("float64: the reference token's logit − the divergent token's", None if f.margin_float64 is None else
         f"{f.margin_float64:.4g}" + ("" if engine else f" (its size: {beyond(abs(f.margin_float64))})")),
        ("plain batching (no speculation) forks here too", None if f.batching_noise is None else
         ("yes" if f.batching_noise else "no")),
        ("the engine's own checks failed (first round)", None if trace.manifest.engine else ", ".join(
            f"{c} (round {r})" for c, r in f.failed_checks.items()) or "none"),
        # An engine check, judged from outside
        ("rank of the engine's token under the target", f.engine_rank),
        ("the engine's own log-probability of it", _num(f.engine_logprob)),
        ("largest gap the engine's rounding explains", None if engine is None else
         f"{_num(f.tolerance)} at false-alarm rate {_num(f.alpha)}"),
        ("first token beyond it, at or after the fork", f.first_bad),
        ("the same engine without speculation departs at", None if trace.manifest.control is None else
         "never" if f.control_fork is None else f.control_fork),
        ("repeated 4-grams after the fork", None if f.repeated is None else f"{f.repeated:.0%}"),
        ("nats a token after the fork, under the target: engine / reference", None if f.nll is None else
         f"{f.nll:.2f} / {_num(f.reference_nll)}"),
    ]


def _tok(trace: Trace, tok: int | None) -> str | None:
    return None if tok is None else f"{visible(_own(trace, tok))} (id {tok})"


def _num(v: float | None) -> str | None:
    return None if v is None else f"{v:.4g}"


def _opt(v) -> str:
    return "left the batch" if v is None else str(v)


def _table(items: list[tuple[str, object]]) -> str:
    """Names and values as plain text (both escaped here)."""
    cells = "".join(f"<tr><td>{html.escape(name)}</td><td>{html.escape(str(value))}</td></tr>"
                    for name, value in items if value is not None)
    return f'<table class="sv-kv">{cells}</table>'


def glossary(trace: Trace | None) -> str:
    """Every metric the page shows, with its formula and (when a trace is open) its value."""
    def value(fn) -> str:
        if trace is None:
            return ""
        v = fn(trace)
        return "" if v is None else f" — here **{v:.3g}**" if isinstance(v, float) else f" — here **{v}**"

    def realign_share(t: Trace) -> float | None:
        return metrics.phase_seconds(t)["realign"] / t.manifest.decode_seconds if t.rows and t.manifest.decode_seconds else None

    def _tolerance(t: Trace) -> float | None:
        ys = t.manifest.yardstick
        return ys.target.tolerance if ys and ys.target else None

    def throughput(t: Trace) -> float | None:
        return sum(len(s.output_ids) for s in t.sequences) / t.manifest.decode_seconds if t.manifest.decode_seconds else None

    def _dist(t: Trace) -> dict | None:
        return metrics.distribution_summary(t)

    def _verdict(t: Trace) -> str | None:
        d = _dist(t)
        return None if d is None else f"{md(d['verdict'])}, p {_p(d['p'])}"

    def _mismatches(t: Trace) -> str | None:
        d = _dist(t)
        return None if d is None or d["checked"] is None else f"{d['mismatches']} of {d['checked']}"

    def _mean_pit(t: Trace) -> float | None:
        values = [u for s in t.sequences for u in s.pit or () if u is not None]
        return sum(values) / len(values) if values else None

    def _speedup(t: Trace) -> float | None:
        sp = metrics.speedup(t)
        return None if sp is None else sp["ratio"]

    def _drafter(t: Trace) -> str | None:
        return md(drafter_text(t.manifest.spec)) if t.rows else None

    def _no_drafts(t: Trace) -> str | None:
        return f"{sum(not r.draft_tokens for r in t.rows)} of {len(t.rows)}" if t.rows else None

    positions = metrics.per_position_acceptance(trace) if trace and trace.rows else []
    lines = [
        "**acceptance rate** = accepted draft tokens / proposed draft tokens, over active rows" + value(metrics.acceptance_rate),
        "**tokens per round** = emitted tokens / (round, row) records, bonus included" + value(metrics.tokens_per_round),
        "**per-position acceptance** = P(draft j accepted | drafts before j accepted and a draft j offered)"
        + (" — here " + ", ".join(f"{p:.2f}" for p in positions) if positions else ""),
        "**realignment overhead** = realign time / decode time" + value(realign_share),
        "**group rate** (exspec) = same-length rounds / all rounds" + value(metrics.group_rate),
        "**throughput** = generated tokens (through EOS) / decode seconds" + value(throughput),
        ("**speed-up** = the run's throughput / the batch-size-1 reference's (its tokens / its decode seconds), both "
         "from the trace; the run's time includes recording its trace" + value(_speedup)),
        ("**drafter** = what proposes a round's drafts: the draft model (one forward pass a draft), or prompt lookup "
         "(the tokens that followed the row's last n-gram where it first occurred earlier in its prompt and output; "
         "no model, the longest n first)" + value(_drafter)),
        ("**drafts offered** (a row's own k) = the drafts its round proposed for that row: k, fewer near its token "
         "budget or where prompt lookup's match runs short, none where no n-gram matches — the row then takes the "
         "target's own token alone (a — cell in the grid, \"no drafts\" in the timeline). Rows offered none"
         + value(_no_drafts)),
        "**exact match** = sequences whose token ids equal the batch-size-1 reference / sequences",
        "**prefix match** = reference tokens before the first difference / reference tokens, averaged",
        "**top-2 margin** = the target's top-1 minus top-2 logit at a position: how close its choice was to flipping",
        ("**rounding** (the yardstick) = per position, the largest |logit difference| between the target in the run's "
         "dtype and a float64 copy, both fresh (batch size 1, no cache: a path no verify-kernel bug reaches), over "
         "the built-in prompts and the reference's continuations on this pair and device"),
        ("**rounding tolerance** = twice the order statistic of those positions that a correct computation of a "
         "verify pass's k + 1 positions, or the one it is compared with, exceeds with probability at most α: two "
         "correct computations differ by more with probability α (the stated false-alarm rate)" + value(_tolerance)),
        ("**state check** = the largest |logit difference| between the pass that emitted a token and a fresh "
         "batch-size-1 recomputation of that row's real tokens (no cache); beyond the rounding tolerance its first "
         "token, positions and mask are checked, the pass is rebuilt from correct inputs, and its cache entries "
         "are replayed, one at a time"),
        ("**float64 gap** = the reference token's logit minus the speculative token's, recomputed in float64 at "
         "batch size 1: the true distance of the near-tie"),
        ("**verdict** = `sync-bug:<state>` when the state check fails on a wrong input (or the emitted token is not "
         "the argmax that chose it: `bonus`); `kernel-bug` when every input was right and the pass rebuilt from "
         "correct inputs still departs; `numerics` when the state was clean and the float64 gap is within the "
         "rounding tolerance; else `unexplained`, with the evidence that is missing"),
        ("**audit** (run with audit) = the state check on every row of every round, for the target and the draft: "
         "the first round a row's state left rounding, fork or not"),
        "**delta** = how many slots a row's KV moved in a realignment (0 when every row gained the same)",
        ("**engine check** = another engine's outputs (a server, a file, a callable) against the batch-size-1 "
         "reference of the same weights; every output token is teacher-forced through the target"),
        ("**gap** (engine checks) = the target's top logit minus the engine token's, in float64 on the engine's own "
         "prefix: 0 where the engine wrote the target's own choice"),
        ("**engine rounding** = the engine's own noise on a logit difference, fitted to its control run (the same "
         "engine without speculation, which holds no speculation bug): the gaps where the control departs from the "
         "target's float64 argmax and the margins where it does not (and its log-probabilities, where given); its "
         "tolerance is the 99th percentile at the 95% upper bound (without a control, transformers' own rounding)"),
        ("**engine-bug** = a token at or after the fork has a gap beyond the engine's own rounding; `numerics` = "
         "every gap from the fork on within it; without a control run a gap beyond transformers' rounding is "
         "`unexplained`, asking for one"),
        ("**temperature, top-k, top-p** (sampled runs) = the target's logits divided by the temperature, cut to "
         "the k most likely tokens, then to the smallest set holding top-p of the mass; the draft uses the same "
         "unless given its own. Temperature 0 is greedy"),
        ("**accept probability** = min(1, p/q) for a draft token with draft probability q and target probability p: "
         "accepted iff its draw u < p/q. After a rejection the token is drawn from the **residual** "
         "norm(max(0, p − q)); after k accepted drafts the bonus is drawn from p"),
        ("**PIT** (randomized probability integral transform) = F(x−) + V · p(x) for an emitted token x, with F(x−) the "
         "target's mass of the tokens ranked before x (most probable first) and V uniform: uniform on (0, 1) under a "
         "correct sampler, whatever p is; a sampler that favours likely tokens piles its values near 0 (a mean PIT "
         "below 0.5), one that favours unlikely tokens near 1. p is recomputed at batch size 1, outside the engine"
         + value(_mean_pit)),
        ("**distribution verdict** = every split of the PIT values (pooled, by slot, by batch row, by rounds, row "
         "pairs) tested against uniform (Kolmogorov–Smirnov and chi-square), Bonferroni across splits: rejected "
         "when p < α, or at once by one **impossible token** (probability 0 under the target)" + value(_verdict)),
        ("**decision audit** = every recorded accept/reject decision re-derived from its recorded p, q and u: a "
         "correct engine has no mismatch" + value(_mismatches)),
    ]
    return "\n".join(f"- {line}" for line in lines)
