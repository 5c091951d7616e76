"""The hypothesis view of an engine check's fork (run/attribution.py): which known mechanism,
replayed in specviz's engine, writes the engine's tokens; the engine's, the reference's and the best
hypothesis's tokens aligned from the fork; every hypothesis ranked, with its threads."""
from __future__ import annotations

import html

from specviz.app.views import token_text, visible_text
from specviz.spec.faults import mechanism, threads
from specviz.trace.evidence import Attribution, Hypothesis
from specviz.trace.records import SequenceRecord
from specviz.trace.schema import Trace

SHOWN = 24  # tokens from the fork on, per aligned line


def attribution_html(trace: Trace, s: SequenceRecord) -> str:
    """The attribution of sequence `s`'s fork, or nothing where it has none."""
    a = s.attribution
    if a is None:
        return ""
    named = any(h.named for h in a.hypotheses)
    best = a.hypotheses[0] if a.hypotheses else None
    out = [f'<div class="sv-attribution" data-named="{str(named).lower()}">',
           '<h4>Which bug is this?</h4>'
           f'<p class="sv-verdict sv-{_kind(named, a.rejected_draft_kept)}">'
           f"{html.escape(a.explanation)}</p>"]
    lines = [("engine", s.engine.ids), ("reference", s.reference_ids or [])]
    if best is not None:
        lines.append((f"best: {'+'.join(best.faults)}", best.replay_ids))
    out.append(_aligned(trace, a, lines, s.engine.ids))
    if best is not None and best.round is not None:
        out.append(f"<p>In its replay the fault wrote the fork token in round {best.round}, slot "
                   f"{best.slot}.</p>")
    if a.facts:
        out.append("<ul>" + "".join(f"<li>{html.escape(f)}</li>" for f in a.facts) + "</ul>")
    out.append(_ranked(a))
    if a.skipped:
        out.append(f"<details><summary>{len(a.skipped)} not tried: they do not fit the engine"
                   "</summary><ul>"
                   + "".join(f"<li><b>{html.escape(f)}</b>: {html.escape(why)}</li>"
                             for f, why in a.skipped.items())
                   + "</ul></details>")
    out.append("</div>")
    return "".join(out)


def _kind(named: bool, kept: bool) -> str:
    """The finding's class on the page: a decision bug (drafts kept that the target rejected), a
    mechanism named, or nothing decided."""
    return "decision-bug" if kept else "bug" if named else "unexplained"


def _aligned(trace: Trace, a: Attribution, lines: list[tuple[str, list[int]]],
             engine: list[int]) -> str:
    """Each line's tokens from the fork, a cell a token: green where it is the engine's, red where
    not; the engine's departing tokens underlined."""
    span = range(a.fork, min(a.fork + SHOWN, max(len(ids) for _, ids in lines)))
    departing = set(a.departing)
    head = "".join(f"<th>{i}</th>" for i in span)
    rows = []
    for name, ids in lines:
        cells = []
        for i in span:
            if i >= len(ids):
                cells.append("<td></td>")
                continue
            same = i < len(engine) and ids[i] == engine[i]
            text = html.escape(visible_text(token_text(trace, ids[i])))
            if same and i in departing:
                text = f"<u>{text}</u>"
            cells.append(f'<td class="{"sv-held" if same else "sv-broken"}">{text}</td>')
        rows.append(f"<tr><th>{html.escape(name)}</th>{''.join(cells)}</tr>")
    return (f'<div style="overflow-x:auto"><table class="sv-aligned"><tr><th>token</th>{head}</tr>'
            f'{"".join(rows)}</table></div>')


def _ranked(a: Attribution) -> str:
    """Every hypothesis tried, best first, the correct engine last: each named by its fault, its
    description on hover."""
    rows = [_row(h) for h in a.hypotheses] + [_row(a.correct)]
    return ('<div style="overflow-x:auto"><table class="sv-hypotheses">'
            "<tr><th>mechanism</th><th>threads</th><th>replayed</th>"
            f"<th>tokens written of {a.tokens}</th><th>departing written of {len(a.departing)}</th>"
            f'<th>first failed</th><th>named</th></tr>{"".join(rows)}</table></div>'
            f"<p>{a.replays} replays in {a.seconds:.1f} s. Departing: the engine's tokens the "
            "target itself would not write on the engine's prefix (underlined above); a mechanism "
            f"is named when it writes {a.threshold} of them more than the correct engine's replay "
            "does, and no other writes more.</p>")


def _row(h: Hypothesis) -> str:
    links = ", ".join(f'<a href="{html.escape(t.url)}" target="_blank">{html.escape(t.label)}</a>'
                      for t in threads(h.faults))
    where = "alone" if not h.companions else f"beside {', '.join(map(str, h.companions))}"
    failed = "—" if h.failed_at is None else str(h.failed_at)
    name = "+".join(h.faults) or "the correct engine"
    return (f'<tr class="{"sv-held" if h.named else ""}">'
            f'<td title="{html.escape(mechanism(h.faults))}">{html.escape(name)}</td>'
            f"<td>{links}</td><td>{where}</td><td>{h.explained}</td><td>{h.beyond}</td>"
            f"<td>{failed}</td><td>{'✓' if h.named else ''}</td></tr>")
