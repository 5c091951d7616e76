"""specviz on the command line: run, verify and bench without a browser."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from . import determinism, metrics, share
from .decoding.catalogue import FAULTS
from .decoding.catalogue import PRESETS as FAULT_PRESETS
from .engines import jsonl
from .methods import DRAFTERS, METHODS
from .models import PRESETS, Placement, pair_for
from .prompts import builtin_set, builtin_sets, read_prompts
from .spec import DEVICES, DTYPES, ENGINE, LOOKUP_FIELDS, MAX_BATCH_SIZE, RunSpec, SpecError
from .sweep import NO_FAULTS, Sweep, SweepReport, report, row_of
from .text import clip
from .trace import Trace, schema


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model pair")
    g.add_argument("--pair", choices=sorted(PRESETS), default="embedded",
                   help="a preset pair (default: embedded SmolLM2-135M-Instruct and its draft)")
    g.add_argument("--target", help="target model: Hub id or local path (overrides --pair)")
    g.add_argument("--draft", help="draft model: Hub id or local path (overrides --pair)")
    g.add_argument("--target-revision")
    g.add_argument("--draft-revision")
    g.add_argument("--trust-remote-code", action="store_true", help="allow models that ship their own code")
    g.add_argument("--device-map", choices=["auto"],
                   help="spread a target too large for one GPU over the visible GPUs with accelerate (then CPU memory)")
    g.add_argument("--max-memory", metavar="LIMITS",
                   help="per-device limits for spreading the target, e.g. 0=20GiB,1=20GiB,cpu=64GiB (implies --device-map auto)")
    g = p.add_argument_group("prompts")
    g.add_argument("--prompts", type=Path, help="a file: one prompt a line, or Spec-Bench JSONL (turns[0])")
    g.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    g.add_argument("--prompt-set", choices=sorted(builtin_sets()), help="a built-in prompt set (default: quick)")
    g.add_argument("--limit", type=int, help="use only the first N prompts of the --prompts file")
    g.add_argument("--sort-by-length", action="store_true", help="order all prompts by length (after --limit)")
    g.add_argument("--no-chat-template", action="store_true", help="feed prompts raw, without the chat template")
    g = p.add_argument_group("decoding")
    g.add_argument("--max-new-tokens", type=int, default=48)
    g.add_argument("--dtype", choices=DTYPES, default="float32")
    g.add_argument("--device", choices=DEVICES, default="auto")
    g.add_argument("--seed", type=int, default=0, help="sampled runs: every sequence's random stream derives from it")
    g.add_argument("--deterministic", action="store_true",
                   help="deterministic GPU kernels (fixed cuBLAS workspace, no TF32): reruns repeat bit for bit; slower")
    g.add_argument("--window", type=int, help="exspec: active sequences in the window (default 2 x batch size)")
    g.add_argument("--max-wait", type=int, default=4, help="exspec: rounds a sequence may be passed over")
    g.add_argument("--drafter", type=_drafters, default=["model"], metavar="DRAFTER",
                   help="what proposes the drafts: " + "; ".join(f"{n}: {d}" for n, d in DRAFTERS.items())
                        + " (verify and bench: several, comma-separated)")
    g.add_argument("--ngram-min", type=int, help="lookup: the shortest n-gram matched (default 1)")
    g.add_argument("--ngram-max", type=int, help="lookup: the longest n-gram matched, tried first (default 3)")
    g.add_argument("--faults", default="", help=f"comma-separated faults or presets: {', '.join([*FAULTS, *FAULT_PRESETS])}"
                                                 " (in the methods that take faults)")
    g.add_argument("--audit", type=int, nargs="?", const=MAX_BATCH_SIZE, default=0, metavar="ROWS",
                   help="check every row's state against a fresh batch-size-1 recomputation every round, or ROWS "
                        "sampled rows a round: finds corruption before (or without) a fork; about one extra "
                        "batch-size-1 pass of the target and one of the draft per audited row and round")
    g = p.add_argument_group("sampling (temperature 0: greedy)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0, help="0: off")
    g.add_argument("--top-p", type=float, default=1.0, help="1: off")
    g.add_argument("--draft-temperature", type=float, help="the draft's own (default: the target's)")
    g.add_argument("--draft-top-k", type=int, help="the draft's own (default: the target's)")
    g.add_argument("--draft-top-p", type=float, help="the draft's own (default: the target's)")


def _names_of(known: dict, what: str):
    """An argparse type: comma-separated names, each one of `known`."""
    def names(text: str) -> list[str]:
        got = [x.strip() for x in text.split(",") if x.strip()]
        unknown = [n for n in got if n not in known]
        if unknown or not got:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown) or repr(text)}; choose from "
                                             + ", ".join(known))
        return got
    return names


_drafters = _names_of(DRAFTERS, "drafter")
_methods = _names_of(METHODS, "method")


def _prompts(args) -> list[str]:
    """Typed prompts, then the built-in set, then the file's first --limit prompts."""
    prompts = list(args.prompt)
    if args.prompt_set or not (prompts or args.prompts):
        prompts += builtin_set(args.prompt_set or "quick")
    if args.prompts:
        prompts += read_prompts(args.prompts)[: args.limit]
    return sorted(prompts, key=len) if args.sort_by_length else prompts


