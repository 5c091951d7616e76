"""The page's summaries of a trace, in Markdown and one table: the headline, the speed-up, a sampled
run's distribution verdict, an engine check's headline, and the sequence table."""
from __future__ import annotations

import pandas as pd

from specviz.app.views import md, rows_by_seq
from specviz.spec.drafters import DRAFTERS
from specviz.trace import metrics, text
from specviz.trace.schema import Trace


def headline(trace: Trace, note: str = "", timing: str | None = None) -> str:
    """One markdown paragraph: what ran and how it went, `note` (our own words) at its end; then the
    speed-up over the batch-size-1 reference (speed_md, `timing` its word on where the times come
    from), and a table for engine checks and sampled runs."""
    m = trace.manifest
    s = m.spec
    if m.engine is not None:
        return engine_headline(trace, note)
    tokens = sum(len(q.output_ids) for q in trace.sequences)
    faults = md(" + " + ", ".join(s.faults)) if s.faults else ""
    sampling = f", **sampled** at {md(sampling_text(s))}" if metrics.sampled(trace) else ""
    models = (f"{md(s.target)} / {md(s.draft)}" if DRAFTERS[s.drafter].draft_model
              else f"{md(s.target)}, drafts by **{md(drafter_text(s))}**")
    parts = [(f"**{md(s.method)}**{faults} on {models}, "
              f"{len(trace.sequences)} prompts, batch size {s.batch_size}, k {s.k}, {md(s.dtype)} "
              f"on {md(m.device)}{sampling}: {tokens} tokens in {m.decode_seconds:.1f} s")]
    if trace.rows:
        # None: no row was offered a draft (prompt lookup found nothing)
        acceptance = metrics.acceptance_rate(trace)
        parts.append(("no drafts offered" if acceptance is None else f"acceptance {acceptance:.2f}")
                     + f", {metrics.tokens_per_round(trace):.2f} tokens/round")
    for facts in (m.head, m.paging):
        if facts:
            parts.append(md(facts.describe()))
    if (g := metrics.group_rate(trace)) is not None:
        parts.append(f"group rate {g:.0%}")
    eq = metrics.equivalence(trace)
    if eq:
        parts.append(f"**{eq['exact']:.0%} of sequences equal the batch-size-1 reference** "
                     f"(prefix match {eq['prefix']:.1%})")
        verdicts = metrics.verdict_counts(trace)
        if verdicts:
            parts.append("divergences: " + ", ".join(f"{md(v)} × {c}" for v, c in verdicts.items()))
    # 16 hex digits: the schema's pattern
    text = "; ".join(parts) + f". Fingerprint `{m.fingerprint}`.{note}"
    if speed := speed_md(trace, timing):
        text += "\n\n" + speed
    if metrics.sampled(trace):
        text += "\n\n" + distribution_row(trace)
    return text + "".join(f"\n\n{line}" for line in lossless_md(trace))


def lossless_md(trace: Trace) -> list[str]:
    """The bugs that keep every token right (Markdown): drafts that were not the drafter's own, and
    drafts refused that the target chose. Nothing else on the page shows them."""
    return [f"**{what}: {md(found.verdict)}.** {md(found.explanation)}"
            for what, found in (("Drafts", trace.acceptance), ("Decisions", trace.rejections))
            if found and found.verdict]


def drafter_text(spec) -> str:
    """What proposed a run's drafts, in words: the draft model, or prompt lookup
    with its n-gram sizes."""
    return DRAFTERS[spec.drafter].words(spec)


# Where the page came by a run's times (serving.py knows; a trace file alone does not).
TIMING_TEXT = {
    "now": "both measured on this machine in this run",
    "reused": ("the run's measured on this machine in this run; the reference's when this process "
               "first decoded it for the same pair, prompts and budget (reused here, not timed "
               "again)"),
    "cached": ("measured on this machine when this process first ran this spec, at {created} (the "
               "run is served from its cache; the reference's time is from then or from an "
               "earlier run of the same prompts)"),
}


