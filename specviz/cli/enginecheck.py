"""The command line's `check`: an engine from outside (a server, a file of its outputs, a Python
callable) judged against the model; what it prints and writes."""
from __future__ import annotations

import json

from specviz.cli.args import placement_of, spec_of
from specviz.cli.commands import (print_acceptance, print_distribution, print_yardsticks,
                                  progress_bars, write_text)
from specviz.engines import openvino
from specviz.engines.dialects import LlamaCpp, OpenAI
from specviz.models.pairs import pair_for
from specviz.run import launch
from specviz.spec.drafters import DRAFTERS
from specviz.spec.run import ENGINE
from specviz.spec.strict import SpecError
from specviz.spec.verdicts import verdict
from specviz.trace import metrics


def cmd_check(args) -> int:
    from specviz.run import check, openvino_check

    # under `accelerate launch`, every process judges a share and the main one reports
    reports = launch.is_main()
    if sum(map(bool, (args.server, args.outputs, args.engine, args.openvino))) != 1:
        raise SpecError("give the engine as one of --server URL, --outputs FILE, --engine "
                        "module:function or --openvino MODE")
    if args.stream and not args.server:
        raise SpecError("--stream reads a server's streamed answers: give --server URL")
    if args.stop and args.openvino:
        raise SpecError("stop strings are not sent to OpenVINO: it ends its ids at a stop string "
                        "its own way, not yet read (docs/engines.md); check a file of its outputs "
                        "made with them, --outputs FILE --stop")
    published = bool(args.engine_drafter) and "head" in DRAFTERS[args.engine_drafter].options
    if bool(args.head) != published:
        raise SpecError(f"--engine-drafter {args.engine_drafter} drafts with a published head: "
                        "give its folder, --head DIR" if published else
                        "--head is the engine's published head: declare it with --engine-drafter "
                        + " or ".join(n for n, d in DRAFTERS.items() if "head" in d.options))
    if args.control_openvino and not args.openvino:
        raise SpecError("--control-openvino is OpenVINO's run without speculation: give "
                        "--openvino MODE")
    # what the engine drafts with, recorded with the check (a published head: from its files)
    spec = spec_of(args, method=ENGINE, k=args.k,
                   **({"drafter": args.engine_drafter} if args.engine_drafter else {}))
    pair = pair_for(spec, args.trust_remote_code, placement_of(args))
    if args.determinism and not (args.server or args.openvino):
        raise SpecError("--determinism asks the engine again: give it as --server URL or "
                        "--openvino MODE")
    # the budget of an outputs file is its longest output
    with progress_bars(lambda phase: None) as progress:
        judging = check.Judging(args.decode_reference, progress, args.checkpoint, args.attribute)
        if args.outputs:
            control = (args.control.read_bytes(), args.control.name) if args.control else None
            trace = check.from_files(spec, pair, (args.outputs.read_bytes(), args.outputs.name),
                                     control, judging=judging, drafter=args.engine_drafter)
        elif args.server:
            control = ((args.control_server, args.control_served_model or args.served_model)
                       if args.control_server else None)
            trace = check.from_servers(spec, pair, (args.server, args.served_model), control,
                                       args.concurrency, args.timeout, determinism=args.determinism,
                                       judging=judging, drafter=args.engine_drafter,
                                       stream=args.stream)
        elif args.openvino:
            setting = openvino.Setting(args.openvino, args.openvino_precision,
                                       spec.prefix_caching, spec.k)
            trace = openvino_check.from_openvino(spec, pair, setting, args.control_openvino,
                                                 args.determinism, judging)
        else:
            trace = check.from_callables(spec, pair, args.engine, args.control_engine, judging,
                                         args.engine_drafter)
    if not reports:
        return 0
    _print_check(trace)
    if args.json:
        write_text(args.json, json.dumps({"engine": trace.manifest.engine.model_dump(),
                                          "summary": metrics.engine_summary(trace),
                                          "sequences": [s.model_dump() for s in trace.sequences]},
                                         indent=1))
    if args.trace:
        write_text(args.trace, trace.to_json(), "trace")
    return 0


