"""Two runs of the same prompts side by side: their tokens aligned by index under the reference's,
their rounds marked, and the first token where the two part.

A run is a `Side`, made from a trace (any run the page showed, an engine check included) or from one
run of a sweep report (sweep.py), so that eqspec and bsp-like, or two engines, compare the same way.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

from specviz.app import views
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import share
from specviz.trace.records import SequenceRecord, first_difference
from specviz.trace.schema import Trace
from specviz.trace.sweep import SweepReport, run_name

TOKENS_PER_LINE = 12  # aligned columns a line; lines wrap, so a phone shows them too


@dataclass(frozen=True)
class Side:
    label: str
    prompts: tuple[str, ...]
    ids: tuple[tuple[int, ...], ...]  # per sequence
    # per sequence, text.pieces: None where a token only starts a character
    pieces: tuple[tuple[str | None, ...], ...]
    # per sequence: the tokens each of its rounds gave it (empty: not recorded)
    rounds: tuple[tuple[int, ...], ...]
    # per sequence: the batch-size-1 reference's ids, where decoded
    reference: tuple[tuple[int, ...] | None, ...]
    reference_pieces: tuple[tuple[str | None, ...] | None, ...]
    # what a link replays it from; None for an engine check, which only its files make
    spec: RunSpec | None = None


def link(a: Side, b: Side, seq: int) -> str:
    """The query string that opens the Compare tab on `a` and `b` at `seq`; "" when either has no
    spec to replay."""
    if a.spec is None or b.spec is None:
        return ""
    try:
        return share.encode_compare(a.spec, b.spec, seq)
    except SpecError:  # too long a link: the runs' trace files are the way to share them
        return ""


def side_of_trace(trace: Trace) -> Side:
    m = trace.manifest
    name = f"engine {m.engine.name}" if m.engine is not None else run_name(m.spec)
    by_seq = views.rows_by_seq(trace)
    rounds = [[len(r.emitted) for r in by_seq.get(q.seq, [])] for q in trace.sequences]
    return _side_of(f"{name} · {m.fingerprint[:8]}", [p.text for p in trace.prompts],
                    trace.sequences, rounds, None if m.engine is not None else m.spec)


def side_of_report(report: SweepReport, run: int) -> Side:
    seqs = report.sequences_of(run)
    return _side_of(report.rows[run].name() + " · sweep", report.spec_of(run).prompts, seqs,
                    [q.rounds for q in seqs], report.sweep.specs()[run])


def _side_of(label: str, prompts, seqs: list[SequenceRecord], rounds: list[list[int]],
             spec: RunSpec | None) -> Side:
    def frozen(values):
        return None if values is None else tuple(values)

    return Side(label, tuple(prompts), tuple(tuple(q.output_ids) for q in seqs),
                tuple(tuple(q.output_pieces) for q in seqs),
                tuple(map(tuple, rounds)), tuple(frozen(q.reference_ids) for q in seqs),
                tuple(frozen(q.reference_pieces) for q in seqs), spec)


def problem(a: Side, b: Side, seq: int) -> str | None:
    """Why `a` and `b` cannot be compared at sequence `seq`, in words; None when they can."""
    if a.prompts != b.prompts:
        return (f"the two runs decode different prompts ({len(a.prompts)} and {len(b.prompts)}, "
                "not the same texts): compare runs of the same prompts")
    if not 0 <= seq < len(a.ids):
        return f"there is no sequence {seq}: these runs have {len(a.ids)}"
    return None


def first_parting(a: Side, b: Side, seq: int) -> int | None:
    """The first token index where the two runs' sequence `seq` differ (one ending early counts);
    None: equal."""
    return first_difference(list(a.ids[seq]), list(b.ids[seq]))


def compare_summary_md(a: Side, b: Side, seq: int) -> str:
    """Where the two runs part, what each wrote there, and where each departs from the reference."""
    if (why := problem(a, b, seq)) is not None:
        return f"**Cannot compare:** {views.md(why)}."
    i = first_parting(a, b, seq)
    head = (f"**Sequence {seq}: the two runs write the same {len(a.ids[seq])} tokens.**"
            if i is None else
            f"**Sequence {seq}: the two runs first differ at token {i}:** A wrote "
            f"{_wrote(a, seq, i)}, B wrote {_wrote(b, seq, i)}.")
    return head + " " + " ".join(f"{name} ({views.md(side.label)}): "
                                 f"{_against_reference(side, seq)}."
                                 for name, side in (("A", a), ("B", b)))


def _wrote(side: Side, seq: int, i: int) -> str:
    if i >= len(side.ids[seq]):
        return "nothing (it had ended)"
    return f"«{views.md(views.visible_text(side.pieces[seq][i]))}» (id {side.ids[seq][i]})"


def _against_reference(side: Side, seq: int) -> str:
    ref = side.reference[seq]
    if ref is None:
        return "no reference recorded"
    fork = first_difference(list(side.ids[seq]), list(ref))
    return ("equal to the batch-size-1 reference" if fork is None
            else f"departs from the reference at token {fork}")


def aligned_html(a: Side, b: Side, seq: int) -> str:
    """The reference, A and B as aligned rows of token chips, TOKENS_PER_LINE columns a line. A chip
    that starts a round has a bar on its left; a token unlike the reference's is shaded; the first
    index where A and B part is outlined in every row (data-first on the wrapper: the index, or ""
    when they never part)."""
    if problem(a, b, seq) is not None:
        return '<p class="sv-empty">Pick two runs of the same prompts.</p>'
    first = first_parting(a, b, seq)
    ref, ref_pieces = (a.reference[seq] or b.reference[seq],
                       a.reference_pieces[seq] or b.reference_pieces[seq])
    rows = ([("reference", ref, ref_pieces, ())] if ref is not None else []) + [
        (f"A: {a.label}", a.ids[seq], a.pieces[seq], a.rounds[seq]),
        (f"B: {b.label}", b.ids[seq], b.pieces[seq], b.rounds[seq])]
    starts = [_round_starts(r[3]) for r in rows]
    width = max(len(r[1]) for r in rows)
    out = [f'<div class="sv-sbs" data-seq="{seq}" data-first="{"" if first is None else first}">']
    for start in range(0, max(width, 1), TOKENS_PER_LINE):
        cols = range(start, min(start + TOKENS_PER_LINE, width))
        # a short last line keeps the others' column widths
        pad = "<td></td>" * (TOKENS_PER_LINE - len(cols))
        out.append('<table class="sv-sbs-line"><thead><tr><th></th>'
                   + "".join(f'<th class="{"sv-first" if i == first else ""}">{i}</th>'
                             for i in cols)
                   + "<th></th>" * (TOKENS_PER_LINE - len(cols)) + "</tr></thead><tbody>")
        for (name, ids, pieces, _), round_starts in zip(rows, starts):
            out.append(f'<tr><th class="sv-sbs-name" title="{html.escape(name)}">'
                       f'{html.escape(name.split(":")[0])}</th>')
            for i in cols:
                out.append(_token_cell(ids, pieces, ref, i, first, round_starts))
            out.append(pad + "</tr>")
        out.append("</tbody></table>")
    return "".join(out) + "</div>"


def _round_starts(rounds: tuple[int, ...]) -> dict[int, int]:
    """Token index -> the round that begins there."""
    starts, at = {}, 0
    for r, n in enumerate(rounds):
        starts[at] = r
        at += n
    return starts


def _token_cell(ids, pieces, ref, i: int, first: int | None, round_starts: dict[int, int]) -> str:
    if i >= len(ids):
        return '<td class="sv-sbs-end" title="ended">·</td>'
    cls = ["sv-tok"]
    tip = [f"token {i}: id {ids[i]}, {views.reads(list(pieces), i)}"]
    if ref is not None and (i >= len(ref) or ref[i] != ids[i]):
        cls.append("sv-off")
        tip.append("not the reference's token")
    if i == first:
        cls.append("sv-first")
        tip.append("first token where A and B differ")
    elif first is not None and i > first:
        cls.append("sv-after")
    if i in round_starts:
        cls.append("sv-rstart")
        tip.append(f"round {round_starts[i]} starts here")
    return (f'<td class="{" ".join(cls)}" data-index="{i}" title="{html.escape(" · ".join(tip))}">'
            f"{html.escape(views.visible_text(pieces[i]) if i < len(pieces) else str(ids[i]))}"
            "</td>")