FILE_TIMING = ("measured on {device} when this trace was made, at {created}; the reference is "
               "decoded once per process for the same pair, prompts and budget, so its time may "
               "come from an earlier run there")


def speed_md(trace: Trace, timing: str | None = None) -> str:
    """The run's tokens/s against the batch-size-1 reference's (metrics.speedup), and where both
    times come from: `timing` one of TIMING_TEXT's keys, None when only the trace is known. Empty
    without a reference time."""
    sp = metrics.speedup(trace)
    if sp is None:
        return ""
    m, s = trace.manifest, trace.manifest.spec
    r = sp["ratio"]
    head = f"**Speed-up: {r:.2f}×** " + ("the batch-size-1 reference's tokens/s"
                                         if f"{r:.2f}" == "1.00"
                                         else "— faster than the batch-size-1 reference" if r > 1
                                         else "— slower than the batch-size-1 reference")
    device = m.device if m.device_name in ("", m.device) else f"{m.device} ({m.device_name})"
    where = TIMING_TEXT.get(timing, FILE_TIMING).format(created=m.created, device=device)
    out = (f"{head}: {sp['tokens_per_second']:.1f} tokens/s ({sp['tokens']} tokens in "
           f"{sp['seconds']:.2f} s) against {sp['reference_tokens_per_second']:.1f} "
           f"({sp['reference_tokens']} tokens in {sp['reference_seconds']:.2f} s), {md(where)}.")
    if timing in TIMING_TEXT:
        out += f" Device: {md(device)}."
    if s.batch_size > 1:
        out += (f" The run decodes up to {s.batch_size} prompts at once, the reference one at a "
                "time: batching is part of this ratio.")
    traced = sum(metrics.phase_seconds(trace)[p] for p in ("trace", "watch"))
    if traced >= 0.005:
        out += (f" The run's time includes {traced:.2f} s of recording its trace and "
                "watching for forks.")
    return out


def sampling_text(spec) -> str:
    """A sampled run's settings in words: the target's, then the draft's own where it has any."""
    def words(t: float, k: int, p: float) -> str:
        return ", ".join([f"temperature {t:g}", *([f"top-k {k}"] if k else []),
                          *([f"top-p {p:g}"] if p < 1 else [])])

    if spec.rows:  # each request its own
        return "each request's own settings, cycled over the prompts: " + "; ".join(
            ("greedy" if r.greedy
             else words(*r.target()) + (" (temperature unset)" if r.temperature is None else ""))
            + ("" if r.seed is None else f", seed {r.seed}") for r in spec.rows)
    out = words(spec.temperature, spec.top_k, spec.top_p)
    own = (spec.draft_temperature, spec.draft_top_k, spec.draft_top_p)
    if any(x is not None for x in own):
        t, k, p = (mine if o is None else o
                   for mine, o in zip((spec.temperature, spec.top_k, spec.top_p), own))
        out += "; the draft at " + words(t, k, p)
    return out


def p_value(p: float | None) -> str:
    return "—" if p is None else f"{p:.3g}"


def _places(first: list[list[int]]) -> str:
    return ", ".join(f"[{', '.join(map(str, x))}]" for x in first)


def distribution_row(trace: Trace) -> str:
    """A sampled run's summary row (markdown): in place of the exact and prefix match
    of a greedy run."""
    d = metrics.distribution_summary(trace)
    head = ("| sampled run | verdict | p | failing split | tokens tested | impossible tokens | "
            "decision mismatches |\n"
            "|---|---|---:|---|---:|---:|---:|\n")
    if d is None:
        return (head + "| distribution | not judged (no distribution in this trace) "
                       "| — | — | — | — | — |")
    mismatches = "—" if d["checked"] is None else f"{d['mismatches']} of {d['checked']}"
    if d["mismatches"]:
        mismatches = f"**{mismatches}**"
    return head + (f"| distribution | **{md(d['verdict'])}** | {p_value(d['p'])} | "
                   f"{md(d['failing'] or '—')} | {d['tokens']} | {d['impossible']} | "
                   f"{mismatches} |")


