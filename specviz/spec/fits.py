"""What a fault fits: the kinds of fault, what a run needs for a fault of each kind to act, and why
a fault is unfit for a run that lacks a need. A fault's record (spec/faults.py) names its kind and
any need of its own (the drafter it breaks); RunSpec's validation and attribution's "what fits
this engine" ask the records, never a fault's name. Plain data: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

# need -> why a fault that needs it is unfit for a run without it (attribution's skipped faults say
# this; RunSpec's validation says it in its own words, with what to set instead)
NEEDS = {
    "greedy": "the run samples (temperature above 0)",
    "sampled": "the run is greedy (temperature 0)",
    "rows": "the run sets no per-request sampling settings (rows)",
    "tree": "the run drafts chains (tree_width 1)",
    "draft-model": "the drafter runs no draft model",  # spec/drafters.py's `draft_model`
    "hidden": "the drafter hears no hidden state",  # "hidden" in a drafter's `hears`
    "published-head": "the drafter drafts with no published head",  # "head" in its options
    "recurrent": "the target keeps no recurrent state",
    "window": "the target has no sliding window",
    "draft-window": "the draft model has no sliding window",
    "penalty": "the check sets no repetition or presence penalty",
    "logprobs": "the run records no log-probabilities",
    "stop": "the model never stops",  # an end-of-sequence token, or a stop string
    "grammar": "the run sets no grammar (a JSON schema)",
    "reasoning": "the run sets no reasoning end",
    "paged": "the run keeps its caches contiguous (no KV block size)",
    "prefix-cached": "the run caches no prefix (prefix caching off)",
}


@dataclass(frozen=True)
class FaultKind:
    name: str
    changes_tokens: bool  # changes a greedy row's tokens (else it wastes drafts, or changes samples
    #                       or log-probabilities only)
    needs: tuple[str, ...] = ()  # names of NEEDS: what a run needs for its faults to act


FAULT_KINDS = {k.name: k for k in (
    FaultKind("breaking", True),
    # Breaking only where a row is offered fewer drafts than the batch's widest (prompt lookup, or a
    # row near its budget): a draft model offers every row k.
    FaultKind("ragged", True),
    # Breaking at temperature 0 only (refused when sampling: it breaks greedy acceptance).
    FaultKind("greedy", True, ("greedy",)),
    # Breaking on a hybrid's recurrent states (Gated DeltaNet, Mamba, short convolutions).
    FaultKind("recurrent", True, ("recurrent",)),
    # Breaking on a model with a sliding window, once a row holds a window of tokens.
    FaultKind("window", True, ("window",)),
    # Breaking where a row's end-of-sequence token, or the token completing a stop string, is
    # accepted inside a block of drafts.
    FaultKind("stop", True, ("stop",)),
    FaultKind("penalty", True, ("penalty",)),  # a repetition or presence penalty set
    # Breaking a structured output's grammar (decoding/grammar.py): its masks, or its state.
    FaultKind("grammar", True, ("grammar",)),
    # Breaking where a row accepts a token tree's branch other than its first (decoding/trees.py).
    FaultKind("tree", True, ("tree",)),
    # Breaking on a paged cache (a KV block size), once a pass writes across a block boundary.
    FaultKind("paged", True, ("paged",)),
    # Breaking under prefix caching, where a request hits blocks an earlier batch's request left.
    FaultKind("prefix", True, ("paged", "prefix-cached")),
    FaultKind("wasteful", False),
    # Greedy runs only: the output stays right and drafts the target chose are refused (the
    # rejections judge, forensics/rejections.py, names the decisions).
    FaultKind("rejecting", False, ("greedy",)),
    # The target verifies every draft, so the output stays right and only the drafts are wasted (the
    # acceptance judge, forensics/acceptance.py, names them).
    FaultKind("lossless", False),
    # Breaking only the recorded log-probabilities: the tokens stay right.
    FaultKind("logprobs", False, ("logprobs",)),
    # Breaking only the run's counters of the tokens a round kept, where a stop trims a round's
    # block: the tokens stay right.
    FaultKind("counters", False, ("stop",)),
    # The text stays fluent, only the distribution is wrong.
    FaultKind("sampling", False, ("sampled",)),
    # A row sampled with settings or noise that are not its own (a run with per-request settings).
    FaultKind("requests", False, ("sampled", "rows")),
    # The distribution stays right; only a row's draws, checked against its own stream, show it.
    FaultKind("streams", False, ("sampled",)),
)}
