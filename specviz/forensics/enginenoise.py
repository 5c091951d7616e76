"""An engine's own rounding, measured on its run without speculation.

A real engine's kernels round differently from transformers' (llama.cpp quantizes
activations, vLLM fuses; both change with batch shape), so our rounding cannot judge
them. Their control run (the same engine, the same weights, speculation off) cannot hold
a speculation bug, so its tokens measure the engine's rounding. Teacher-forced through the
target in float64, each control token is either the true argmax on its own prefix (the
engine's noise stayed below that position's top-2 margin) or a departure of a known
float64 gap (the noise reached past it).

Model the engine's noise on a logit difference as Gaussian of scale sigma. A departure of
gap g has probability P(noise > g); a kept token of margin m has P(noise < m). sigma is the
maximum-likelihood fit to both (a censored sample: departures alone would only show that
noise reached somewhere), with a likelihood-ratio 95% upper bound. A fork is that engine's
numerics while every float64 gap from the fork on stays within z(1 - alpha / n) times that
bound, n the output's budget of tokens: each of them is compared, so the false-alarm rate
alpha holds per output, not per token. Where the engine gave log-probabilities, their
departures from float64 read sigma too, and are reported beside it; they never widen the
tolerance: the tokens are what is judged, and log-probabilities from another computation
(another model, a processed distribution) would otherwise explain any gap. Without a control,
or with one whose tokens bound nothing (`unbounded`), only transformers' own rounding in the
dtype is known.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from scipy import optimize, special, stats

from specviz.decoding import kvcache
from specviz.forensics.recompute import float64_target, fresh_logits
from specviz.forensics.yardstick import ALPHA  # one false-alarm rate for every comparison
from specviz.models.architecture import is_recurrent
from specviz.trace.records import shared_prefix

CHI2_95 = stats.chi2.ppf(0.95, 1)
SIGMA_RANGE = (1e-9, 1e3)
SIGMA_GRID = np.geomspace(*SIGMA_RANGE, 12 * 50 + 1)  # 50 a decade, each 4.7% above the last
MAX_DEPARTURES = 200  # kept in the trace, the largest first

Computed = TypeVar("Computed")
# (key, compute) -> compute(), or what it gave for the key before
Memo = Callable[[Hashable, Callable[[], Computed]], Computed]


def computed(key: Hashable, compute: Callable[[], Computed]) -> Computed:
    """No memory: computed every time."""
    return compute()


def truth_model(pair):
    """The target the truth is computed with: its float64 copy, else itself (and the trace
    says so)."""
    model = float64_target(pair)
    return (model, "float64") if model is not None else (pair.target,
                                                         str(pair.dtype).removeprefix("torch."))


class TeacherForcing:
    """The target's logits for each token of an output on its own prefix, (len(output), vocab)
    float64, for several outputs of the same prompt in turn (an engine's, its control's, the
    reference's): the prompt goes into a cache of this model's own in the pass over its first
    output, and each further output is one pass over it (cropped back after). The next prompt keeps
    what it shares with this one (a chat template's prefix: a fifth of a check's float64 positions
    on the built-in prompts). Batch size 1 throughout; nothing of any engine's is reused. A hybrid's
    recurrent state cannot be cropped back to the prompt: each of its outputs is a fresh pass.

    `memo(key, compute)`: where `force` keeps what it read of each (prompt, output), so that an
    output checked again (the same control beside another engine, a file of a live run's answers) is
    forced once per process."""

    def __init__(self, model, vocab: int, memo: Memo = computed):
        self.model, self.vocab, self.memo = model, vocab, memo
        self._prompt: list[int] | None = None
        self._cache = None

    @torch.inference_mode()
    def __call__(self, prompt: list[int], output: list[int]) -> torch.Tensor:
        if not output:
            return torch.zeros(0, self.vocab, dtype=torch.float64)
        # nothing to cache; a recurrent state cannot be cropped back
        if len(prompt) < 2 or is_recurrent(self.model):
            return fresh_logits(self.model, prompt + output[:-1], len(output), self.vocab)
        device = self.model.get_input_embeddings().weight.device
        prefill = []
        if self._prompt != prompt:
            shared = 0 if self._prompt is None else shared_prefix(self._prompt[:-1], prompt[:-1])
            if shared:
                kvcache.crop(self._cache, shared)
            else:
                self._cache = kvcache.new(self.model)
            prefill, self._prompt = prompt[shared:-1], list(prompt)
        # The prompt's new tokens and the output in one pass: float64 GEMMs of a few dozen rows run
        # at half speed.
        out = self.model(input_ids=torch.tensor([prefill + prompt[-1:] + output[:-1]],
                                                device=device),
                         cache=self._cache, logits_to_keep=len(output))
        kvcache.crop(self._cache, len(prompt) - 1)
        return out.logits[0, :, : self.vocab].double().cpu()


@dataclass
class Forced:
    """One output teacher-forced through the target: per token, what the judges read of the target's
    logits on its own prefix. The logits themselves are dropped, so that a check holds O(tokens),
    not O(tokens x vocab)."""

    gaps: list[float]  # the top logit minus the token's (0: the target's own choice)
    margins: list[float]  # top-1 minus top-2
    logprobs: list[float]  # the token's log-probability
    # (1 - p_t)^2 + sum over v != t of p_v^2: how noise on the logits moves log p_t
    spreads: list[float]
    ranks: list[int]  # 1 + how many tokens' logits exceed the token's


def force(forcing: TeacherForcing, prompt: list[int], output: list[int]) -> Forced:
    """`output` teacher-forced on `prompt`, read down to what the judges need."""
    if not output:
        return Forced([], [], [], [], [])
    # the truth: float64, else the dtype's
    key = ("forced", str(forcing.model.dtype), tuple(prompt), tuple(output))
    return forcing.memo(key, lambda: _forced_from(forcing(prompt, output), output))


def _forced_from(logits: torch.Tensor, output: list[int]) -> Forced:
    top = logits.topk(2, -1).values
    idx = torch.tensor(output)[:, None]
    token = logits.gather(1, idx)
    logp = logits.log_softmax(-1)
    p = logp.exp()
    pt = p.gather(1, idx)[:, 0]
    return Forced(gaps=(top[:, 0] - token[:, 0]).tolist(), margins=(top[:, 0] - top[:, 1]).tolist(),
                  logprobs=logp.gather(1, idx)[:, 0].tolist(),
                  spreads=((1 - pt) ** 2 + (p ** 2).sum(-1) - pt ** 2).tolist(),
                  ranks=(1 + (logits > token).sum(-1)).tolist())


def _log_likelihoods(departures: list[float], kept: list[float],
                     sigmas: np.ndarray = SIGMA_GRID) -> np.ndarray:
    """The tokens' log-likelihood at each of `sigmas`: log P(noise > g) for each departure, log
    P(noise < m) for each margin kept."""
    return (special.log_ndtr(-np.asarray(departures, dtype=float)[:, None] / sigmas).sum(0)
            + special.log_ndtr(np.asarray(kept, dtype=float)[:, None] / sigmas).sum(0))


def _split(gaps: list[float], margins: list[float]) -> tuple[list[float], list[float]]:
    """Tokens' float64 gaps where they depart from the target's argmax, and their margins where they
    are it."""
    return [g for g in gaps if g > 0], [m for g, m in zip(gaps, margins) if g == 0 and m > 0]


def fit_sigma(gaps: list[float], margins: list[float]) -> tuple[float, float] | None:
    """(sigma, its 95% upper bound) from tokens' float64 gaps (a departure where > 0) and margins
    (where kept); None without tokens."""
    departures, kept = _split(gaps, margins)
    if not departures and not kept:
        return None
    lo, hi = (math.log(x) for x in SIGMA_RANGE)

    def nll(log_sigma: float) -> float:
        return -float(_log_likelihoods(departures, kept, np.array([math.exp(log_sigma)]))[0])

    best = (lo if not departures
            else optimize.minimize_scalar(nll, bounds=(lo, hi), method="bounded").x)
    bound = nll(best) + CHI2_95 / 2
    upper = hi if nll(hi) <= bound else optimize.brentq(lambda x: nll(x) - bound, best, hi)
    return (math.exp(best) if departures else 0.0), math.exp(upper)


def outliers(outputs: list[tuple[list[float], list[float]]], alpha: float = ALPHA) -> list[int]:
    """The outputs (indices into `outputs`, each its tokens' (gaps, margins)) whose departures no
    noise shared with the others explains. Rounding is one engine's kernels on every output, so an
    output that needs far more noise than the rest departs from the model for another reason
    (another model, template or request on that prompt); fitted with the rest, it would widen the
    tolerance for every output. Tested worst first, one output set apart at a time, among those not
    yet set apart: the likelihood ratio of a sigma for the output and one for the others against one
    for all (chi-square with one degree of freedom, at alpha / outputs each), each likelihood
    maximized over SIGMA_GRID. Outputs without departures never need more noise and are never
    set apart."""
    each = np.array([_log_likelihoods(*_split(gaps, margins))
                     for gaps, margins in outputs]).reshape(-1, len(SIGMA_GRID))
    candidates = [i for i, (gaps, _) in enumerate(outputs) if any(g > 0 for g in gaps)]
    threshold = stats.chi2.isf(alpha / max(len(outputs), 1), 1) / 2
    kept = np.ones(len(outputs), dtype=bool)
    while True:
        together = each[kept].sum(0)
        ratio = {i: each[i].max() + (together - each[i]).max() - together.max() for i in candidates
                 if kept[i]}
        worst = max(ratio, key=ratio.get, default=None)
        if worst is None or ratio[worst] <= threshold:
            return sorted(np.flatnonzero(~kept).tolist())
        kept[worst] = False


def unbounded(gaps: list[float], margins: list[float],
              fit: tuple[float, float] | None) -> str | None:
    """Why a control's tokens bound none of its engine's rounding, or None where they bound it. The
    fit tests noise only at the scales of the margins the control kept: far above the largest, every
    kept token is about as likely under any larger noise, so the upper bound is where the likelihood
    flattens (or SIGMA_RANGE's top), not a measurement, and its tolerance would explain any gap. A
    control that departs at every token, or one of a few tokens, would otherwise let any engine's
    output pass as rounding."""
    departures, kept = _split(gaps, margins)
    if fit is None:
        return "none of its tokens could be scored"
    if not kept:
        return (f"all {len(gaps)} of its tokens depart from the target's own choice, by up to "
                f"{max(departures):.3g}, so none shows where its rounding stops")
    if fit[1] >= max(kept):
        return (f"the 95% upper bound on its noise, {fit[1]:.3g}, is not below the largest margin "
                f"it kept, {max(kept):.3g}: none of its {len(gaps)} tokens tests noise that large")
    return None


def sigma_from_logprobs(forced: Forced, logprobs: list[float]) -> list[float]:
    """Per token, the squared log-probability error scaled to a logit difference's noise: with
    independent noise of variance s^2 on each logit, log p(t) moves by about (1 - p_t) e_t -
    sum_v!=t p_v e_v, of variance s^2 ((1 - p_t)^2 + sum_v!=t p_v^2), and a difference of two logits
    has variance 2 s^2."""
    return [2 * (lp - truth) ** 2 / max(spread, 1e-12)
            for lp, truth, spread in zip(logprobs, forced.logprobs, forced.spreads)]


def robust_sigma(scaled_squares: list[float]) -> float | None:
    """sigma from scaled squared errors: their median over the median of a chi-square with one
    degree of freedom."""
    if not scaled_squares:
        return None
    return math.sqrt(float(torch.tensor(scaled_squares).median()) / stats.chi2.ppf(0.5, 1))


def tolerance(sigma_upper: float, tokens: int, alpha: float = ALPHA) -> float:
    """The largest float64 gap the engine's rounding explains in an output of up to `tokens` tokens,
    every one of which is compared with it: a correct output stays within it throughout with
    probability at least 1 - alpha (alpha / tokens a token; 1% a token would allow, where every
    margin is near zero, a false alarm in about one output of three)."""
    return stats.norm.isf(alpha / max(tokens, 1)) * sigma_upper
