"""The tokens of the focused sequence, as HTML: the timeline (chips grouped by round, coloured by
origin), the acceptance grid (sequences by rounds), and the reference and speculative texts side
by side."""
from __future__ import annotations

import html

from specviz.app import engineviews
from specviz.app.summary import sampling_text
from specviz.app.treeview import tree_words
from specviz.app.views import (PICK_TEXT, SOURCE_TEXT, Focus, chip_text, fork_round, no_drafts,
                               no_rounds, reads, round_widths, rows_by_seq, says, token_text)
from specviz.trace import metrics, text
from specviz.trace.records import THINKING, RowRecord, SequenceRecord
from specviz.trace.schema import Trace


def timeline_html(trace: Trace, focus: Focus) -> str:
    """The focused sequence's tokens as chips, grouped by round, coloured by origin."""
    seq = trace.sequences[focus.seq]
    rows = rows_by_seq(trace).get(focus.seq, [])
    out = [f'<div class="sv-timeline" data-seq="{focus.seq}">']
    # an engine check: each token against the target's own choice, in its rounds where reported
    if not rows and seq.gaps is not None:
        seen = engineviews.seen_rounds(trace, focus.seq) or [None]
        for x in seen:
            start, end = (x.start, x.end) if x else (0, len(seq.output_ids))
            tip = (f' title="round {x.n} · {html.escape(engineviews.describe(trace, x))}"'
                   if x else "")
            out.append(f'<div class="sv-round" data-seq="{focus.seq}"{tip}>')
            out += [_engine_chip(trace, seq, i, seq.output_ids[i]) for i in range(start, end)]
            out.append("</div>")
    elif not rows:  # a non-speculative method: tokens only
        out.append('<div class="sv-round">')
        drawn = " · sampled from the target's p" if metrics.sampled(trace) else " · from the target"
        for i, tok in enumerate(seq.output_ids):
            out.append(_chip(seq, i, "sv-target",
                             f"#{i} · id {tok} · {reads(seq.output_pieces, i)}{drawn}"))
        out.append("</div>")
    i = 0
    widths = round_widths(trace)
    for r in rows:
        out.append(_round_html(trace, seq, r, i, widths[r.round], r.round == focus.round))
        i += len(r.emitted)
    if seq.grammar_allowed is not None and seq.output_ids:
        out.append(grammar_legend(seq))
    out.append("</div>")
    return "".join(out)


def _round_html(trace: Trace, seq: SequenceRecord, r: RowRecord, i: int, widest: int,
                selected: bool) -> str:
    """One round of the timeline: the row's emitted tokens (the first is output token i), then its
    rejected drafts."""
    k = len(r.draft_tokens)
    wrong = metrics.mismatched(r)
    if k:
        offered = f"accepted {r.accepted} of its {k} drafts" + (
            f" (others in this round were offered up to {widest})" if k < widest else "")
    else:
        offered = no_drafts(trace, i)
    out = [f'<div class="sv-round{" sv-sel" if selected else ""}{"" if k else " sv-nodrafts"}" '
           f'data-seq="{seq.seq}" data-round="{r.round}" '
           f'title="round {r.round} · batch row {r.row} · {html.escape(offered)}'
           + (f" · {len(wrong)} decision(s) do not follow their draw" if wrong else "")
           + f'"><span class="sv-rn">{r.round}</span>']
    if not k:
        out.append(f'<span class="sv-nodraft" title="{html.escape(offered)}">no drafts</span>')
    for j, (tok, src) in enumerate(zip(r.emitted, r.sources)):
        tip = [f"#{i + j} · id {tok} · {reads(seq.output_pieces, i + j)}",
               SOURCE_TEXT[src] if k
               else "the target's own token (no drafts were offered this round)",
               *_emitted_tip(trace, r, j, src), *_branch_tip(r, j),
               *([f"log-probability {seq.logprobs[i + j]:.4g}"] if seq.logprobs else []),
               f"round {r.round} · target KV {r.target_kv_before + 1 + j}"]
        off = r.tree is not None and j < r.accepted and r.tree.candidate(r.tree.path[j])[0] > 1
        out.append(_chip(seq, i + j,
                         f"sv-{src}" + (" sv-mismatch" if src == "draft" and j in wrong else "")
                         + (" sv-branch" if off else ""), " · ".join(tip)))
    for j in range(r.accepted, k):  # the first rejected draft, then those that came after it
        out.append(_rejected_chip(trace, r, j, j in wrong))
    out.append("</div>")
    return "".join(out)


