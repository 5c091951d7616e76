"""The fault catalogue, declared once: one record per fault, with its name, kind, description, the
field threads it cites, the verdict its forks get, what the acceptance judge names its drafts, and
what it needs of a run to act (its kind's needs and any of its own: spec/fits.py). The presets, and
every group of faults a reader asks for, are computed from the records.

A fault's field case, where it has one, is spec/casebook.py's card for it (`BY_FAULT[name]`: what
the users saw, the replica's run). Its behaviour is decoding/faults.py's `Policy`, the one module
besides this one that names a fault (tests/test_fault_records.py checks it). Plain data: a RunSpec
checks its fault names here, so specs and trace files validate without torch.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specviz.spec.fits import FAULT_KINDS, NEEDS
from specviz.spec.threads import Thread


@dataclass(frozen=True)
class Fault:
    name: str
    kind: str  # a name of spec/fits.py's FAULT_KINDS
    description: str  # what it does, and where the field met it
    # The verdict (spec/verdicts.py) its forks get: the state it puts out of step, or the decision
    # it gets wrong (a sampled run's faults: where the sampled-run judges can name it).
    verdict: str | None = None
    acceptance: str | None = None  # what the acceptance judge names its drafts (a lossless fault)
    also_needs: tuple[str, ...] = ()  # needs beyond its kind's: the drafter whose passes it breaks
    threads: tuple[Thread, ...] = ()  # the field's issues and pull requests it replays

    @property
    def needs(self) -> tuple[str, ...]:
        """What a run needs for it to act (names of spec/fits.py's NEEDS)."""
        return FAULT_KINDS[self.kind].needs + self.also_needs

    @property
    def changes_tokens(self) -> bool:
        """Whether it changes a greedy row's tokens (else it wastes drafts, or changes samples or
        log-probabilities only)."""
        return FAULT_KINDS[self.kind].changes_tokens

    def unfit_reason(self, has: Mapping[str, bool]) -> str | None:
        """Why it cannot act on a run, judged on the facts `has` gives (need -> whether the run has
        it); None where it fits them. A need `has` leaves out is not judged here."""
        return next((NEEDS[n] for n in self.needs if not has.get(n, True)), None)


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("positions-from-slots", "breaking",
          "position ids from the slot index, counting pads and stale slots (the paper's BSP; vLLM "
          "PR #10350 dropped a per-row position offset alike)",
          verdict="sync-bug:positions", threads=(Thread("vLLM", 10350),)),
    Fault("no-mask", "breaking",
          "no padding mask: pads and stale slots are attended",
          verdict="sync-bug:mask"),
    Fault("draft-bonus", "breaking",
          "the correction/bonus token comes from the draft, not the target",
          verdict="sync-bug:bonus"),
    Fault("no-kv-shift", "breaking",
          "tokens are realigned but the KV cache is not moved when a row's padding changes",
          verdict="sync-bug:kv"),
    Fault("min-crop", "breaking",
          "every row's cache is cropped to the batch-minimum accepted length; tokens are kept",
          verdict="sync-bug:kv"),
    Fault("verify-positions-not-advanced", "breaking",
          "every slot of a verify window gets the window's first position (oMLX PR #2363: each "
          "row's start offset broadcast across the window; the keys committed to the cache "
          "mis-rotated)",
          verdict="sync-bug:positions", threads=(Thread("oMLX", 2363),)),
    Fault("bonus-from-another-row", "breaking",
          "the token after a row's accepted drafts is another row's target choice (openvino.genai "
          "#4190: the recovered token read from the wrong row)",
          verdict="sync-bug:bonus",
          threads=(Thread("openvino.genai", 4190, pr=False), Thread("openvino.genai", 4490))),
    Fault("keep-rejected-kv", "wasteful",
          "rejected drafts stay in the cache as masked stale slots"),
    Fault("growing-padding", "wasteful",
          "padding is only ever added, never removed"),
    Fault("right-padding", "wasteful",
          "prompts are padded on the right (the pad block sits after the prompt)"),
    Fault("rollback-by-draft-list", "ragged",
          "a row's cache is rolled back by the batch's draft list less its accepted drafts, not by "
          "the drafts it was offered: a row offered fewer loses that many committed entries (Atlas "
          "PR #699: the rewind was sized by the pending draft list, erasing tokens the forward "
          "never added)",
          verdict="sync-bug:kv", threads=(Thread("Atlas", 699),)),
    Fault("accept-on-raw-softmax", "greedy",
          "at temperature 0 each argmax draft is accepted with probability min(1, p/q) of the "
          "untempered softmaxes, not when it is the target's argmax (jaymody/speculative-sampling "
          "#3; mistral.rs PR #2424)",
          verdict="decision-bug:accept",
          threads=(Thread("speculative-sampling", 3, pr=False),
                   Thread("speculative-sampling", 4),
                   Thread("mistral.rs", 2424))),
    Fault("state-not-rolled-back", "recurrent",
          "a recurrent state is not rolled back after rejected drafts: every drafted token stays "
          "in it (mlx-lm PR #1109: a rollback that was a no-op)",
          verdict="sync-bug:recurrent",
          threads=(Thread("mlx-lm", 1109), Thread("mlx-lm", 846, pr=False))),
    Fault("state-after-zero-draft", "recurrent",
          "a row offered no drafts reads its recurrent state from before the last round's accepted "
          "drafts (vLLM #39273: the decode path's stale column)",
          verdict="sync-bug:recurrent",
          threads=(Thread("vLLM", 39273, pr=False),
                   Thread("vLLM", 40738),
                   Thread("SGLang", 26351))),
    Fault("conv-state-off-by-one", "recurrent",
          "a recurrent layer's convolution state is rolled back one position late: a rejected "
          "draft stays in its window; the scan's state is right",
          verdict="sync-bug:recurrent"),
    Fault("window-full-keeps-rejected", "window",
          "once a row holds a window of tokens, the drafts it rejects are never rolled back: they "
          "stay in its window, seen by every later token (mlx-lm #1423, PR #1427: a full rotating "
          "cache cannot be trimmed)",
          verdict="sync-bug:kv",
          threads=(Thread("mlx-lm", 1423, pr=False), Thread("mlx-lm", 1427))),
    Fault("stop-at-last-token", "stop",
          "the stop check looks only at the last token a round keeps: an end-of-sequence token "
          "accepted mid-block is written and decoding goes on; a stop string is seen only after "
          "the whole block is kept (transformers #47912, PRs #47931 and #48981; koboldcpp #1276)",
          verdict="decision-bug:stop",
          threads=(Thread("transformers", 47912, pr=False),
                   Thread("transformers", 47931),
                   Thread("transformers", 48981),
                   Thread("koboldcpp", 1276, pr=False))),
    Fault("penalty-history-last-token", "penalty",
          "the penalty history gains only the last token of each round, and every verify slot is "
          "penalised by the round-start history, without the drafts before it (SGLang PR #33643: "
          "only output_ids[-1] fed per step; #28180, TensorRT-LLM PR #17701: penalties ignored)",
          verdict="decision-bug:penalty",
          threads=(Thread("SGLang", 33643),
                   Thread("SGLang", 28180, pr=False),
                   Thread("TensorRT-LLM", 17701))),
    Fault("logprobs-from-draft", "logprobs",
          "an accepted draft's log-probability is the drafter's own, not the target's (llama.cpp "
          "#27972, PR #27196: 0.0 for every drafted token, as prompt lookup's point mass gives "
          "here; vLLM #17876, #53488)",
          verdict="decision-bug:logprobs",
          threads=(Thread("llama.cpp", 27972, pr=False),
                   Thread("llama.cpp", 27196),
                   Thread("vLLM", 53488, pr=False),
                   Thread("vLLM", 17876, pr=False))),
    Fault("draft-positions-off-by-one", "lossless",
          "the draft model's passes over its cache are fed positions one ahead of its prefill's "
          "(SGLang PR #25015: the draft positions were advanced before each draft pass, not after)",
          acceptance="draft-bug:positions", also_needs=("draft-model",),
          threads=(Thread("SGLang", 25015),)),
    Fault("drafts-to-another-row", "lossless",
          "each row verifies the drafts proposed for the row before it (vLLM PR #43434: the "
          "row-to-draft mapping stale after the batch was reordered)",
          acceptance="draft-bug:rows",
          threads=(Thread("vLLM", 43434), Thread("TensorRT-LLM", 7803))),
    Fault("draft-misses-target-token", "lossless",
          "the drafter drafts before it has fed the token the target wrote last round (its "
          "correction or bonus): it proposes that token again (vllm-metal PR #721, after prefill "
          "only: 65% acceptance with draft = target, 98% fixed)",
          acceptance="draft-bug:first-token", also_needs=("draft-model",),
          threads=(Thread("vllm-metal", 721),)),
    Fault("head-hidden-off-by-one", "lossless",
          "a draft head is fed, at each slot, the target's hidden state two slots back instead of "
          "the one before (vLLM #14647, PR #14464: EAGLE's first input token not removed, an input "
          "shift of one; 25% of acceptance lost)",
          acceptance="draft-bug:hidden", also_needs=("hidden",),
          threads=(Thread("vLLM", 14647, pr=False), Thread("vLLM", 14464))),
    Fault("head-keeps-own-guesses", "lossless",
          "a draft head never re-feeds the slots of the drafts a row accepted: their cache entries "
          "stay computed from its own guesses of the target's hidden states (vLLM #14649: "
          "approximated hidden states never overwritten, 8-15% of acceptance length lost)",
          acceptance="draft-bug:cache", also_needs=("hidden",),
          threads=(Thread("vLLM", 14649, pr=False),)),
    Fault("tree-siblings-visible", "tree",
          "a tree's nodes are verified under a chain's causal mask: each sees every node listed "
          "before it, its siblings' branches too, not its ancestors only",
          verdict="sync-bug:mask"),
    Fault("tree-positions-by-index", "tree",
          "a tree's nodes are fed positions by their index in the tree, as a chain's, not by their "
          "depth",
          verdict="sync-bug:positions"),
    Fault("tree-rejected-branch-kept", "tree",
          "the accepted path is not compacted in the cache: the slots after the root keep the "
          "nodes fed there, a refused branch's K/V among them",
          verdict="sync-bug:kv"),
    Fault("tree-bonus-by-index", "tree",
          "the token after an accepted path is chosen at the node listed at the path's length, as "
          "a chain's is, not at the path's last node",
          verdict="sync-bug:bonus"),
    Fault("residual-from-draft", "sampling",
          "after a rejection the token is drawn from the draft's q, not the residual"),
    Fault("residual-unclamped", "sampling",
          "the residual is p - q without max(0, .)"),
    Fault("residual-unnormalised", "sampling",
          "the residual max(0, p - q) is drawn from without renormalising it"),
    Fault("accept-q-over-p", "sampling",
          "a draft is accepted with probability min(1, q/p) instead of min(1, p/q)"),
    Fault("temperature-draft-only", "sampling",
          "temperature is applied to the draft only: the target verifies at 1"),
    Fault("top-p-not-in-residual", "sampling",
          "top-k and top-p truncate p for acceptance but not in the residual"),
    Fault("shared-stream", "sampling",
          "every row draws the same random numbers, one stream for the batch (TensorRT-LLM #19487: "
          "unseeded requests shared one stream)",
          verdict="decision-bug:stream",
          threads=(Thread("TensorRT-LLM", 19487, pr=False), Thread("TensorRT-LLM", 17599))),
    Fault("target-probs-mutated", "sampling",
          "the drafts' p is zeroed in place when the residual is built, before the drafts are "
          "decided: every draft is rejected (vllm-ascend PR #2881, vLLM PR #30846: the target's "
          "probabilities altered before they were cloned)",
          verdict="sampler-bug:rule",
          threads=(Thread("vllm-ascend", 2881), Thread("vLLM", 30846))),
    Fault("settings-from-first-row", "requests",
          "the verify samples every row with the batch's first row's temperature, top-k and top-p "
          "(sglang-jax PRs #1293 and #1389: request 0's params broadcast to the batch)",
          verdict="decision-bug:settings",
          threads=(Thread("sglang-jax", 1293), Thread("sglang-jax", 1389))),
    Fault("unset-temperature-greedy", "requests",
          "a request that left its temperature unset is verified greedily, not at the default 1.0 "
          "(TensorRT-LLM PR #19390: the greedy sentinel for every unset temperature)",
          verdict="decision-bug:settings", threads=(Thread("TensorRT-LLM", 19390),)),
    Fault("unseeded-noise-to-copy", "requests",
          "in a batch that mixes seeded and unseeded requests, the unseeded rows' verify noise is "
          "written to a copy and never reaches them: they draw 0 (vLLM #9441 and #11123, PR "
          "#10863: advanced indexing wrote a copy)",
          verdict="decision-bug:stream",
          threads=(Thread("vLLM", 9441, pr=False),
                   Thread("vLLM", 11123, pr=False),
                   Thread("vLLM", 10863))),
    Fault("stream-advanced-for-zero-draft", "streams",
          "a row offered no drafts, in a round that verifies drafts, still advances its random "
          "stream: its later draws shift with the schedule (vllm-ascend #13608; vLLM #6038, PR "
          "#6034)",
          verdict="decision-bug:stream",
          threads=(Thread("vllm-ascend", 13608, pr=False),
                   Thread("vLLM", 6038, pr=False),
                   Thread("vLLM", 6034))),
)}
FAULT_PRESETS = {
    "bsp-like": ("positions-from-slots", "keep-rejected-kv", "right-padding"),
    "dsd-like": ("no-mask", "growing-padding", "draft-bonus"),
}


def of_kind(*kinds: str) -> tuple[str, ...]:
    """The faults of `kinds`, in catalogue order."""
    return tuple(name for name, f in FAULTS.items() if f.kind in kinds)


def needing(need: str, names: tuple[str, ...] | list[str] | None = None) -> tuple[str, ...]:
    """The faults that act only where a run has `need` (a name of spec/fits.py's NEEDS), in
    catalogue order: of `names` (presets expanded), or of the whole catalogue."""
    among = FAULTS if names is None else expand(names)
    return tuple(name for name in among if need in FAULTS[name].needs)


def expand(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Presets expanded, duplicates removed, in catalogue order; unknown names raise ValueError."""
    out = set()
    for n in names:
        if n in FAULT_PRESETS:
            out.update(FAULT_PRESETS[n])
        elif n in FAULTS:
            out.add(n)
        else:
            known = ', '.join([*FAULTS, *FAULT_PRESETS])
            raise ValueError(f"unknown fault {n!r}; choose from {known}")
    return tuple(f for f in FAULTS if f in out)
