"""Every metric and verdict the page shows, with its formula and, when a trace is open, its value: a
table of definitions, the page's Glossary tab."""
from __future__ import annotations

from specviz.app.summary import drafter_text, p_value
from specviz.app.views import md
from specviz.spec.verdicts import OWN_DRAFTS, VERDICTS
from specviz.trace import metrics
from specviz.trace.schema import Trace


def glossary(trace: Trace | None) -> str:
    """Every metric the page shows, with its formula and (when a trace is open) its value."""
    def value(fn) -> str:
        if trace is None:
            return ""
        v = fn(trace)
        return ("" if v is None else f" — here **{v:.3g}**" if isinstance(v, float)
                else f" — here **{v}**")

    def realign_share(t: Trace) -> float | None:
        return (metrics.phase_seconds(t)["realign"] / t.manifest.decode_seconds
                if t.rows and t.manifest.decode_seconds else None)

    def _tolerance(t: Trace) -> float | None:
        ys = t.manifest.yardstick
        return ys.target.tolerance if ys and ys.target else None

    def throughput(t: Trace) -> float | None:
        return (sum(len(s.output_ids) for s in t.sequences) / t.manifest.decode_seconds
                if t.manifest.decode_seconds else None)

    def _dist(t: Trace) -> dict | None:
        return metrics.distribution_summary(t)

    def _verdict(t: Trace) -> str | None:
        d = _dist(t)
        return None if d is None else f"{md(d['verdict'])}, p {p_value(d['p'])}"

    def _mismatches(t: Trace) -> str | None:
        d = _dist(t)
        return None if d is None or d["checked"] is None else f"{d['mismatches']} of {d['checked']}"

    def _mean_pit(t: Trace) -> float | None:
        values = [u for s in t.sequences for u in s.pit or () if u is not None]
        return sum(values) / len(values) if values else None

    def _speedup(t: Trace) -> float | None:
        sp = metrics.speedup(t)
        return None if sp is None else sp["ratio"]

    def _drafter(t: Trace) -> str | None:
        return md(drafter_text(t.manifest.spec)) if t.rows else None

    def _no_drafts(t: Trace) -> str | None:
        return f"{sum(not r.draft_tokens for r in t.rows)} of {len(t.rows)}" if t.rows else None

    def _states(t: Trace) -> str | None:
        held = [r.checks["recurrent"] for r in t.rows if "recurrent" in r.checks]
        return f"{sum(held)} of {len(held)} (round, row) records held I5" if held else None

    def _drafts(t: Trace) -> str | None:
        a = t.acceptance
        return None if a is None else (f"{md(a.verdict or OWN_DRAFTS)}: {a.accepted} drafts "
                                       f"accepted, {a.accepted_fresh} by the fresh pass's")

    def _refused(t: Trace) -> str | None:
        r = t.rejections
        return None if r is None else (f"{r.wrong} of {r.judged} rounds; {r.accepted} drafts "
                                       f"accepted, {r.kept} by the target's own choices")

    positions = metrics.per_position_acceptance(trace) if trace and trace.rows else []
    lines = [
        "**acceptance rate** = accepted draft tokens / proposed draft tokens, over active rows"
        + value(metrics.acceptance_rate),
        "**tokens per round** = emitted tokens / (round, row) records, bonus included"
        + value(metrics.tokens_per_round),
        "**per-position acceptance** = "
        "P(draft j accepted | drafts before j accepted and a draft j offered)"
        + (" — here " + ", ".join(f"{p:.2f}" for p in positions) if positions else ""),
        "**realignment overhead** = realign time / decode time" + value(realign_share),
        "**group rate** (exspec) = same-length rounds / all rounds" + value(metrics.group_rate),
        "**throughput** = generated tokens (through EOS) / decode seconds" + value(throughput),
        ("**speed-up** = the run's throughput / the batch-size-1 reference's (its tokens / its "
         "decode seconds), both from the trace; the run's time includes recording its trace"
         + value(_speedup)),
        ("**drafter** = what proposes a round's drafts: the draft model (one forward pass a "
         "draft), or prompt lookup (the tokens that followed the row's last n-gram where it first "
         "occurred earlier in its prompt and output; no model, the longest n first)"
         + value(_drafter)),
        ("**drafts offered** (a row's own k) = the drafts its round proposed for that row: k, "
         "fewer near its token budget or where prompt lookup's match runs short, none where no "
         "n-gram matches — the row then takes the target's own token alone (a — cell in the grid, "
         "\"no drafts\" in the timeline). Rows offered none"
         + value(_no_drafts)),
        "**exact match** = sequences whose token ids equal the batch-size-1 reference / sequences",
        "**prefix match** = reference tokens before the first difference / "
        "reference tokens, averaged",
        "**top-2 margin** = the target's top-1 minus top-2 logit at a position: "
        "how close its choice was to flipping",
        ("**rounding** (the yardstick) = per position, the largest |logit difference| between the "
         "target in the run's dtype and a float64 copy, both fresh (batch size 1, no cache: a path "
         "no verify-kernel bug reaches), over the built-in prompts and the reference's "
         "continuations on this pair and device"),
        ("**rounding tolerance** = twice the order statistic of those positions that a correct "
         "computation of a verify pass's k + 1 positions, or the one it is compared with, exceeds "
         "with probability at most α: two correct computations differ by more with probability α "
         "(the stated false-alarm rate)" + value(_tolerance)),
        ("**state check** = the largest |logit difference| between the pass that emitted a token "
         "and a fresh batch-size-1 recomputation of that row's real tokens (no cache); beyond the "
         "rounding tolerance its first token, positions and mask are checked, the pass is rebuilt "
         "from correct inputs, and its cache entries are replayed, one at a time"),
        ("**float64 gap** = the reference token's logit minus the speculative token's, recomputed "
         "in float64 at batch size 1: the true distance of the near-tie"),
        "**verdict** = what went wrong, named by the state or the decision: "
        + "; ".join(f"`{v.name}`: {v.meaning} (from {v.evidence})" for v in VERDICTS.values()),
        ("**drafts** (greedy runs with a draft model) = each round's drafts against a fresh "
         "batch-size-1 pass of the draft model on the row's committed tokens: beyond the draft's "
         "rounding a draft is not the draft model's own, a bug that keeps the output right and "
         "wastes the drafts (`draft-bug:<side>`)" + value(_drafts)),
        ("**refused drafts the target chose** (greedy runs with rounds) = rounds whose first "
         "refused draft is the very token they wrote in its place, the verify pass's argmax (where "
         "recorded) and a fresh pass's: a wrong decision that keeps the output right and loses "
         "the drafts "
         "(`decision-bug:reject`)" + value(_refused)),
        ("**audit** (run with audit) = the state check on every row of every round, for the target "
         "and the draft: the first round a row's state left rounding, fork or not"),
        ("**sampled verdict** = a sampled run's kind of fault: `sync-bug:<state>` when a row's "
         "state went wrong, `sampler-bug:decisions` when decisions do not follow their recorded p, "
         "q and draw, `sampler-bug:proposal` when a draft is not a draw from the q its decision "
         "read, `sampler-bug:rule` when every audited state and decision held yet the tokens "
         "are not the target's distribution, `unexplained` when rows went unaudited"),
        "**delta** = how many slots a row's KV moved in a realignment "
        "(0 when every row gained the same)",
        ("**recurrent state** (hybrid models: Gated DeltaNet, Mamba, short convolutions) = a "
         "layer's per-row state instead of a slot per token, which cannot be cropped: the engine "
         "keeps it after every drafted position and each row continues from the one at its own "
         "accepted count. Its lane counts the row's tokens it holds (-1: a token that is not the "
         "row's, a rejected draft). **I5**: after each round it holds exactly the row's committed "
         "tokens but the last (the draft's, but two); the state check replays the row's own states "
         "over fresh K/V, and beyond rounding names `sync-bug:recurrent`" + value(_states)),
        ("**engine check** = another engine's outputs (a server, a file, a callable) against the "
         "batch-size-1 reference of the same weights; every output token is teacher-forced "
         "through the target"),
        ("**gap** (engine checks) = the target's top logit minus the engine token's, in float64 on "
         "the engine's own prefix: 0 where the engine wrote the target's own choice"),
        ("**engine rounding** = the engine's own noise on a logit difference, fitted to its "
         "control run (the same engine without speculation, which holds no speculation bug): the "
         "gaps where the control departs from the target's float64 argmax and the margins where it "
         "does not (its log-probabilities, where given, are reported, not granted; an output of it "
         "whose departures need far more noise than the rest's is set apart); its tolerance is the "
         "gap that every token of a correct output stays within with probability 99% "
         "(its 1 - 0.01 / n quantile, n the output's budget of tokens) at the 95% upper bound "
         "(without a control, or with one that bounds nothing below the largest margin it kept, "
         "transformers' own rounding)"),
        ("**engine-bug** = a token at or after the fork has a gap beyond the engine's own "
         "rounding; `numerics` = every gap from the fork on within it; without a control run, or "
         "with one that bounds nothing, a gap beyond transformers' rounding is `unexplained`, "
         "asking for one that does"),
        ("**temperature, top-k, top-p** (sampled runs) = the target's logits divided by the "
         "temperature, cut to the k most likely tokens, then to the smallest set holding top-p of "
         "the mass; the draft uses the same unless given its own. Temperature 0 is greedy"),
        ("**accept probability** = min(1, p/q) for a draft token with draft probability q and "
         "target probability p: accepted iff its draw u < p/q. After a rejection the token is "
         "drawn from the **residual** norm(max(0, p − q)); after k accepted drafts the bonus is "
         "drawn from p"),
        ("**PIT** (randomized probability integral transform) = F(x−) + V · p(x) for an emitted "
         "token x, with F(x−) the target's mass of the tokens ranked before x (most probable "
         "first) and V uniform: uniform on (0, 1) under a correct sampler, whatever p is; a "
         "sampler that favours likely tokens piles its values near 0 (a mean PIT below 0.5), one "
         "that favours unlikely tokens near 1. p is recomputed at batch size 1, outside the engine"
         + value(_mean_pit)),
        ("**distribution verdict** = every split of the PIT values (pooled, by slot, by batch row, "
         "by rounds, row pairs) tested against uniform (Kolmogorov–Smirnov and chi-square), "
         "Bonferroni across splits: rejected when p < α, or at once by one **impossible token** "
         "(probability 0 under the target)" + value(_verdict)),
        ("**decision audit** = every recorded accept/reject decision re-derived from its recorded "
         "p, q and u: a correct engine has no mismatch" + value(_mismatches)),
    ]
    return "\n".join(f"- {line}" for line in lines)