def _branch_tip(r: RowRecord, j: int) -> list[str]:
    """Which branch of the row's token tree an accepted draft came from (nothing
    for a chain's round)."""
    if r.tree is None or j >= r.accepted:
        return []
    node = r.tree.path[j]
    rank, of = r.tree.candidate(node)
    return [f"tree node {node}: candidate {rank} of {of} at depth {j + 1}"
            + ("" if rank == 1 else ", off the first branch")]


def _emitted_tip(trace: Trace, r: RowRecord, j: int, src: str) -> list[str]:
    """What an emitted token's tooltip says of how it was chosen: its decision and draws when
    sampled, the draft's and the target's probabilities when greedy."""
    k = len(r.draft_tokens)
    proposed = f"the draft proposed {says(token_text(trace, r.draft_tokens[j]))}" if j < k else ""
    if r.accept_draws is None:  # greedy
        if src == "draft":
            first = [f"draft p {r.draft_probs[j]:.3f}"]
        else:
            first = [f"{proposed} (p {r.draft_probs[j]:.3f})"] if j < k else []
        return [*first,
                f"target p {r.target_probs[j]:.3f} · top-2 margin {r.target_margins[j]:.2f}"]
    draw = "" if r.pick_draw is None else f", with draw v {r.pick_draw:.4g}"
    if src == "draft":
        first = [decision_text(r, j)]
    elif not k and r.pick_from == "target":
        first = ["drawn from the target's p" + draw]
    else:
        first = [PICK_TEXT.get(r.pick_from, "drawn from an unknown distribution") + draw]
        first += [f"{proposed}: {decision_text(r, j)}"] if j < k else []
    return [*first, f"target top-2 margin {r.target_margins[j]:.2f} (logits)"]


def _rejected_chip(trace: Trace, r: RowRecord, j: int, mismatched: bool) -> str:
    tok = r.draft_tokens[j]
    piece = token_text(trace, tok)
    if r.accept_draws is not None:
        tip = f"rejected draft: id {tok} · {says(piece)} · {decision_text(r, j)}"
    else:
        why = (f"the target chose {says(token_text(trace, r.target_tokens[j]))}" if j == r.accepted
               else "it followed a rejected draft")
        tip = f"rejected draft: id {tok} · {says(piece)} · draft p {r.draft_probs[j]:.3f} · {why}"
    cls = (" sv-part" if piece is None else "") + (" sv-mismatch" if mismatched else "")
    return ('<span class="sv-tok '
            f'sv-rejected{cls}" title="{html.escape(tip)}">{chip_text(piece)}</span>')


def decision_text(r: RowRecord, j: int) -> str:
    """Draft j of a sampled row, for a tooltip: q, p, the accept probability min(1, p/q), the draw u
    and the decision, and whether the decision follows the draw (u · q < p, as
    distribution.decisions re-derives it)."""
    q, p, u = r.draft_probs[j], r.target_draft_probs[j], r.accept_draws[j]
    ratio = min(1.0, p / q) if q > 0 else 1.0
    text_ = (f"draft q {q:.4g} · target p {p:.4g} · accept probability min(1, p/q) {ratio:.4g} · "
             f"draw u {u:.4g}")
    if j > r.accepted:
        return text_ + " · not decided: it followed a rejected draft"
    accepted, rule = j < r.accepted, u * q < p
    text_ += " · " + ("ACCEPTED" if accepted else "REJECTED")
    if accepted == rule:
        return text_ + (" (u < p/q)" if rule else " (u ≥ p/q)")
    return text_ + f", yet u {'<' if rule else '≥'} p/q: this decision does not follow its draw"


