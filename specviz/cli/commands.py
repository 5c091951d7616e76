"""The command line's commands: run, verify, shrink, bench, schema, train-head (check's:
enginecheck.py); what each prints and writes, and the progress bars and summaries they share."""
from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from specviz.cli.args import placement_of, spec_of
from specviz.engines import jsonl
from specviz.forensics import yardstick_cache
from specviz.models.heads import TRAINED
from specviz.models.pairs import load_pair, pair_for
from specviz.run import launch
from specviz.spec.drafters import DRAFTERS
from specviz.spec.run import EMBEDDED_TARGET, PAIR_PRESETS, RunSpec
from specviz.spec.strict import SpecError
from specviz.spec.verdicts import OWN_DRAFTS
from specviz.trace import metrics, share
from specviz.trace.schema import Trace, trace_schema
from specviz.trace.sweep import Sweep, SweepReport, report, row_of
from specviz.trace.text import clip


@contextlib.contextmanager
def progress_bars(total: Callable[[str], int | None]):
    """A progress callback `(phase, n)` drawing one bar per phase, of `total(phase)` units (None:
    a count)."""
    bars: dict[str, tqdm] = {}

    def progress(phase: str, n: int) -> None:
        if phase not in bars:
            unit = "replay" if phase == "attribution" else "tok"
            bars[phase] = tqdm(total=total(phase), desc=phase, unit=unit, leave=False,
                               # one process draws
                               disable=not sys.stderr.isatty() or launch.rank() > 0)
        bars[phase].update(n)

    try:
        yield progress
    finally:
        for bar in bars.values():
            bar.close()


def _run_with_bars(spec: RunSpec, args, record: bool = True):
    """`run` with one progress bar per phase (the batch-size-1 reference, then the method)."""
    from specviz.run.runner import run

    with progress_bars(lambda phase: len(spec.prompts) * spec.max_new_tokens) as progress:
        return run(spec, record=record, progress=progress, trust_remote_code=args.trust_remote_code,
                   placement=placement_of(args))


def cmd_run(args) -> int:
    if len(args.drafter) > 1:
        raise SpecError("run takes one drafter; verify and bench compare several")
    spec = spec_of(args, method=args.method, batch_size=args.batch_size, k=args.k)
    trace = _run_with_bars(spec, args, record=not args.no_record)
    tok = pair_for(spec, args.trust_remote_code, placement_of(args)).tokenizer
    for s, p in zip(trace.sequences, trace.prompts):
        mark = {True: "= reference", False: f"DIVERGES at token {s.first_divergence}",
                None: ""}[s.equivalent]
        print(f"\n[{s.seq}] {clip(p.text, 70)!r}  ({len(s.output_ids)} tokens) {mark}")
        print("   " + tok.decode(s.output_ids).replace("\n", "\n   "))
        if s.logprobs:
            print(f"   log-probability {sum(s.logprobs):.4g} (mean "
                  f"{sum(s.logprobs) / len(s.logprobs):.4g} a token); per token: "
                  + " ".join(f"{x:.3g}" for x in s.logprobs[:12])
                  + (" …" if len(s.logprobs) > 12 else ""))
        if s.forensics:
            print(f"   -> {s.forensics.verdict}: {s.forensics.explanation}")
    print()
    _print_summary(trace)
    if args.json:
        data = {"spec": spec.model_dump(mode="json"), "fingerprint": trace.manifest.fingerprint,
                "sequences": [s.model_dump() for s in trace.sequences],
                "texts": [tok.decode(s.output_ids) for s in trace.sequences]}
        write_text(args.json, json.dumps(data, indent=1))
    if args.trace:
        write_text(args.trace, trace.to_json(), f"trace {trace.manifest.fingerprint} to")
    return 0


