"""specviz on the command line: run, verify, check, shrink, bench, schema and train-head, without
a browser."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specviz.cli.args import add_common, add_field, fault_set, float_list, int_list, methods
from specviz.cli.commands import (cmd_bench, cmd_run, cmd_schema, cmd_shrink, cmd_train_head,
                                  cmd_verify)
from specviz.cli.enginecheck import cmd_check
from specviz.decoding import determinism
from specviz.engines import openvino
from specviz.forensics import yardstick_cache
from specviz.spec.defaults import default_of
from specviz.spec.drafters import JUDGED_DRAFTERS
from specviz.spec.methods import METHODS
from specviz.spec.strict import SpecError
from specviz.trace.sweep import NO_FAULTS


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specviz", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    for add in (_add_run, _add_verify, _add_check, _add_shrink, _add_bench, _add_schema,
                _add_train_head):
        add(sub)
    return ap


def _add_run(sub) -> None:
    p = sub.add_parser("run",
                       help="decode prompts with one method; print outputs, write JSON or a trace")
    add_common(p)
    add_field(p, "method", choices=list(METHODS))
    add_field(p, "batch_size")
    add_field(p, "k")
    p.add_argument("--json", type=Path, help="write outputs and token ids here")
    p.add_argument("--trace", type=Path, help="write the full trace (JSON) here")
    p.add_argument("--no-record", action="store_true", help="do not record the per-round trace")
    p.set_defaults(func=cmd_run)


def _add_verify(sub) -> None:
    p = sub.add_parser("verify", help="equivalence table: exact and prefix match against reference")
    add_common(p)
    # verify's own sweep: the reference batched as the method is, beside RunSpec's method
    p.add_argument("--methods", type=methods, default=["batched-reference", default_of("method")])
    p.add_argument("--batch-sizes", type=int_list, default=[1, 4])
    p.add_argument("--k", type=int_list, default=[default_of("k")],
                   help="draft lengths, comma-separated")
    p.add_argument("--temperatures", type=float_list, metavar="T,T",
                   help="sweep target temperatures, comma-separated (default: --temperature); 0 is "
                        "greedy, judged token by token, above 0 by the distribution; a method "
                        "that runs greedy only runs at 0")
    p.add_argument("--fault-sets", type=fault_set, nargs="+", metavar="SET",
                   help=f"sweep fault sets: each comma-joined faults or presets, or {NO_FAULTS!r} "
                        f"(no faults), e.g. {NO_FAULTS} bsp-like no-mask,min-crop; the methods "
                        "that take no faults run once, without")
    p.add_argument("--json", type=Path,
                   help="write the sweep report here (every run recorded): the page's Sweep tab "
                        "loads it")
    p.add_argument("--allow-divergence", action="store_true",
                   help="exit 0 even when a method diverges")
    p.add_argument("--forensics", action="store_true",
                   help="record full per-round traces (the engine's own invariant checks, margins, "
                        "timings); always on with --faults and --audit. Every divergence gets its "
                        "state check and verdict either way")
    p.set_defaults(func=cmd_verify)


def _add_check(sub) -> None:
    p = sub.add_parser(
        "check", help="an engine's outputs (a server, a file, a callable) against the batch-size-1 "
                      "reference of the same weights; every difference judged")
    add_common(p)
    g = p.add_argument_group("the engine under test (one of)")
    g.add_argument("--server",
                   help="a server's base URL, e.g. http://localhost:8000: llama.cpp's "
                        "llama-server, or OpenAI-compatible (vLLM, SGLang, ...); which one is "
                        "asked of the server")
    g.add_argument("--outputs", type=Path,
                   help="a JSONL file of its outputs (docs/engines.md; `specviz schema --outputs`)")
    g.add_argument("--engine",
                   help="a Python callable module:function that takes prompt ids and settings")
    g.add_argument("--openvino", choices=openvino.MODES,
                   help="OpenVINO GenAI (`make openvino`) on the check's pair, every prompt in "
                        "one batch: none, ngram (prompt lookup) or draft (the pair's draft)")
    g = p.add_argument_group("a control run: the same engine without speculation (it measures the "
                             "engine's rounding)")
    g.add_argument("--control-server", help="its server's base URL")
    g.add_argument("--control-served-model", help="its served model name (default: --served-model)")
    g.add_argument("--control", type=Path,
                   help="its outputs file (the same prompts, in the same order)")
    g.add_argument("--control-engine", help="its callable module:function")
    g.add_argument("--control-openvino", action="store_true",
                   help="with --openvino: its own run without speculation")
    g = p.add_argument_group("server options")
    g.add_argument("--served-model",
                   help="the model name the server serves (default: the server's only model)")
    g.add_argument("--concurrency", type=int, default=8,
                   help="requests in flight, so the server batches them")
    g.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one answer")
    g.add_argument("--stream", action="store_true",
                   help="stream each answer (OpenAI-compatible servers): its chunks, one per "
                        "engine step, are the request's rounds, seen from outside")
    g = p.add_argument_group("OpenVINO options")
    g.add_argument("--openvino-precision", choices=list(openvino.PRECISIONS), default="f32",
                   help="f32: compute and KV cache in float32; cpu-default: the CPU plugin's "
                        "own (bf16 and a u8 KV cache where the CPU has bfloat16)")
    g = p.add_argument_group("repeats")
    g.add_argument("--determinism", action="store_true",
                   help="a server or OpenVINO: ask every prompt twice more (the same requests "
                        "again, then in reverse order: other slots and batch company) and report "
                        "every prompt answered otherwise, with its fork")
    add_field(p, "k", help="the engine's draft length, if it speculates (a verify pass's k + 1 "
                           "positions size the tolerance)")
    p.add_argument("--engine-drafter", choices=list(JUDGED_DRAFTERS),
                   help="what the engine drafts with, whose acceptance is then judged from the "
                        "engine's counters (per request, or a server's /metrics over the run) "
                        "against that drafter's own proposals: `model`, the check's --draft "
                        "model; `eagle3` or `eagle1`, the published head of --head DIR; an "
                        "outputs file's header may say it instead")
    p.add_argument("--decode-reference", action="store_true",
                   help="decode the reference token by token for every prompt, instead of proving "
                        "it from the outputs by teacher forcing and decoding only from a fork or "
                        "near-tie on (slower; the same verdicts)")
    p.add_argument("--checkpoint", type=Path,
                   help="keep every prompt's judging in this file as it is done; the same command "
                        "run again after a stop (a crash, Ctrl-C) takes up the prompts judged "
                        "already, where the engine answered alike")
    p.add_argument("--no-attribution", dest="attribute", action="store_false",
                   help="do not replay forks under the catalogue's faults to name their mechanism "
                        "(attribution runs only on forks not put down to rounding, in batches of "
                        "the engine's declared batch_size or --concurrency)")
    p.add_argument("--json", type=Path, help="write the summary and every sequence here")
    p.add_argument("--trace", type=Path, help="write the check as a trace (opens in the app)")
    p.set_defaults(func=cmd_check)


def _add_shrink(sub) -> None:
    p = sub.add_parser("shrink", help="the smallest run that still forks where a divergent run "
                                      "forked, as a share link")
    p.add_argument("--trace", type=Path,
                   help="the divergent run: a trace file "
                        "(specviz run --trace, or the page's download)")
    p.add_argument("--link", help="the divergent run: a share link (it is decoded once first)")
    p.add_argument("--seq", type=int,
                   help="the divergent sequence to keep (default: the first that diverges)")
    p.add_argument("--url", default="http://localhost:7860/",
                   help="the page the printed share link points to")
    p.add_argument("--out", type=Path, help="write the smallest run's trace here")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow models that ship their own code")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic GPU kernels (see run)")
    p.set_defaults(func=cmd_shrink, device_map=None, max_memory=None)


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="throughput and phase shares, side by side in one run")
    add_common(p)
    p.add_argument("--batch-sizes", type=int_list, default=[1, 2, 4, 8])
    add_field(p, "k")
    p.add_argument("--methods", type=methods, default=list(METHODS))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--max-waits", type=int_list,
                   help="exspec: sweep these max-wait values (default: --max-wait)")
    p.add_argument("--name", default="bench",
                   help="file name (without extension) of the table and plot")
    p.set_defaults(func=cmd_bench)


def _add_schema(sub) -> None:
    p = sub.add_parser("schema", help="print the trace's JSON Schema (docs/trace.schema.json)")
    shapes = (("--outputs", "an engine outputs file (docs/engine-outputs.schema.json)"),
              ("--report", "a sweep report (verify --json; docs/sweep-report.schema.json)"))
    for flag, what in shapes:
        p.add_argument(flag, action="store_true", help=f"the JSON Schema of {what} instead")
    p.set_defaults(func=cmd_schema)


def _add_train_head(sub) -> None:
    p = sub.add_parser("train-head",
                       help="train the embedded pair's EAGLE-style head on this machine, once, and "
                            "cache it (about 15 minutes on 2 CPU cores)")
    p.add_argument("--eagle3", action="store_true",
                   help="train its EAGLE-3 head instead, in the published layout "
                        "(--drafter eagle3 --head specviz:trained-eagle3; a folder vLLM serves)")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_train_head)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "deterministic", False):
        determinism.enable()
    try:
        with yardstick_cache.recording():  # so that a command can say where its yardstick came from
            return args.func(args)
    except SpecError as e:
        print(f"specviz: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
