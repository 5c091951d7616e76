"""vLLM sampling, checked by its distribution: does vLLM's CPU build, with and without speculation,
draw its tokens from the target's distribution? And specviz's own eqspec sampler on the same
prompts, for comparison.

vLLM (`make vllm`) serves the embedded target, one mode after the other: no speculation, and ngram
(prompt lookup, n 2-4, k tokens a draft). Its prompts go as token ids, --batch-size requests in
flight, sampled at --temperature with --top-p and --top-k, every request seeded from --seed and its
prompt's index; each mode's outputs are judged as `specviz check --server` judges them at those
settings: every token's randomized PIT under the target recomputed at batch size 1, uniformity
tested per split (pooled, token-index ranges, row pairs), Bonferroni across splits, alpha 0.001
(docs/engines.md, "Sampled checks"). specviz's eqspec (at --batch-size, k) samples the same prompts
in this process; its outputs are judged twice: by their ids alone, exactly as vLLM's (the same
splits), and with its rounds (the white-box splits by slot and row too).

--repeat N asks every prompt N times (each time its own seed): more tokens, more power. --fixed adds
a row of vLLM's ngram mode with one function of its CPU build replaced (FIX below: the expansion of
per-request temperature and top-p to draft tokens), to show what the verdict is once that function
does its job. Timings (tok/s: output tokens over the wall time of all requests, server start and
scoring excluded) are noisy on a shared machine.

    python benchmarks/vllm_sampling.py [--prompt-set all] [--repeat 1] [--max-new-tokens 48]
    [--batch-size 8]
        [--k 5] [--temperature 0.8] [--top-p 0.95] [--top-k 0] [--seed 0] [--modes none,ngram]
        [--fixed] [--threads 2] [--out benchmarks/results/vllm-sampling.md [--append]]
"""
import argparse
import os
import statistics
import tempfile
from pathlib import Path

import torch

from specviz.decoding.sampling import Sampler
from specviz.engines.base import EngineRun
from specviz.engines.server import from_server
from specviz.engines.vllm import MODES, vllm_server
from specviz.forensics.recompute import fresh_logits
from specviz.models.pairs import load_pair
from specviz.run import check
from specviz.run.runner import decode, explain
from specviz.spec.prompts import builtin_set
from specviz.spec.run import ENGINE, RunSpec
from specviz.trace.records import EngineOutput