def write_text(path: Path, text: str, what: str = "") -> None:
    """Write `text` to `path` (its folders made) and say so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {what + ' ' if what else ''}{path}")  # e.g. "wrote trace 1f0c… to out.json"


def _print_summary(trace) -> None:
    m = trace.manifest
    eq = metrics.equivalence(trace)
    line = (f"{m.spec.method}: {sum(len(s.output_ids) for s in trace.sequences)} tokens in "
            f"{m.decode_seconds:.1f} s")
    if trace.rows:
        line += (f"; acceptance rate {metrics.acceptance_rate(trace):.2f}, "
                 f"{metrics.tokens_per_round(trace):.2f} tokens per round, {len(trace.rounds)} "
                 "rounds")
    print(line)
    for facts in (m.head, m.paging):
        if facts:
            print(facts.describe())
    if metrics.group_rate(trace) is not None:
        pct = metrics.completion_percentiles(trace)
        print(f"group rate {metrics.group_rate(trace):.0%}; completion P50/P90/P99 "
              f"{pct['p50']:.2f}/{pct['p90']:.2f}/{pct['p99']:.2f} s")
    if eq:
        print(f"equivalence with reference: {eq['exact']:.0%} exact, {eq['prefix']:.1%} prefix "
              f"match (n={eq['n']})")
    print_acceptance(trace)
    print_yardsticks(trace)
    print_distribution(trace)


def print_acceptance(trace) -> None:
    """The acceptance judge's finding on the drafts, and the rejections judge's on the decisions,
    where they judged them."""
    if trace.acceptance:
        print(f"drafts: {trace.acceptance.verdict or OWN_DRAFTS}. {trace.acceptance.explanation}")
    if r := trace.rejections:
        sound = ("the target refused every draft refused" if r.tail is None
                 else "as many drafts kept as the rule keeps")
        print(f"decisions: {r.verdict or sound}. {r.explanation}")


def print_yardsticks(trace) -> None:
    """What the verdicts were judged against, and how far an engine departs from the model
    at all."""
    ys = trace.manifest.yardstick
    if ys is None:
        return
    if ys.target is not None:
        print(f"judged against {ys.target.describe()}{yardstick_cache.provenance()}")
        if ys.target.anomaly:
            print(f"WARNING: the yardstick itself is suspect: {ys.target.anomaly}")
    if ys.engine is not None:
        print(f"engine verdicts: {ys.engine.describe()}")
    for f in trace.manifest.fidelity:
        print(f"  {f.describe()}")


def print_distribution(trace) -> None:
    """A sampled run's distribution test and, for a run of ours, the kind of fault it shows."""
    if trace.distribution:
        print(f"distribution: {_distribution(trace)}")
        kind = metrics.sampled_verdict(trace)
        if kind:
            print(f"sampled verdict: {kind[0]}. {kind[1]}")
        if (a := trace.distribution.attribution) is not None:
            print(f"attribution: {a.explanation}")
            for h in a.hypotheses:
                print(f"  {'named ' if h.named else ''}{h.fault}: {metrics.ratio_text(h)} over "
                      "the correct rule")


def _distribution(trace) -> str:
    """A sampled run's verdict in one line: the kind of fault where one was found, then the
    distribution test."""
    d, line = trace.distribution, trace.distribution.verdict
    kind = metrics.sampled_verdict(trace)
    if kind and kind[0] != d.verdict:
        line = f"{kind[0]}; {line}"
    if d.p is not None:
        line += (f" (p = {d.p:.2g}, {d.tokens} tokens"
                 + (f"; fails: {d.failing}" if d.failing else "") + ")")
    if d.impossible:
        line += f"; {d.impossible} tokens the target gives probability 0"
    if trace.decisions:
        line += (f"; decision audit: {trace.decisions.mismatches} of {trace.decisions.checked} "
                 "decisions mismatch")
    return line


def _sweep(args) -> Sweep:
    """verify's runs: the methods × drafters × fault sets × batch sizes × k × temperatures on one
    base spec."""
    if args.fault_sets and args.faults:
        raise SpecError("give one fault set as --faults or several as --fault-sets, not both")
    # The base carries a swept drafter's options (the lookup's n-gram sizes); every run sets its own
    # method and drafter.
    drafter = next((d for d in args.drafter if DRAFTERS[d].options), args.drafter[0])
    # It samples at its highest temperature, so that the sampling settings hold; every run sets
    # its own.
    temperatures = args.temperatures or [args.temperature]
    hottest = max(temperatures, default=0)
    base = spec_of(args, drafter=drafter, faults=(), batch_size=min(args.batch_sizes, default=1),
                   temperature=hottest)
    return Sweep.build(base=base, methods=args.methods, drafters=args.drafter,
                       fault_sets=args.fault_sets or [spec_of(args, temperature=hottest).faults],
                       batch_sizes=args.batch_sizes, ks=args.k, temperatures=temperatures)


def _print_row(spec: RunSpec, trace: Trace) -> Trace:
    """One line of verify's table, printed as its run is done."""
    row = row_of(spec, trace)
    shown = ", ".join(f"{v} {c}" for v, c in row.verdicts.items()) or "-"
    if trace.distribution:  # a sampled run: no token reference, a verdict on its distribution
        shown = _distribution(trace)
    if trace.acceptance and trace.acceptance.verdict:
        shown += f"; drafts: {trace.acceptance.verdict}"
    if trace.rejections and trace.rejections.verdict:
        shown += f"; decisions: {trace.rejections.verdict}"
    if row.audit:
        shown += ("; audit: state departed in {target} (target) and {draft} "
                  "(draft) sequences").format(**row.audit)
    tqdm.write(f"{row.method:<18} {row.drafter:<8} {row.faults or '-':<14} {row.batch_size:>3} "
               f"{row.k:>3} {row.temperature:>4g} {row.n:>5} "
               f"{metrics.percent(row.exact_pct):>8} {metrics.percent(row.prefix_pct):>9}  {shown}")
    return trace


