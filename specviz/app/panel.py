"""The forensic panel: the focused sequence's verdict with its evidence, in the order its judge
weighed it (forensics/whitebox.py, forensics/blackbox.py), and the focused round's state
and checks."""
from __future__ import annotations

import html

from specviz.app.attributionview import attribution_html
from specviz.app.summary import sampling_text
from specviz.app.treeview import tree_svg, tree_words
from specviz.app.views import (CHECK_TEXT, PICK_TEXT, Focus, no_drafts, round_widths, rows_by_seq,
                               token_text, visible_text)
from specviz.spec.drafters import DRAFTERS
from specviz.spec.verdicts import verdict
from specviz.trace import metrics
from specviz.trace.evidence import EngineForensics, RunForensics
from specviz.trace.records import RowRecord, SequenceRecord
from specviz.trace.schema import Trace
from specviz.trace.text import span


def forensics_html(trace: Trace, focus: Focus) -> str:
    """The focused sequence's verdict with its evidence, and the focused round's state
    and checks."""
    s = trace.sequences[focus.seq]
    out = [f'<div class="sv-forensics" data-seq="{focus.seq}" '
           f'data-round="{"" if focus.round is None else focus.round}">']
    f = s.forensics
    # (an equivalent sequence's log-probabilities may still be named)
    if s.equivalent and f is None:
        out.append(f'<p class="sv-verdict sv-ok">Sequence {s.seq} equals the reference, '
                   'token for token.</p>')
    elif f is None and metrics.sampled(trace):
        out.append(_sampled_verdict(trace, s))
    elif f is None:
        out.append(f'<p class="sv-verdict">Sequence {s.seq}: no reference to compare with.</p>')
    else:
        kind = html.escape(verdict(f.verdict).family)
        out.append(f'<p class="sv-verdict sv-{kind}">Sequence {s.seq}: '
                   f'<b>{html.escape(f.verdict)}</b> — {html.escape(f.explanation)}</p>')
        out.append(_table(_evidence_rows(trace, f)))
        out.append(attribution_html(trace, s))
        if metrics.sampled(trace):  # its state named; its tokens still judged by their distribution
            out.append(_sampled_verdict(trace, s))
    if s.audit_round is not None or s.audit_draft_round is not None:
        out.append(_table([("audit: first round the target's state left rounding", s.audit_round),
                           ("audit: the same for the draft", s.audit_draft_round)]))
    row = next((r for r in rows_by_seq(trace).get(focus.seq, []) if r.round == focus.round), None)
    if row is not None:
        k = len(row.draft_tokens)
        widest = round_widths(trace)[row.round]
        have = sum(len(r.emitted) for r in rows_by_seq(trace)[focus.seq] if r.round < row.round)
        kind = DRAFTERS[trace.manifest.spec.drafter]
        out.append(f"<h4>Round {row.round}, batch row {row.row}</h4>")
        if row.tree is not None:
            out.append(f'<p class="sv-tree-words">{html.escape(tree_words(row))}:</p>'
                       f'{tree_svg(trace, row)}')
        out.append(_table([
            ("drafts offered to this row",
             f"{k}" + (f" (the round's widest row: {widest})" if k < widest else "")
             + (f" — {no_drafts(trace, have)}" if not k else "")),
            ("accepted", f"{row.accepted} of {k}" if k else "—"),
            ("emitted", " ".join(f"{visible_text(token_text(trace, t))} ({src})"
                                 for t, src in zip(row.emitted, row.sources))),
            ("padding before → after", f"{row.pad_before} → {_opt(row.pad_after)}"),
            ("content before → after", f"{row.content_before} → {_opt(row.content_after)}"),
            ("positions fed to verify", f"{row.pos_first} … {row.pos_last}"),
            ("mask sum (slots visible to the first verified token)", row.mask_sum),
            ("target KV before → after", f"{row.target_kv_before} → {_opt(row.target_kv_after)}"),
            ("draft KV before → after",
             f"— ({kind.noun} keeps no draft cache)" if not kind.cache else
             f"{row.draft_kv_before} → {_opt(row.draft_kv_after)}"),
            *[(f"{who} recurrent state before → after (its tokens; -1: not the row's)",
               f"{getattr(row, f'{who}_state_before')} → "
               f"{_opt(getattr(row, f'{who}_state_after'))}")
              for who in ("target", "draft") if getattr(row, f"{who}_state_before") is not None],
            ("realignment shift (delta)", row.delta),
        ]))
        if row.accept_draws is not None:
            out.append(_draws_table(trace, row))
        out.append('<table class="sv-checks"><tr><th>invariant</th><th>held</th></tr>')
        for name, held in row.checks.items():
            says = CHECK_TEXT.get(name, name) if kind.cache or name != "draft_kv" else \
                f"I3 draft KV: nothing to check ({kind.noun} keeps no draft cache)"
            out.append(f'<tr class="{"sv-held" if held else "sv-broken"}"><td>{html.escape(says)}'
                       f"</td><td>{'✓' if held else '✗'}</td></tr>")
        out.append("</table>")
    out.append("</div>")
    return "".join(out)


