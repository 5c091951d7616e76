"""Server-side time to show a 64-run sweep report in the Sweep tab (budget: under 1 s,
figures included).

The report is a real one: eqspec on the tiny pair, float32, the quick prompts, 4 fault sets × batch
sizes 1, 2, 4, 8 × k 1, 2, 4, 5 = 64 runs, made by `specviz verify --json` and saved before anything
is timed. Each repeat then runs the page's own handlers for an opened report: sweeptab.open_report
(read, validate, keep a copy to download), sweeptab.render_sweep (summary, both heatmaps, the four
figures, the share link), each figure's to_json() (what Gradio sends), and sweeptab.remember_sides
(the compare tab's pickers gain the 64 runs).

    OMP_NUM_THREADS=1 python benchmarks/sweep_render.py [--report out/sweep-64.json] [--repeats 7]
"""
import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from specviz.app import sweeptab
from specviz.cli.main import main as specviz
from specviz.run.settings import Settings
from specviz.trace.sweep import SweepReport

# correct, two presets, a fault only batches show
FAULT_SETS = ("none", "bsp-like", "dsd-like", "no-kv-shift")
VERIFY = ["verify", "--pair", "tiny", "--dtype", "float32", "--device", "cpu", "--prompt-set",
          "quick", "--methods", "eqspec", "--fault-sets", *FAULT_SETS, "--batch-sizes", "1,2,4,8",
          "--k", "1,2,4,5", "--allow-divergence"]
RESULT = Path(__file__).parent / "results" / "sweep-render.md"


def show(path: Path) -> dict[str, float]:
    """Everything the page's server does to show a report file, each step's seconds."""
    seconds, t = {}, time.perf_counter()
    report, _, _ = sweeptab.open_report(str(path))
    seconds["open_report (read, validate)"] = time.perf_counter() - t
    t = time.perf_counter()
    # with its link
    views = dict(zip(sweeptab.SWEEP_VIEW_NAMES,
                     sweeptab.render_sweep(Settings(max_sweep_runs=64), report, 0)))
    seconds["render_sweep (heatmaps, figures, link)"] = time.perf_counter() - t
    t = time.perf_counter()
    for figure in ("verdicts", "divergence", "accept_lengths", "acceptance"):
        views[figure].to_json()
    seconds["figures to_json"] = time.perf_counter() - t
    t = time.perf_counter()
    sweeptab.remember_sides({}, report)
    seconds["remember_sides (compare pickers)"] = time.perf_counter() - t
    seconds["total"] = sum(seconds.values())
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=Path("out/sweep-64.json"),
                        help="made here if missing")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if not args.report.exists():
        t = time.perf_counter()
        specviz([*VERIFY, "--json", str(args.report)])
        print(f"made {args.report} in {time.perf_counter() - t:.0f} s")
    data = args.report.read_bytes()
    report = SweepReport.from_json(data)
    assert report.sweep.size() == 64, report.sweep.size()
    runs = [show(args.report) for _ in range(args.repeats)]
    lines = [f"| {step} | {statistics.median(r[step] for r in runs):.3f} | "
             f"{max(r[step] for r in runs):.3f} |"
             for step in runs[0]]
    table = "| step | median s | max s |\n|---|---:|---:|\n" + "\n".join(lines)
    print(table)
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared), "
               f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, Python "
               f"{sys.version.split()[0]}")
    RESULT.write_text(
        f"# Sweep tab: server time to show a 64-run report\n\n"
        f"{len(report.rows)} runs, {len(report.sequences)} sequences, report "
        f"{len(data) / 2**20:.2f} MiB (`specviz {' '.join(VERIFY)} --json {args.report}`). "
        f"{args.repeats} repeats of everything the page's server does to show it, the page's own "
        "handlers: open the file (read, validate), render every view of the Sweep tab with its "
        "share link, serialize each figure (to_json, as Gradio does), and list the runs for the "
        "compare tab."
        f"\n\n{table}\n\nMachine: {machine}. "
        f"Made by `OMP_NUM_THREADS=1 python benchmarks/sweep_render.py`.\n")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
