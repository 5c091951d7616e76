"""Reference decoders: the target alone, greedy or sampled. `reference` (batch
size 1) is the ground truth every other method is compared with;
`batched-reference` runs the same decoding on the left-padded batch, to separate
batching noise from speculation bugs. Sampled, both draw each token with the
stream every method uses for the target's own tokens (sampling.py)."""
from __future__ import annotations

import time

import torch

from specviz.decoding import kvcache
from specviz.decoding.batch import forward, left_pad
from specviz.decoding.result import DecodeResult, Progress, SequenceOutput, chunks, top2_margin
from specviz.decoding.sampling import GREEDY, TARGET, Sampling, inverse_cdf, uniform
from specviz.models.pairs import ModelPair


def choose(logits: torch.Tensor, sampling: Sampling, seqs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Each row's next token from its logits (B, V): the argmax, or a draw from the target's distribution."""
    if sampling.greedy:
        return logits.argmax(-1)
    return inverse_cdf(sampling.target.probs(logits), uniform(sampling.seed, sampling.streams(seqs), index, TARGET))


@torch.inference_mode()
def reference(pair: ModelPair, prompts: list[list[int]], max_new_tokens: int, progress: Progress | None = None,
              sampling: Sampling = GREEDY, known: list[SequenceOutput] | None = None) -> DecodeResult:
    """Plain argmax (or a draw, when sampling), one prompt at a time, through the model's own forward,
    positions and cache. `known`: each prompt's leading reference tokens, already established (proof.py): the
    decode goes on after them, their prompt and tokens prefilled in one pass.

    Not `generate`: transformers 5 fills every field a GenerationConfig leaves unset from the checkpoint's
    own generation_config (repetition penalty, suppressed tokens, ...), and it takes the argmax of float32
    copies of the logits. Here nothing alters the logits, the argmax runs on the model's own dtype, and only
    over the pair's shared vocabulary, as the engine's does (an output head may be padded beyond it).
    tests/test_reference.py checks this loop against `generate` for a model without such defaults.
    """
    outputs, start = [], time.perf_counter()
    for seq, ids in enumerate(prompts):
        out = SequenceOutput([]) if known is None else known[seq]
        given = len(out.ids)
        cache, x = kvcache.new(pair.target), torch.tensor([ids + out.ids], device=pair.device)
        while len(out.ids) < max_new_tokens and (not out.ids or out.ids[-1] not in pair.eos_ids):
            logits = pair.target(input_ids=x, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
            logits = logits[: pair.vocab_size].double()  # exact for every model dtype: the argmax is the model's
            at = torch.tensor([[seq, len(out.ids)]], device=pair.device)
            out.ids.append(int(choose(logits[None], sampling, at[:, 0], at[:, 1])))
            out.margins.append(float(top2_margin(logits)))
            x = torch.tensor([out.ids[-1:]], device=pair.device)
        outputs.append(out)
        if progress:
            progress(len(out.ids) - given)
    return DecodeResult(outputs, time.perf_counter() - start)


@torch.inference_mode()
def batched_reference(pair: ModelPair, prompts: list[list[int]], batch_size: int, max_new_tokens: int,
                      progress: Progress | None = None, watch=None, sampling: Sampling = GREEDY) -> DecodeResult:
    outputs, start = [None] * len(prompts), time.perf_counter()
    eos = torch.tensor(pair.eos_ids, device=pair.device)
    for chunk in chunks(len(prompts), batch_size):
        tokens, valid = left_pad([prompts[i] for i in chunk], pair.device)
        seqs = list(chunk)
        gen = {i: SequenceOutput([]) for i in seqs}
        cache = kvcache.new(pair.target)
        q_start = 0
        while seqs:
            if watch:
                watch.start()
            logits = forward(pair.target, tokens, valid, q_start, cache, pair.vocab_size, keep=1)[:, -1]
            have = torch.tensor([len(gen[i].ids) for i in seqs], device=pair.device)
            nxt = choose(logits, sampling, torch.tensor(seqs, device=pair.device), have)
            margins = top2_margin(logits).tolist()
            for r, (i, t) in enumerate(zip(seqs, nxt.tolist())):
                gen[i].ids.append(t)
                gen[i].margins.append(margins[r])
            if watch:
                watch.end(seqs, gen)
            done = torch.isin(nxt, eos) | torch.tensor([len(gen[i].ids) >= max_new_tokens for i in seqs], device=pair.device)
            if progress:
                progress(len(seqs))
            q_start = tokens.shape[1]
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            valid = torch.cat([valid, torch.ones_like(valid[:, :1])], dim=1)
            if done.any():  # finished rows leave the batch
                keep = (~done).nonzero().flatten()
                seqs = [seqs[r] for r in keep.tolist()]
                tokens, valid = tokens[keep], valid[keep]
                kvcache.select_rows(cache, keep)
        for i in chunk:
            outputs[i] = gen[i]
    return DecodeResult(outputs, time.perf_counter() - start)