def distribution_md(trace: Trace | None) -> str:
    """The PIT panel's verdict: the test, its p, the failing split, and the decision audit,
    in a few lines."""
    if trace is None:
        return ("A sampled run (temperature above 0) is judged here: each token's randomized PIT "
                "under the target, recomputed at batch size 1, must be uniform in every split; "
                "every accept/reject decision is re-derived from its recorded p, q and draw.")
    if not metrics.sampled(trace):
        return ("**Greedy run** (temperature 0): checked token by token against the batch-size-1 "
                "reference (the sequence table and the forensic panel). The distribution test is "
                "for sampled runs.")
    d = metrics.distribution_summary(trace)
    if d is None:
        return ("**Not judged:** this sampled run's trace holds no distribution test (it was run "
                "without one).")
    ok = d["verdict"] == "consistent"
    splits = f"{d['splits']} split" + ("s" if d["splits"] != 1 else "")
    if d["impossible"]:
        test = (f"p = {p_value(d['p'])}: an impossible token rejects alone" + (
            "" if d["splits_p"] is None else
            f" (the PIT splits alone: p = {p_value(d['splits_p'])}, the smallest split's p × "
            f"{splits} tested)"))
    elif d["p"] is None:
        test = "too few tokens to test (a split needs 50)"
    else:
        test = (f"p = {p_value(d['p'])} (the smallest split's p × {splits} tested, Bonferroni) "
                + ("≥" if ok else "<") + f" α = {d['alpha']:g}")
    kind = metrics.sampled_verdict(trace)
    lines = [f"**{md(kind[0])}** — {md(kind[1])}"] if kind else []
    lines.append(f"**Distribution: {md(d['verdict'])}** — {test}"
                 + ("" if ok or d["failing"] is None else f"; failing: **{md(d['failing'])}**")
                 + ".")
    lines.append(f"{d['tokens']} tokens tested; **{d['impossible']} impossible** (probability 0 "
                 "under the target: no correct sampler emits one)" if d["impossible"] else
                 f"{d['tokens']} tokens tested; no impossible token")
    if d["skipped"]:
        lines[-1] += f"; {d['skipped']} splits too small to test"
    lines[-1] += "."
    if d["checked"] is not None:
        audit = (f"Decision audit: {d['checked']} accept/reject decisions re-derived from their "
                 "recorded p, q and draw u (accepted iff u < p/q): ")
        if d["mismatches"]:
            shown = d["first"][:5]
            audit += (f"**{d['mismatches']} do not follow their draw**; the first at "
                      f"(round, row, slot) {md(_places(shown))}"
                      + (", …" if d["mismatches"] > len(shown) else "") + ". "
                      + ("The engine does not sample as it records, whatever the PIT test can see "
                         "yet." if ok else ""))
        else:
            audit += "all follow their draw."
        lines.append(audit)
    if (drafts := trace.proposals) is not None:
        if drafts.q_off or drafts.draw_off:
            found = f"**{drafts.q_off} carry another q, {drafts.draw_off} are not their own draw**"
            if drafts.drawn_with:
                found += f" (every one is {md(drafts.drawn_with)} draw)"
        else:
            found = "each is its own draw from the q its decision read"
        lines.append(f"Proposal audit: {drafts.checked} decided drafts against the draft model's "
                     f"own q, fresh at batch size 1: {found}.")
    if (a := trace.distribution.attribution) is not None:
        lines.append(f"**Which rule wrote these tokens?** {md(a.explanation)}")
        lines.append("| acceptance rule | log-likelihood ratio over the correct rule | named |\n"
                     "|---|---:|---|\n"
                     + "".join(f"| {md(h.fault)} | {metrics.ratio_text(h)} | "
                               f"{'✓' if h.named else ''} |\n" for h in a.hypotheses))
    return "\n\n".join(lines)


