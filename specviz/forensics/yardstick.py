"""The rounding yardstick: how far a correct computation of a model's logits sits from
float64 truth, in the run's dtype, on this pair and device, measured on computations that
a bug in the batched, cached verify path cannot reach.

Each measured sequence (the reference's own continuations, then the built-in prompts,
chained end to end, as calibration) runs through the model twice, fresh (batch size 1, no
cache, one pass): in the run's dtype and as a float64 copy. At every position the largest
|logit difference| over the vocabulary is one sample of the dtype's rounding. Positions
whose prefix an earlier sequence already had give the same sample again (chat templates
repeat): skipped.

No shape is assumed for the distribution. A correct computation's error at a position is
exchangeable with the n samples, so it exceeds the j-th smallest with probability
(n + 1 - j) / (n + 1). Two correct computations that each stay within q of the truth over
their `slots` positions differ by at most 2q: the tolerance is 2q at the smallest j that
keeps the chance of either leaving q, over 2 x slots positions, within alpha. With too
few samples for alpha, q is the largest and the larger rate is stated.

A hybrid model's recurrent layers (Gated DeltaNet, Mamba, short convolutions) compute a prefill with
one algorithm (chunked) and a decode step with another (recurrent): two correct computations with
different rounding. A fresh pass runs only the first, so a hybrid's sequences are also decoded a
token a pass, fresh (batch size 1, its own cache, the positions of up to RECURRENT_POSITIONS in
all), and those positions are samples too: the tolerance covers the rounding of both, and never a
state the verify path carries.

In float64 both algorithms agree to rounding (recompute.py's truth computes in float64 throughout),
unless the model's own code computes two different things: transformers' NemotronH and Zamba 2 clamp
a scan's time step in their chunked algorithm and not in their decode step, and on a random
checkpoint the two part by 2e-3 and 3e-2 logits. Their gap in float64 is measured too
(`algorithms`); it is the least a float64 tolerance can be, and beyond rounding it makes the
yardstick an anomaly: no fork is then put down to rounding, and no engine is called a bug for
computing the model's other algorithm.

A float64 run cannot be measured against float64: its rounding is a float32 copy's,
scaled by the ratio of the two unit roundoffs (rounding error is first order in it). The
same scaling gives float64's tolerance for passes forensics rebuild in float64, where any
difference beyond it is the computation's own; at least float32's known count of its own units
(KNOWN_RELATIVE) in float64's: a bfloat16 run's tolerance, scaled, would ask float64 for
fewer units than it rounds by (bfloat16 stores in 8 bits but sums in float32).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specviz.forensics.recompute import copy_in, decoded_logits, fresh_logits
from specviz.models.architecture import is_recurrent
from specviz.trace.records import shared_prefix
from specviz.trace.yardsticks import Rounding

# Measurements are kept on disk under this version (yardstick_cache.py): bump it whenever `sample`
# would measure differently (here, or in recompute.py's passes and float64 copies).
MEASUREMENT_VERSION = 1
ALPHA = 0.01  # the false-alarm rate one comparison is judged at
SEQUENCES = 8  # of the reference's continuations, the longest, at most this many
MAX_POSITIONS = 512  # per sequence, its last
CHAIN = 256  # tokens per calibration pass, at most (a longer prompt is a pass of its own)
# from the built-in prompts: enough for 1% at k = 5 (2 x 6 slots / 1300) on its own
CALIBRATION_POSITIONS = 1300
# a hybrid's positions also decoded a token a pass (its recurrent algorithm), at most
RECURRENT_POSITIONS = 256
LEVELS = tuple(i / 100 for i in range(101))
# The largest error / (unit roundoff x the position's largest logit) measured on the embedded and
# tiny pairs on CPU against a truth in float64 throughout (tiny 276 and embedded 99 in float32, 15
# and 14 in bfloat16); a yardstick ANOMALY times above what its dtype shows is itself suspect.
# Against transformers' own float64, which keeps its norms in float32, float32 showed 67: that truth
# shared part of float32's rounding.
KNOWN_RELATIVE = {"float32": 280.0, "bfloat16": 16.0, "float16": 280.0}
ANOMALY = 10.0
NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
         torch.float64: "float64"}


@dataclass
class Samples:
    """Per measured position: the largest |logit - float64 logit| and that error relative to the
    dtype's unit roundoff times the position's largest logit."""

    errors: torch.Tensor
    relative: torch.Tensor
    sequences: int
    largest_logit: float
    # the sequences measured, so that later ones skip their shared prefixes
    seen: tuple[tuple[int, ...], ...]
    # of the samples, the positions decoded a token a pass (a hybrid's recurrent algorithm)
    decoded: int = 0
    # a hybrid's largest float64 gap between its decode and its fresh algorithm
    algorithms: float = 0.0

    def __add__(self, other: Samples) -> Samples:
        return Samples(torch.cat([self.errors, other.errors]),
                       torch.cat([self.relative, other.relative]),
                       self.sequences + other.sequences,
                       max(self.largest_logit, other.largest_logit),
                       self.seen + other.seen, self.decoded + other.decoded,
                       max(self.algorithms, other.algorithms))


def _shared(ids: list[int], seen) -> int:
    """Leading tokens `ids` shares with the longest matching sequence in `seen`."""
    return max((shared_prefix(ids, other) for other in seen), default=0)


def chained(sequences: list[list[int]], tokens: int = CHAIN) -> list[list[int]]:
    """`sequences` joined end to end into passes of up to `tokens` tokens. Each prompt on its own
    repeats the chat template's prefix, computed again in every pass and sampled once: 2,150
    positions computed for 1,330 samples on the built-in prompts, where chained passes compute 1,485
    for 1,362 (and measure the same tolerance on the embedded pair)."""
    passes: list[list[int]] = []
    for ids in sequences:
        if passes and len(passes[-1]) + len(ids) <= tokens:
            passes[-1] += ids
        else:
            passes.append(list(ids))
    return passes


@torch.inference_mode()
def sample(model, sequences: list[list[int]], vocab: int, seen: tuple = (),
           enough: int | None = None) -> Samples | None:
    """The rounding of `model` at the new positions of `sequences`, stopping once it has `enough`
    (None without a float64 copy of it)."""
    scale = 1.0
    truth, measured = copy_in(model, torch.float64), model
    # measure a float32 copy, then scale its rounding down to float64's
    if model.dtype == torch.float64:
        measured = copy_in(model, torch.float32)
        scale = torch.finfo(torch.float64).eps / torch.finfo(torch.float32).eps
    if truth is None or measured is None:
        return None
    unit = torch.finfo(measured.dtype).eps / 2
    errors, relative, kept, largest, measured_sequences, algorithms = [], [], [], 0.0, 0, 0.0
    # positions still to decode a token a pass
    decoded = RECURRENT_POSITIONS if is_recurrent(model) else 0
    for ids in sequences:
        if enough is not None and sum(len(e) for e in errors) >= enough:
            break
        new = min(len(ids) - _shared(ids, seen + tuple(kept)), MAX_POSITIONS)
        kept.append(tuple(ids))
        if new <= 0:
            continue
        measured_sequences += 1
        z64 = fresh_logits(truth, ids, new, vocab)
        top = z64.abs().amax(-1)
        ways = [fresh_logits(measured, ids, new, vocab)]
        if decoded:
            steps = min(new, decoded)
            decoded -= steps
            ways.append(decoded_logits(measured, ids, steps, vocab))
            gap = (decoded_logits(truth, ids, steps, vocab) - z64[new - steps:]).abs().amax(-1)
            algorithms = max(algorithms, float(gap.max()))
            # a float64 run decodes so itself: its gap, as it is, is a sample
            if model.dtype == torch.float64:
                errors.append(gap)
                relative.append(gap / (torch.finfo(torch.float64).eps / 2
                                       * top[new - steps:].clamp(min=1e-30)))
        for z in ways:
            err = (z - z64[len(z64) - len(z):]).abs().amax(-1)
            errors.append(err * scale)
            relative.append(err / (unit * top[len(top) - len(z):].clamp(min=1e-30)))
        largest = max(largest, float(top.max()))
    if not errors:
        return Samples(torch.zeros(0), torch.zeros(0), 0, 0.0, tuple(kept))
    return Samples(torch.cat(errors).double(), torch.cat(relative).double(), measured_sequences,
                   largest, tuple(kept),
                   (RECURRENT_POSITIONS - decoded) if is_recurrent(model) else 0, algorithms)


def threshold(errors: torch.Tensor, slots: int, alpha: float) -> tuple[float, float]:
    """(q, the false-alarm rate it gives): the order statistic that a correct computation of `slots`
    positions, or the one it is compared with, leaves with probability at most alpha (or the
    largest, at its rate)."""
    n = len(errors)
    spare = max(1, math.floor(alpha * (n + 1) / (2 * slots)))  # samples allowed above q
    q = float(errors.sort().values[n - spare])
    return q, min(1.0, 2 * slots * spare / (n + 1))


def rounding(samples: Samples, dtype: torch.dtype, slots: int,
             alpha: float = ALPHA) -> Rounding | None:
    """The yardstick from `samples` of a model running in `dtype`, for comparisons
    of `slots` positions."""
    if samples is None or not len(samples.errors):
        return None
    name = NAMES.get(dtype, str(dtype))
    q, stated = threshold(samples.errors, slots, alpha)
    resolution = torch.finfo(dtype).eps * samples.largest_logit
    relative = float(samples.relative.max())
    expected = KNOWN_RELATIVE.get("float32" if dtype == torch.float64 else name)
    anomaly = None
    algorithms = samples.algorithms if samples.decoded else None
    float32_resolution = torch.finfo(torch.float32).eps * samples.largest_logit
    if algorithms is not None and algorithms > float32_resolution:
        anomaly = ("this model's own two algorithms part: a token a pass (its recurrent "
                   "layers' decode step) and fresh (their chunked prefill), its logits differ by "
                   f"{algorithms:.3g} in float64, beyond even float32's resolution "
                   f"({float32_resolution:.2g}). Its code computes two different things "
                   "(transformers' NemotronH and Zamba 2 clamp a scan's time step in one and not "
                   "the other), so no fork is put down to rounding against it, and an engine "
                   "computing either is not called a bug for it")
    elif expected is not None and relative > ANOMALY * expected:
        anomaly = (f"this model's own fresh passes in {name} depart from float64 by {relative:.3g} "
                   f"times the dtype's unit roundoff at the largest logit, where {name} shows at "
                   f"most {expected:g} on the pairs specviz measured: the model's kernels are "
                   "suspect even without a cache, so no fork is put down to rounding against it")
    method = (f"each of {samples.sequences} sequences (the reference's continuations, then the "
              f"built-in prompts chained into passes of up to {CHAIN} tokens) through the target "
              f"twice, fresh (batch size 1, no cache): in {name} and in float64; per position the "
              "largest |logit difference| over the vocabulary"
              + (f"; {samples.decoded} of its positions also decoded a token a pass, fresh, as a "
                 "hybrid's recurrent layers decode (their other algorithm)"
                 if samples.decoded else "")
              + ("; measured on a float32 copy and scaled by float64's unit roundoff over float32's"
                 if dtype == torch.float64 else "")
              + f". Tolerance: twice the order statistic that a correct pass of {slots} positions, "
                "or the one it is compared with, exceeds with at most the stated probability")
    levels = torch.tensor(LEVELS, dtype=torch.float64)
    tolerance = max(2 * q, 2 * resolution)
    # float64 rounds as many of its own units as float32 does (bfloat16 stores in 8 bits but sums in
    # float32: its count is no guide), and never tighter than a hybrid's own two algorithms part.
    eps64 = torch.finfo(torch.float64).eps
    float64_tolerance = max(tolerance * eps64 / torch.finfo(dtype).eps,
                            KNOWN_RELATIVE["float32"] * eps64 * samples.largest_logit,
                            2 * (algorithms or 0))
    return Rounding(dtype=name, method=method, positions=len(samples.errors),
                    sequences=samples.sequences, levels=list(LEVELS),
                    quantiles=samples.errors.quantile(levels).tolist(), resolution=resolution,
                    slots=slots, tolerance=tolerance, alpha=stated, relative=relative,
                    float64_tolerance=float64_tolerance, expected=expected, anomaly=anomaly,
                    algorithms=algorithms)


def zero_tolerance(rounding: Rounding | None) -> Rounding | None:
    """`rounding` for a batch-invariant run: a row's logits are the same bits however it was
    batched, so any difference between two computations of them is no rounding (tolerance 0)."""
    return rounding and rounding.model_copy(update={
        "tolerance": 0.0, "batch_invariant": True, "rounding": rounding.tolerance})