def _engine_chip(trace: Trace, s: SequenceRecord, i: int, tok: int) -> str:
    """An engine's output token, coloured by the reference's surprise at it: the target's own choice
    (up to numerics), or how far below the target's choice it sits on the engine's own prefix."""
    tolerance = engine_tolerance(trace)
    gap = s.gaps[i]
    tip = [f"#{i} · id {tok} · {reads(s.output_pieces, i)}"]
    if gap <= tolerance:
        cls = "sv-own"
        tip.append("the target's own choice here"
                   + (f" (up to numerics: {gap:.3g} logits below)" if gap else ""))
    else:
        cls = "sv-surprise"
        tip.append(f"{gap:.3g} logits below the target's choice on this prefix: the target would "
                   "not write it")
    if s.engine and s.engine.logprobs and i < len(s.engine.logprobs):
        tip.append(f"the engine's log-probability {s.engine.logprobs[i]:.3f}")
    return _chip(s, i, cls, " · ".join(tip))


def engine_tolerance(trace: Trace) -> float:
    """The largest gap an engine check puts down to the engine's rounding (its yardstick's; as its
    forensics did)."""
    f = next((s.forensics for s in trace.sequences if s.forensics
              and s.forensics.tolerance is not None), None)
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
        tip += (f" · FIRST DIVERGENCE: the reference has {reads(s.reference_pieces, i)}"
                if i < len(s.reference_ids)
                else " · FIRST DIVERGENCE: the reference had ended")
    elif fork is not None and i > fork:
        cls += " sv-after"
    # a sampled run's corrupt state; an engine's right tokens with a wrong report (its score)
    elif fork is None and s.forensics is not None and i == s.forensics.fork:
        cls += " sv-fork"
        tip += (f" · FIRST TOKEN DRAWN FROM A CORRUPT STATE (round {s.forensics.round}): "
                if s.forensics.judge == "run" else " · WHERE ITS VERDICT POINTS: "
                ) + s.forensics.verdict
    if s.pit is not None and i < len(s.pit):
        if s.pit[i] is None:
            cls += " sv-impossible"
            tip += (" · IMPOSSIBLE under the target: probability 0 at batch size 1 (no correct "
                    "sampler emits it)")
        else:
            tip += f" · PIT {s.pit[i]:.3f} under the target"
    if s.grammar_allowed is not None:
        state, said = grammar_state(s, i)
        cls, tip = cls + f" sv-g-{state}", tip + f" · grammar: {said}"
    piece = s.output_pieces[i]
    cls += " sv-part" if piece is None else ""
    return ('<span class="sv-tok '
            f'{cls}" data-index="{i}" title="{html.escape(tip)}">{chip_text(piece)}</span>')


def grammar_state(s: SequenceRecord, i: int) -> tuple[str, str]:
    """Output token i's place in its run's grammar (forensics/grammar.py), as a class and in
    words."""
    n = s.grammar_allowed[i]
    if n == THINKING:
        return "free", "free (the request is thinking)"
    if n == 0:
        first = i == 0 or s.grammar_allowed[i - 1] != 0
        return "broken", ("FORBIDDEN here: the grammar refuses this token" if first
                          else "broken earlier in the output")
    return ("forced", "forced (the only token it allowed)") if n == 1 else (
        "open", f"{n} tokens allowed")


def grammar_legend(s: SequenceRecord) -> str:
    """The key to the grammar's marks, under a timeline whose run has a grammar."""
    marks = [("free", "free: thinking"), ("forced", "forced by the grammar"),
             ("open", "allowed among others"), ("broken", "forbidden by the grammar")]
    shown = {grammar_state(s, i)[0] for i in range(len(s.output_ids))}
    return ('<div class="sv-glegend">structured output: ' + " ".join(
        f'<span class="sv-tok sv-g-{m}">{text}</span>' for m, text in marks if m in shown)
        + "</div>")