def _spec(args, **overrides) -> RunSpec:
    target, draft = PRESETS[args.pair]
    fields = dict(
        target=args.target or target, draft=args.draft or draft,
        target_revision=args.target_revision, draft_revision=args.draft_revision,
        prompts=tuple(_prompts(args)), chat_template=not args.no_chat_template,
        max_new_tokens=args.max_new_tokens, dtype=args.dtype, device=args.device, seed=args.seed,
        faults=tuple(f.strip() for f in args.faults.split(",") if f.strip()),
        window=args.window, max_wait=args.max_wait, audit=args.audit,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, draft_temperature=args.draft_temperature,
        draft_top_k=args.draft_top_k, draft_top_p=args.draft_top_p, drafter=args.drafter[0],
    )
    fields.update(overrides)
    ngrams = {f: getattr(args, f) for f in LOOKUP_FIELDS if getattr(args, f) is not None}
    if ngrams and "lookup" not in args.drafter:
        raise SpecError("--ngram-min and --ngram-max set the lookup drafter; add --drafter lookup")
    if fields["drafter"] == "lookup":  # the runs of other drafters in a sweep leave them out
        fields.update(ngrams)
    return RunSpec.build(**fields)


def _placement(args) -> Placement:
    return Placement(spread=bool(args.device_map or args.max_memory), max_memory=args.max_memory)


def _run_with_bars(spec: RunSpec, args, record: bool = True):
    """`run` with one progress bar per phase (the batch-size-1 reference, then the method)."""
    from .runner import run

    bars: dict[str, tqdm] = {}

    def progress(phase: str, n: int) -> None:
        if phase not in bars:
            bars[phase] = tqdm(total=len(spec.prompts) * spec.max_new_tokens, desc=phase, unit="tok", leave=False,
                               disable=not sys.stderr.isatty())
        bars[phase].update(n)

    try:
        return run(spec, record=record, progress=progress, trust_remote_code=args.trust_remote_code,
                   placement=_placement(args))
    finally:
        for bar in bars.values():
            bar.close()


