"""`specviz check`'s time to a verdict: the reference proved by teacher forcing against the same
check with the reference decoded token by token, side by side in one process, and a large check's
time and peak memory.

The engine is specviz's own eqspec (batch --batch-size, k --k) on the embedded pair, its control the
batched reference: both correct, as most of a production's rows are (--faults breaks the engine, so
that rows fork and each fork is judged). The first table checks --rows prompts (the built-in `all`
set, then Spec-Bench's) both ways, each from cold caches (the reference, the yardstick's
calibration), then again with the calibration measured before (as any later check in the process,
the page's included, finds it), and says whether the two ways give the same reference ids and
verdicts. Before them, the same check as it was at --before (by default b1cd892, the last commit
before the proof and the faster check), in a process of its own on a copy of that tree, cold: what a
check cost when the issue asking for a faster one was filed. The second table checks --big prompts
(the built-in prompts, each numbered to make it new) with the proof; its engine outputs are decoded
first, untimed. Timings on a shared machine are noisy: compare rows of one run.

    python benchmarks/check.py [--rows 36] [--max-new-tokens 48] [--before b1cd892] [--big 1000]
    [--big-tokens 16]
                               [--faults F,...] [--device cpu] [--out benchmarks/results/check.md]
"""
import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from specviz.decoding.eqspec import eqspec
from specviz.decoding.reference import batched_reference
from specviz.engines.base import EngineRun
from specviz.forensics import yardstick_cache
from specviz.models.pairs import load_pair
from specviz.run import check, runner
from specviz.spec.prompts import builtin_set
from specviz.spec.run import ENGINE, RunSpec
from specviz.trace import metrics
from specviz.trace.records import EngineOutput
from publish import publish


def cold_yardsticks() -> None:
    """Yardsticks kept in an empty folder from here on: each timed check measures its own, as in one
    process (benchmarks/first_verdict.py times what keeping them on disk saves)."""
    folder = Path(tempfile.mkdtemp(prefix="yardsticks-"))
    yardstick_cache.directory = lambda: folder


def as_engine(name: str, result) -> EngineRun:
    return EngineRun(name=name, source="callable", seconds=result.seconds,
                     outputs=[EngineOutput(ids=o.ids) for o in result.outputs])


# Run in a copy of the earlier tree: that commit's own check, timed from cold as the rows below are.
CHECK_THEN = """
import json, sys, time
import torch
import specviz
from specviz.engines.base import EngineRun
from specviz.models.pairs import load_pair
from specviz.run import check
from specviz.spec.run import ENGINE, RunSpec
from specviz.trace.records import EngineOutput
rows = json.loads(open(sys.argv[1]).read())
torch.set_num_threads(rows["threads"])
pair = load_pair(dtype="float32", device=rows["device"])
spec = RunSpec.build(prompts=tuple(rows["prompts"]), method=ENGINE, k=rows["k"],
                     max_new_tokens=rows["tokens"], device=rows["device"])
runs = [EngineRun(name=n, source="callable", outputs=[EngineOutput(ids=o) for o in rows[n]])
        for n in ("engine", "control")]
start = time.perf_counter()
trace = check.check(spec, pair, pair.encode(rows["prompts"]), *runs)
print(json.dumps({"module": specviz.__file__, "seconds": time.perf_counter() - start,
                  "reference": [s.reference_ids for s in trace.sequences],
                  "verdicts": [s.forensics and s.forensics.verdict for s in trace.sequences]}))
"""


