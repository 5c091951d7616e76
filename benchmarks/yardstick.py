"""The verdict's power: the smallest logit error planted in the verify pass that the state check
catches, per pair and dtype, before (version 4's noise floor) and after (the rounding yardstick),
with each one's false alarms on correct runs, measured side by side in one run.

The error: every verify-shaped pass of the target (several queries over a cache) gets +x on one
logit of each row and slot (a seeded choice), as a kernel bug would add it. Version 4 measured its
floor through the same kind of pass, so its floor rose with the error; it is shown both ways: as it
was (the floor measured with the error in place) and as if its floor had been measured clean. Every
audited (round, row) is one check: it catches the error when its state difference exceeds the
threshold (version 4: 4 x floor; now: the rounding tolerance).

Then the rebuild in float64: a kernel error planted as a softmax scale off by a factor (1 + eps),
the pass rebuilt from correct inputs in the run's dtype and in float64 against fresh passes; the
smallest eps each catches.

    python benchmarks/yardstick.py [--out benchmarks/results/yardstick.md]
"""
import argparse
import contextlib
import sys
from pathlib import Path

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface

from specviz.decoding import kvcache
from specviz.forensics.recompute import copy_in, fresh_logits
from specviz.run import runner
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from publish import publish

PAIRS = {"tiny": (dict(target=TINY_TARGET, draft=TINY_DRAFT), "all", 32),
         "embedded": ({}, "quick", 24)}
FACTOR = 4.0  # version 4: a state is corrupt beyond 4 floors
STEPS = [2 ** (i / 2) for i in range(-6, 9)]  # error sizes, as multiples of the new tolerance


def _verify_shaped(kwargs) -> bool:
    ids, cache = kwargs["input_ids"], kwargs.get("cache")
    return ids.shape[1] > 1 and cache is not None and cache.get_seq_length() > 0


@contextlib.contextmanager
def logit_error(model, x: float):
    """+x on one seeded logit of each row and slot of every verify-shaped pass of `model`."""
    def hook(module, args, kwargs, output):
        if x and _verify_shaped(kwargs):
            z = output.logits
            where = torch.randint(z.shape[-1], z.shape[:-1],
                                  generator=torch.Generator().manual_seed(z.shape[1]))
            output.logits = z.scatter_add(-1, where[..., None].to(z.device),
                                          torch.full((*z.shape[:-1], 1), x,
                                                     dtype=z.dtype, device=z.device))
        return output

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@torch.inference_mode()
def version_4_floor(model, prompts, continuations, chunk, vocab) -> float:
    """Version 4's floor (noise.py as it was): the longest references teacher-forced as a
    left-padded, cached batch in chunks of k + 1 tokens, against each alone with no cache; the
    largest |logit difference|."""
    order = sorted(range(len(prompts)), key=lambda i: -len(continuations[i]))[:8]
    length = min(len(continuations[i]) for i in order)
    rows = [prompts[i] + continuations[i][: length - 1] for i in order]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, width - len(row):], mask[r, width - len(row):] = torch.tensor(row), 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache, start, batched = kvcache.new(model), width - length, []
    model(input_ids=ids[:, :start], attention_mask=mask[:, :start],
          position_ids=positions[:, :start], cache=cache)
    while start < width:
        end = min(start + chunk, width)
        out = model(input_ids=ids[:, start:end], attention_mask=mask[:, :end],
                    position_ids=positions[:, start:end], cache=cache)
        batched.append(out.logits[..., :vocab].double())
        start = end
    batched = torch.cat(batched, 1)
    return max(float((batched[r] - fresh_logits(model, row, length, vocab)).abs().max())
               for r, row in enumerate(rows))


def _audits(spec: RunSpec, pair, x: float) -> list[float]:
    with logit_error(pair.target, x):
        trace = run(spec)
    return [r.audit for r in trace.rows if r.audit is not None]


def state_check_power(name: str, dtype: str) -> dict:
    models, prompt_set, budget = PAIRS[name]
    spec = RunSpec.build(**models, dtype=dtype, device="cpu",
                         prompts=tuple(builtin_set(prompt_set)), batch_size=4, k=5,
                         max_new_tokens=budget, audit=4)
    pair = runner.pair_for(spec)
    ids = runner.encode(spec, pair)
    ref = runner.reference_for(pair, ids, budget)
    rounding = runner.yardsticks_for(spec, pair, ids, ref).target
    continuations = [o.ids for o in ref.outputs]
    old_clean = version_4_floor(pair.target, ids, continuations, spec.k + 1, pair.vocab_size)
    clean = _audits(spec, pair, 0.0)
    result = {"pair": name, "dtype": dtype, "tolerance": rounding.tolerance,
              "alpha": rounding.alpha, "old_floor": old_clean, "checks": len(clean),
              "false_new": sum(a > rounding.tolerance for a in clean) / len(clean),
              "false_old": sum(a > FACTOR * old_clean for a in clean) / len(clean),
              "caught_new": None, "caught_old_clean": None, "caught_old_moved": None,
              "moved_floor": None}
    for step in STEPS:
        x = step * rounding.tolerance
        audits = _audits(spec, pair, x)
        with logit_error(pair.target, x):
            moved = version_4_floor(pair.target, ids, continuations, spec.k + 1, pair.vocab_size)
        rate = {"new": rounding.tolerance, "old_clean": FACTOR * old_clean,
                "old_moved": FACTOR * moved}
        for key, threshold in rate.items():
            if (result[f"caught_{key}"] is None
                    and sum(a > threshold for a in audits) >= 0.99 * len(audits)):
                result[f"caught_{key}"] = x
        result["moved_floor"] = moved
        print(f"  {name} {dtype}: error {x:.3g}: caught new "
              f"{sum(a > rounding.tolerance for a in audits)}/{len(audits)}, v4 floor moved "
              f"to {moved:.3g}", file=sys.stderr)
    return result


