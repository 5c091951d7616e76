"""An engine's rounds as it reports them per request (trace.records.EngineRound), drawn as a run of
specviz's own engine is: the acceptance grid, the timeline's rounds, acceptance per draft slot.
Seen from outside (OpenVINO GenAI's steps) a round shows how many drafts it kept, not which it was
offered: the views say so, and draw only what was seen."""
from __future__ import annotations

import html
from dataclasses import dataclass

from specviz.trace.records import EngineRound
from specviz.trace.schema import Trace

OUTSIDE = "seen from outside: the drafts it was offered are not shown"


@dataclass(frozen=True)
class Seen:
    """One reported round of a request: its output tokens [start, end)."""

    n: int  # its place among the request's rounds (0: the prefill's token)
    round: EngineRound
    start: int
    end: int


def seen_rounds(trace: Trace, seq: int) -> list[Seen]:
    """The sequence's rounds as its engine reported them (empty where it reported none)."""
    out = trace.sequences[seq].engine
    if out is None:
        return []
    return [Seen(n, r, *span) for n, (r, span) in enumerate(zip(out.rounds or [], out.spans()))]


def reports_rounds(trace: Trace) -> bool:
    return any(seen_rounds(trace, s.seq) for s in trace.sequences)


def offered(trace: Trace, r: EngineRound) -> int | None:
    """The drafts a round was offered: shown, or the engine's k where they are not (as it says,
    else as the check declared it)."""
    return (len(r.drafts) if r.shown
            else trace.manifest.engine.settings.get("k", trace.manifest.spec.k))


def describe(trace: Trace, seen: Seen) -> str:
    r = seen.round
    if seen.n == 0:
        return "the prefill's token (no drafts)"
    k = offered(trace, r)
    kept = f"accepted {r.accepted}" + (f" of {k} drafts" if k else " drafts")
    return (f"{kept} · emitted tokens {seen.start}–{seen.end - 1}"
            + ("" if r.shown else f" · {OUTSIDE}")
            + ("" if r.score is None else f" · score after it {r.score:.4g}"))


def marked(trace: Trace, seq: int) -> int | None:
    """The token the sequence's verdict points at: its first divergence, else its finding's."""
    s = trace.sequences[seq]
    if s.first_divergence is not None:
        return s.first_divergence
    return s.forensics.fork if s.forensics else None


def grid_html(trace: Trace, focus_seq: int) -> str:
    """Requests × their reported rounds after the first token; each cell the drafts accepted (of
    the engine's k, where the drafts are not shown), the round holding the marked token ringed."""
    rounds = {s.seq: seen_rounds(trace, s.seq)[1:] for s in trace.sequences}
    width = max(map(len, rounds.values()), default=0)
    out = [f'<p class="sv-empty">The engine\'s rounds as it reported them, request by request; '
           f"{OUTSIDE} where a cell says so.</p>",
           '<div class="sv-grid-wrap"><table class="sv-grid sv-engine-grid"><thead><tr>'
           "<th>seq</th>", *(f"<th>{n + 1}</th>" for n in range(width)), "</tr></thead><tbody>"]
    for s in trace.sequences:
        mark = {True: "✓", False: "✗", None: "⚠" if s.forensics else ""}[s.equivalent]
        at = marked(trace, s.seq)
        # (data-round: the round's place in its request, which a click focuses on)
        out.append(f'<tr><th class="sv-seq" data-seq="{s.seq}" data-round="0">{s.seq} {mark}</th>')
        for seen in rounds[s.seq]:
            r, k = seen.round, offered(trace, seen.round)
            hue = 120 * min(r.accepted / k, 1) if k else 0
            here = at is not None and seen.start <= at < seen.end
            cls = ("sv-cell" + (" sv-fork" if here else "")
                   + (" sv-sel" if here and s.seq == focus_seq else ""))
            tip = (f"seq {s.seq} · round {seen.n} · {describe(trace, seen)}"
                   + (f" · holds token {at}, where its verdict points" if here else ""))
            out.append(f'<td class="{cls}" data-seq="{s.seq}" data-round="{seen.n}" '
                       f'style="background-color:hsl({hue:.0f},65%,72%)" '
                       f'title="{html.escape(tip)}">{r.accepted}{f"/{k}" if k else ""}</td>')
        out.append("<td></td>" * (width - len(rounds[s.seq])) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def per_slot(trace: Trace) -> tuple[list[float], int]:
    """Per draft slot j, the share of the rounds after the first token that accepted a j-th
    draft; and how many rounds that is."""
    rounds = [x.round for s in trace.sequences for x in seen_rounds(trace, s.seq)[1:]]
    k = max([offered(trace, r) or 0 for r in rounds] + [r.accepted for r in rounds], default=0)
    shares = [sum(r.accepted > j for r in rounds) / max(len(rounds), 1) for j in range(k)]
    return shares, len(rounds)
