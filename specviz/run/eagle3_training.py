"""Training the embedded target's EAGLE-3 head on this machine's CPU, by EAGLE-3's recipe, small,
and caching it in the published layout (`specviz train-head --eagle3`; models/builtinheads.py's
TRAINED_HEAD), a folder vLLM and SGLang load as well.

EAGLE-3's recipe: the head hears three of the target's layers (the engines' default 2, L/2, L-3,
named in its config), learns from the target's own continuations of a built-in prompt set (greedy,
and one sampled for more contexts; run/head_training.py's `examples`) to predict the target's
argmax at each slot, by cross-entropy alone (no hidden-state loss), and is trained with
training-time test: each step unrolls the head `UNROLLED` times over the whole sequence, every
unrolled pass fed the head's own outputs of the pass before (one slot on) in place of the target's
states, so that its later drafts, fed what it guessed, learn as its first does. (EAGLE-3's own
unrolled passes attend to the target-fed slots before each chain; here each attends to its own
pass.) It starts from the least-squares fit of models/builtinheads.py on the same text, its
attention opened (the fit's writes nothing: its drafts could not read the token they are fed); its
draft vocabulary is that text's ids. The target's
embedding stays frozen; a fixed step count, seed and token budget per step train the same head on
every machine, up to float rounding.
"""
from __future__ import annotations

from pathlib import Path

import torch

from specviz.models.builtinheads import fitted, trained_folder, write_head
from specviz.models.checkpoints import atomic_save
from specviz.models.eagle3 import Eagle3Head, default_aux_layers
from specviz.models.heads import Recipe
from specviz.models.pairs import ModelPair
from specviz.run.head_training import (Example, TrainingProgress, examples, one_on,
                                       optimize)
from specviz.spec.prompts import builtin_set

RECIPE = Recipe(steps=200, tokens_per_step=1024, learning_rate=1e-4, new_tokens=128, sampled=1)
UNROLLED = 3  # passes of training-time test a step: the first draft and two fed the head's own
IGNORED = -100  # a label outside the draft vocabulary


def train_eagle3_head(pair: ModelPair, name: str,
                      progress: TrainingProgress | None = None) -> tuple[Path, list[float]]:
    """Train target `name`'s EAGLE-3 head by RECIPE and cache it: its folder and the loss per
    token of every step."""
    torch.manual_seed(RECIPE.seed)
    layers = pair.target.config.get_text_config().num_hidden_layers
    aux = sorted(set(default_aux_layers(layers)))
    data = examples(pair, builtin_set(RECIPE.prompts), RECIPE, progress, heard=tuple(aux))
    head, files = started(pair.target, data, aux)
    losses = train(head, data, pair.vocab_size, RECIPE, progress)
    folder = trained_folder(name)
    atomic_save(folder, lambda tmp: write_head(tmp, *published(head, files)))
    return folder, losses


def started(target, data: list[Example], aux: list[int]) -> tuple[Eagle3Head, tuple[dict, dict]]:
    """The head training starts from, and its files (weights, config): the fit on the examples'
    text, its attention opened (its output projection small and random, not zero) so that the
    token it is fed can reach its output."""
    weights, config = fitted(target, [ids.tolist() for ids, _, _ in data], aux,
                             "trained by run/eagle3_training.py: EAGLE-3's recipe, small")
    o_proj = weights["midlayer.self_attn.o_proj.weight"]
    weights["midlayer.self_attn.o_proj.weight"] = 0.02 * torch.randn(
        o_proj.shape, generator=torch.Generator().manual_seed(RECIPE.seed), dtype=o_proj.dtype)
    return Eagle3Head(target, config, dict(weights), "training"), (weights, config)


def published(head: Eagle3Head, files: tuple[dict, dict]) -> tuple[dict, dict]:
    """The trained head's files as published (weights, config): its vocabulary map as it started."""
    weights, config = files
    trained = {_published(n): w for n, w in head.state_dict().items() if _published(n)}
    return {**trained, "d2t": weights["d2t"], "t2d": weights["t2d"]}, config


def _published(name: str) -> str | None:
    """The published name of one of the head's weights (None: computed, not shipped)."""
    if name == "to_target" or "rotary" in name:
        return None
    return name.replace("body.layers.0.", "midlayer.")


def train(head: Eagle3Head, data: list[Example], vocab_size: int, recipe: Recipe,
          progress: TrainingProgress | None = None) -> list[float]:
    """Train `head` in place on `data` (over a target of `vocab_size` ids); the loss per token of
    every step, averaged over its unrolled passes."""
    label_of = torch.full((vocab_size,), IGNORED)  # target id -> draft id
    label_of[head.to_target] = torch.arange(len(head.to_target))

    def loss(example: Example) -> torch.Tensor:
        ids, argmax, heard = example
        fed, total = one_on(head.from_target(heard)), 0.0  # the target's states, a slot on
        for _ in range(UNROLLED):
            out = head.fresh(ids, fed)
            drafted = head.lm_head(head.norm(out))  # over the draft vocabulary
            total = total + torch.nn.functional.cross_entropy(
                drafted.float(), label_of[argmax], ignore_index=IGNORED, reduction="sum")
            fed = one_on(out)  # what it guessed, as its next draft is fed
        return total / UNROLLED
    return optimize(head, data, loss, recipe, progress)