@contextlib.contextmanager
def scale_error(eps: float):
    def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        if query.shape[2] > 1 and key.shape[2] > query.shape[2]:
            scaling = scaling * (1 + eps)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      **kwargs)

    saved = AttentionInterface._global_mapping["sdpa"]
    AttentionInterface._global_mapping["sdpa"] = attention
    try:
        yield
    finally:
        AttentionInterface._global_mapping["sdpa"] = saved


@torch.inference_mode()
def rebuilt_diff(model, ids: list[int], keep: int, vocab: int) -> float:
    """A verify-shaped pass over a fresh prefill of ids[:-keep], against a fresh pass:
    the largest |difference|."""
    cache = kvcache.new(model)
    model(input_ids=torch.tensor([ids[:-keep]]), cache=cache, logits_to_keep=1)
    n = len(ids) - keep
    out = model(input_ids=torch.tensor([ids[-keep:]]), position_ids=torch.arange(n, n + keep)[None],
                cache=cache)
    return float((out.logits[0, :, :vocab].double()
                  - fresh_logits(model, ids, keep, vocab)).abs().max())


def rebuild_power(name: str, dtype: str) -> dict:
    models, prompt_set, _ = PAIRS[name]
    spec = RunSpec.build(**models, dtype=dtype, device="cpu",
                         prompts=tuple(builtin_set(prompt_set)), k=5, max_new_tokens=8)
    pair = runner.pair_for(spec)
    ids = runner.encode(spec, pair)
    rounding = runner.yardsticks_for(spec, pair, ids, runner.reference_for(pair, ids, 8)).target
    f64 = copy_in(pair.target, torch.float64)
    found = {"in_dtype": None, "in_float64": None}
    for exp in range(-12, 1):
        eps = 10.0 ** exp
        with scale_error(eps):
            d = max(rebuilt_diff(pair.target, x, 6, pair.vocab_size) for x in ids[:4])
            d64 = max(rebuilt_diff(f64, x, 6, pair.vocab_size) for x in ids[:4])
        if found["in_dtype"] is None and d > rounding.tolerance:
            found["in_dtype"] = eps
        if found["in_float64"] is None and d64 > rounding.float64_tolerance:
            found["in_float64"] = eps
    return {"pair": name, "dtype": dtype, **found}


def _x(v) -> str:
    return "never" if v is None else f"{v:.3g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    configs = [(p, d) for p in PAIRS for d in ("float32", "bfloat16")]
    checks = [state_check_power(p, d) for p, d in configs]
    rebuilds = [rebuild_power(p, d) for p, d in configs]
    lines = ["# The verdict's power", "",
             f"`python benchmarks/yardstick.py` on {torch.get_num_threads()} CPU threads; "
             "eqspec, bs 4, k 5, every row audited.", "",
             "## A logit error planted in the verify pass: the smallest the state check catches "
             "in 99% of checks", "",
             "| pair | dtype | checks | tolerance now (α) | caught now | false alarms now | v4 "
             "floor × 4 | caught by v4, floor clean | caught by v4, floor as measured | v4 floor "
             "with the largest error | false alarms v4 |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in checks:
        lines.append(f"| {c['pair']} | {c['dtype']} | {c['checks']} | {c['tolerance']:.3g} "
                     f"({c['alpha']:.2g}) | {_x(c['caught_new'])} | {c['false_new']:.1%} | "
                     f"{FACTOR * c['old_floor']:.3g} | {_x(c['caught_old_clean'])} | "
                     f"{_x(c['caught_old_moved'])} | {c['moved_floor']:.3g} | "
                     f"{c['false_old']:.1%} |")
    lines += ["", "## A kernel error (softmax scale × (1 + ε) in verify-shaped passes): the "
                  "smallest ε the rebuild catches", "",
              "| pair | dtype | rebuilt in the run's dtype | rebuilt in float64 |",
              "|---|---|---:|---:|"]
    lines += [f"| {r['pair']} | {r['dtype']} | {_x(r['in_dtype'])} | {_x(r['in_float64'])} |"
              for r in rebuilds]
    text = "\n".join(lines) + "\n"
    publish(text, args.out)


if __name__ == "__main__":
    main()