def check_at(commit: str, rows: dict, folder: Path) -> dict:
    """The check as it was at `commit`, cold, in a process of its own on a copy of that tree's
    package and assets: its seconds, reference ids and verdicts."""
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "specviz", "assets"],
                             cwd=Path(__file__).parent.parent, check=True,
                             capture_output=True).stdout
    tree = folder / commit
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    (folder / "rows.json").write_text(json.dumps(rows))
    out = subprocess.run([sys.executable, "-c", CHECK_THEN, str(folder / "rows.json")], check=True,
                         text=True, stdout=subprocess.PIPE, cwd=folder,
                         env={**os.environ, "PYTHONPATH": str(tree)}).stdout
    then = json.loads(out.splitlines()[-1])
    # that commit's package, not this one
    assert then["module"].startswith(str(tree)), then["module"]
    return then


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gpu_peak(device: str) -> str:
    """The GPU memory the check itself peaked at, where it ran on one."""
    if device != "cuda":
        return ""
    return f"; GPU memory peak {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=36)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--before", default="b1cd892",
                    help="the commit whose check is timed beside (empty: skip it)")
    ap.add_argument("--big", type=int, default=1000, help="prompts in the large check (0: skip it)")
    ap.add_argument("--big-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--faults", default="",
                    help="the engine's faults, comma-separated (e.g. dsd-like: most rows fork, and "
                         "each fork is judged)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(dtype="float32", device=args.device)
    prompts = (builtin_set("all") + builtin_set("spec-bench"))[: args.rows]
    ids = pair.encode(prompts)
    spec = RunSpec.build(prompts=tuple(prompts), method=ENGINE, k=args.k,
                         max_new_tokens=args.max_new_tokens, device=args.device)
    faults = tuple(f for f in args.faults.split(",") if f)
    engine = as_engine("eqspec", eqspec(pair, ids, args.batch_size, args.k, args.max_new_tokens,
                                        faults=faults))
    control = as_engine("batched-reference",
                        batched_reference(pair, ids, args.batch_size, args.max_new_tokens))
    device = torch.cuda.get_device_name() if args.device == "cuda" else "this CPU"
    lines = ["# specviz check: time to a verdict\n",
             (f"{len(ids)} prompts, {args.max_new_tokens} new tokens, embedded pair in float32 on "
              f"{device}, greedy; engine: eqspec (batch {args.batch_size}, k "
              f"{args.k}{', faults ' + ', '.join(faults) if faults else ''}), control: "
              f"batched-reference; {args.threads} threads; each way from cold caches (reference, "
              "yardstick calibration), then with the calibration kept.\n"),
             "| reference | seconds | proved tokens | decoded tokens | verdicts |",
             "|---|---:|---:|---:|---|"]
    traces, seconds_of = {}, {}
    if args.before:
        with tempfile.TemporaryDirectory() as folder:
            then = check_at(args.before,
                            {"prompts": prompts, "k": args.k, "tokens": args.max_new_tokens,
                             "threads": args.threads, "device": args.device,
                             "engine": [o.ids for o in engine.outputs],
                             "control": [o.ids for o in control.outputs]}, Path(folder))
        verdicts = ", ".join(f"{v} {c}"
                             for v, c in Counter(v for v in then["verdicts"] if v).items()) or "-"
        lines.append(f"| decoded, the check at {args.before} | {then['seconds']:.1f} | 0 | "
                     f"{sum(map(len, then['reference']))} | {verdicts} |")
        print(lines[-1], flush=True)
    # cold; then with the yardstick's calibration measured, as a later check finds it
    for calibrated in (False, True):
        for way in ("decoded", "proved"):
            runner.clear_caches(calibration=not calibrated)
            cold_yardsticks()
            start = time.perf_counter()
            # benchmarks/attribution.py
            judging = check.Judging(decode_reference=way == "decoded", attribute=False)
            traces[way] = check.check(spec, pair, ids, engine, control, judging)
            seconds_of[calibrated, way] = seconds = time.perf_counter() - start
            proofs = [s.reference_proof for s in traces[way].sequences if s.reference_proof]
            proved = sum(p.proved for p in proofs)
            decoded = (sum(p.decoded for p in proofs) if proofs
                       else sum(len(s.reference_ids) for s in traces[way].sequences))
            verdicts = ", ".join(f"{v} {c}"
                                 for v, c in metrics.verdict_counts(traces[way]).items()) or "-"
            lines.append(f"| {way}{', calibration measured before' if calibrated else ''} | "
                         f"{seconds:.1f} | {proved} | {decoded} | {verdicts} |")
            print(lines[-1], flush=True)
    slow, fast = (traces[w] for w in ("decoded", "proved"))
    same_refs = all(a.reference_ids == b.reference_ids
                    for a, b in zip(slow.sequences, fast.sequences))
    same_verdicts = all((a.forensics and a.forensics.verdict)
                        == (b.forensics and b.forensics.verdict)
                        for a, b in zip(slow.sequences, fast.sequences))
    ratio = {c: seconds_of[c, "decoded"] / seconds_of[c, "proved"] for c in (False, True)}
    lines += ["",
              (f"Proved over decoded: **{ratio[False]:.1f}x** faster cold, **{ratio[True]:.1f}x** "
               f"with the calibration measured before; the same reference ids: {same_refs}; the "
               f"same verdicts: {same_verdicts}.")]
    if args.before:
        same_then = ([s.reference_ids for s in fast.sequences] == then["reference"]
                     and [s.forensics and s.forensics.verdict for s in fast.sequences]
                     == then["verdicts"])
        lines.append(f"Proved, cold, over the check at {args.before}: "
                     f"**{then['seconds'] / seconds_of[False, 'proved']:.1f}x** faster; the same "
                     f"reference ids and verdicts: {same_then}.")
    if args.big:
        base = builtin_set("all") + builtin_set("spec-bench")
        many = [f"{base[i % len(base)]} (#{i})" for i in range(args.big)]
        big_ids = pair.encode(many)
        big_spec = RunSpec.build(prompts=tuple(many), method=ENGINE, k=args.k,
                                 max_new_tokens=args.big_tokens, device=args.device)
        big_engine = as_engine("batched-reference",
                               batched_reference(pair, big_ids, args.batch_size, args.big_tokens))
        runner.clear_caches()
        cold_yardsticks()
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        before, start = peak_mib(), time.perf_counter()
        big = check.check(big_spec, pair, big_ids, big_engine)
        seconds = time.perf_counter() - start
        proofs = [s.reference_proof for s in big.sequences]
        lines += ["", f"## {args.big} rows\n",
                  (f"{args.big} prompts, {args.big_tokens} new tokens, engine: batched-reference "
                   f"(batch {args.batch_size}), no control: **{seconds:.0f} s** "
                   f"({args.big / seconds:.1f} rows/s); {sum(p.proved for p in proofs)} reference "
                   f"tokens proved, {sum(p.decoded for p in proofs)} decoded; "
                   f"{sum(s.equivalent for s in big.sequences)} of {args.big} equal; peak memory "
                   f"{peak_mib():.0f} MiB (before the check: {before:.0f} "
                   f"MiB){gpu_peak(args.device)}.")]
        print("\n".join(lines[-2:]), flush=True)
    text = "\n".join(lines) + "\n"
    publish(text, args.out)


if __name__ == "__main__":
    main()