def cmd_run(args) -> int:
    if len(args.drafter) > 1:
        raise SpecError("run takes one drafter; verify and bench compare several")
    spec = _spec(args, method=args.method, batch_size=args.batch_size, k=args.k)
    trace = _run_with_bars(spec, args, record=not args.no_record)
    tok = pair_for(spec, args.trust_remote_code, _placement(args)).tokenizer
    for s, p in zip(trace.sequences, trace.prompts):
        mark = {True: "= reference", False: f"DIVERGES at token {s.first_divergence}", None: ""}[s.equivalent]
        print(f"\n[{s.seq}] {clip(p.text, 70)!r}  ({len(s.output_ids)} tokens) {mark}")
        print("   " + tok.decode(s.output_ids).replace("\n", "\n   "))
        if s.forensics:
            print(f"   -> {s.forensics.verdict}: {s.forensics.explanation}")
    print()
    _print_summary(trace)
    if args.json:
        data = {"spec": spec.model_dump(mode="json"), "fingerprint": trace.manifest.fingerprint,
                "sequences": [s.model_dump() for s in trace.sequences],
                "texts": [tok.decode(s.output_ids) for s in trace.sequences]}
        _write(args.json, json.dumps(data, indent=1))
        print(f"wrote {args.json}")
    if args.trace:
        _write(args.trace, trace.to_json())
        print(f"wrote trace {args.trace} (fingerprint {trace.manifest.fingerprint})")
    return 0


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _print_summary(trace) -> None:
    m = trace.manifest
    eq = metrics.equivalence(trace)
    line = f"{m.spec.method}: {sum(len(s.output_ids) for s in trace.sequences)} tokens in {m.decode_seconds:.1f} s"
    if trace.rows:
        line += (f"; acceptance rate {metrics.acceptance_rate(trace):.2f}, "
                 f"{metrics.tokens_per_round(trace):.2f} tokens per round, {len(trace.rounds)} rounds")
    print(line)
    if metrics.group_rate(trace) is not None:
        pct = metrics.completion_percentiles(trace)
        print(f"group rate {metrics.group_rate(trace):.0%}; completion P50/P90/P99 "
              f"{pct['p50']:.2f}/{pct['p90']:.2f}/{pct['p99']:.2f} s")
    if eq:
        print(f"equivalence with reference: {eq['exact']:.0%} exact, {eq['prefix']:.1%} prefix match (n={eq['n']})")
    _print_yardsticks(trace)
    if trace.distribution:
        print(f"distribution: {_distribution(trace)}")


def _print_yardsticks(trace) -> None:
    """What the verdicts were judged against, and how far an engine departs from the model at all."""
    ys = trace.manifest.yardstick
    if ys is None:
        return
    if ys.target is not None:
        print(f"judged against {ys.target.describe()}")
        if ys.target.anomaly:
            print(f"WARNING: the yardstick itself is suspect: {ys.target.anomaly}")
    if ys.engine is not None:
        print(f"engine verdicts: {ys.engine.describe()}")
    for f in trace.manifest.fidelity:
        print(f"  {f.describe()}")


def _distribution(trace) -> str:
    """A sampled run's verdict in one line."""
    d, line = trace.distribution, trace.distribution.verdict
    if d.p is not None:
        line += f" (p = {d.p:.2g}, {d.tokens} tokens" + (f"; fails: {d.failing}" if d.failing else "") + ")"
    if d.impossible:
        line += f"; {d.impossible} tokens the target gives probability 0"
    if trace.decisions:
        line += f"; decision audit: {trace.decisions.mismatches} of {trace.decisions.checked} decisions mismatch"
    return line


_faults = _names_of({NO_FAULTS: "", **FAULTS, **FAULT_PRESETS}, "fault")


def _fault_set(text: str) -> tuple[str, ...]:
    """A --fault-sets item: comma-joined fault or preset names, or `none`."""
    names = _faults(text)
    if NO_FAULTS in names and len(names) > 1:
        raise argparse.ArgumentTypeError(f"{NO_FAULTS!r} is the set of no faults: give it alone")
    return () if names == [NO_FAULTS] else tuple(names)


def _sweep(args) -> Sweep:
    """verify's runs: the methods × drafters × fault sets × batch sizes × k on one base spec."""
    if args.fault_sets and args.faults:
        raise SpecError("give one fault set as --faults or several as --fault-sets, not both")
    # The base carries the lookup drafter's n-gram sizes when it is swept; every run sets its own method and drafter.
    drafter = "lookup" if "lookup" in args.drafter else args.drafter[0]
    base = _spec(args, method="eqspec", drafter=drafter, faults=(), batch_size=min(args.batch_sizes, default=1))
    return Sweep.build(base=base, methods=args.methods, drafters=args.drafter,
                       fault_sets=args.fault_sets or [_spec(args).faults], batch_sizes=args.batch_sizes, ks=args.k)