def _sampled_verdict(trace: Trace, s: SequenceRecord) -> str:
    """A sampled sequence has no reference to diverge from: how its tokens score under
    the target instead."""
    spec = trace.manifest.spec
    head = (f"Sequence {s.seq} was sampled at {html.escape(sampling_text(spec))}: "
            "no token-by-token reference")
    if s.pit is None:
        return f'<p class="sv-verdict">{head}; its tokens were not scored under the target.</p>'
    bad = metrics.impossible(s)
    wrong = sum(len(metrics.mismatched(r)) for r in rows_by_seq(trace).get(s.seq, []))
    mean = metrics.mean_pit(s)
    facts = [f"{len(s.pit)} tokens",
             f"mean PIT {'—' if mean is None else f'{mean:.3f}'} (0.5 expected)"]
    if bad:
        first = next(i for i, u in enumerate(s.pit) if u is None)
        facts.append(f"<b>{bad} impossible under the target</b> "
                     f"(probability 0; the first is token #{first})")
    if wrong:
        facts.append(f"<b>{wrong} decision(s) that do not follow their draw</b>")
    cls = " sv-sync-bug" if bad or wrong else ""
    return (f'<p class="sv-verdict{cls}">{head}; its tokens are judged with the whole run\'s, by '
            "their randomized PIT under the target recomputed at batch size 1 (the distribution "
            f"panel): {'; '.join(facts)}.</p>")