def engine_headline(trace: Trace, note: str = "") -> str:
    """An engine check: the engine as it described itself (a stranger's words), and a Table-1 row
    per run."""
    m, s = trace.manifest, trace.manifest.spec
    e = m.engine
    against = (f"**sampled** at {md(sampling_text(s))} (seed {s.seed}), judged by its "
               "tokens' distribution under "
               if metrics.sampled(trace) else "against the batch-size-1 reference of ")
    head = (f"**engine check** of {md(' '.join(x for x in (e.name, e.version) if x))} "
            f"({md(e.source)}) {against}{md(s.target)} in {md(s.dtype)}, {len(trace.sequences)} "
            f"prompts, up to {s.max_new_tokens} new tokens. Fingerprint `{m.fingerprint}`.{note}")
    rows = ["| run | answered | no answer | exact % | prefix % | tok/s | verdicts |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for r in metrics.engine_summary(trace):
        tps = "-" if r["tokens_per_second"] is None else f"{r['tokens_per_second']:.1f}"
        verdicts = ", ".join(f"{md(v)} × {c}" for v, c in r["verdicts"].items()) or "-"
        rows.append(f"| {md(r['engine'])} | {r['n']} | {r['errors']} | "
                    f"{metrics.percent(r['exact_pct'])} | {metrics.percent(r['prefix_pct'])} | "
                    f"{tps} | {verdicts} |")
    return head + "\n\n" + "\n".join(rows) + "".join(
        f"\n\n{line}" for line in [*lossless_md(trace), *engine_facts(trace)])


def engine_facts(trace: Trace) -> list[str]:
    """What an engine check learnt besides the outputs (Markdown): the drafts the engine counted,
    how the references were obtained, the fields of its file that were ignored, whether it answered
    alike when asked again."""
    m, lines = trace.manifest, []
    accepted, offered = metrics.engine_drafts(trace)
    if offered:
        lines.append(f"**Engine drafts** (its own count, per request): {accepted} of {offered} "
                     f"draft tokens accepted ({accepted / offered:.0%}).")
    proofs = metrics.reference_proofs(trace)
    if proofs:
        lines.append(f"**Reference:** {proofs}.")
    if m.engine.ignored:
        lines.append("**Ignored fields** of the outputs file: "
                     + ", ".join(md(f) for f in m.engine.ignored) + ".")
    if m.determinism:
        lines.append("**Asked again:** "
                     f"{md(m.determinism.describe().removeprefix('determinism: '))}.")
    return lines


def summary_frame(trace: Trace) -> pd.DataFrame:
    """One line per sequence. A sampled run has no reference to diverge from: its lines say how its
    tokens score under the target instead (mean PIT, impossible tokens) and whether its decisions
    follow their draws."""
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
                "decision mismatches": str(sum(len(metrics.mismatched(r)) for r in rows)) if rows
                else "—",
            })
        else:
            record.update({
                "equal": {True: "yes", False: "NO", None: "-"}[s.equivalent],
                "diverges at": "" if s.first_divergence is None else str(s.first_divergence),
                "verdict": s.forensics.verdict if s.forensics else "",
            })
        record.update({
            "acceptance": f"{sum(r.accepted for r in rows) / proposed:.2f}" if proposed else "",
            "tokens a round": f"{sum(len(r.emitted) for r in rows) / len(rows):.2f}" if rows
            else "",
        })
        records.append(record)
    return pd.DataFrame.from_records(records)


# the prompt wraps (the table's cells do): the other columns fit beside it at 1280 px
PROMPT_COLUMN_PX = 200


def column_widths(frame: pd.DataFrame) -> list[str]:
    """The sequence table's column widths: none so narrow that a header breaks inside a word (Gradio
    sizes columns from their cells alone, and wrapped "equivalent" letter by letter), and no wider
    than its longest word or cell. About 8 px a header character and 8 a cell's (monospace), plus
    the cell's padding."""
    def width(column: str) -> int:
        longest_cell = max((len(str(v)) for v in frame[column]), default=0)
        return max(max(len(w) for w in column.split()) * 8 + 28, longest_cell * 8 + 24)
    return [f"{PROMPT_COLUMN_PX}px" if c == "prompt" else f"{width(c)}px" for c in frame.columns]

