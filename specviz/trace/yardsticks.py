"""The yardsticks a trace's verdicts were judged against: a model's rounding in the run's dtype
(forensics/yardstick.py) and an engine's own (forensics/enginenoise.py), measured apart from the run
they judge."""
from __future__ import annotations

from typing import Literal

from specviz.spec.strict import Many, Strict


class Rounding(Strict):
    """A model's rounding in the run's dtype (yardstick.py): how far a correct computation of its
    logits sits from float64 truth, measured on fresh batch-size-1 passes without a cache, which no
    bug in the batched, cached verify path can reach. The white-box verdicts' yardstick."""

    dtype: str
    method: str  # how it was measured, in words
    positions: int  # distinct positions measured
    sequences: int
    levels: Many[float]  # quantile levels in [0, 1], ascending
    # per position, the largest |logit - float64 logit| over the vocabulary, at those levels
    quantiles: Many[float]
    # machine epsilon of the dtype times the largest logit: nothing is measured finer
    resolution: float
    slots: int | None = None  # positions one comparison spans (a verify pass: k + 1)
    # two correct computations of `slots` positions differ by more than this with probability alpha
    tolerance: float
    # the same scaled to float64's unit roundoff: for passes rebuilt in float64
    float64_tolerance: float | None = None
    # that probability: the stated false-alarm rate of one comparison (None: not stated)
    alpha: float | None = None
    relative: float | None = None  # largest error / (unit roundoff x the largest logit there)
    expected: float | None = None  # the largest `relative` this dtype is known to show
    # set when `relative` is far above `expected`: the yardstick itself is suspect
    anomaly: str | None = None
    # A hybrid: how far its decode (recurrent) algorithm departs from its fresh (chunked) one, both
    # in float64.
    algorithms: float | None = None
    # The run was batch-invariant (models/invariant.py): a row's logits are the same bits in any
    # batch, so `tolerance` is 0, and `rounding` is what rounding alone would allow.
    batch_invariant: bool = False
    rounding: float | None = None

    def from_float64(self) -> float:
        """The tolerance of a computation in the run's dtype against float64 truth: rounding's,
        which no batch-invariant mode takes away."""
        return self.rounding if self.batch_invariant else self.tolerance

    def place(self, difference: float) -> float:
        """Where a difference between two computations falls on the yardstick: the share of measured
        positions whose rounding, doubled, lies below it (1.0: beyond every one)."""
        below = [level for level, q in zip(self.levels, self.quantiles) if 2 * q < difference]
        return below[-1] if below else 0.0

    def describe(self) -> str:
        """The yardstick in words, for a verdict or a summary."""
        if self.batch_invariant:
            return (f"batch-invariant {self.dtype}: zero tolerance, since a row's logits are the "
                    "same bits in any batch (rounding alone would allow "
                    f"{self.rounding:.3g} logits)")
        rate = ("no false-alarm rate stated" if self.alpha is None
                else f"false-alarm rate {self.alpha:.2g}")
        return (f"rounding of the target in {self.dtype}: tolerance {self.tolerance:.3g} logits, "
                f"{rate}, from {self.positions} positions of {self.sequences} sequences measured "
                "fresh against float64")


class EngineNoise(Strict):
    """An engine's own rounding, measured on its run without speculation (enginenoise.py), which
    cannot contain a speculation bug: where its tokens depart from the target's float64 argmax, and
    by how much, against the margins it kept. The engine verdicts' yardstick."""

    # control: measured on the control run; unbounded: the control's tokens bound none of it (method
    # says why) and, as with none (no control run), only transformers' rounding is granted
    source: Literal["control", "unbounded", "none"]
    truth: str  # "float64", or the target's dtype where no float64 copy could be made
    tokens: int  # control tokens scored
    # float64 gaps of the control's tokens that are not the target's argmax, largest first
    departures: Many[float]
    # the control's noise on a logit difference (Gaussian, fitted to flips and kept margins)
    sigma: float | None = None
    sigma_upper: float | None = None  # its 95% upper bound
    # the same noise read off the control's log-probabilities, where it gave them: reported, never
    # in the tolerance
    sigma_logprobs: float | None = None
    # transformers' own tolerance in this dtype (Rounding.tolerance): the yardstick without
    # a control
    rounding: float
    # the largest float64 gap this engine's own rounding explains, at false-alarm rate alpha
    tolerance: float
    alpha: float
    method: str
    # control outputs (sequence indices) set apart from the fit: their departures need far more
    # noise than the rest's
    outliers: Many[int] = []

    def describe(self) -> str:
        """What the yardstick explains, and from what."""
        if self.source == "none":
            return ("transformers' own rounding in this dtype explains gaps up to "
                    f"{self.rounding:.3g} (no control run measured this engine's)")
        if self.source == "unbounded":
            return ("transformers' own rounding in this dtype explains gaps up to "
                    f"{self.rounding:.3g}; the control run bounds none of this engine's: "
                    f"{self.method}")
        seen = "none departing" if not self.departures else \
            f"{len(self.departures)} departing, by up to {self.departures[0]:.3g}"
        # a version-7 control: no token
        upper = "unknown" if self.sigma_upper is None else f"{self.sigma_upper:.3g}"
        lp = ("" if self.sigma_logprobs is None
              else f", {self.sigma_logprobs:.3g} from its log-probabilities"
              + (" (more than its tokens allow: not granted)"
                 if self.sigma_logprobs > (self.sigma_upper or 0) else ""))
        apart = (f"; {len(self.outliers)} of its outputs set apart, departing by far more than the "
                 "rest's rounding"
                 if self.outliers else "")
        return (f"this engine's own rounding explains gaps up to {self.tolerance:.3g} (from its "
                f"control run: {self.tokens} tokens, {seen}; noise sigma at most "
                f"{upper}{lp}{apart}; false-alarm rate {self.alpha:g} an output)")


class Yardsticks(Strict):
    """What this run's verdicts were judged against: measured on its pair, dtype and device, never
    on the run."""

    target: Rounding | None  # None: no float64 copy of the target could be made
    draft: Rounding | None = None  # measured for audits
    engine: EngineNoise | None = None  # engine checks
