"""The trace's records: one per (round, row), one per round, one per prompt, one per sequence, and
what an engine under test returned. Plain, JSON-serializable data (pydantic), validated on load."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specviz.spec.strict import Many, Map, Strict
from specviz.trace.evidence import Attribution, Forensics

Source = Literal["draft", "correction", "bonus"]
PickFrom = Literal["target", "residual", "draft"]


class TreeRecord(Strict):
    """A row's token tree in one round (decoding/trees.py): its nodes, each one's parent (-1: the
    row's last committed token), and the nodes it accepted, root to leaf. The row's draft_tokens are
    then the accepted path's tokens, followed by the first child the target refused, where there
    was one."""

    tokens: Many[int]
    parents: Many[int]
    path: Many[int]

    @model_validator(mode="after")
    def _a_tree(self) -> TreeRecord:
        if len(self.parents) != len(self.tokens) or any(not -1 <= p < i
                                                        for i, p in enumerate(self.parents)):
            raise ValueError("a tree lists each node after its parent, one parent per token")
        if any(not 0 <= n < len(self.tokens) for n in self.path) or \
                [self.parents[n] for n in self.path] != [-1, *self.path][:len(self.path)]:
            raise ValueError("a tree's accepted path runs from the root, each node a child of the "
                             "one before")
        return self

    def children(self, node: int) -> list[int]:
        """The nodes whose parent is `node` (-1: the root's), in the order they were listed."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def candidate(self, node: int) -> tuple[int, int]:
        """Which candidate `node` is among its parent's children (1: the first), and how many
        there are."""
        siblings = self.children(self.parents[node])
        return siblings.index(node) + 1, len(siblings)

    def ranks(self, slots: int) -> list[int]:
        """The candidate each of a row's first `slots` drafts was: its path's nodes, then the first
        child the target refused (a first candidate)."""
        return ([self.candidate(n)[0] for n in self.path] + [1])[:slots]


class BlockTable(Strict):
    """A row's block table in the target's pool as the round's passes left it (a paged run):
    position i lives in blocks[i // block size], its drafts' blocks included."""

    blocks: Many[int]
    shared: Many[bool]  # each one shared with another row, or kept by the prefix cache

    @model_validator(mode="after")
    def _paired(self) -> BlockTable:
        if len(self.shared) != len(self.blocks):
            raise ValueError("a block table says for each of its blocks whether it is shared")
        return self


class RowRecord(Strict):
    """One row of one round: what was drafted, verified, kept, and the state around it."""

    round: int
    batch: int
    row: int
    seq: int
    draft_tokens: Many[int]
    draft_probs: Many[float]  # the draft's probability of each of its tokens
    target_tokens: Many[int]  # the target's argmax at each of the k+1 verified slots
    target_probs: Many[float]
    target_margins: Many[float]  # top-1 minus top-2 target logit at each verified slot
    accepted: int
    emitted: Many[int]
    sources: Many[Source]
    finished: bool
    # the tokens the run's own counters took as this round's (what its tokens per round and mean
    # acceptance length sum); None: its emitted tokens (a trace written before it was recorded)
    counted: int | None = None
    pad_before: int
    pad_after: int | None  # None: the row finished and left the batch
    content_before: int
    content_after: int | None
    pos_first: int  # position ids fed to the target's verify pass: first and last
    pos_last: int
    mask_sum: int  # slots visible to the first verified token
    target_kv_before: int
    target_kv_after: int | None
    draft_kv_before: int
    draft_kv_after: int | None
    delta: int  # slots this row's KV moved by in the realignment
    # A hybrid model's recurrent states (Gated DeltaNet, Mamba, short convolutions), where the model
    # has them: how many of the row's tokens each holds, before and after the round (-1: it holds a
    # token that is not the row's, a rejected draft). A correct engine's target state holds all but
    # the row's last token; the draft's all but two.
    target_state_before: int | None = None
    target_state_after: int | None = None
    draft_state_before: int | None = None
    draft_state_after: int | None = None
    checks: Map[str, bool]  # invariant checks at the start of / during this round
    audit: float | None = None  # audited rows: largest |verify logit - fresh batch-size-1 logit|
    audit_draft: float | None = None  # the same for the draft's first pass of the round
    # Sampled runs (speculative sampling): draft_probs holds q of each draft, after the draft's
    # temperature/top-k/top-p.
    # p of each draft, after the target's temperature/top-k/top-p
    target_draft_probs: Many[float] | None = None
    # the uniform draw of each draft's decision: accepted iff draw < p/q
    accept_draws: Many[float] | None = None
    pick_draw: float | None = None  # the uniform draw the non-draft token was sampled with
    # the distribution the non-draft token was drawn from, as the engine did it
    pick_from: PickFrom | None = None
    tree: TreeRecord | None = None  # a round that verified token trees: this row's
    block_table: BlockTable | None = None  # a paged run: this row's


class BlockFinding(Strict):
    """A paged cache's own check that failed (decoding/paging.py), naming its block: a row's
    position mapped to a slot holding another token, a pass writing a block not in its row's table
    or one its row shares, a prefix-cache hit on a block holding other tokens than its key's, or
    on a block whose recurrent states were fed other tokens than its chain's
    (decoding/boundarystates.py)."""

    check: Literal["holds-another-token", "foreign-block-written", "shared-block-written",
                   "hit-on-other-tokens", "state-holds-other-tokens"]
    model: Literal["target", "draft"]  # whose pool
    seq: int  # the request whose row found it, or whose pass wrote
    block: int = Field(ge=0)
    position: int | None = None  # the row's position it is about (None: a hit's whole block)
    writer: int  # the request that last wrote the slot (-1: none ever did)
    holds: int  # the token the slot holds (-1: none)
    wants: int  # the token the row, the pass or the key has there

    def describe(self, vocab: dict[int, str]) -> str:
        def token(t: int) -> str:
            return f"id {t}" + (f" {vocab[t]!r}" if t in vocab else "")

        held = ("nothing ever written" if self.holds < 0
                else f"{token(self.holds)} written by request {self.writer}")
        where = f"block {self.block} of the {self.model}'s pool"
        if self.check == "holds-another-token":
            return (f"request {self.seq}'s block table maps its position {self.position} to "
                    f"{where}, which holds {held}, not its {token(self.wants)}")
        if self.check == "state-holds-other-tokens":
            fed = (f"{token(self.holds)} past the block's last token" if self.wants < 0
                   else f"{token(self.holds)} where the chain has {token(self.wants)}")
            return (f"request {self.seq} hit the prefix cache on {where}, and took the recurrent "
                    f"states request {self.writer}'s pass kept there, which were fed, at position "
                    f"{self.position}, {fed}")
        if self.check != "hit-on-other-tokens":
            whose = ("not in its block table" if self.check == "foreign-block-written"
                     else "which it shares with other requests or the prefix cache")
            return (f"request {self.seq}'s pass wrote its position {self.position} "
                    f"({token(self.wants)}) into {where}, {whose} (it held {held})")
        return (f"request {self.seq} hit the prefix cache on {where}, which holds {held} where "
                f"the key has {token(self.wants)}")


class RoundRecord(Strict):
    round: int
    batch: int
    seqs: Many[int]
    realigned: bool  # caches gathered (some row's offset changed), else only cropped
    # seconds: draft, verify, realign, trace, watch (forensic checks outside the engine)
    timings: Map[str, float]
    group: bool | None = None  # exspec: a same-length group, needing no realignment
    waits: Many[int] | None = None  # exspec: rounds each row had been passed over
    # a paged run: its paged checks that failed by the round's start (the engine's own)
    blocks: Many[BlockFinding] = []


class PromptRecord(Strict):
    seq: int
    text: str
    ids: Many[int]


class EngineRound(Strict):
    """One round of an engine's speculation, as it reports it: the drafts it offered, and how many
    of them it accepted. It then wrote one token of its own (the correction, or the bonus): a round
    emits accepted + 1 tokens, the last round as many as the output has left (a stop or the length
    cap trims it; an engine that leaves its stop out of the ids, none). The first token, written by
    the prefill with no drafts, is a round of its own: {"drafts": [], "accepted": 0}.

    Seen from outside (OpenVINO GenAI's steps, each adding a round's tokens to a request), a round
    shows how many tokens it emitted but not the drafts it offered: `shown` is false, `drafts` is
    empty, and accepted is what it emitted less one."""

    drafts: Many[int]
    accepted: int = Field(ge=0)
    shown: bool = True  # the drafts' ids are reported (false: only how many were accepted)
    # the sequence's cumulative log-probability after this round, as the engine reports it
    score: float | None = None

    @model_validator(mode="after")
    def _within(self) -> EngineRound:
        if not self.shown and self.drafts:
            raise ValueError("a round whose drafts are not shown lists none")
        if self.shown and self.accepted > len(self.drafts):
            raise ValueError(f"a round accepted {self.accepted} of {len(self.drafts)} drafts")
        return self


class EngineOutput(Strict):
    """One prompt's answer from the engine."""

    ids: Many[int] = []  # output token ids, as the engine produced them
    # the engine's log-probability of each output token, where given
    logprobs: Many[float] | None = None
    # per output token: the engine's top alternatives, where given
    top_logprobs: Many[Map[int, float]] | None = None
    # the engine gave text only: ids re-tokenized by specviz, so not exact
    approximate: bool = False
    finish_reason: str | None = None  # as reported ("stop", "length", ...)
    # draft tokens the engine offered for this prompt, where it counts them (llama.cpp)
    drafts: int | None = None
    accepted: int | None = None  # of those, the ones it accepted
    # its rounds, where it reports them (an outputs file's `rounds`): the output, cut into rounds
    rounds: Many[EngineRound] | None = None
    # the sequence's cumulative log-probability, where the engine reports one (OpenVINO's score)
    score: float | None = None
    # the output is kept but suspect (e.g. fewer tokens than asked, no stop reason)
    warning: str | None = None
    # this prompt failed (the server stopped answering, timed out, ...): the rest is kept
    error: str | None = None

    def spans(self) -> list[tuple[int, int]]:
        """Each reported round's output tokens [start, end): its accepted drafts and its own token,
        the last round's as many as the output has left (empty without rounds)."""
        out, start = [], 0
        for r in self.rounds or []:
            end = min(start + r.accepted + 1, len(self.ids))
            out.append((start, end))
            start = end
        return out

    @model_validator(mode="after")
    def _rounds_cut_the_output(self) -> EngineOutput:
        if self.rounds:
            before = sum(r.accepted + 1 for r in self.rounds[:-1])
            if not before <= len(self.ids) <= before + self.rounds[-1].accepted + 1:
                raise ValueError(
                    f"its {len(self.rounds)} rounds emit {before} tokens before the last, which "
                    f"emits up to {self.rounds[-1].accepted + 1}: they do not cut an output of "
                    f"{len(self.ids)} tokens (each round emits its accepted drafts and one token)")
            t0 = 0
            for n, r in enumerate(self.rounds):
                kept = self.ids[t0: t0 + r.accepted]  # (the last round's, trimmed)
                if r.shown and r.drafts[: len(kept)] != kept:
                    raise ValueError(f"round {n}'s accepted drafts are not the output's tokens "
                                     "there")
                t0 += r.accepted + 1
        return self


class EngineInfo(Strict):
    """What the engine said about itself."""

    name: str  # e.g. "vllm", or module:function
    version: str | None = None
    source: str  # "file", "server" or "callable"
    settings: dict = {}  # its configuration as it reports it (speculative method, k, dtype, ...)
    seconds: float | None = None  # wall time it took for all prompts, where known
    # fields of its outputs file that specviz does not read (listed, never refused)
    ignored: Many[str] = []


class ReferenceProof(Strict):
    """How a reference was obtained when not decoded token by token from its prompt
    (forensics/proof.py): its leading tokens proved by teacher forcing an output through the target
    in float64, the rest decoded."""

    # leading reference tokens proved: each the float64 argmax on its own prefix, beyond
    # the tolerance
    proved: int
    decoded: int  # tokens after them, decoded one at a time at batch size 1 on the proved prefix
    source: str  # the output the proof was read from: "engine" or "control"
    # logits: the rounding yardstick's tolerance, which every proved margin exceeds
    tolerance: float
    # the smallest float64 top-1 minus top-2 margin among the proved tokens
    smallest_margin: float | None = None
    # why the proof ended before the reference did (a fork, a near-tie, the output's end)
    stop: str | None = None


THINKING = -1  # a grammar_allowed entry: a token of the request's thinking, before its grammar


class SequenceRecord(Strict):
    seq: int
    output_ids: Many[int]
    # per token: the whole characters it completes; None when it only starts one
    output_pieces: Many[str | None]
    margins: Many[float]
    # runs with logprobs: per token, under the target (decoding/penalties.py)
    logprobs: Many[float] | None = None
    reference_ids: Many[int] | None = None
    reference_pieces: Many[str | None] | None = None
    reference_margins: Many[float] | None = None
    # None: the reference was decoded token by token from the prompt
    reference_proof: ReferenceProof | None = None
    first_divergence: int | None = None  # first index where output_ids and reference_ids differ
    equivalent: bool | None = None
    completion_seconds: float | None = None  # from the start of decoding to its last token
    # audited runs: first round its target state departed from the noise floor
    audit_round: int | None = None
    audit_draft_round: int | None = None  # the same for the draft's state
    engine: EngineOutput | None = None  # engine checks: what the engine returned for this prompt
    control: EngineOutput | None = None  # and the same engine without speculation, when given
    # engine checks: per output token, the reference's top logit minus that token's, on the engine's
    # own prefix (0: the target's own greedy choice)
    gaps: Many[float] | None = None
    # sampled runs: each token's randomized PIT under the target, recomputed at batch size 1
    # (distribution.py); None where the target gives it 0
    pit: Many[float | None] | None = None
    # structured output: per token, how many tokens the run's grammar allowed there, replayed fresh
    # (forensics/grammar.py): THINKING while the request thinks, 1 forced, 0 from where it broke
    grammar_allowed: Many[int] | None = None
    forensics: Forensics | None = None
    # engine checks: the mechanism behind a fork not put down to rounding
    attribution: Attribution | None = None


def check_sequence(s: SequenceRecord) -> None:
    """What the views rely on in one sequence beyond types: a piece (and PIT value, log-probability)
    per token id, and a first_divergence and equivalent that follow from its ids.
    Raises ValueError."""
    if s.pit is not None and len(s.pit) != len(s.output_ids):
        raise ValueError(f"sequence {s.seq}: one PIT value per token id is needed")
    if s.logprobs is not None and len(s.logprobs) != len(s.output_ids):
        raise ValueError(f"sequence {s.seq}: one log-probability per token id is needed")
    if s.grammar_allowed is not None and len(s.grammar_allowed) != len(s.output_ids):
        raise ValueError(f"sequence {s.seq}: one grammar count per token id is needed")
    if (len(s.output_pieces) != len(s.output_ids)
            or (s.reference_pieces is None) != (s.reference_ids is None)
            or s.reference_ids is not None and len(s.reference_pieces) != len(s.reference_ids)):
        raise ValueError(f"sequence {s.seq}: one piece of text per token id is needed")
    fork = None if s.reference_ids is None else first_difference(s.output_ids, s.reference_ids)
    if (s.first_divergence, s.equivalent) != (fork,
                                              None if s.reference_ids is None else fork is None):
        raise ValueError(f"sequence {s.seq}: first_divergence and equivalent do not match its ids")


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids two lists share."""
    first = first_difference(a, b)
    return min(len(a), len(b)) if first is None else first


def first_difference(a: list[int], b: list[int]) -> int | None:
    """First index where two id lists differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
