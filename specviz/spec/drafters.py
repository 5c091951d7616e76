"""The drafters, declared once: what proposes a round's drafts, the state it keeps, what it costs,
the run settings it reads and what it hears of the verify pass.

Plain data, as spec/methods.py's methods are: the spec validates against these declarations, and the
CLI, the page, the trace views, the sweep and the judges ask them instead of a drafter's name. How
each one drafts is decoding/drafters.py's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def ngrams(spec) -> str:
    """A lookup run's n-gram sizes: "3", or "1–3"."""
    return (str(spec.ngram_min) if spec.ngram_min == spec.ngram_max
            else f"{spec.ngram_min}–{spec.ngram_max}")


@dataclass(frozen=True)
class DrafterKind:
    name: str
    summary: str
    noun: str  # what drafts, in words: "the draft model"
    # drafts with the pair's draft model: its drafts can be replayed (the acceptance judge), and the
    # faults of a draft model's passes apply
    draft_model: bool
    # keeps a cache laid out like the target's, one slot shorter (the trace's draft KV lane)
    cache: bool
    passes_per_draft: int  # forward passes of its own model per draft (0: it runs none)
    # the RunSpec fields it reads; a run of another drafter leaves them at default
    options: tuple[str, ...] = ()
    setting: Callable[..., str] | None = None  # (spec) -> its options in words
    # (spec) -> why it offered a row nothing (None: it always drafts)
    empty: Callable[..., str] | None = None
    # what of the verify pass it observes: "hidden", the target's last hidden states
    hears: tuple[str, ...] = ()
    # transformers' assisted generation drafts as it does (the hf-assisted cross-check)
    in_transformers: bool = True
    # engines draft with it as specviz reads it (a draft model, a published head's files, the
    # target's MTP layer): an engine check may declare it, and its drafts are replayed
    engines_run: bool = False

    @property
    def trees(self) -> bool:
        """It can propose several candidates per position (a token tree, run setting tree_width),
        not only a chain."""
        return "tree_width" in self.options

    def words(self, spec) -> str:
        """What drafted a run, in words: "the draft model", "prompt lookup (n-grams 1–3,
        no draft model)"."""
        notes = [*([self.setting(spec)] if self.setting else []),
                 *([] if self.draft_model else ["no draft model"]),
                 *([f"trees {spec.tree_width} wide"] if getattr(spec, "tree_width", 1) > 1 else [])]
        return self.noun + (f" ({', '.join(notes)})" if notes else "")

    def draft_passes(self, k: int) -> int:
        """Its forward passes in a round of k drafts."""
        return self.passes_per_draft * k


def _from_folder(spec) -> str:
    return f"from {spec.head}"


def _no_hidden_state_yet(spec) -> str:
    return ("had no hidden state of the target to draft from yet: the target's first pass over a "
            "batch computes them")


# what every published head's drafter is: a head from its folder, which engines run as well
_PUBLISHED_HEAD = dict(draft_model=False, cache=True, passes_per_draft=1,
                       options=("head", "tree_width"), setting=_from_folder, hears=("hidden",),
                       in_transformers=False, empty=_no_hidden_state_yet, engines_run=True)
DRAFTERS: dict[str, DrafterKind] = {d.name: d for d in (
    DrafterKind(
        "model",
        "the draft model, one forward pass per draft; in a tree, the likeliest other tokens of "
        "each draft's distribution beside it",
        "the draft model", draft_model=True, cache=True, passes_per_draft=1,
        options=("tree_width",), engines_run=True),
    DrafterKind(
        "lookup",
        "prompt lookup: the tokens that followed the last n-gram's earliest earlier occurrence; "
        "no model; in a tree, the tokens after its next earliest occurrences too",
        "prompt lookup", draft_model=False, cache=False, passes_per_draft=0,
        options=("ngram_min", "ngram_max", "tree_width"),
        setting=lambda spec: f"n-grams {ngrams(spec)}",
        empty=lambda spec: f"found no earlier occurrence of its last n-gram, n {ngrams(spec)}"),
    DrafterKind(
        "eagle",
        "an EAGLE-style head: a small decoder over the target's own last hidden state and the next "
        "token's embedding, one pass per draft; for the embedded pair, one layer trained on this "
        "machine (specviz train-head, once); for the tiny pair, untrained copies of its first "
        "layers, which show how a head's state is kept, not a trained head's speed-up",
        "an EAGLE-style head",
        draft_model=False, cache=True, passes_per_draft=1, options=("tree_width",),
        hears=("hidden",), in_transformers=False, empty=_no_hidden_state_yet),
    DrafterKind(
        "eagle1",
        "a published EAGLE-1 head, from its folder (the layout vLLM loads for its eagle method): "
        "decoder layers over the target's last hidden state mixed with the next token's "
        "embedding, read by the target's output head, one pass per draft",
        "an EAGLE-1 head",
        **_PUBLISHED_HEAD),
    DrafterKind(
        "eagle3",
        "a published EAGLE-3 head, from its folder (the layout vLLM and SGLang load): one layer "
        "over several of the target's layers' hidden states (its config's aux layers, else the "
        "engines' default 2, L/2, L-3) and the next token's embedding, one pass per draft, over "
        "its own draft vocabulary (d2t)",
        "an EAGLE-3 head",
        **_PUBLISHED_HEAD),
    DrafterKind(
        "mtp",
        "the target's own multi-token-prediction (MTP) layer, which its checkpoint ships "
        "(DeepSeek-V3, GLM-4.5, Mellum, Ling's hybrids, loaded by transformers' MtpModel; MiMo, "
        "read as vLLM reads it): fed the target's last hidden state and the next token, one pass "
        "per draft, then its own output",
        "the model's MTP layer",
        draft_model=False, cache=True, passes_per_draft=1, options=("tree_width",),
        hears=("hidden",), empty=_no_hidden_state_yet, engines_run=True),
)}
DEFAULT_DRAFTER = "model"
# what an engine may say it drafts with, whose own drafts the engine acceptance judge replays on its
# outputs
JUDGED_DRAFTERS = {n: d for n, d in DRAFTERS.items() if d.engines_run}
DRAFTER_OPTIONS = tuple(dict.fromkeys(f for d in DRAFTERS.values() for f in d.options))


def reading(option: str) -> list[str]:
    """The drafters that read a RunSpec field."""
    return [name for name, d in DRAFTERS.items() if option in d.options]