def _print_row(spec: RunSpec, trace: Trace) -> Trace:
    """One line of verify's table, printed as its run is done."""
    row = row_of(spec, trace)
    shown = ", ".join(f"{v} {c}" for v, c in row.verdicts.items()) or "-"
    if trace.distribution:  # a sampled run: no token reference, a verdict on its distribution
        shown = _distribution(trace)
    if row.audit:
        shown += "; audit: state departed in {target} (target) and {draft} (draft) sequences".format(**row.audit)
    tqdm.write(f"{row.method:<18} {row.drafter:<8} {row.faults or '-':<14} {row.batch_size:>3} {row.k:>3} {row.n:>5} "
               f"{metrics.percent(row.exact_pct):>8} {metrics.percent(row.prefix_pct):>9}  {shown}")
    return trace


def cmd_verify(args) -> int:
    from .shard import is_main, sweep

    plan = _sweep(args)
    specs = plan.specs()
    reports = is_main()  # under `accelerate launch`, the main process reports for all
    if reports:
        print(f"{'method':<18} {'drafter':<8} {'faults':<14} {'bs':>3} {'k':>3} {'n':>5} {'exact %':>8} {'prefix %':>9}"
              "  verdicts")
    # Recorded runs: every one for a report (its accept lengths and rounds come from the records), else those with
    # something to explain, and sampled ones (their decisions are audited, their PIT split by slot).
    recorded = [bool(args.json or spec.faults or spec.audit or spec.temperature or args.forensics) for spec in specs]
    traces = sweep(list(zip(specs, recorded)), args.trust_remote_code, _placement(args))
    if not reports:  # this process decoded its shares for the main one
        for _ in traces:
            pass
        return 0
    bar = tqdm(traces, total=len(specs), desc="verify", leave=False, disable=not sys.stderr.isatty())
    done = report(plan, (_print_row(spec, trace) for spec, trace in zip(specs, bar)))
    if args.json:
        _write(args.json, done.to_json())
        print(f"wrote {args.json}")
    sound = all(r.distribution.verdict == "consistent" if r.distribution else r.exact_pct == 100 for r in done.rows)
    return 0 if sound or args.allow_divergence else 1


def cmd_check(args) -> int:
    from . import check

    if sum(map(bool, (args.server, args.outputs, args.engine))) != 1:
        raise SpecError("give the engine as one of --server URL, --outputs FILE or --engine module:function")
    spec = _spec(args, method=ENGINE, k=args.k)
    pair = pair_for(spec, args.trust_remote_code, _placement(args))
    if args.outputs:
        control = (args.control.read_bytes(), args.control.name) if args.control else None
        trace = check.from_files(spec, pair, (args.outputs.read_bytes(), args.outputs.name), control)
    elif args.server:
        control = (args.control_server, args.control_served_model or args.served_model) if args.control_server else None
        trace = check.from_servers(spec, pair, (args.server, args.served_model), control, args.concurrency, args.timeout)
    else:
        trace = check.from_callables(spec, pair, args.engine, args.control_engine)
    _print_check(trace)
    if args.json:
        _write(args.json, json.dumps({"engine": trace.manifest.engine.model_dump(), "summary": metrics.engine_summary(trace),
                                      "sequences": [s.model_dump() for s in trace.sequences]}, indent=1))
        print(f"wrote {args.json}")
    if args.trace:
        _write(args.trace, trace.to_json())
        print(f"wrote trace {args.trace}")
    return 0