def _print_check(trace) -> None:
    print(f"{'engine':<44} {'n':>4} {'errors':>6} {'exact %':>8} {'prefix %':>9} {'tok/s':>7}  "
          "verdicts")
    for row in metrics.engine_summary(trace):
        tps = "-" if row["tokens_per_second"] is None else f"{row['tokens_per_second']:.1f}"
        shown = ", ".join(f"{v} {c}" for v, c in row["verdicts"].items()) or "-"
        print(f"{row['engine'][:44]:<44} {row['n']:>4} {row['errors']:>6} "
              f"{metrics.percent(row['exact_pct']):>8} {metrics.percent(row['prefix_pct']):>9} "
              f"{tps:>7}  {shown}")
    print_yardsticks(trace)
    if proofs := metrics.reference_proofs(trace):
        print(f"reference: {proofs}")
    _print_engine_facts(trace)
    print_distribution(trace)
    for s in trace.sequences:
        if s.forensics:
            print(f"  [{s.seq}] {s.forensics.verdict}: {s.forensics.explanation}")
            # a bug seen from outside: the smallest request that shows it
            if verdict(s.forensics.verdict).bug:
                print(f"    reproduce: {_reproducer(trace, s)}")
            if s.attribution:
                _print_attribution(s.attribution)
        elif s.engine.error:
            print(f"  [{s.seq}] no answer: {s.engine.error}")


def _print_attribution(a) -> None:
    """Which mechanism writes the fork's tokens: the finding, then the best hypotheses, one
    a line."""
    print(f"    attribution: {a.explanation}")
    for h in a.hypotheses[:3]:
        where = "alone" if not h.companions else f"beside {','.join(map(str, h.companions))}"
        failed = "none" if h.failed_at is None else h.failed_at
        print(f"      {'named ' if h.named else ''}{'+'.join(h.faults)} ({where}): {h.explained} "
              f"of {a.tokens} tokens written, {h.beyond} of {len(a.departing)} departing, first "
              f"failed {failed}")
    for fact in a.facts:
        print(f"      fact: {fact}")
    print(f"      tried {len(a.hypotheses)} mechanisms in {a.replays} replays ({a.seconds:.1f} s); "
          f"skipped {len(a.skipped)} that do not fit the engine")


def _reproducer(trace, s) -> str:
    """The smallest request that shows a bug's fork: the prompt's ids, greedy, up
    to the fork token."""
    e, f = trace.manifest.engine, s.forensics
    if f.verdict == "decision-bug:score":  # the tokens are right: the score is the bug
        return (f"prompt ids {trace.prompts[s.seq].ids}, greedy, {len(s.output_ids)} tokens: the "
                f"score it reports should be the sum of its tokens' log-probabilities, "
                f"{f.score_expected:.6g} up to token {f.fork}'s round, and is {f.score:.6g}")
    budget = f.fork + 1
    should = ("nothing (the reference has stopped)" if f.reference_token is None
              else f.reference_token)
    dialects = {d.name: d for d in (LlamaCpp, OpenAI)}
    if e.source == "server" and e.settings.get("api") in dialects:
        asked = dialects[e.settings["api"]](e.settings.get("served_model") or "", budget, 0.0, 1.0,
                                            0, 0)
        body = json.dumps(asked.request(trace.prompts[s.seq].ids, None), separators=(",", ":"))
        return f"POST {asked.path} {body} (token {f.fork} should be {should}, is {f.output_token})"
    return (f"prompt ids {trace.prompts[s.seq].ids}, greedy, {budget} tokens: token {f.fork} "
            f"should be {should}, is {f.output_token}")


def _print_engine_facts(trace) -> None:
    """What the engine said besides its outputs: its drafts (judged, where it drafts with the
    check's draft model), the fields of its file left unread, its determinism."""
    engine = trace.manifest.engine
    accepted, offered = metrics.engine_drafts(trace)
    if offered:
        print(f"engine drafts, per request: {accepted} of {offered} draft tokens accepted "
              f"({accepted / offered:.0%})")
    if rounds := metrics.engine_rounds_seen(trace):
        print(f"engine rounds: {rounds}")
    counters = engine.settings.get("spec_decode") or {}
    if counters.get("draft_tokens"):
        drafts = counters.get("drafts") or 0
        positions = sorted((k for k in counters if k.startswith("accepted_tokens_per_pos_")),
                           key=lambda k: int(k.rsplit("_", 1)[1]))
        by_position = [counters[k] / drafts for k in positions]
        print(f"engine drafts, its /metrics: {counters['accepted_tokens']:.0f} of "
              f"{counters['draft_tokens']:.0f} draft tokens accepted in {drafts:.0f} drafts"
              + ("; accepted by position: " + " ".join(f"{a:.2f}" for a in by_position)
                 if drafts and by_position else ""))
    print_acceptance(trace)  # declared to draft with the check's draft model: its counts judged
    if engine.ignored:
        print(f"ignored fields of the outputs file: {', '.join(engine.ignored)}")
    if trace.manifest.determinism:
        print(trace.manifest.determinism.describe())