def cmd_verify(args) -> int:
    from specviz.run.shard import sweep

    plan = _sweep(args)
    specs = plan.specs()
    reports = launch.is_main()  # under `accelerate launch`, the main process reports for all
    if reports:
        print(f"{'method':<18} {'drafter':<8} {'faults':<14} {'bs':>3} {'k':>3} {'T':>4} {'n':>5} "
              f"{'exact %':>8} {'prefix %':>9}  verdicts")
    # Recorded runs: every one for a report (its accept lengths and rounds come from the records),
    # else those with something to explain, and sampled ones (their decisions are audited, their PIT
    # split by slot).
    recorded = [bool(args.json or spec.faults or spec.audit or not spec.greedy or args.forensics)
                for spec in specs]
    traces = sweep(list(zip(specs, recorded)), args.trust_remote_code, placement_of(args))
    if not reports:  # this process decoded its shares for the main one
        for _ in traces:
            pass
        return 0
    bar = tqdm(traces, total=len(specs), desc="verify", leave=False,
               disable=not sys.stderr.isatty())
    done = report(plan, (_print_row(spec, trace) for spec, trace in zip(specs, bar)))
    if args.json:
        write_text(args.json, done.to_json())
    sound = all(r.distribution.verdict == "consistent" if r.distribution else r.exact_pct == 100
                for r in done.rows)
    return 0 if sound or args.allow_divergence else 1


def cmd_shrink(args) -> int:
    from specviz.run.shrink import mark_of, shrink, size

    if bool(args.trace) == bool(args.link):
        raise SpecError("give the divergent run as --trace FILE or --link URL")
    if args.trace:
        trace = Trace.from_json(args.trace.read_bytes())
    else:
        link = share.decode_link(args.link.partition("?")[2] or args.link)
        if link is None:
            raise SpecError("that link carries no run")
        trace = _run_with_bars(link.spec, args)
    spec = trace.manifest.spec
    marked = [s.seq for s in trace.sequences if _marked(trace, s.seq)]
    seq = marked[0] if args.seq is None and marked else args.seq
    if seq is None or seq not in marked:
        what = ("shows no corrupt state or impossible token" if metrics.sampled(trace)
                else "does not diverge")
        raise SpecError(f"sequence {seq} {what} in that run; those that do: {marked or 'none'}")
    mark = mark_of(trace, seq)
    print(f"before: {size(spec)}; sequence {seq} {mark.describe()}")
    with tqdm(desc="shrink", unit="run", disable=not sys.stderr.isatty()) as bar:
        found = shrink(spec, seq, mark, pair_for(spec, args.trust_remote_code),
                       progress=lambda n: bar.update())
    small = found.trace.sequences[found.seq]
    verdict = small.forensics.verdict if small.forensics else "-"
    print(f"after:  {size(found.trace.manifest.spec)}; sequence {found.seq} still "
          f"{mark.describe()}: {verdict} ({found.trials} runs tried)")
    print(f"share link: {args.url.rstrip('/')}/{found.link()}")
    if args.out:
        write_text(args.out, found.trace.to_json(), "trace")
    return 0


def _marked(trace: Trace, seq: int) -> bool:
    """Whether sequence `seq` shows something to shrink (a fork; sampled, a corrupt state or an
    impossible token)."""
    from specviz.run.shrink import mark_of

    try:
        mark_of(trace, seq)
    except SpecError:
        return False
    return True


def cmd_bench(args) -> int:
    from specviz.run.bench import bench, configs

    runs = configs(args, spec_of(args).faults)
    if not runs:
        raise SpecError("nothing to run: none of these methods runs at these batch sizes")
    bench(args, [spec_of(args, **c) for c in runs], placement_of(args))
    return 0


def cmd_schema(args) -> int:
    print(json.dumps(jsonl.outputs_schema() if args.outputs else SweepReport.model_json_schema()
                     if args.report else trace_schema(), indent=1))
    return 0


def cmd_train_head(args) -> int:
    from specviz.run import eagle3_training
    from specviz.run.head_training import CONTINUING, train_head
    from specviz.spec.prompts import builtin_set

    recipe = eagle3_training.RECIPE if args.eagle3 else TRAINED[EMBEDDED_TARGET]
    units = {CONTINUING: len(builtin_set(recipe.prompts)) * recipe.new_tokens
             * (1 + recipe.sampled)}
    pair = load_pair(*PAIR_PRESETS["embedded"], dtype="float32", device=args.device)
    train = eagle3_training.train_eagle3_head if args.eagle3 else train_head
    with progress_bars(lambda phase: units.get(phase, recipe.steps)) as progress:
        path, losses = train(pair, EMBEDDED_TARGET, progress)
    print(f"trained the embedded pair's {'EAGLE-3' if args.eagle3 else 'EAGLE-style'} head in "
          f"{recipe.steps} steps: loss per token {losses[0]:.3f} at the first, "
          f"{losses[-1]:.3f} at the last; cached at {path}")
    return 0