def _print_check(trace) -> None:
    print(f"{'engine':<44} {'n':>4} {'errors':>6} {'exact %':>8} {'prefix %':>9} {'tok/s':>7}  verdicts")
    for row in metrics.engine_summary(trace):
        tps = "-" if row["tokens_per_second"] is None else f"{row['tokens_per_second']:.1f}"
        shown = ", ".join(f"{v} {c}" for v, c in row["verdicts"].items()) or "-"
        print(f"{row['engine'][:44]:<44} {row['n']:>4} {row['errors']:>6} {metrics.percent(row['exact_pct']):>8} "
              f"{metrics.percent(row['prefix_pct']):>9} {tps:>7}  {shown}")
    _print_yardsticks(trace)
    if trace.distribution:
        print(f"distribution: {_distribution(trace)}")
    for s in trace.sequences:
        if s.forensics:
            print(f"  [{s.seq}] {s.forensics.verdict}: {s.forensics.explanation}")
        elif s.engine.error:
            print(f"  [{s.seq}] no answer: {s.engine.error}")


def cmd_shrink(args) -> int:
    from .shrink import shrink, size

    if bool(args.trace) == bool(args.link):
        raise SpecError("give the divergent run as --trace FILE or --link URL")
    if args.trace:
        trace = Trace.from_json(args.trace.read_bytes())
    else:
        link = share.decode(args.link.partition("?")[2] or args.link)
        if link is None:
            raise SpecError("that link carries no run")
        trace = _run_with_bars(link.spec, args)
    spec = trace.manifest.spec
    divergent = [s.seq for s in trace.sequences if s.equivalent is False]
    seq = divergent[0] if args.seq is None and divergent else args.seq
    if seq is None or seq not in divergent:
        raise SpecError(f"sequence {seq} does not diverge in that run; divergent: {divergent or 'none'}")
    s = trace.sequences[seq]
    fork = s.first_divergence
    token = s.output_ids[fork] if fork < len(s.output_ids) else None
    print(f"before: {size(spec)}; sequence {seq} forks at token {fork}")
    with tqdm(desc="shrink", unit="run", disable=not sys.stderr.isatty()) as bar:
        found = shrink(spec, seq, fork, token, pair_for(spec, args.trust_remote_code), progress=lambda n: bar.update())
    small = found.trace.sequences[found.seq]
    verdict = small.forensics.verdict if small.forensics else "-"
    print(f"after:  {size(found.trace.manifest.spec)}; sequence {found.seq} forks at token {found.fork}: {verdict} "
          f"({found.trials} runs tried)")
    print(f"share link: {args.url.rstrip('/')}/{found.link()}")
    if args.out:
        _write(args.out, found.trace.to_json())
        print(f"wrote trace {args.out}")
    return 0


def cmd_bench(args) -> int:
    from .bench import bench, configs

    runs = configs(args, _spec(args).faults)
    if not runs:
        raise SpecError("nothing to run: none of these methods runs at these batch sizes")
    bench(args, [_spec(args, **c) for c in runs], _placement(args))
    return 0