def grid_html(trace: Trace, focus: Focus) -> str:
    """Sequences × their rounds; each cell the accepted count out of the drafts that row was offered
    (its own k, which prompt lookup and the token budget make differ between rows), or
    a "no drafts" cell."""
    by_seq = rows_by_seq(trace)
    if not by_seq and engineviews.reports_rounds(trace):
        return engineviews.grid_html(trace, focus.seq)
    if not by_seq:
        return f'<p class="sv-empty">{no_rounds(trace)}</p>'
    width = max(len(v) for v in by_seq.values())
    widths = round_widths(trace)
    out = ['<div class="sv-grid-wrap"><table class="sv-grid"><thead><tr><th>seq</th>']
    out += [f"<th>{n + 1}</th>" for n in range(width)]
    out.append("</tr></thead><tbody>")
    for s in trace.sequences:
        rows = by_seq.get(s.seq, [])
        fr = fork_round(trace, s.seq, rows)
        mark = {True: "✓", False: "✗",
                None: "⚠" if metrics.impossible(s) or s.forensics else ""}[s.equivalent]
        out.append(f'<tr><th class="sv-seq" data-seq="{s.seq}" '
                   f'data-round="{rows[0].round if rows else ""}">{s.seq} {mark}</th>')
        start = 0
        for n, r in enumerate(rows):
            k = len(r.draft_tokens)
            hue = 120 * r.accepted / k if k else 0
            bad = sum(u is None for u in (s.pit or [])[start:start + len(r.emitted)])
            start += len(r.emitted)
            wrong = metrics.mismatched(r)
            cls = ("sv-cell" + (" sv-fork" if r.round == fr else "")
                   + (" sv-sel" if (s.seq, r.round) == (focus.seq, focus.round) else "")
                   + (" sv-audit" if r.round in (s.audit_round, s.audit_draft_round) else "")
                   + (" sv-impossible" if bad else "") + (" sv-mismatch" if wrong else "")
                   + ("" if k else " sv-nodraft"))
            if k:
                offered = f"accepted {r.accepted} of its {k} drafts" + (
                    f" (the round's widest row was offered {widths[r.round]})"
                    if k < widths[r.round] else "")
            else:
                offered = no_drafts(trace, start - len(r.emitted))
            fork = "first divergence" if s.equivalent is False else "its state found corrupt"
            if r.tree is not None:
                offered += f" along {tree_words(r)}"
                cls += " sv-tree-cell"
            tip = (f"seq {s.seq} · round {r.round} (its {n + 1}.) · {offered} · "
                   f"emitted {len(r.emitted)}" + (f" · {fork}" if r.round == fr else "")
                   + (" · audit: the target's state left rounding here"
                      if r.round == s.audit_round else "")
                   + (" · audit: the draft's state left rounding here"
                      if r.round == s.audit_draft_round else "")
                   + (f" · {bad} token(s) impossible under the target" if bad else "")
                   + (f" · {len(wrong)} decision(s) do not follow their draw" if wrong else ""))
            # background-color alone: the corners (audit, impossible) and the no-drafts stripes are
            # background images
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
            body = (html.escape(text.joined(pieces[:a])) + '<mark class="sv-fork">'
                    + html.escape(text.joined(pieces[a:b]))
                    + "</mark>" + '<span class="sv-after">' + html.escape(text.joined(pieces[b:]))
                    + "</span>")
        return (f'<div class="sv-col"><h4>{html.escape(title)}</h4>'
                f'<div class="sv-text">{body}</div></div>')

    if s.reference_ids is None and metrics.sampled(trace):
        note = ("a sampled run has no token-by-token reference: this text is one draw, and the "
                "distribution panel judges whether the run's draws come from the target's "
                "distribution")
        return (f'<div class="sv-compare" data-seq="{focus.seq}"><p class="sv-note">sequence '
                f'{focus.seq}: {note}</p>'
                + column(f"{trace.manifest.spec.method}, sampled at "
                         f"{sampling_text(trace.manifest.spec)}", s.output_pieces)
                + "</div>")
    if s.reference_ids is None:
        return '<p class="sv-empty">No reference was decoded for this trace.</p>'
    note = ("identical token ids" if fork is None else f"first divergence at token {fork}")
    return (f'<div class="sv-compare" data-seq="{focus.seq}"><p class="sv-note">sequence '
            f'{focus.seq}: {note}</p>'
            + column("reference (target alone, batch size 1)", s.reference_pieces)
            + column(f"{trace.manifest.spec.method}", s.output_pieces) + "</div>")
