"""Reference decoders: the target alone, greedy or sampled. `reference` (batch
size 1) is the ground truth every other method is compared with;
`batched-reference` runs the same decoding on a left-padded batch kept full as
rows finish, to separate batching noise from speculation bugs. Sampled, both
draw each token with the stream every method uses for the target's own
tokens (sampling.py)."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specviz.decoding import kvcache
from specviz.decoding.batch import forward, left_pad
from specviz.decoding.grammar import dense, masked
from specviz.decoding.penalties import history, logprobs
from specviz.decoding.result import DecodeResult, Progress, SequenceOutput, top2_margin
from specviz.decoding.sampling import GREEDY, TARGET, Sampling, inverse_cdf
from specviz.decoding.stops import Stops
from specviz.models.pairs import ModelPair


def choose_tokens(logits: torch.Tensor, sampling: Sampling, seqs: torch.Tensor,
                  index: torch.Tensor) -> torch.Tensor:
    """Each row's next token from its logits (B, V): the argmax, or a draw from its request's target
    distribution (a greedy request's: a point mass on the argmax)."""
    if sampling.greedy:
        return logits.argmax(-1)
    rows = seqs.tolist()
    return inverse_cdf(sampling.targets(rows).probs(logits),
                       sampling.streams(rows, device=logits.device).draw(index, TARGET))


@torch.inference_mode()
def reference(pair: ModelPair, prompts: list[list[int]], max_new_tokens: int,
              progress: Progress | None = None,
              sampling: Sampling = GREEDY,
              known: list[SequenceOutput] | None = None) -> DecodeResult:
    """Plain argmax (or a draw, when sampling), one prompt at a time, through the model's own
    forward, positions and cache. `known`: each prompt's leading reference tokens, already
    established (proof.py): the decode goes on after them, their prompt and tokens prefilled
    in one pass.

    Not `generate`: transformers 5 fills every field a GenerationConfig leaves unset from the
    checkpoint's own generation_config (repetition penalty, suppressed tokens, ...), and it takes
    the argmax of float32 copies of the logits. Here nothing alters the logits but the run's own
    penalties (penalties.py) and grammar (grammar.py), the argmax runs on the model's own dtype,
    and only over the pair's shared vocabulary, as the engine's does (an output head may be padded
    beyond it).
    tests/test_reference.py checks this loop against `generate` for a model without such defaults.
    """
    outputs, start = [], time.perf_counter()
    stops = Stops.of(pair, sampling.stop)
    for seq, ids in enumerate(prompts):
        out = SequenceOutput([]) if known is None else known[seq]
        given = len(out.ids)
        cache, x = kvcache.new(pair.target), torch.tensor([ids + out.ids], device=pair.device)
        grammar = sampling.grammar and sampling.grammar.matcher(pair.tokenizer, pair.eos_ids,
                                                                 pair.vocab_size)
        if grammar:
            grammar.advance(out.ids)
        while len(out.ids) < max_new_tokens and not stops.ended(out.ids):
            # positions given: some models' own default ignores the cache (Bamba's)
            at = kvcache.length(cache)
            logits = pair.target(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1,
                                 position_ids=torch.arange(at, at + x.shape[1],
                                                           device=pair.device)[None]).logits[0, -1]
            logits = logits[: pair.vocab_size]
            # penalised in the dtype the engine's logits come in (batch.forward's)
            if sampling.penalties:
                logits = sampling.penalties.along(
                    logits.to(torch.promote_types(logits.dtype, torch.float32))[None],
                    ids, out.ids)[0]
            if grammar:
                logits = masked(logits, dense(grammar.mask(), pair.vocab_size))
            logits = logits.double()  # exact for every model dtype: the argmax is the model's
            at = torch.tensor([[seq, len(out.ids)]], device=pair.device)
            out.ids.append(int(choose_tokens(logits[None], sampling, at[:, 0], at[:, 1])))
            out.margins.append(float(top2_margin(logits)))
            out.logprobs.append(float(logprobs(logits[None],
                                               torch.tensor(out.ids[-1:], device=pair.device),
                                               sampling.target.temperature)))
            if grammar:
                grammar.advance(out.ids[-1:])
            x = torch.tensor([out.ids[-1:]], device=pair.device)
        outputs.append(out)
        if progress:
            progress(len(out.ids) - given)
    return DecodeResult(outputs, time.perf_counter() - start)


def prefill_groups(admitted: list[int], prompts: list[list[int]]) -> list[list[int]]:
    """The prompts admitted at one step, in the groups prefilled together: by length, a group
    growing while its padding stays within a quarter of its real tokens (one long prompt would pad
    every short one to its length, and a padded slot costs what a real one does); each group in the
    order admitted."""
    groups: list[list[int]] = []
    for i in sorted(admitted, key=lambda i: len(prompts[i])):
        group = groups[-1] if groups else []
        real = len(prompts[i]) + sum(len(prompts[j]) for j in group)
        if group and 4 * (len(group) + 1) * len(prompts[i]) > 5 * real:
            group = []
        if not group:
            groups.append(group)
        group.append(i)
    return [sorted(g, key=admitted.index) for g in groups]


@dataclass
class _Rows:
    """Rows decoding together on the padded layout (decoding/batch.py): `tokens` and `valid` (B, S),
    the cache holding every slot but the last, which the next pass feeds."""

    seqs: list[int]
    tokens: torch.Tensor
    valid: torch.Tensor
    cache: object

    def keep(self, rows: torch.Tensor) -> None:
        """Only these rows stay, in one gather of the cache; slots that none of them holds any more
        (their padding) are dropped."""
        self.seqs = [self.seqs[r] for r in rows.tolist()]
        valid = self.valid[rows]
        # leading slots no row holds (0 when no row stays)
        unused = int(valid.any(0).long().argmax())
        self.tokens, self.valid = self.tokens[rows, unused:], valid[:, unused:]
        slots = torch.arange(unused, kvcache.length(self.cache), device=rows.device)
        kvcache.gather(self.cache, rows, slots.expand(len(rows), -1))

    def join(self, other: _Rows) -> None:
        """Stack `other`'s rows under these, both left-padded to the wider layout."""
        width = max(self.tokens.shape[1], other.tokens.shape[1])
        grids = [(F.pad(r.tokens, (width - r.tokens.shape[1], 0)),
                  F.pad(r.valid, (width - r.valid.shape[1], 0)))
                 for r in (self, other)]
        self.tokens, self.valid = (torch.cat(g) for g in zip(*grids))
        self.cache = kvcache.merge([self.cache, other.cache])
        self.seqs = self.seqs + other.seqs


@torch.inference_mode()
def batched_reference(pair: ModelPair, prompts: list[list[int]], batch_size: int,
                      max_new_tokens: int, progress: Progress | None = None, watch=None,
                      sampling: Sampling = GREEDY) -> DecodeResult:
    """The target alone on a left-padded batch of at most `batch_size` rows, kept full as a serving
    engine keeps it: a row that finishes leaves at once, and the next prompts take the free places,
    prefilled together in a pass of their own and then stacked under the batch (their layouts
    left-padded to the wider one)."""
    outputs, start = [SequenceOutput([]) for _ in prompts], time.perf_counter()
    stops = Stops.of(pair, sampling.stop)
    waiting, batch = deque(range(len(prompts))), None
    grammars = {i: sampling.grammar.matcher(pair.tokenizer, pair.eos_ids, pair.vocab_size)
                for i in range(len(prompts))} if sampling.grammar else {}

    def step(rows: _Rows) -> None:
        """One token for every row, from the slots its cache does not hold yet; the finished
        rows leave."""
        if watch:
            watch.start()
        fed = kvcache.length(rows.cache)
        logits = forward(pair.target, rows.tokens, rows.valid, fed, rows.cache, pair.vocab_size,
                         keep=1)
        if sampling.penalties:
            said = torch.tensor([len(outputs[i].ids) for i in rows.seqs], device=pair.device)
            logits = sampling.penalties.apply(
                logits, *history(rows.tokens, rows.valid, said, pair.vocab_size),
                said.new_zeros(len(said), 0))
        logits = logits[:, -1]
        if grammars:
            logits = masked(logits, torch.stack([dense(grammars[i].mask(), pair.vocab_size)
                                                 for i in rows.seqs]))
        seqs = torch.tensor(rows.seqs, device=pair.device)
        nxt = choose_tokens(
            logits, sampling, seqs,
            torch.tensor([len(outputs[i].ids) for i in rows.seqs], device=pair.device))
        for i, t, m, lp in zip(rows.seqs, nxt.tolist(), top2_margin(logits).tolist(),
                               logprobs(logits, nxt, sampling.target.temperature).tolist()):
            outputs[i].ids.append(t)
            outputs[i].margins.append(m)
            outputs[i].logprobs.append(lp)
            if grammars:
                grammars[i].advance([t])
        if watch:
            watch.end(rows.seqs, outputs)
        if progress:
            progress(len(rows.seqs))
        rows.tokens = torch.cat([rows.tokens, nxt[:, None]], dim=1)
        rows.valid = torch.cat([rows.valid, torch.ones_like(rows.valid[:, :1])], dim=1)
        done = torch.tensor([len(outputs[i].ids) >= max_new_tokens or stops.ended(outputs[i].ids)
                             for i in rows.seqs], device=pair.device)
        if done.any():
            rows.keep((~done).nonzero().flatten())

    while waiting or batch:
        if batch:
            step(batch)
            batch = batch if batch.seqs else None
        room = batch_size - (len(batch.seqs) if batch else 0)
        for group in prefill_groups([waiting.popleft() for _ in range(min(room, len(waiting)))],
                                    prompts):
            new = _Rows(group, *left_pad([prompts[i] for i in group], pair.device),
                        kvcache.new(pair.target))
            step(new)
            if batch and new.seqs:
                batch.join(new)
            elif new.seqs:
                batch = new
    return DecodeResult(outputs, time.perf_counter() - start)
