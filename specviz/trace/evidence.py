"""The evidence a trace keeps of its verdicts (judged against the yardsticks of yardsticks.py): how
far an engine departs from the model, the two judges' verdicts, and a sampled run's distribution
test and decision audit."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Discriminator, Field, Tag

from specviz.spec.strict import Many, Map, Strict
from specviz.spec.untrusted import shown
from specviz.spec.verdicts import VERDICTS


class Fidelity(Strict):
    """How far one run of an engine departs from the model at all, with or without speculation
    (descriptive: a run never judges itself)."""

    role: Literal["engine", "control"]
    outputs: int
    equal: int  # outputs equal to the reference
    tokens: int
    departures: int  # tokens that are not the target's float64 argmax on their own prefix
    beyond: int  # departures beyond the tolerance
    largest_gap: float  # the largest float64 gap of any of its tokens
    sigma: float | None = None  # its noise on a logit difference, fitted as EngineNoise.sigma is
    # the largest |engine log-probability - float64 log-probability|
    logprob_error: float | None = None

    def describe(self) -> str:
        sigma = "" if self.sigma is None else f"; noise sigma {self.sigma:.3g}"
        lp = ("" if self.logprob_error is None
              else f"; log-probabilities within {self.logprob_error:.3g}")
        return (f"{self.role}: {self.equal} of {self.outputs} outputs equal the reference; "
                f"{self.departures} of {self.tokens} tokens are not the target's float64 argmax on "
                f"their own prefix, {self.beyond} beyond the tolerance; largest gap "
                f"{self.largest_gap:.3g}{sigma}{lp}")


def _declared(name: str) -> str:
    """A name spec/verdicts.py declares: no judge gives another, and a record or file holding one
    is refused."""
    if name not in VERDICTS:
        raise ValueError(f"{shown(name)} is not a verdict specviz gives (spec/verdicts.py)")
    return name


# A verdict's name, checked against the registry wherever a record is built, assigned or read.
VerdictName = Annotated[str, AfterValidator(_declared),
                        Field(json_schema_extra={"enum": list(VERDICTS)})]


class Judgement(Strict):
    """Why a sequence departed from the reference: what both judges record (what the verdict's name
    means is its declaration, spec/verdicts.py's Verdict)."""

    model_config = ConfigDict(validate_assignment=True)  # a judge setting an undeclared name fails

    verdict: VerdictName
    explanation: str
    fork: int  # index of the first differing token
    output_token: int | None = None
    reference_token: int | None = None
    # target top-1 minus top-2 logit at the fork: the reference pass (bs 1)
    margin_reference: float | None = None
    # float64, batch size 1: logit of the reference's token minus the output's
    margin_float64: float | None = None
    # largest logit difference rounding explains here (the yardstick's)
    tolerance: float | None = None
    alpha: float | None = None  # the false-alarm rate the verdict was judged at
    yardstick: str | None = None  # which yardstick judged it, in words


class RunForensics(Judgement):
    """The white-box judge's verdict on one of our runs, with its evidence (forensics/whitebox.py):
    the watched state of the row that emitted the fork, recomputed against the truth."""

    judge: Literal["run"] = "run"
    round: int | None = None  # the round and batch row that emitted it (speculative methods)
    row: int | None = None
    # the engine's own breaking checks -> first round failed, at or before the fork
    failed_checks: Map[str, int] = {}
    margin_batched: float | None = None  # the same in the pass that emitted the fork
    # largest |emitting - fresh batch-size-1 logit| over the row's verified slots
    state_diff: float | None = None
    # the same pass rebuilt from correct inputs (fresh caches, true positions), vs fresh
    kernel_diff: float | None = None
    kernel_diff_float64: float | None = None  # the same in float64, against a fresh float64 pass
    # the row's visible cache entries alone, true positions and plain mask, vs fresh
    kv_diff: float | None = None
    # a hybrid: the row's own recurrent states over fresh K/V, vs fresh
    recurrent_diff: float | None = None
    # cache entries that fit their token badly: [true position, computed at (-1: none)]
    written_at: Many[Many[int]] = []
    tokens_fed_ok: bool | None = None  # the emitting pass was fed the sequence's own last token
    positions_fed: Many[int] | None = None  # position ids of the verified slots, as fed
    positions_expected: Many[int] | None = None  # where those tokens sit in the sequence
    visible: Many[int] | None = None  # key slots each verified slot could attend to
    visible_expected: Many[int] | None = None  # real tokens up to and including each verified slot
    # the emitting pass's own choice at the fork slot (penalised, under a penalty)
    emitting_argmax: int | None = None
    # what the fork token was in its round
    fork_source: Literal["draft", "correction", "bonus"] | None = None
    # decision-bug:penalty: the token the engine's choice needs its penalty lifted for
    penalty_lifted: int | None = None
    # decision-bug:logprobs: the run's log-probability of the token at `fork`
    logprob: float | None = None
    # and the target's, recomputed fresh in float64 at batch size 1
    logprob_float64: float | None = None
    batching_noise: bool | None = None  # batched-reference (no speculation) already departs here


class EngineForensics(Judgement):
    """The black-box judge's verdict on an engine from outside, by its token ids alone
    (forensics/blackbox.py): its tokens teacher-forced through the target, against the engine's
    own rounding."""

    judge: Literal["engine"] = "engine"
    # rank of the engine's fork token under the reference (1: its own choice)
    engine_rank: int | None = None
    # the engine's own log-probability of its fork token, where it gave one
    engine_logprob: float | None = None
    # first token, at or after the fork, whose reference gap exceeds the tolerance
    first_bad: int | None = None
    # where the same engine without speculation departs (None: it does not)
    control_fork: int | None = None
    repeated: float | None = None  # share of repeated 4-grams in the output after the fork (loops)
    # mean negative log-likelihood, under the reference, of the output after the fork
    nll: float | None = None
    reference_nll: float | None = None  # the same for the reference's own continuation
    # where the engine reported its rounds: the round that wrote the fork token (0: the prefill's),
    # and how: one of its accepted drafts, or its own token after them
    fork_round: int | None = None
    fork_written_as: Literal["accepted draft", "own token"] | None = None
    # decision-bug:score: the sequence's score as the engine reported it after the fork's round,
    # and the sum of its own log-probabilities of the tokens up to there
    score: float | None = None
    score_expected: float | None = None


def _judge_of(data) -> str:
    """Which judge wrote a verdict: its `judge`, else (a verdict written before judges were told
    apart) the fields only an engine check records."""
    if not isinstance(data, dict):
        return getattr(data, "judge", "run")
    return data.get("judge") or ("engine" if any(data.get(f) is not None for f in ENGINE_ONLY)
                                 else "run")


ENGINE_ONLY = tuple(EngineForensics.model_fields.keys() - Judgement.model_fields.keys() - {"judge"})
Forensics = Annotated[Annotated[RunForensics, Tag("run")]
                      | Annotated[EngineForensics, Tag("engine")], Discriminator(_judge_of)]


class Split(Strict):
    """One tested split of the PIT values and its uniformity test."""

    # what the values share: "all tokens", "slot 0", "row 3", "rounds 0-9", "row pairs", ...
    name: str
    n: int  # values tested
    ks: float  # Kolmogorov-Smirnov p-value against uniform(0, 1)
    chi2: float  # chi-square p-value over the bins of counts
    p: float  # the split's p-value: min(1, 2 * min(ks, chi2)), Bonferroni over its two tests
    counts: Many[int]  # values per equal bin on [0, 1]; len(counts) bins (see pit.bins())


class OtherSettings(Strict):
    """A sequence whose tokens settings not its own fit far better than its own (runs with
    per-request settings)."""

    seq: int
    temperature: float  # the settings that fit (temperature 0: greedy)
    top_k: int
    top_p: float
    # log of their likelihood over its own settings'; None: its own make a token impossible
    log_ratio: float | None


class RuleHypothesis(Strict):
    """A sampling engine's tokens scored under one acceptance rule (forensics/rules.py)."""

    fault: str
    # log-likelihood of the tokens under this rule minus under the correct one; None: infinite
    log_ratio: float | None
    # the rule gives every token some probability (log_ratio None and possible: +infinite)
    possible: bool = True
    named: bool = False


class RuleAttribution(Strict):
    """Which acceptance rule wrote a sampling engine's tokens: every rule of the catalogue scored,
    likeliest first."""

    hypotheses: Many[RuleHypothesis]
    tokens: int
    threshold: float  # nats a rule's log-likelihood ratio must reach to be named
    skipped: Map[str, str] = {}  # sampling faults with no likelihood here, and why
    explanation: str


class Distribution(Strict):
    """The verdict on a sampler: do its tokens come from the target's distribution?"""

    verdict: Literal["consistent", "not the target's distribution", "too few tokens"]
    alpha: float  # the family-wise significance level of the verdict
    # smallest split p times the number of splits tested (Bonferroni), at most 1; 0 with an
    p: float | None
    # impossible token; None when too few tokens were tested
    failing: str | None  # the split with the smallest p, or "impossible tokens", when rejected
    tokens: int  # PIT values in the pooled split
    impossible: int  # emitted tokens the target gives probability 0; any one of them rejects
    splits: Many[Split]  # the tested splits, the pooled one first, in the caller's order
    skipped: Many[str]  # splits with fewer than min_count values: not tested
    # Runs with per-request settings: the sequences another request's settings (or greedy) fit
    # beyond chance.
    settings: Many[OtherSettings] = []
    # Engine checks that draft with the check's draft model, when the tokens are not the target's:
    # which rule.
    attribution: RuleAttribution | None = None


class SampledJudgement(Strict):
    """A sampled run of ours judged as a whole (forensics/sampledrun.py): which kind of fault its
    state audit, decision audit and distribution test show together, and why; where none, the
    distribution test's outcome."""

    verdict: VerdictName | Literal["consistent", "too few tokens"]
    explanation: str


class Decisions(Strict):
    """Sampled runs: every recorded accept/reject decision re-derived from its recorded p, q
    and draw."""

    checked: int
    mismatches: int
    first: Many[Many[int]] = []  # [round, row, slot] of the first mismatches (at most 20)
    # Audited runs and runs with per-request settings: every recorded draw re-derived from its row's
    # own stream (None: not checked).
    draws: int | None = None
    stream_mismatches: int = 0
    # [round, seq, token index] of the first draws not the row's stream's
    stream_first: Many[Many[int]] = []


class Proposals(Strict):
    """Audited sampled runs with a draft model (forensics/proposals.py): each decided draft of a
    chain round against a fresh batch-size-1 pass of the draft model under the run's draft
    settings. A draft must be its row's own draw from the q its decision reads."""

    checked: int  # drafts checked: each round's accepted ones and the first it refused
    q_off: int  # of them, those whose recorded q is not the fresh q, beyond rounding
    draw_off: int  # those that are not the fresh q's inverse CDF at the row's draft draw
    first: Many[Many[int]] = []  # [round, seq, slot] of the first drafts off (at most 20)
    tolerance: float  # the draft's rounding in logits: 2 x this / T in log q and in the CDF
    # where drafts are not their own draws: another decision's draws at the same token that every
    # draft is ("the acceptance's"): one number used for two decisions (None: none is)
    drawn_with: str | None = None


class ContextBand(Strict):
    """A run's drafts in the rounds that began with a context length in [start, end) tokens (the
    prompt and the output before the round): a drafter that loses its way past a context length (a
    sliding window run as full attention) shows as a cliff between bands."""

    start: int
    end: int
    offered: int  # drafts offered in those rounds, as far as the output reaches
    accepted: int
    accepted_fresh: int  # the draft model's own proposals', in the same rounds


class Acceptance(Strict):
    """Greedy runs with a draft model: each round's drafts against what a fresh batch-size-1 pass of
    the draft model proposes on the row's committed tokens (forensics/acceptance.py). A draft bug
    keeps the output right (the target verifies every draft) and shows only here: drafts a correct
    drafter would not propose, and the acceptance they cost."""

    compared: int  # draft slots compared: each round's accepted drafts and its first rejected one
    differ: int  # of them, drafts other than the fresh pass's own choice
    # of those, beyond the draft's rounding (the fresh pass prefers its own by more than it flips)
    beyond: int
    tolerance: float | None  # the draft's rounding tolerance (None: not measured, no float64 copy)
    first: Many[int] | None = None  # [round, seq, slot] of the first draft beyond rounding
    accepted: int  # drafts the run accepted
    # drafts the fresh pass's proposals would have had accepted, in the same rounds
    accepted_fresh: int
    # the run's acceptance at each draft slot, of the rounds that reached it
    per_position: Many[float | None]
    per_position_fresh: Many[float | None]  # (None: no round reached the slot)
    # the same drafts by the context length each round began with (bands doubling from 32 tokens)
    by_context: Many[ContextBand] = []
    verdict: VerdictName | None  # None: the drafter's own drafts; else a draft-bug, or unexplained
    explanation: str
    # An engine seen from outside has only its counters (per prompt, or /metrics over the run):
    # `compared` counts the drafts it offered, replayed in rounds of k on its output. Only /metrics
    # count per draft position (`per_position`; else empty).
    counters: bool = False
    offered_fresh: int | None = None  # counters: the drafts those replayed rounds offer
    matches: Many[str] = []  # a short head's wrong feedings replayed as the engine accepted


class Rejections(Strict):
    """Rounds' decisions (forensics/rejections.py): did a greedy round refuse a draft that the
    target chose? Such a round writes, at the slot it refused, the very token it refused: the
    output stays right and the drafts are lost. A sampled engine's rounds: did they accept far
    fewer drafts than speculative sampling's rule keeps?"""

    judged: int  # rounds judged: every round but a sequence's last (a stop or the cap trims it)
    wrong: int  # of them, rounds that refused a draft the target chose
    # [round, seq, slot] of the first wrong rejection: the run's round number, or the index of the
    # round among the sequence's own (an engine's rounds)
    first: Many[int] | None = None
    accepted: int  # drafts the judged rounds accepted
    kept: int  # drafts the target's own choices keep in the same rounds
    verdict: VerdictName | None  # None: every refused draft was refused by the target
    explanation: str
    # whose rounds: "the run's" (specviz's own), or "the engine's" (as it reported them)
    source: str
    # a sampled engine's rounds, judged by their counts (judge_sampled_rejections): the drafts a
    # correct rule accepts on average, and the chance it accepts as few as the engine did
    expected: float | None = None
    tail: float | None = None


class Repeat(Strict):
    """A prompt the engine answered otherwise when asked again."""

    seq: int
    # which repeat: "again" (the same requests, in the same order) or "reordered" (other slots
    # and company)
    run: str
    index: int  # the first token where the two answers part
    first: int | None  # the first answer's token there (None: it had ended)
    then: int | None  # the repeat's


class Determinism(Strict):
    """Engine checks: does the engine answer the same prompt alike every time it is asked?"""

    runs: Map[str, str]  # each repeat's name -> how it was asked, in words
    prompts: int  # prompts answered every time, and so compared
    differing: Many[Repeat]  # each (prompt, repeat) whose answer departs from the first

    def describe(self) -> str:
        if not self.differing:
            return (f"determinism: the {self.prompts} prompts got the same answer every time "
                    f"({', '.join(self.runs)})")
        seqs = sorted({r.seq for r in self.differing})
        per_run = ", ".join(f"{name} {sum(r.run == name for r in self.differing)}"
                            for name in self.runs)
        return (f"determinism: {len(seqs)} of {self.prompts} prompts got another answer when asked "
                f"again ({per_run}); first at "
                + ", ".join(f"[{r.seq}] token {r.index}" for r in self.differing[:5]))


class Hypothesis(Strict):
    """One known mechanism, planted in specviz's engine, replaying an engine's forked row
    (replayed by run/attribution.py, scored by forensics/attribution.py)."""

    faults: Many[str]  # the fault (or preset) replayed; () for the correct engine
    # the other prompts replayed in its batch, in batch order; [] when replayed alone
    companions: Many[int]
    explained: int  # the engine's tokens from the fork on that the replay wrote too
    # of those, the ones the correct target would not write on the engine's prefix: the evidence
    beyond: int = 0
    # the first engine token the replay did not write (None: it wrote them all)
    failed_at: int | None = None
    replay_ids: Many[int] = []  # the replay's tokens, up to and including the one at failed_at
    # the replay's round that wrote the fork token, and its slot in that round
    round: int | None = None
    slot: int | None = None
    # beyond the threshold and beyond the correct engine: the mechanism is named
    named: bool = False


class Attribution(Strict):
    """Which mechanism writes a forked engine row's tokens (forensics/attribution.py): every
    hypothesis tried, ranked."""

    fork: int
    tokens: int  # the engine's tokens from the fork on
    # of those, the ones the correct target would not write on the engine's prefix (indices)
    departing: Many[int]
    # departing tokens a hypothesis must write to be named (all of them, where there are fewer)
    threshold: int
    correct: Hypothesis  # the correct engine replayed the same ways: its best
    hypotheses: Many[Hypothesis]  # each fault's best replay, ranked best first
    # fault -> why it was not tried (it does not fit the engine's method)
    skipped: Map[str, str] = {}
    # what fresh float64 passes establish about the fork, where nothing is named
    facts: Many[str] = []
    # Every departing token is the draft model's own choice on the engine's prefix, at a fork judged
    # a bug: drafts the target rejected were kept. (Where every departing token is the draft's, no
    # mechanism is named: any accept rule that keeps refused drafts writes them; the explanation
    # says which of the catalogue's do.)
    rejected_draft_kept: bool = False
    replays: int  # replays run
    seconds: float
    explanation: str
