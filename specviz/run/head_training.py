"""Training an EAGLE-style head (models/heads.py) on this machine's CPU, by the recipe
heads.py declares.

EAGLE's recipe, small: the head is one decoder layer (started as a copy of the target's first) and
the map that mixes each slot's token embedding with the target's last hidden state at the slot
before. It learns from the target itself: the target's continuations of a built-in prompt set
(greedy, and a few sampled for more contexts), and over each prompt and continuation one target
pass, whose argmax at every slot is the token to predict and whose last hidden state is the one the
head must guess (its guess is what it feeds itself for its next draft). The loss is the
cross-entropy against the target's argmax plus a smooth L1 on the hidden state, as EAGLE's. A fixed
step count, seed and token budget per step train the same head on every machine, up to its float
rounding; the target's embedding and output head stay frozen. `specviz train-head` runs it and
caches the head where heads.py loads it.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from specviz.decoding.reference import batched_reference
from specviz.decoding.sampling import Sampler, Sampling
from specviz.models.checkpoints import atomic_save
from specviz.models.head import heard_states
from specviz.models.heads import SHAPES, TRAINED, EagleHead, Recipe
from specviz.models.pairs import ModelPair
from specviz.spec.prompts import builtin_set

TrainingProgress = Callable[[str, int], None]  # (phase, n more done)
CONTINUING, TRAINING = "the target's continuations", "training"  # in tokens, in steps
# token ids, the target's argmax, the hidden states a head hears (its last, by default)
Example = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def examples(pair: ModelPair, prompts: list[str], recipe: Recipe,
             progress: TrainingProgress | None = None,
             heard: tuple[int, ...] = (-1,)) -> list[Example]:
    """Every prompt followed by each of the target's continuations (greedy, then sampled): its ids,
    and at each slot the target's argmax (what the head must predict, whichever token the
    continuation took) and the hidden states a head hears (`heard`, concatenated: the last one by
    default)."""
    ids, found = pair.encode(prompts), []
    for copy in range(1 + recipe.sampled):
        sampler = Sampler(recipe.temperature if copy else 0.0)
        outputs = batched_reference(pair, ids, 8, recipe.new_tokens,
                                    progress and (lambda n: progress(CONTINUING, n)),
                                    sampling=Sampling(sampler, sampler, recipe.seed + copy)).outputs
        with torch.no_grad():
            for prompt, out in zip(ids, outputs):
                seq = torch.tensor([prompt + out.ids], device=pair.device)
                o = pair.target(input_ids=seq, output_hidden_states=True)
                found.append((seq[0], o.logits[0, :, : pair.vocab_size].argmax(-1),
                              heard_states(o.hidden_states, heard)[0]))
    return found


def train(head: EagleHead, data: list[Example], vocab: int, recipe: Recipe,
          progress: TrainingProgress | None = None) -> list[float]:
    """Train `head` in place on `data` over the pair's shared `vocab`; the mean loss per token of
    every step."""
    def loss(example: Example) -> torch.Tensor:
        ids, argmax, hidden = example
        out = head.fresh(ids, one_on(hidden))  # each slot fed the hidden state at the slot before
        return (torch.nn.functional.cross_entropy(head.logits(out)[:, :vocab].float(), argmax,
                                                  reduction="sum")
                + torch.nn.functional.smooth_l1_loss(out, hidden, reduction="sum")
                / hidden.shape[-1])
    return optimize(head, data, loss, recipe, progress)


def optimize(head: torch.nn.Module, data: list[Example], loss: Callable[[Example], torch.Tensor],
             recipe: Recipe, progress: TrainingProgress | None = None) -> list[float]:
    """Train `head` in place by `recipe` (AdamW, one cycle): each step, examples in a seeded order
    until it has `tokens_per_step` tokens, each its `loss` summed over its tokens; the loss per
    token of every step."""
    generator = torch.Generator().manual_seed(recipe.seed)
    head.train().requires_grad_(True)
    optimizer = torch.optim.AdamW(head.parameters(), lr=recipe.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, recipe.learning_rate,
                                                   total_steps=recipe.steps, pct_start=0.1)
    losses, order = [], []
    for _ in range(recipe.steps):
        optimizer.zero_grad()
        tokens = total = 0
        while tokens < recipe.tokens_per_step:
            if not order:
                order = torch.randperm(len(data), generator=generator).tolist()
            example = data[order.pop()]
            summed = loss(example)
            (summed / recipe.tokens_per_step).backward()
            tokens, total = tokens + len(example[0]), total + summed.item()
        optimizer.step()
        schedule.step()
        losses.append(total / tokens)
        if progress:
            progress(TRAINING, 1)
    head.eval().requires_grad_(False)
    return losses


def one_on(states: torch.Tensor) -> torch.Tensor:
    """(T, H) each slot fed the state of the slot before (the first, zeros)."""
    return torch.cat([torch.zeros_like(states[:1]), states[:-1]])


def train_head(pair: ModelPair, name: str,
               progress: TrainingProgress | None = None) -> tuple[Path, list[float]]:
    """Train the head of `pair`'s target (id `name`) by its recipe, from its untrained start, and
    cache it: its file and the losses."""
    recipe = TRAINED[name]
    torch.manual_seed(recipe.seed)
    head = EagleHead(pair.target, *SHAPES[name])
    data = examples(pair, builtin_set(recipe.prompts), recipe, progress)
    losses = train(head, data, pair.vocab_size, recipe, progress)
    state = {n: w.contiguous() for n, w in head.state_dict().items()}
    path = recipe.weights(name)
    atomic_save(path.parent, lambda tmp: save_file(state, tmp / path.name))
    return path, losses
