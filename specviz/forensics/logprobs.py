"""The log-probability judge: each token's recorded log-probability against the target's own.

A run with `logprobs` records, per emitted token, its log-probability under the target's
distribution (penalised and tempered as the run was, no top-k or top-p: decoding/penalties.py). Its
tokens may all be right while those numbers are not (an accepted draft's taken from the drafter:
llama.cpp #27972, vLLM #17876), so they are judged on their own: every sequence is teacher-forced
through the target in float64 at batch size 1, and a recorded value further from that truth than
rounding moves it is a `decision-bug:logprobs`. Rounding moves a logit by at most the yardstick's
tolerance (yardstick.py), so a log-probability (a logit minus a log-sum-exp of logits) by at most
twice that, over the temperature.
"""
from __future__ import annotations

import torch

from specviz.decoding.penalties import logprobs
from specviz.decoding.sampling import sampling_of
from specviz.forensics.recompute import float64_target, fresh_logits
from specviz.forensics.whitebox import emitter
from specviz.models.pairs import ModelPair
from specviz.trace.evidence import RunForensics
from specviz.trace.findings import Findings
from specviz.trace.schema import Trace
from specviz.trace.yardsticks import Rounding


def judge_logprobs(trace: Trace, pair: ModelPair, rounding: Rounding | None) -> Findings:
    """`forensics` of every sequence whose tokens no other verdict named and whose recorded
    log-probabilities depart from the target's float64 ones beyond `rounding`. Nothing without a
    float64 target or a yardstick: rounding could not be told from a bug."""
    found = Findings()
    model = float64_target(pair)
    if model is None or rounding is None:
        return found
    sampling = sampling_of(trace.manifest.spec)
    temperature = sampling.target.temperature
    bound = 2 * rounding.from_float64() / (temperature or 1.0)
    for s in trace.sequences:
        if s.logprobs is None or s.forensics is not None or not s.output_ids:
            continue
        truth = _float64_logprobs(model, pair.vocab_size, sampling, trace.prompts[s.seq].ids,
                                  s.output_ids)
        off = (torch.tensor(s.logprobs, dtype=torch.float64) - truth).abs()
        if not bool((off > bound).any()):
            continue
        i = int((off > bound).long().argmax())
        rec, _ = emitter([r for r in trace.rows if r.seq == s.seq], i)
        found.of(s.seq)["forensics"] = RunForensics(
            verdict="decision-bug:logprobs", fork=i, round=rec and rec.round, row=rec and rec.row,
            output_token=s.output_ids[i], logprob=s.logprobs[i],
            logprob_float64=float(truth[i]), tolerance=bound, alpha=rounding.alpha,
            yardstick=rounding.model_copy(update={"batch_invariant": False,
                                                  "tolerance": rounding.from_float64()}).describe(),
            explanation=(f"The tokens are right, but token {i}'s recorded log-probability "
                         f"{s.logprobs[i]:.6g} is not the target's: a fresh float64 recomputation "
                         f"at batch size 1 gives {float(truth[i]):.6g}, {float(off[i]):.3g} apart "
                         f"where rounding in {rounding.dtype} moves it by at most {bound:.3g}. "
                         f"{int((off > bound).sum())} of the sequence's {len(s.output_ids)} "
                         "tokens are so far off."))
    return found


def _float64_logprobs(model, vocab: int, sampling, prompt: list[int],
                      output: list[int]) -> torch.Tensor:
    """Each output token's log-probability under the float64 target, penalised by the prompt and the
    tokens before it and tempered as the run was: (len(output),)."""
    z = fresh_logits(model, prompt + output[:-1], len(output), vocab)
    if sampling.penalties:
        z = sampling.penalties.along(z, prompt, output[:-1])
    return logprobs(z, torch.tensor(output), sampling.target.temperature)