# vLLM 0.32's CPU build, without Triton, runs its own C++ stand-ins for Triton kernels
# (vllm/utils/cpu_triton_utils.py). Its stand-in for the rejection sampler's `expand_kernel`
# converts the output tensor to int64 and writes into that copy, so a float32 output (the
# per-request temperature and top-p, expanded to each draft token in
# rejection_sampler.apply_sampling_constraints) is never written: it keeps whatever memory
# torch.empty gave it. FIX replaces that stand-in with a plain torch expansion, in vLLM's processes
# only (a sitecustomize module on their PYTHONPATH), for the --fixed row.
FIX = '''"""specviz benchmark: vLLM's CPU expand_kernel stand-in, replaced by a torch expansion
(see vllm_sampling.py)."""
import importlib.abc
import importlib.util
import sys


def _expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    import torch

    cu = cu_num_tokens.long()
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    replaced = torch.full_like(input_val, replace_to)
    values = torch.where(input_val == replace_from, replaced, input_val)
    output[: int(cu[-1])] = values.repeat_interleave(counts).to(output.dtype)


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "vllm.utils.cpu_triton_utils":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            module._expand_kernel_impl = _expand
            print("specviz: vllm.utils.cpu_triton_utils._expand_kernel_impl replaced",
                  file=sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Patch())
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-set", default="all")
    ap.add_argument("--repeat", type=int, default=1,
                    help="ask every prompt this many times, each its own seed")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default="none,ngram", help=f"vLLM modes, of {', '.join(MODES)}")
    ap.add_argument("--fixed", action="store_true",
                    help="also vLLM ngram with its CPU expand_kernel replaced")
    ap.add_argument("--threads", type=int, default=2,
                    help="CPU threads, for vLLM's workers and specviz's torch")
    ap.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    ap.add_argument("--append", action="store_true", help="append to --out instead of replacing it")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(dtype="float32", device="cpu")
    prompts = builtin_set(args.prompt_set) * args.repeat
    spec = RunSpec.build(prompts=tuple(prompts), method=ENGINE, max_new_tokens=args.max_new_tokens,
                         device="cpu", k=args.k, temperature=args.temperature, top_p=args.top_p,
                         top_k=args.top_k, seed=args.seed)
    ids = pair.encode(prompts)
    sampling = check.sampling_settings(spec)
    setup = (f"{len(ids)} prompts ({args.prompt_set!r} "
             f"set{f' x {args.repeat}' if args.repeat > 1 else ''}, chat template), "
             f"{args.max_new_tokens} new tokens, float32, temperature {args.temperature}, top-p "
             f"{args.top_p}, top-k {args.top_k or 'off'}, seed {args.seed}; batch size "
             f"{args.batch_size}, k {args.k}, {args.threads} threads; PIT alpha 0.001")
    load = os.getloadavg()[0]
    print(setup, flush=True)
    configs = [(f"vLLM {mode}", mode, None) for mode in args.modes.split(",")]
    rows, evidence = [], []
    with tempfile.TemporaryDirectory() as tmp:
        if args.fixed:
            (Path(tmp) / "fix").mkdir()
            (Path(tmp) / "fix" / "sitecustomize.py").write_text(FIX)
            configs.append(("vLLM ngram, expand_kernel fixed", "ngram",
                            {"PYTHONPATH": str(Path(tmp) / "fix")}))
        for label, mode, env in configs:
            with vllm_server(mode, Path(tmp) / f"{mode}.log", k=args.k,
                             max_num_seqs=args.batch_size, threads=args.threads,
                             extra_env=env) as server:
                from_server(server.url, server.served_model, ids[:2], 4, **sampling)  # warm-up
                run = from_server(server.url, server.served_model, ids, args.max_new_tokens,
                                  concurrency=args.batch_size, tokenizer=pair.tokenizer,
                                  launch=server.launch, **sampling)
                if env and "replaced" not in server.log.read_text(errors="replace"):
                    raise SystemExit("the expand_kernel fix was not loaded into vLLM")
            trace = check.check(spec, pair, ids, run)
            rows.append(_row(label, check.sampled_summary(trace), run.settings.get("spec_decode")))
            evidence.append(_evidence(label, trace, pair))
            print(_table(rows[-1:]), flush=True)
        eqspec = RunSpec.build(**{**spec.model_dump(), "method": "eqspec",
                                  "batch_size": args.batch_size})
        # warm-up
        decode(eqspec.model_copy(update={"max_new_tokens": 4}), pair, ids[:2], record=False)
        result = decode(eqspec, pair, ids, record=True)
        white = explain(eqspec, pair, ids, result, None)
        black = check.check(spec, pair, ids, EngineRun(
            name="specviz eqspec", source="callable", seconds=result.seconds,
            outputs=[EngineOutput(ids=o.ids) for o in result.outputs]))
        drafted = sum(len(r.draft_tokens) for r in white.rows)
        accepted = {"draft_tokens": drafted, "accepted_tokens": sum(r.accepted for r in white.rows)}
        rows.append(_row(f"specviz eqspec (bs {args.batch_size}, k {args.k}), its ids alone",
                         check.sampled_summary(black), accepted))
        white_summary = {**check.sampled_summary(black), **_dist(white)}
        rows.append(_row("specviz eqspec, with its rounds (slot and row splits)", white_summary,
                         accepted))
        evidence.append(_evidence("specviz eqspec", black, pair))
    table = _table(rows)
    legend = ("p: the smallest split's p times the splits tested (Bonferroni), 0 when a token is "
              "impossible under the target (outside its top-k/top-p); accepted: draft tokens "
              "accepted of those proposed (vLLM's /metrics counters; specviz's rounds).\n")
    setup += (f"; load average (1 min) {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the "
              f"end, on {os.cpu_count()} CPUs")
    text = "\n".join([f"# vLLM sampling, checked by its distribution\n\n{setup}.\n", table, "",
                      legend, *evidence,
                      "\nThe cause, read in vLLM's source: docs/engines.md, \"Sampled checks\".\n"])
    print("\n" + text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text((args.out.read_text() + "\n" if args.append and args.out.exists()
                             else "") + text)
        print(f"wrote {args.out}")


def _dist(trace) -> dict:
    d = trace.distribution
    worst = min(d.splits, key=lambda x: x.p, default=None)
    return {"verdict": d.verdict, "p": d.p, "splits": len(d.splits),
            "worst_split": worst and worst.name,
            "worst_split_p": worst and worst.p, "impossible": d.impossible}


def _row(label: str, summary: dict, spec_decode: dict | None) -> dict:
    return {"label": label, **summary, "accepted": (f"{spec_decode['accepted_tokens']:.0f} / "
                                                    f"{spec_decode['draft_tokens']:.0f}")
            if spec_decode else "-"}


def _table(rows: list[dict]) -> str:
    out = ["| engine | tokens | verdict | p (Bonferroni) | worst split (p) | impossible tokens | "
           "accepted | tok/s |",
           "|---|---:|---|---:|---|---:|---:|---:|"]
    for r in rows:
        tps = "-" if r["tokens_per_second"] is None else f"{r['tokens_per_second']:.1f}"
        p = "-" if r["p"] is None else f"{r['p']:.3g}"
        worst = ("-" if r["worst_split"] is None
                 else f"{r['worst_split']} ({r['worst_split_p']:.3g})")
        out.append(f"| {r['label']} | {r['tokens']} | {r['verdict']} | {p} | {worst} | "
                   f"{r['impossible']} | {r['accepted']} | {tps} |")
    return "\n".join(out)


def _evidence(label: str, trace, pair) -> str:
    """Where the impossible tokens rank under the target at the run's temperature alone (no top-k,
    top-p), and the p of every split."""
    sampler = Sampler(trace.manifest.spec.temperature)
    ranks, probs = [], []
    for s in trace.sequences:
        at = [i for i, u in enumerate(s.pit or ()) if u is None]
        if not at:
            continue
        logits = fresh_logits(pair.target, trace.prompts[s.seq].ids + s.output_ids[:-1],
                              len(s.output_ids), pair.vocab_size)
        p = sampler.probs(logits)
        for i in at:
            t = s.output_ids[i]
            ranks.append(int((p[i] > p[i, t]).sum()) + 1)
            probs.append(float(p[i, t]))
    splits = ", ".join(f"{x.name} {x.p:.3g}" for x in trace.distribution.splits)
    line = f"- **{label}**: split p-values: {splits}."
    if ranks:
        line += (f" Its {len(ranks)} impossible tokens rank, under the target at temperature "
                 f"{trace.manifest.spec.temperature} alone, {min(ranks)} to {max(ranks)} of "
                 f"{pair.vocab_size} (median {statistics.median(ranks):.0f}; "
                 f"{sum(r <= 10 for r in ranks)} in the top 10), with probability "
                 f"{statistics.median(probs):.2g} at the median.")
    return line


if __name__ == "__main__":
    main()
