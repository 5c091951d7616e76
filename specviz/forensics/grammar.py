"""The grammar judge: does each output follow its run's grammar (structured output)?

Each output is replayed, token by token, through a fresh llguidance matcher of the run's JSON schema
(none of the engine's grammar state: a new one per sequence, from its first token), free up to its
reasoning end where the run sets one. Where its mask lacks a token, the grammar forbade it there;
where an output ends with its grammar unfinished, with budget left and no stop string, it
stopped where the grammar does not let it. Either is `decision-bug:grammar`: a grammar's masks
allow only what it accepts, so the engine's mask at that token was not its state's (another
state's, or none), or the request ended without its answer. Where the output departed from the
reference before it broke its grammar, that departure is the verdict's fork.

Each token's count of allowed tokens goes on its sequence (`grammar_allowed`), for the page's
timeline: THINKING while the request thinks, 1 where the grammar forced the token, 0 from where it
broke.
"""
from __future__ import annotations

from collections import defaultdict

import llguidance
import llguidance.hf

from specviz.decoding.grammar import one_token
from specviz.spec.grammar import compile_schema
from specviz.spec.verdicts import VERDICTS
from specviz.trace.evidence import RunForensics
from specviz.trace.findings import Findings
from specviz.trace.records import THINKING
from specviz.trace.schema import Trace

# the white-box verdict on a kept token that is not the target pass's own argmax
CHOSEN_ELSEWHERE = "sync-bug:bonus"


def judge_grammar(trace: Trace, tokenizer, eos_ids: tuple[int, ...]) -> Findings:
    """Each sequence's tokens against its grammar; `forensics` where the output breaks it and no
    other judge named a bug at an earlier token."""
    spec, found, rows = trace.manifest.spec, Findings(), defaultdict(list)
    for r in sorted(trace.rows, key=lambda r: r.round):
        rows[r.seq].append(r)
    vocab = llguidance.hf.from_tokenizer(tokenizer, eos_token=list(eos_ids))
    grammar = compile_schema(spec.json_schema)
    end = None if spec.reasoning_end is None else one_token(tokenizer, spec.reasoning_end)
    for s in trace.sequences:
        allowed, broke = _replay(llguidance.LLMatcher(vocab, grammar, log_level=0), end,
                                 s.output_ids)
        found.of(s.seq)["grammar_allowed"] = allowed
        ended_early = (broke is None and len(s.output_ids) < spec.max_new_tokens
                       and allowed and allowed[-1] != THINKING
                       and not _stopped(s.output_pieces, spec.stop) and not _complete(
                           llguidance.LLMatcher(vocab, grammar, log_level=0), end, s.output_ids))
        at = broke if broke is not None else len(s.output_ids) if ended_early else None
        if at is None or _named_before(s.forensics, at):
            continue
        # an earlier departure from the reference is this bug's first token; an unfinished end's
        # fork is where the output stops
        departs = s.first_divergence is not None and s.first_divergence < at
        fork = s.first_divergence if departs else at
        emitted = _emitting_row(rows.get(s.seq, []), fork)
        found.of(s.seq)["forensics"] = RunForensics(
            verdict="decision-bug:grammar", fork=fork, round=emitted and emitted.round,
            row=emitted and emitted.row,
            output_token=s.output_ids[fork] if fork < len(s.output_ids) else None,
            reference_token=(s.reference_ids[fork] if s.reference_ids is not None
                             and fork < len(s.reference_ids) else None),
            explanation=_explain(s, at, broke is None, fork if departs else None))
    return found


def _emitting_row(rows: list, index: int):
    """The round's row that emitted output token `index`, or the last, past the output's end (None:
    a run without rounds)."""
    seen = 0
    for r in rows:
        seen += len(r.emitted)
        if index < seen:
            return r
    return rows[-1] if rows else None


def _named_before(forensics, at: int) -> bool:
    """Another judge named a bug at a token before `at`. A kept token that is not the target pass's
    own choice is not one under a grammar: that pass is judged unmasked, the engine chose under a
    mask."""
    return (forensics is not None and forensics.fork < at and VERDICTS[forensics.verdict].bug
            and forensics.verdict != CHOSEN_ELSEWHERE)


def _replay(m: llguidance.LLMatcher, end: int | None, ids: list[int]):
    """Per token, how many tokens the grammar allowed there (THINKING while thinking, 0 from the
    first token it refused), and that token's index (None: none refused). A token is allowed where
    the grammar's mask holds it: the matcher would also consume another tokenization of the same
    text (`{` then `"` for the one token `{"`), which no masked engine can write."""
    thinking, out, broke = end is not None, [], None
    for i, t in enumerate(ids):
        if thinking:
            out.append(THINKING)
            thinking = t != end
        elif broke is not None:
            out.append(0)
        else:
            mask = m.compute_bitmask()
            out.append(sum(bin(b).count("1") for b in mask))
            if t // 8 >= len(mask) or not mask[t // 8] >> (t % 8) & 1 or not m.consume_token(t):
                broke, out[-1] = i, 0
    return out, broke


def _complete(m: llguidance.LLMatcher, end: int | None, ids: list[int]) -> bool:
    """The grammar accepts the output as it stands (its answer whole)."""
    start = ids.index(end) + 1 if end is not None else 0
    return m.consume_tokens(ids[start:]) and m.is_accepting()


def _stopped(pieces: list[str | None], stops: tuple[str, ...]) -> bool:
    text = "".join(p or "" for p in pieces)
    return any(text.endswith(s) for s in stops)


def _explain(s, at: int, ended: bool, departs: int | None) -> str:
    if ended:
        said = (f"The output ends after {at} tokens with its grammar unfinished: no stop, and "
                "budget left. The request stopped where its grammar does not let it (an engine "
                "aborts a request whose grammar failed).")
    else:
        said = (f"Token {at} ({s.output_pieces[at]!r}) is one the run's grammar forbids there: a "
                "fresh matcher, fed the output from its start, refuses it. The grammar's mask at "
                "that token was not its state's: another state's (a rejected draft kept in it), "
                "or none (a slot left unconstrained).")
    if departs is not None:
        said = (f"At token {departs} the output departs from the reference: the engine kept a "
                "token the grammar allows there, but not the one the target chooses under the "
                "grammar's mask: it chose under another mask, or none. " + said)
    return said
