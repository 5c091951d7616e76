"""How malformed share links and trace files are turned away: counts, and CPU time per input.

Runs the seeded generators of the fuzz test (tests/hostile.py) through the handlers the server
calls: `ui.open_link` for links, `ui.open_trace` then `ui.render` for trace files. Prints, for links
and for traces separately, how many got our message, how many opened, how many raised anything else,
and the median and p90, p99, p99.9 and slowest CPU time of a rejection (the goal: every one under
50 ms).

    python benchmarks/fuzz.py [--links 10000] [--traces 1000] [--seed 12]
    [--out benchmarks/results/fuzz.md]
"""
import argparse
import collections
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gradio as gr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hostile import malformed_links, malformed_traces, real_link_and_trace  # noqa: E402

from specviz.app import page as ui  # noqa: E402


def open_link(query: str) -> str:
    status = ui.open_link(query)["status"]
    return "message" if "could not be used" in status else "opened"


def open_trace(data: bytes, folder: Path) -> str:
    path = folder / "upload.json"
    path.write_bytes(data)
    try:
        trace = ui.open_trace(str(path))[0]
    except gr.Error:
        return "message"
    ui.render(trace)
    return "opened"


def measure(label: str, cases, handle) -> list[str]:
    """Run every case through `handle`; the lines that report it."""
    outcomes: collections.Counter = collections.Counter()
    rejected = []
    slowest = (0.0, "")
    for case in cases:
        t = time.process_time()
        try:
            outcome = handle(case)
        except Exception as e:  # noqa: BLE001  anything but our message is a bug: count it, by type
            outcome = f"other: {type(e).__name__}"
        dt = time.process_time() - t
        outcomes[outcome] += 1
        if outcome != "opened":
            rejected.append(dt)
            slowest = max(slowest, (dt, repr(case[:80])))
    lines = [f"{label}: {sum(outcomes.values())} inputs: "
             + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))]
    if rejected:
        cuts = statistics.quantiles(rejected, n=1000, method="inclusive")
        lines.append(f"  rejection CPU time: median {1000 * statistics.median(rejected):.2f} ms, "
                     f"p90 {1000 * cuts[899]:.2f} ms, p99 {1000 * cuts[989]:.2f} ms, p99.9 "
                     f"{1000 * cuts[998]:.2f} ms, slowest {1000 * slowest[0]:.1f} ms "
                     f"({slowest[1]}…); over 50 ms: {sum(dt > 0.05 for dt in rejected)}")
    print("\n".join(lines), flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--links", type=int, default=10_000)
    ap.add_argument("--traces", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=12, help="default: the fuzz test's")
    ap.add_argument("--out", type=Path, help="also write the lines here")
    args = ap.parse_args()
    link, trace = real_link_and_trace()
    # A full cyclic GC pass over this process (torch, gradio, the pair) takes ~0.2 s whenever
    # allocation counts trigger one, whatever the input: freeze what is loaded, so each input is
    # charged for its own objects.
    gc.freeze()
    lines = measure("links", malformed_links(args.seed, args.links, link), open_link)
    with tempfile.TemporaryDirectory() as tmp:
        lines += measure("traces", malformed_traces(args.seed, args.traces, trace),
                         lambda d: open_trace(d, Path(tmp)))
    if args.out:
        made = (f"python benchmarks/fuzz.py --links {args.links} --traces {args.traces} --seed "
                f"{args.seed}")
        args.out.write_text("# Malformed links and trace files turned away\n\n```\n"
                            + "\n".join(lines)
                            + f"\n```\n\nMade by `{made}` (CPU time per input, one run, "
                              "2 cores).\n")


if __name__ == "__main__":
    main()
