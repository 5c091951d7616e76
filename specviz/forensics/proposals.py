"""The proposal audit: was each sampled draft drawn from the q its decision reads?

Speculative sampling is exact only where a draft is a draw from q, the very distribution its
decision divides p by. The decision audit (distribution.py) re-derives each decision from the
recorded p, q and draw; it cannot see a q that is not the one the draft came from (transformers
#47932: a candidate generator returned its unprocessed logits; DeepSpec #31: drafts sampled from
bfloat16 logits, decided on the float32 softmax). So each sequence's committed tokens go once
through the draft model, fresh (batch size 1, no cache, the run's dtype), and every decided draft
of a chain round (those accepted and the first refused, whose prefix the row had committed) is
checked two ways against that pass under the run's draft settings:
- its recorded q: the fresh q of the draft, within the draft's rounding;
- the draft itself: the token the fresh q's inverse CDF gives at the row's own draft draw (its
  stream, at its token), within the same rounding of the CDF.
A correct sampler passes both exactly as far as rounding goes; a draw that lands within rounding of
a CDF boundary is not counted against it. Where drafts are not their own draws, the round's other
draws at the same token are tried: drafts that are, every one, the draw of another decision (vLLM PR
#47386: the draft's noise keyed by the acceptance's offset) used one random number for two
decisions, which couples them, whatever each decision follows.
"""
from __future__ import annotations

import math

import torch

from specviz.decoding.sampling import DRAFT, PURPOSES, sampling_of
from specviz.forensics.recompute import fresh_logits
from specviz.trace.evidence import Proposals
from specviz.trace.schema import Trace

MAX_LISTED = 20


@torch.inference_mode()
def judge_proposals(trace: Trace, draft, vocab: int, tolerance: float) -> Proposals:
    """`draft`: the run's draft model; `tolerance`: its rounding in logits (the draft's yardstick),
    which moves a log-probability at temperature T by at most 2 x tolerance / T."""
    spec = trace.manifest.spec
    sampling = sampling_of(spec)
    have: dict[int, int] = {}
    fresh: dict[int, torch.Tensor] = {}
    checked, q_off, first = 0, 0, []
    misses = dict.fromkeys(PURPOSES, 0)  # purpose -> decided drafts that are not its draw
    for r in sorted(trace.rows, key=lambda r: r.round):
        t0 = have.get(r.seq, 0)
        have[r.seq] = t0 + len(r.emitted)
        sampler = sampling.drafts([r.seq])
        temperature = sampler.by_row[0].temperature
        # a greedy draft's q is a point mass: there is no draw to check
        if not r.draft_tokens or r.draft_probs is None or r.tree is not None or not temperature:
            continue
        out = trace.sequences[r.seq].output_ids
        if r.seq not in fresh:  # one pass a sequence: the draft model at every output token
            fresh[r.seq] = fresh_logits(draft, trace.prompts[r.seq].ids + out[:-1], len(out),
                                        vocab)
        decided = min(r.accepted + 1, len(r.draft_tokens), len(out) - t0)
        at = torch.arange(t0, t0 + decided)
        q = sampler.probs(fresh[r.seq][at])
        stream = sampling.streams([r.seq])
        draws = {p: stream.draw(at[None], torch.full((1, decided), p))[0] for p in PURPOSES}
        eps = 2 * tolerance / temperature
        for j in range(decided):
            d = r.draft_tokens[j]
            cdf = q[j].cumsum(-1)
            low, high = float(cdf[d - 1]) if d else 0.0, float(cdf[d])
            # each purpose's draw at this token: is the draft its inverse CDF? (u as the inverse
            # CDF reads it, by the total)
            gives = {p: low - eps <= float(u[j]) * float(cdf[-1]) < high + eps
                     for p, u in draws.items()}
            for p, fits in gives.items():
                misses[p] += not fits
            wrong_q = abs(math.log(max(r.draft_probs[j], 1e-300))
                          - math.log(max(float(q[j, d]), 1e-300))) > eps
            checked += 1
            q_off += wrong_q
            if (wrong_q or not gives[DRAFT]) and len(first) < MAX_LISTED:
                first.append([r.round, r.seq, j])
    others = [p for p in PURPOSES if p != DRAFT and not misses[p]]
    return Proposals(checked=checked, q_off=q_off, draw_off=misses[DRAFT], first=first,
                     tolerance=tolerance,
                     drawn_with=PURPOSES[others[0]] if misses[DRAFT] and others else None)
