"""Every verdict a judge can give, declared once: its name, what it means, the evidence it rests on,
and whether it names a bug. The judges (forensics/) give only these names, to a sequence or to a
run's drafts (a sampled run's distribution test has its own three outcomes: trace/evidence.py's
Distribution); the page, the CLI, the sweep and the glossary ask here what each means. Plain data:
specs, traces and views read it without torch.

A name says what went wrong in the user's words: `sync-bug:<state>` when a state fell out of step
with the row's tokens (positions, mask, KV cache, a hybrid's recurrent state, rows mixed up, or the
kept token not the one the target's pass chose: `bonus`), `decision-bug:<decision>` when the state
was right and a decision made from it was wrong (which drafts to accept, when to stop, the penalty
applied, the log-probability reported; a sampled row's settings or random stream),
`draft-bug:<side>` when the drafts were not the drafter's own (the output unharmed, the drafts
wasted), `kernel-bug` when both were right and the computation was not; `numerics` and `unexplained`
are not bugs."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    name: str
    meaning: str  # what it says happened
    evidence: str  # what the judge needs to give it
    bug: bool = True

    @property
    def family(self) -> str:
        """The part before the colon: sync-bug, decision-bug, kernel-bug, engine-bug, sampler-bug,
        numerics, ..."""
        return self.name.split(":")[0]


_WATCHED = ("the emitting pass as the model saw it, against a fresh batch-size-1 recomputation of "
            "the row")
VERDICTS = {v.name: v for v in (
    Verdict("sync-bug:positions",
            "the row's position ids were wrong: its tokens were computed at other positions",
            f"{_WATCHED}, beyond the rounding yardstick; the positions it was fed, or its cache "
            "entries fitting their own tokens at other positions"),
    Verdict("sync-bug:mask",
            "the row's attention mask let through slots that are not its tokens, or hid some",
            f"{_WATCHED}, beyond the yardstick; the slots each verified token could see"),
    Verdict("sync-bug:kv",
            "the row's KV cache held entries of other tokens, or was cut or moved wrong",
            f"{_WATCHED}, beyond the yardstick; each cache entry replayed against a fresh "
            "prefill of the row"),
    Verdict("sync-bug:recurrent",
            "a hybrid's recurrent or convolution state held tokens that are not the row's "
            "(a rejected draft, a stale state)",
            f"{_WATCHED}, beyond the yardstick; the row's own states replayed over fresh K/V, and "
            "its own K/V over fresh states"),
    Verdict("sync-bug:state",
            "the row's state was corrupt and no single input explains it: rows mixed up, or "
            "the pass fed another token than the row's own",
            f"{_WATCHED}, beyond the yardstick; the engine's own invariant checks"),
    Verdict("sync-bug:bonus",
            "the correction or bonus token kept is not the target's own choice at the pass that "
            "chose it: taken from the draft, another row or another slot",
            "the emitting pass's own argmax at the fork, or the engine's check I4"),
    Verdict("decision-bug:accept",
            "a draft was accepted that the target's pass rejects: the accept rule itself "
            "(at temperature 0 a draft is kept only where it is the verifying pass's argmax)",
            "the verifying pass's own argmax at the fork, where the fork token is an accepted "
            "draft"),
    Verdict("decision-bug:reject",
            "a round refused a draft that the target chose, and wrote that same token in its "
            "place: the output is right and the drafts from there on are lost (the accept rule, "
            "or the count it returned); sampled, rounds that kept far fewer drafts than the rule "
            "keeps",
            "each greedy round's first refused draft against the token the round wrote there, the "
            "verify pass's own argmax where recorded, and a fresh batch-size-1 pass of the target "
            "where the run is unpenalised; the rounds specviz ran, or an engine's as it reported "
            "them; a sampled engine's rounds: its decided drafts' count against the chances "
            "min(1, p/q) of the fresh target and draft model (an exact lower tail below 0.001)"),
    Verdict("decision-bug:stop",
            "the output ran on past a stop (an end-of-sequence token, or the token completing "
            "a stop string, accepted inside a block of drafts), or stopped where the model does "
            "not",
            "the output's tokens alone: a stop followed by more tokens, or an end the reference "
            "lacks"),
    Verdict("decision-bug:penalty",
            "the token was chosen under a repetition or presence penalty that missed tokens "
            "the sequence already holds (its history lost accepted tokens, or a verify slot did "
            "not count the drafts before it)",
            "the target's float64 logits at the fork, penalised by the row's whole history, "
            "choose the reference's token; with the penalty on the engine's token lifted they "
            "choose the engine's"),
    Verdict("decision-bug:logprobs",
            "the tokens are right but their reported log-probabilities are not the "
            "target's (an accepted draft's taken from the drafter)",
            "each recorded log-probability against a fresh float64 recomputation of the target "
            "at batch size 1, penalised and tempered as the run was, beyond what rounding "
            "moves it"),
    Verdict("decision-bug:score",
            "the tokens and their log-probabilities are right but the sequence's reported score "
            "(its cumulative log-probability) is not their sum: a round's rejected drafts left in "
            "it, or its accepted ones counted twice",
            "the score the engine reports after each round against the sum of its own reported "
            "log-probabilities of the tokens so far, beyond what adding them in float32 moves it; "
            "the target's float64 sum beside them"),
    Verdict("decision-bug:counters",
            "the tokens are right but the run's counters count tokens its output does not hold: "
            "a round's whole accepted block counted before a stop trimmed it (the tokens per "
            "round, the mean acceptance length, overcount)",
            "each sequence's rounds' emitted tokens, as the run counted them, against its output's "
            "tokens"),
    Verdict("decision-bug:grammar",
            "the output broke its structured output's grammar: a token the grammar forbids "
            "there (the mask was another state's, a rejected draft kept in it, or none), or an "
            "end before the answer was whole (the request aborted)",
            "the output's tokens fed from its start to a fresh matcher of the run's JSON schema "
            "(free up to its reasoning end): the first token it refuses, or an unfinished "
            "grammar at an output's end with budget left and no stop string"),
    # A sampled run's, with per-request settings or audited (forensics/distribution.py).
    Verdict("decision-bug:settings",
            "a row was sampled with settings not its own: another request's temperature, "
            "top-k or top-p, or greedily where its temperature was unset",
            "each sequence's tokens scored under the target at batch size 1, with its own settings "
            "and with every other request's (and greedy): another's fits them a likelihood ratio "
            "beyond chance (Markov's bound, Bonferroni over sequences and settings)"),
    Verdict("decision-bug:stream",
            "a row drew random numbers that are not its own stream's: noise never written, "
            "shared with other rows, shifted by draws the schedule consumed, or one number used "
            "for two decisions (a draft drawn with the draw that decides it); its tokens then "
            "depend on its batch, or lean toward its drafts",
            "every recorded draw of a sampled run, audited or with per-request settings, "
            "re-derived from the row's own stream (its seed, or the run's seed and its sequence) "
            "at its token; audited with a draft model, each decided draft against the inverse CDF "
            "of the draft model's fresh q at each of the round's draws at its token"),
    # The acceptance judge's (forensics/acceptance.py): lossless, the output right
    # and the drafts wasted.
    Verdict("draft-bug:first-token",
            "the drafter drafted without the token the target wrote last round: its "
            "first draft repeats that token",
            "each round's drafts against a fresh pass of the draft model on the "
            "committed tokens, beyond its rounding; they match its choice one token earlier"),
    Verdict("draft-bug:rows", "each row was handed another row's drafts",
            "each round's drafts against a fresh pass of the draft model, beyond its rounding; "
            "they are its proposals for another row of the round"),
    Verdict("draft-bug:positions", "the draft model was fed position ids one off",
            "each round's drafts against a fresh pass of the draft model, beyond its rounding; "
            "a fresh pass at positions one off gives them"),
    Verdict("draft-bug:window",
            "the draft model's sliding-window layers attended past their window (run as full "
            "attention): its drafts part from its own past the window",
            "each round's drafts against a fresh pass of the draft model, beyond its rounding; the "
            "same pass with its window removed gives them, and the acceptance by context length "
            "falls past the window"),
    Verdict("draft-bug:hidden",
            "a draft head was fed the target's hidden states of other slots (one off)",
            "each round's drafts against the head replayed from a fresh pass of the target, beyond "
            "rounding; replayed from the hidden states one slot earlier, it gives them"),
    Verdict("draft-bug:features",
            "a published head was fed the wrong features: aux layers other than its config's, or "
            "its norm before fc flipped",
            "each round's drafts against the head replayed from a fresh pass of the target, beyond "
            "rounding; the head replayed so fed gives them"),
    Verdict("draft-bug:vocabulary",
            "a published head's draft ids were mapped to the wrong target ids (its d2t read as "
            "ids, or dropped)",
            "each round's drafts against the head replayed from a fresh pass of the target, beyond "
            "rounding; the head replayed with its map so read gives them"),
    Verdict("draft-bug:cache", "the drafter's own state (its cache, or what it was fed) was wrong",
            "each round's drafts against a fresh pass of the draft model, beyond its rounding, and "
            "no simpler hypothesis gives them"),
    Verdict("draft-bug:acceptance",
            "an engine accepted fewer of its drafts than its draft model's own proposals "
            "would have had: its drafter went wrong on a side not seen from outside (or, where "
            "it reports no rounds, its decisions refused drafts the target chose)",
            "the engine's own counters (drafts offered and accepted) against the draft model's "
            "fresh proposals on the engine's output, its rounds replayed at k, short beyond "
            "chance"),
    Verdict("kernel-bug",
            "every input of the pass was right and it still computes logits the model does not: "
            "the batched verify computation",
            "the pass rebuilt from correct inputs departs from a fresh one beyond rounding, in the "
            "run's dtype or in float64"),
    Verdict("engine-bug",
            "another engine wrote a token the target would not, beyond that engine's own rounding",
            "its output teacher-forced through the target in float64, against its rounding "
            "measured on its control run (the same engine without speculation)"),
    Verdict("sampler-bug:decisions",
            "accept/reject decisions do not follow the sampler's own recorded p, q and draw",
            "every decision re-derived from its record"),
    Verdict("sampler-bug:proposal",
            "a draft was not drawn from the q its decision reads: the decision divided by "
            "another distribution (the draft model's unprocessed logits, another precision)",
            "each decided draft's recorded q, and the draft itself at its row's own draft draw, "
            "against a fresh batch-size-1 pass of the draft model under the run's draft settings, "
            "beyond the draft's rounding"),
    Verdict("sampler-bug:rule",
            "every state and decision held, yet the tokens are not the target's "
            "distribution: the sampling rule itself",
            "the state audit of every row, the decision audit and the distribution test"),
    Verdict("numerics",
            "a near-tie that floating point tipped: both tokens are right within rounding",
            "a clean state, and the float64 gap at the fork within what rounding flips", bug=False),
    Verdict("unexplained", "the evidence cannot decide; the explanation says what is missing",
            "whatever would decide it", bug=False),
)}
OWN_DRAFTS = "the draft model's own"  # the acceptance judge's finding where there is no draft-bug


def verdict(name: str) -> Verdict:
    """The declaration of `name`; a name no judge gives (a sweep report written by another version:
    a trace refuses one) is never a bug."""
    return VERDICTS.get(name) or Verdict(name, "not a verdict specviz gives", "", bug=False)


def state_bug(name: str) -> bool:
    """A state that fell out of step, or a decision made wrong from a right one: batching alone
    causes neither (no batching-noise check needed)."""
    v = verdict(name)
    return v.bug and v.family in ("sync-bug", "decision-bug")
