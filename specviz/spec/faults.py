"""The fault catalogue: every fault's name, kind and description, the presets, and the verdict each fault that
breaks equivalence gets (the state it puts out of step, or the decision it gets wrong). Plain data, kept apart
from the engine's side of the faults (decoding/faults.py, torch): a RunSpec checks its fault names here, so specs
and trace files validate without torch.
"""
from __future__ import annotations

# name -> (kind, what it does)
FAULTS = {
    "positions-from-slots": ("breaking", "position ids from the slot index, counting pads and stale slots (the "
                                         "paper's BSP; vLLM PR #10350 dropped a per-row position offset alike)"),
    "no-mask": ("breaking", "no padding mask: pads and stale slots are attended"),
    "draft-bonus": ("breaking", "the correction/bonus token comes from the draft, not the target"),
    "no-kv-shift": ("breaking", "tokens are realigned but the KV cache is not moved when a row's padding changes"),
    "min-crop": ("breaking", "every row's cache is cropped to the batch-minimum accepted length; tokens are kept"),
    "verify-positions-not-advanced": ("breaking", "every slot of a verify window gets the window's first position "
                                                  "(oMLX PR #2363: each row's start offset broadcast across the "
                                                  "window; the keys committed to the cache mis-rotated)"),
    "bonus-from-another-row": ("breaking", "the token after a row's accepted drafts is another row's target choice "
                                           "(openvino.genai #4190: the recovered token read from the wrong row)"),
    "keep-rejected-kv": ("wasteful", "rejected drafts stay in the cache as masked stale slots"),
    "growing-padding": ("wasteful", "padding is only ever added, never removed"),
    "right-padding": ("wasteful", "prompts are padded on the right (the pad block sits after the prompt)"),
    # Breaking only where a row is offered fewer drafts than the batch's widest (prompt lookup, or a row near its
    # budget): a draft model offers every row k.
    "rollback-by-draft-list": ("ragged", "a row's cache is rolled back by the batch's draft list less its accepted "
                                         "drafts, not by the drafts it was offered: a row offered fewer loses that "
                                         "many committed entries (Atlas PR #699: the rewind was sized by the pending "
                                         "draft list, erasing tokens the forward never added)"),
    # Breaking at temperature 0 only (refused when sampling: the rule it breaks is greedy acceptance).
    "accept-on-raw-softmax": ("greedy", "at temperature 0 each argmax draft is accepted with probability min(1, p/q) "
                                        "of the untempered softmaxes, not when it is the target's argmax "
                                        "(jaymody/speculative-sampling #3; mistral.rs PR #2424)"),
    # Breaking on a hybrid's recurrent states (Gated DeltaNet, Mamba, short convolutions); nothing on other models.
    "state-not-rolled-back": ("recurrent", "a recurrent state is not rolled back after rejected drafts: every drafted "
                                           "token stays in it (mlx-lm PR #1109: a rollback that was a no-op)"),
    "state-after-zero-draft": ("recurrent", "a row offered no drafts reads its recurrent state from before the last "
                                            "round's accepted drafts (vLLM #39273: the decode path's stale column)"),
    "conv-state-off-by-one": ("recurrent", "a recurrent layer's convolution state is rolled back one position late: "
                                           "a rejected draft stays in its window; the scan's state is right"),
    # Breaking on a model with a sliding window, once a row holds a window of tokens; nothing before, or on others.
    "window-full-keeps-rejected": ("window", "once a row holds a window of tokens, the drafts it rejects are never "
                                             "rolled back: they stay in its window, seen by every later token (mlx-lm "
                                             "#1423, PR #1427: a full rotating cache cannot be trimmed)"),
    # Breaking where a row's end-of-sequence token, or the token completing a stop string, is accepted inside a
    # block of drafts (a model that stops).
    "stop-at-last-token": ("stop", "the stop check looks only at the last token a round keeps: an end-of-sequence "
                                   "token accepted mid-block is written and decoding goes on; a stop string is "
                                   "seen only after the whole block is kept (transformers #47912, PRs #47931 and "
                                   "#48981; koboldcpp #1276)"),
    # Breaking where a repetition or presence penalty is set (decoding/penalties.py).
    "penalty-history-last-token": ("penalty", "the penalty history gains only the last token of each round, and every "
                                              "verify slot is penalised by the round-start history, without the "
                                              "drafts before it (SGLang PR #33643: only output_ids[-1] fed per "
                                              "step; #28180, TensorRT-LLM PR #17701: penalties ignored)"),
    # Breaking only the recorded log-probabilities (a run with logprobs): its tokens stay right.
    "logprobs-from-draft": ("logprobs", "an accepted draft's log-probability is the drafter's own, not the target's "
                                        "(llama.cpp #27972, PR #27196: 0.0 for every drafted token, as prompt "
                                        "lookup's point mass gives here; vLLM #17876, #53488)"),
    # Lossless: the target verifies every draft, so the output stays right and only the drafts are wasted (the
    # acceptance judge, forensics/acceptance.py, names them). Draft model only.
    "draft-positions-off-by-one": ("lossless", "the draft model's passes over its cache are fed positions one "
                                               "ahead of its prefill's (SGLang PR #25015: the draft positions were "
                                               "advanced before each draft pass, not after)"),
    "drafts-to-another-row": ("lossless", "each row verifies the drafts proposed for the row before it (vLLM PR "
                                          "#43434: the row-to-draft mapping stale after the batch was reordered)"),
    "draft-misses-target-token": ("lossless", "the drafter drafts before it has fed the token the target wrote last "
                                              "round (its correction or bonus): it proposes that token again "
                                              "(vllm-metal PR #721, after prefill only: 65% acceptance with draft "
                                              "= target, 98% fixed)"),
    "head-hidden-off-by-one": ("lossless", "a draft head is fed, at each slot, the target's hidden state two slots back "
                                           "instead of the one before (vLLM #14647, PR #14464: EAGLE's first input "
                                           "token not removed, an input shift of one; 25% of acceptance lost)"),
    "head-keeps-own-guesses": ("lossless", "a draft head never re-feeds the slots of the drafts a row accepted: their "
                                           "cache entries stay computed from its own guesses of the target's hidden "
                                           "states (vLLM #14649: approximated hidden states never overwritten, 8-15% "
                                           "of acceptance length lost)"),
    # Breaking where a row accepts a token tree's branch other than its first (a tree wider than 1, decoding/trees.py).
    "tree-siblings-visible": ("tree", "a tree's nodes are verified under a chain's causal mask: each sees every node "
                                      "listed before it, its siblings' branches too, not its ancestors only"),
    "tree-positions-by-index": ("tree", "a tree's nodes are fed positions by their index in the tree, as a chain's, "
                                        "not by their depth"),
    "tree-rejected-branch-kept": ("tree", "the accepted path is not compacted in the cache: the slots after the root "
                                          "keep the nodes fed there, a refused branch's K/V among them"),
    "tree-bonus-by-index": ("tree", "the token after an accepted path is chosen at the node listed at the path's "
                                    "length, as a chain's is, not at the path's last node"),
    # Sampling faults (temperature > 0): the text stays fluent, only the distribution is wrong.
    "residual-from-draft": ("sampling", "after a rejection the token is drawn from the draft's q, not the residual"),
    "residual-unclamped": ("sampling", "the residual is p - q without max(0, .)"),
    "residual-unnormalised": ("sampling", "the residual max(0, p - q) is drawn from without renormalising it"),
    "accept-q-over-p": ("sampling", "a draft is accepted with probability min(1, q/p) instead of min(1, p/q)"),
    "temperature-draft-only": ("sampling", "temperature is applied to the draft only: the target verifies at 1"),
    "top-p-not-in-residual": ("sampling", "top-k and top-p truncate p for acceptance but not in the residual"),
    "shared-stream": ("sampling", "every row draws the same random numbers, one stream for the batch (TensorRT-LLM "
                                  "#19487: unseeded requests shared one stream)"),
    "target-probs-mutated": ("sampling", "the drafts' p is zeroed in place when the residual is built, before the "
                                         "drafts are decided: every draft is rejected (vllm-ascend PR #2881, vLLM PR "
                                         "#30846: the target's probabilities altered before they were cloned)"),
    # Per-request sampling (a run with per-request settings, `rows`): a row sampled with settings or noise that are
    # not its own.
    "settings-from-first-row": ("requests", "the verify samples every row with the batch's first row's temperature, "
                                            "top-k and top-p (sglang-jax PRs #1293 and #1389: request 0's params "
                                            "broadcast to the batch)"),
    "unset-temperature-greedy": ("requests", "a request that left its temperature unset is verified greedily, not "
                                             "at the default 1.0 (TensorRT-LLM PR #19390: the greedy sentinel for "
                                             "every unset temperature)"),
    "unseeded-noise-to-copy": ("requests", "in a batch that mixes seeded and unseeded requests, the unseeded rows' "
                                           "verify noise is written to a copy and never reaches them: they draw 0 "
                                           "(vLLM #9441 and #11123, PR #10863: advanced indexing wrote a copy)"),
    # The distribution stays right; only a row's draws, checked against its own stream, show it.
    "stream-advanced-for-zero-draft": ("streams", "a row offered no drafts, in a round that verifies drafts, still "
                                                  "advances its random stream: its later draws shift with the "
                                                  "schedule (vllm-ascend #13608; vLLM #6038, PR #6034)"),
}
SAMPLING = tuple(f for f, (kind, _) in FAULTS.items() if kind == "sampling")
GREEDY_ONLY = tuple(f for f, (kind, _) in FAULTS.items() if kind == "greedy")
REQUESTS = tuple(f for f, (kind, _) in FAULTS.items() if kind == "requests")
SAMPLED = tuple(f for f, (kind, _) in FAULTS.items() if kind in ("sampling", "requests", "streams"))  # temperature > 0
PRESETS = {
    "bsp-like": ("positions-from-slots", "keep-rejected-kv", "right-padding"),
    "dsd-like": ("no-mask", "growing-padding", "draft-bonus"),
}
# The verdict (spec/verdicts.py) each fault that breaks equivalence gets: the state it puts out of step, or the
# decision it gets wrong (a sampled run's faults: where the sampled-run judges can name it).
VERDICT_OF = {
    "positions-from-slots": "sync-bug:positions",
    "no-mask": "sync-bug:mask",
    "draft-bonus": "sync-bug:bonus",
    "no-kv-shift": "sync-bug:kv",
    "min-crop": "sync-bug:kv",
    "verify-positions-not-advanced": "sync-bug:positions",
    "bonus-from-another-row": "sync-bug:bonus",
    "rollback-by-draft-list": "sync-bug:kv",
    "accept-on-raw-softmax": "decision-bug:accept",
    "tree-siblings-visible": "sync-bug:mask",
    "tree-positions-by-index": "sync-bug:positions",
    "tree-rejected-branch-kept": "sync-bug:kv",
    "tree-bonus-by-index": "sync-bug:bonus",
    "state-not-rolled-back": "sync-bug:recurrent",
    "state-after-zero-draft": "sync-bug:recurrent",
    "conv-state-off-by-one": "sync-bug:recurrent",
    "window-full-keeps-rejected": "sync-bug:kv",
    "stop-at-last-token": "decision-bug:stop",
    "penalty-history-last-token": "decision-bug:penalty",
    "logprobs-from-draft": "decision-bug:logprobs",
    "settings-from-first-row": "decision-bug:settings",
    "unset-temperature-greedy": "decision-bug:settings",
    "unseeded-noise-to-copy": "decision-bug:stream",
    "stream-advanced-for-zero-draft": "decision-bug:stream",
}
# Faults of a draft model's passes: prompt lookup and a head run none.
DRAFT_MODEL_ONLY = ("draft-positions-off-by-one", "draft-misses-target-token")
# Faults of a draft head's inputs: only a drafter that hears the target's hidden states has them.
HEAD_ONLY = ("head-hidden-off-by-one", "head-keeps-own-guesses")
# Faults of a token tree's verify: only a run drafting trees (tree_width above 1) has them.
TREE_ONLY = tuple(f for f, (kind, _) in FAULTS.items() if kind == "tree")
# What the acceptance judge names each lossless fault.
ACCEPTANCE_OF = {
    "draft-positions-off-by-one": "draft-bug:positions",
    "draft-misses-target-token": "draft-bug:first-token",
    "drafts-to-another-row": "draft-bug:rows",
    "head-hidden-off-by-one": "draft-bug:hidden",
    "head-keeps-own-guesses": "draft-bug:cache",
}


def expand(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Presets expanded, duplicates removed, in catalogue order; unknown names raise ValueError."""
    out = set()
    for n in names:
        if n in PRESETS:
            out.update(PRESETS[n])
        elif n in FAULTS:
            out.add(n)
        else:
            raise ValueError(f"unknown fault {n!r}; choose from {', '.join([*FAULTS, *PRESETS])}")
    return tuple(f for f in FAULTS if f in out)
