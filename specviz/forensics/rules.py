"""Which acceptance rule wrote a sampling engine's tokens: the likelihood of its tokens under
each rule.

A speculative sampler's round emits some accepted drafts, then one token the target chose: a draw
from the residual after a rejection, or from p once all k drafts passed. Which tokens were drafts
cannot be read from the ids, so an output's likelihood sums over every way of cutting it into rounds
(a forward pass over the round boundaries, n x (k + 1) steps). At each token it needs three chances,
from the target's p and the draft model's q on the engine's own prefix, recomputed fresh at batch
size 1: `accept`, that the draft was this token and the rule kept it; `redraw`, that the rule
refused the draft and then drew this token; `bonus`, that it is the token after k kept drafts. Under
the correct rule accept + redraw = bonus = p: the sum is the product of p, the likelihood of a
lossless sampler, as the tests check. Each sampling fault of the catalogue (spec/faults.py) whose
sampler has a closed form is a rule, written here from its description, not from the engine's code;
the log-likelihood ratio of the engine's tokens under it against the correct rule, summed over the
check, names it beyond LOG_RATIO, if no other rule comes within APART of it. Under the correct rule
each ratio is a martingale of mean 1: it passes LOG_RATIO with probability at most e^-LOG_RATIO
(Ville's inequality), whatever the number of tokens, as far as the p and q recomputed here are the
engine's (its rounding is not).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from specviz.decoding.sampling import Sampler, sampling_of
from specviz.forensics.recompute import fresh_logits
from specviz.models.pairs import ModelPair
from specviz.spec.faults import mechanism
from specviz.trace.evidence import RuleAttribution, RuleHypothesis
from specviz.trace.schema import Trace

# nats: a rule is named when it makes the engine's tokens a million times likelier
LOG_RATIO = math.log(1e6)
APART = math.log(100)  # than the correct rule, and a hundred times likelier than the next rule


def _norm(w: torch.Tensor) -> torch.Tensor:
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / total.clamp(min=1e-300), torch.zeros_like(w))


def _leftover_last(w: torch.Tensor) -> torch.Tensor:
    """Unnormalised weights drawn by u against their own running sum: the mass they lack falls on
    the last id."""
    out = w.clone()
    out[..., -1] += (1 - w.sum(-1)).clamp(min=0)
    return out


# rule -> (p, q, p untruncated, p at temperature 1) -> (q x acceptance, residual, bonus
# distribution), each (n, V)
Rule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]
RULES: dict[str, Rule] = {
    "correct": lambda p, q, full, one: (torch.minimum(p, q), _norm((p - q).clamp(min=0)), p),
    "accept-q-over-p": lambda p, q, full, one: (
        torch.where(p > 0, q * (q / p.clamp(min=1e-300)).clamp(max=1), q),
        _norm((p - q).clamp(min=0)), p),
    "residual-from-draft": lambda p, q, full, one: (torch.minimum(p, q), q, p),
    "residual-unnormalised": lambda p, q, full, one: (torch.minimum(p, q),
                                                      _leftover_last((p - q).clamp(min=0)), p),
    "temperature-draft-only": lambda p, q, full, one: (torch.minimum(one, q),
                                                       _norm((one - q).clamp(min=0)), one),
    "top-p-not-in-residual": lambda p, q, full, one: (torch.minimum(p, q),
                                                      _norm((full - q).clamp(min=0)), p),
    "processors-on-bonus-only": lambda p, q, full, one: (torch.minimum(full, q),
                                                         _norm((full - q).clamp(min=0)), p),
}
_CORRECT_HERE = "the rule is the correct one here"
# a rule that differs from the correct one only where top-k or top-p truncates p
_UNTRUNCATED = (lambda spec: spec.top_p == 1 and not spec.top_k,
                f"no top-k or top-p truncates p: {_CORRECT_HERE}")
MOOT = {  # rule -> (whether a run's settings make it the correct rule, why)
    "temperature-draft-only": (lambda spec: spec.temperature == 1,
                               f"the target samples at temperature 1: {_CORRECT_HERE}"),
    "top-p-not-in-residual": _UNTRUNCATED,
    "processors-on-bonus-only": _UNTRUNCATED,
}
SKIPPED = {  # the catalogue's other sampling faults, and why no likelihood is computed for them
    "residual-unclamped": "its residual p - q is no distribution: what it draws depends on the "
                          "sampler's arithmetic",
    "target-probs-mutated": "its residual depends on which draft was refused: a sum over the "
                            "vocabulary per token",
    "draft-probs-unprocessed": "it decides by the draft model's raw softmax, which the rules are "
                               "not given (they hold the draft's q as it was drawn from)",
    "draft-drawn-in-bfloat16": "its drafts follow the draft model's logits rounded as the "
                               "engine rounded them, which the rules are not given",
    "shared-stream": "it acts on the random streams of the batch, not on one row's distribution",
}


def chances(rule: Rule, p, q, full, one,
            tokens: torch.Tensor) -> tuple[list[float], list[float], list[float]]:
    """Per token of an output: (accept, redraw, bonus) under `rule`."""
    kept, residual, bonus = rule(p, q, full, one)
    refused = (1 - kept.sum(-1)).clamp(min=0)
    at = tokens[:, None]
    return (kept.gather(1, at)[:, 0].tolist(), (refused * residual.gather(1, at)[:, 0]).tolist(),
            bonus.gather(1, at)[:, 0].tolist())


def log_likelihood(accept: list[float], redraw: list[float], bonus: list[float], k: int) -> float:
    """log P(output) under a rule: summed over every cut of the output into rounds of at most k kept
    drafts and one token the target chose; the last round may end on a kept draft (an
    end-of-sequence token, the budget)."""
    n = len(accept)
    alpha = [-math.inf] * (n + 1)
    alpha[0] = 0.0
    total = -math.inf
    for t in range(n):
        if alpha[t] == -math.inf:
            continue
        drafts = 0.0  # log of the chance that tokens t..j-1 were all drafts the rule kept
        for m in range(min(k, n - 1 - t) + 1):
            j = t + m
            end = bonus[j] if m == k else redraw[j]
            # the output ends in this round: on the target's token, or on a kept draft
            if j == n - 1:
                last = end + (accept[j] if m < k else 0.0)
                if last > 0:
                    total = _add(total, alpha[t] + drafts + math.log(last))
            elif end > 0:
                alpha[j + 1] = _add(alpha[j + 1], alpha[t] + drafts + math.log(end))
            if accept[j] <= 0:
                break
            drafts += math.log(accept[j])
    return total if n else 0.0


def _add(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    hi, lo = max(a, b), min(a, b)
    return hi + math.log1p(math.exp(lo - hi))


def judge_rules(trace: Trace, pair: ModelPair, prompt_ids: list[list[int]],
                k: int) -> RuleAttribution:
    """Each rule's log-likelihood ratio over the correct one, summed over the check's answered
    outputs (an engine that drafts with the check's draft model, `k` drafts a round)."""
    spec = trace.manifest.spec
    sampling = sampling_of(spec)
    same = {rule: why for rule, (moot, why) in MOOT.items() if moot(spec)}
    totals = {rule: 0.0 for rule in RULES if rule not in same}
    tokens = 0
    for s in trace.sequences:
        if not s.output_ids or (s.engine and s.engine.error):
            continue
        ids = prompt_ids[s.seq] + s.output_ids[:-1]
        z = fresh_logits(pair.target, ids, len(s.output_ids), pair.vocab_size)
        zq = fresh_logits(pair.draft, ids, len(s.output_ids), pair.vocab_size)
        target, draft = sampling.row(s.seq).target, sampling.row(s.seq).draft
        p, q = target.probs(z), draft.probs(zq)
        full = target.probs(z, truncate=False)
        one = Sampler(1.0, target.top_k, target.top_p).probs(z)
        out = torch.tensor(s.output_ids)
        for name in totals:
            totals[name] += log_likelihood(*chances(RULES[name], p, q, full, one, out), k)
        tokens += len(s.output_ids)
    correct = totals.pop("correct")
    # -inf where the rule makes a token impossible; +inf where only the correct rule does (the check
    # refuses penalties, so the target's p here is the engine's, up to its rounding)
    ratios = {name: ll - correct if ll > -math.inf else -math.inf for name, ll in totals.items()}
    ranked = sorted(ratios.items(), key=lambda x: -x[1])
    hypotheses = [RuleHypothesis(fault=name, log_ratio=ratio if math.isfinite(ratio) else None,
                                 possible=ratio > -math.inf)
                  for name, ratio in ranked]
    best, runner_up = ranked[0][1], ranked[1][1] if len(ranked) > 1 else -math.inf
    hypotheses[0].named = best >= LOG_RATIO and (runner_up == -math.inf
                                                 or best - runner_up >= APART)
    return RuleAttribution(hypotheses=hypotheses, tokens=tokens, threshold=LOG_RATIO,
                           skipped={**SKIPPED, **same}, explanation=_explain(hypotheses, tokens))


def _explain(hypotheses: list[RuleHypothesis], tokens: int) -> str:
    best = hypotheses[0]
    tried = (f"{len(hypotheses)} acceptance rules of the catalogue scored on {tokens} tokens, each "
             "summed over every way its tokens split into rounds")
    if best.named:
        return (f"{mechanism([best.fault])}. It makes the engine's tokens {_times(best)} likelier "
                f"than the correct rule does ({tried}).")
    if not best.possible:
        return f"No rule is named: each makes some of the engine's tokens impossible ({tried})."
    # far likelier, but so is the next one
    if best.log_ratio is None or best.log_ratio >= LOG_RATIO:
        return (f"No rule is named: {best.fault} and {hypotheses[1].fault} both make the engine's "
                f"tokens far likelier than the correct rule does ({_times(best)} and "
                f"{_times(hypotheses[1])}), and these tokens cannot tell them apart (naming one "
                f"needs e^{APART:.1f} between them; {tried}). Missing evidence: more tokens.")
    return (f"No rule of the catalogue is named: the likeliest, {best.fault}, makes the engine's "
            f"tokens e^{best.log_ratio:.1f} times as likely as the correct rule does, and naming "
            f"one needs e^{LOG_RATIO:.1f} ({tried}).")


def _times(h: RuleHypothesis) -> str:
    """How many times likelier a rule makes the engine's tokens, in words."""
    return ("infinitely (some are impossible under the correct rule alone)" if h.log_ratio is None
            else f"e^{h.log_ratio:.1f} times")
