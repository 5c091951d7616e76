"""What every view of the page shares, built from a Trace alone (no model, no gradio): the focus,
and strangers' text made safe to show.

Every view is linked to one focus: a sequence and one of its rounds. HTML
views (tokens.py, panel.py) carry `data-seq` / `data-round` on whatever can be
clicked, so the page turns a click into a new focus.
"""
from __future__ import annotations

import html
import re
from collections import defaultdict
from dataclasses import dataclass

from specviz.spec.drafters import DRAFTERS
from specviz.trace import metrics, text
from specviz.trace.records import RowRecord
from specviz.trace.schema import Trace

CHECK_TEXT = {
    "rectangular": "I1 rectangular: pad + content = batch width",
    "positions": "I2 positions follow the mask (cumsum(mask) − 1)",
    "mask": "mask: exactly the real slots are visible",
    "kv": "I3 target KV: one entry per real token, at its own position (paged: its block table "
          "maps each position to a slot holding that token)",
    "draft_kv": "I3 draft KV: the same for the draft's cache",
    "bonus": "I4 the non-draft token is the target's own (its argmax; when sampling, its draw)",
    "recurrent": "I5 recurrent state: holds exactly the row's committed tokens (all but the last; "
                 "the draft's, but two)",
}
SOURCE_TEXT = {"draft": "accepted draft", "correction": "target correction",
               "bonus": "bonus (target, all drafts accepted)"}
# A sampled round's non-draft token: the distribution it was drawn from (trace.PickFrom).
PICK_TEXT = {
    "target": "drawn from the target's p (every draft accepted: the bonus)",
    "residual": "drawn from the residual norm(max(0, p − q)) after the draft was rejected",
    "draft": "the draft's own token, not drawn from the target at all (a fault)",
}


@dataclass(frozen=True)
class Focus:
    seq: int
    # a global round index the sequence took part in; None for non-speculative traces
    round: int | None


def rows_by_seq(trace: Trace) -> dict[int, list[RowRecord]]:
    out: dict[int, list[RowRecord]] = defaultdict(list)
    for r in trace.rows:
        out[r.seq].append(r)
    return out


def round_widths(trace: Trace) -> dict[int, int]:
    """Each round's width: the most drafts any of its rows was offered (what its verify pass
    checked). A row may be offered fewer, or none (prompt lookup found no match; the token budget
    ends the row)."""
    out: dict[int, int] = defaultdict(int)
    for r in trace.rows:
        out[r.round] = max(out[r.round], len(r.draft_tokens))
    return out


def no_rounds(trace: Trace) -> str:
    """Why a trace holds no rounds to draw."""
    if trace.manifest.engine is not None and any(s.engine and s.engine.rounds
                                                 for s in trace.sequences):
        return ("An engine's rounds are seen from outside: how many tokens each emitted (the grid "
                "and the timeline), never its caches, positions or timings.")
    if trace.manifest.engine is not None:
        return ("No rounds: this engine reported none, and is judged from its tokens alone (an "
                "outputs file's `rounds` give every round view).")
    return "No rounds: this method does not speculate."


def no_drafts(trace: Trace, have: int) -> str:
    """A row offered no drafts, that already had `have` tokens: why, and what it emitted instead."""
    spec = trace.manifest.spec
    if spec.max_new_tokens - 1 - have <= 0:
        why = "its token budget left room for one token only"
    elif (kind := DRAFTERS[spec.drafter]).empty:
        why = f"{kind.noun} {kind.empty(spec)}"
    else:
        why = "its drafter proposed nothing"
    return f"{NO_DRAFTS} ({why}): the target's own token alone"


NO_DRAFTS = "no drafts offered"


def fork_round(trace: Trace, seq: int, rows: list[RowRecord]) -> int | None:
    """The round that emitted the sequence's first divergent token; in a sampled run, the round its
    state was found corrupt in (forensics/whitebox.py)."""
    s = trace.sequences[seq]
    fork = s.first_divergence
    if fork is None:
        return s.forensics.round if s.forensics and s.reference_ids is None else None
    seen = 0
    for r in rows:
        seen += len(r.emitted)
        if fork < seen:
            return r.round
    return rows[-1].round if rows else None


def resolve(trace: Trace, seq: int | None = None, round: int | None = None) -> tuple[Focus, str]:
    """A valid focus near the one asked for, and a note when it had to move.

    No sequence asked: the first divergent one; sampled, the one whose state went wrong first, else
    the first with an impossible token or a wrong decision (else 0). No valid round: the round of
    its divergence (else its first round).
    """
    note = ""
    n = len(trace.sequences)
    if seq is not None and not 0 <= seq < n:
        note = f"sequence {seq} is not in this run (it has {n}); showing another. "
        seq = None
    by_seq = rows_by_seq(trace)
    # the corrupt state the run's verdict names: the earliest
    if seq is None and metrics.sampled(trace):
        named = [s for s in trace.sequences if s.forensics]
        seq = min(named, key=lambda s: (s.forensics.round or 0, s.seq)).seq if named else None
    if seq is None:
        seq = next((s.seq for s in trace.sequences if s.equivalent is False), None)
    # a sampled run: the first sequence with an impossible token, else a wrong decision
    if seq is None:
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
    """A sampled sequence's round to open on: the one that emitted its first impossible token, else
    its first round with a decision that does not follow its draw."""
    s = trace.sequences[seq]
    first = next((i for i, u in enumerate(s.pit or ()) if u is None), None)
    if first is not None:
        seen = 0
        for r in rows:
            seen += len(r.emitted)
            if first < seen:
                return r.round
    return next((r.round for r in rows if metrics.mismatched(r)), None)


# ---------------------------------------------------------------- text helpers Every string in a
# trace or a link was written by a stranger: it is escaped wherever it becomes HTML (html.escape) or
# Markdown (md), and token texts are shown as whole characters (text.py).

# a token holding only part of a character: the character shows on the token that completes it
PART = "…"
_MD_PUNCTUATION = re.compile(r"[!-/:-@\[-`{-~]")


def md(stranger: str) -> str:
    """Text as inert Markdown: every ASCII punctuation mark backslash-escaped (CommonMark allows it
    for each), so no link, image, HTML tag, code span or emphasis can start, and lines joined, so no
    block can either."""
    return _MD_PUNCTUATION.sub(r"\\\g<0>", " ".join(stranger.splitlines()))


def visible_text(piece: str | None) -> str:
    """A token's text with invisible characters made visible (not escaped)."""
    if piece is None:
        return PART
    if piece == "":
        return "∅"
    return piece.replace("\n", "↵").replace("\t", "⇥")


def chip_text(piece: str | None) -> str:
    return html.escape(visible_text(piece))


def token_text(trace: Trace, tok: int) -> str | None:
    """A token's own text; None when it holds only part of a character (alone, it decodes
    to U+FFFD)."""
    piece = trace.vocab.get(tok, f"<{tok}>")
    return None if text.REPLACEMENT in piece else piece


def says(piece: str | None) -> str:
    """A token's text for a tooltip."""
    return "part of a character split across tokens" if piece is None else repr(piece)


def reads(pieces: list[str | None], i: int) -> str:
    """What token i of a sequence reads as, for a tooltip: a partial token names the character
    it starts."""
    if pieces[i] is not None:
        return repr(pieces[i])
    end = text.character_at(pieces, i)[1]
    return f"the first bytes of {pieces[end - 1]!r}, which token #{end - 1} completes"


# ---------------------------------------------------------------- views