def cmd_schema(args) -> int:
    print(json.dumps(jsonl.schema() if args.outputs else SweepReport.model_json_schema() if args.report else schema(),
                     indent=1))
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specviz", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="decode prompts with one method; print outputs, write JSON or a trace")
    _common(p)
    p.add_argument("--method", choices=list(METHODS), default="eqspec")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--json", type=Path, help="write outputs and token ids here")
    p.add_argument("--trace", type=Path, help="write the full trace (JSON) here")
    p.add_argument("--no-record", action="store_true", help="do not record the per-round trace")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("verify", help="equivalence table: exact and prefix match against reference")
    _common(p)
    p.add_argument("--methods", type=_methods, default=["batched-reference", "eqspec"])
    p.add_argument("--batch-sizes", type=_int_list, default=[1, 4])
    p.add_argument("--k", type=_int_list, default=[5], help="draft lengths, comma-separated")
    p.add_argument("--fault-sets", type=_fault_set, nargs="+", metavar="SET",
                   help=f"sweep fault sets: each comma-joined faults or presets, or {NO_FAULTS!r} (no faults), e.g. "
                        f"{NO_FAULTS} bsp-like no-mask,min-crop; the methods that take no faults run once, without")
    p.add_argument("--json", type=Path, help="write the sweep report here (every run recorded): the page's Sweep tab "
                                             "loads it")
    p.add_argument("--allow-divergence", action="store_true", help="exit 0 even when a method diverges")
    p.add_argument("--forensics", action="store_true",
                   help="record full per-round traces (the engine's own invariant checks, margins, timings); always on "
                        "with --faults and --audit. Every divergence gets its state check and verdict either way")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("check", help="an engine's outputs (a server, a file, a callable) against the batch-size-1 "
                                     "reference of the same weights; every difference judged")
    _common(p)
    g = p.add_argument_group("the engine under test (one of)")
    g.add_argument("--server", help="an OpenAI-compatible server's base URL, e.g. http://localhost:8000 (vLLM, SGLang, ...)")
    g.add_argument("--outputs", type=Path, help="a JSONL file of its outputs (docs/engines.md; `specviz schema --outputs`)")
    g.add_argument("--engine", help="a Python callable module:function that takes prompt ids and settings")
    g = p.add_argument_group("a control run: the same engine without speculation (optional)")
    g.add_argument("--control-server", help="its server's base URL")
    g.add_argument("--control-served-model", help="its served model name (default: --served-model)")
    g.add_argument("--control", type=Path, help="its outputs file (the same prompts, in the same order)")
    g.add_argument("--control-engine", help="its callable module:function")
    g = p.add_argument_group("server options")
    g.add_argument("--served-model", help="the model name the server serves (default: the server's only model)")
    g.add_argument("--concurrency", type=int, default=8, help="requests in flight, so the server batches them")
    g.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one answer")
    p.add_argument("--k", type=int, default=5,
                   help="the engine's draft length, if it speculates (a verify pass's k + 1 positions size the tolerance)")
    p.add_argument("--json", type=Path, help="write the summary and every sequence here")
    p.add_argument("--trace", type=Path, help="write the check as a trace (opens in the app)")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("shrink", help="the smallest run that still forks where a divergent run forked, as a share link")
    p.add_argument("--trace", type=Path, help="the divergent run: a trace file (specviz run --trace, or the page's download)")
    p.add_argument("--link", help="the divergent run: a share link (it is decoded once first)")
    p.add_argument("--seq", type=int, help="the divergent sequence to keep (default: the first that diverges)")
    p.add_argument("--url", default="http://localhost:7860/", help="the page the printed share link points to")
    p.add_argument("--out", type=Path, help="write the smallest run's trace here")
    p.add_argument("--trust-remote-code", action="store_true", help="allow models that ship their own code")
    p.add_argument("--deterministic", action="store_true", help="deterministic GPU kernels (see run)")
    p.set_defaults(func=cmd_shrink, device_map=None, max_memory=None)

    p = sub.add_parser("bench", help="throughput and phase shares, side by side in one run")
    _common(p)
    p.add_argument("--batch-sizes", type=_int_list, default=[1, 2, 4, 8])
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--methods", type=_methods, default=list(METHODS))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--max-waits", type=_int_list, help="exspec: sweep these max-wait values (default: --max-wait)")
    p.add_argument("--name", default="bench", help="file name (without extension) of the table and plot")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("schema", help="print the trace's JSON Schema (docs/trace.schema.json)")
    p.add_argument("--outputs", action="store_true",
                   help="the JSON Schema of an engine outputs file instead (docs/engine-outputs.schema.json)")
    p.add_argument("--report", action="store_true",
                   help="the JSON Schema of a sweep report instead (verify --json; docs/sweep-report.schema.json)")
    p.set_defaults(func=cmd_schema)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "deterministic", False):
        determinism.enable()
    try:
        return args.func(args)
    except SpecError as e:
        print(f"specviz: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