def _draws_table(trace: Trace, row: RowRecord) -> str:
    """A sampled round's draws for one row: each draft's q, p, min(1, p/q), u and decision, then the
    non-draft token and where it was drawn from. A decision that does not follow its draw
    is marked."""
    wrong = metrics.mismatched(row)
    out = [('<table class="sv-checks"><tr><th>slot</th><th>draft token</th><th>q (draft)</th>'
            "<th>p (target)</th><th>min(1, p/q)</th><th>draw u</th><th>decision</th></tr>")]
    for j, tok in enumerate(row.draft_tokens):
        q, p, u = row.draft_probs[j], row.target_draft_probs[j], row.accept_draws[j]
        decision = ("accepted" if j < row.accepted else "rejected" if j == row.accepted
                    else "not decided")
        if j in wrong:
            decision += " — does not follow u < p/q"
        cells = (j, f"{visible_text(token_text(trace, tok))} (id {tok})", f"{q:.4g}", f"{p:.4g}",
                 f"{min(1.0, p / q) if q > 0 else 1.0:.4g}", f"{u:.4g}", decision)
        out.append(f'<tr class="{"sv-broken" if j in wrong else "sv-held"}">'
                   + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    a = row.accepted
    if a < len(row.emitted):
        tok = row.emitted[a]
        where = PICK_TEXT.get(row.pick_from, "drawn from an unknown distribution")
        draw = "" if row.pick_draw is None else f", with draw v {row.pick_draw:.4g}"
        out.append(_table([(f"slot {a}: {visible_text(token_text(trace, tok))} (id {tok})",
                            where + draw)]))
    return "".join(out)


def _evidence_rows(trace: Trace, f: RunForensics | EngineForensics) -> list[tuple[str, object]]:
    """The verdict's evidence, in the order its judge weighed it."""
    common = [
        ("first token drawn in the corrupt round" if metrics.sampled(trace)
         else "the first token of the round it points at" if getattr(f, "score", None) is not None
         else "first divergent token", f.fork),
        ("engine's token" if f.judge == "engine" else "speculative token",
         _tok(trace, f.output_token)),
        ("reference token", _tok(trace, f.reference_token)),
        ("judged against", f.yardstick),
    ]
    return common + (_engine_evidence(trace, f) if f.judge == "engine" else _run_evidence(trace, f))


def _run_evidence(trace: Trace, f: RunForensics) -> list[tuple[str, object]]:
    """The white-box judge's (forensics/whitebox.py)."""
    ys = trace.manifest.yardstick
    rounding = ys.target if ys else None

    def beyond(diff: float | None) -> str | None:
        # a stranger's tolerance may be 0
        if diff is None or rounding is None or not rounding.tolerance:
            return _num(diff)
        return (f"{diff:.3g} logits = {diff / rounding.tolerance:.3g} × the rounding tolerance, "
                f"beyond twice the rounding of {rounding.place(diff):.0%} of measured positions")

    return [
        ("emitted in round / batch row", f"{f.round} / {f.row}" if f.round is not None else None),
        ("rounding tolerance (two correct computations differ by more with probability α)",
         None if rounding is None
         else f"0 in batch-invariant {rounding.dtype} (rounding alone: {rounding.rounding:.3g})"
         if rounding.batch_invariant
         else f"{rounding.tolerance:.3g} logits in {rounding.dtype}, α = "
         + ("not stated" if rounding.alpha is None else f"{rounding.alpha:.2g}")),
        ("rounding yardstick suspect", rounding.anomaly if rounding else None),
        ("state check: emitting pass vs fresh batch-size-1 recomputation", beyond(f.state_diff)),
        ("first token fed is the sequence's own last token", None if f.tokens_fed_ok is None else
         ("yes" if f.tokens_fed_ok else "NO")),
        ("positions fed / where its tokens sit", None if f.positions_fed is None else
         f"{span(f.positions_fed)} / {span(f.positions_expected)}"),
        ("key slots visible / real tokens",
         None if f.visible is None else f"{span(f.visible)} / {span(f.visible_expected)}"),
        ("the same pass rebuilt from correct inputs, vs fresh", beyond(f.kernel_diff)),
        ("the same, rebuilt in float64, vs fresh float64",
         None if f.kernel_diff_float64 is None else
         f"{f.kernel_diff_float64:.3g} logits (float64's rounding tolerance: "
         + ("?" if rounding is None or rounding.float64_tolerance is None
            else f"{rounding.float64_tolerance:.2g}") + ")"),
        ("cache replayed alone with true positions, vs fresh", _num(f.kv_diff)),
        ("cache entries computed at another position", ", ".join(
            f"position {i} at {at}" if at >= 0 else f"position {i}: another token's"
            for i, at in f.written_at) or None),
        ("the emitting pass's own choice", _tok(trace, f.emitting_argmax)),
        ("top-1 − top-2 margin, batch size 1", _num(f.margin_reference)),
        ("the same in the emitting pass", _num(f.margin_batched)),
        ("float64: the reference token's logit − the divergent token's",
         None if f.margin_float64 is None else
         f"{f.margin_float64:.4g} (its size: {beyond(abs(f.margin_float64))})"),
        ("penalty lifted: the token the engine's choice needs it lifted for",
         _tok(trace, f.penalty_lifted)),
        ("log-probability recorded / float64 at batch size 1", None if f.logprob is None else
         f"{f.logprob:.6g} / {f.logprob_float64:.6g}"),
        ("plain batching (no speculation) forks here too", None if f.batching_noise is None else
         ("yes" if f.batching_noise else "no")),
        ("the engine's own checks failed (first round)", ", ".join(
            f"{c} (round {r})" for c, r in f.failed_checks.items()) or "none"),
    ]


def _engine_evidence(trace: Trace, f: EngineForensics) -> list[tuple[str, object]]:
    """The black-box judge's (forensics/blackbox.py), or the score judge's (forensics/scores.py)."""
    if f.score is not None:
        return [
            ("score reported after the round / its log-probabilities summed",
             f"{f.score:.6g} / {f.score_expected:.6g}"),
            ("adding them in float32 moves the sum by at most", _num(f.tolerance)),
        ]
    return [
        ("rank of the engine's token under the target", f.engine_rank),
        ("the engine's own log-probability of it", _num(f.engine_logprob)),
        ("top-1 − top-2 margin, batch size 1", _num(f.margin_reference)),
        ("float64: the reference token's logit − the engine's", _num(f.margin_float64)),
        ("largest gap the engine's rounding explains", None if f.tolerance is None else
         f"{_num(f.tolerance)} at false-alarm rate {_num(f.alpha)}"),
        ("first token beyond it, at or after the fork", f.first_bad),
        ("the engine's round that wrote it (as it reported them)", None
         if f.fork_round is None else f"{f.fork_round} ({f.fork_written_as})"),
        ("the same engine without speculation departs at",
         None if trace.manifest.control is None else
         "never" if f.control_fork is None else f.control_fork),
        ("repeated 4-grams after the fork", None if f.repeated is None else f"{f.repeated:.0%}"),
        ("nats a token after the fork, under the target: engine / reference",
         None if f.nll is None else
         f"{f.nll:.2f} / {_num(f.reference_nll)}"),
    ]


def _tok(trace: Trace, tok: int | None) -> str | None:
    return None if tok is None else f"{visible_text(token_text(trace, tok))} (id {tok})"


def _num(v: float | None) -> str | None:
    return None if v is None else f"{v:.4g}"


def _opt(v) -> str:
    return "left the batch" if v is None else str(v)


def _table(items: list[tuple[str, object]]) -> str:
    """Names and values as plain text (both escaped here)."""
    cells = "".join(f"<tr><td>{html.escape(name)}</td><td>{html.escape(str(value))}</td></tr>"
                    for name, value in items if value is not None)
    return f'<table class="sv-kv">{cells}</table>'
