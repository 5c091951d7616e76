"""Server-side time to build every view of the page for a trace (issue: 8 × 128 under 0.5 s,
64 × 256 under 2 s), and to show the first page (the bundled trace: under 1 s).

Traces come from the tiny pair (fast to decode; the views only see the trace's shape). Each size is
timed for the default focus and for a focus on the last sequence, median of 5, including the plotly
figures' JSON encoding that Gradio does before sending them.

    python benchmarks/views.py [--prompts FILE]
        (default: the carried Spec-Bench slice, 64 questions)
"""
import argparse
import statistics
import time
from pathlib import Path

from specviz.app import views
from specviz.app.runview import open_link, render
from specviz.run.runner import run
from specviz.spec.prompts import SPEC_BENCH_FILE, read_prompts
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec

SIZES = ((8, 128), (64, 256))  # (sequences, new tokens)


def _first_page() -> float:
    """Seconds the server spends on a fresh visit: open_link (the bundled trace, its status and
    download), then every view of it, the figures JSON-encoded as Gradio sends them."""
    t = time.perf_counter()
    *_, trace, _, _, _ = open_link("")
    for fig in render(trace)[5:7]:
        fig.to_json()
    return time.perf_counter() - t


def main() -> None:
    first = _first_page()  # this process's first visit also parses the bundled traces
    again = [_first_page() for _ in range(5)]
    print(f"first page (bundled trace): first visit {first:.3f} s, later visits median "
          f"{statistics.median(again):.3f} s, max {max(again):.3f} s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=SPEC_BENCH_FILE,
                        help="one prompt a line, or Spec-Bench JSONL; needs at least 64 prompts")
    questions = read_prompts(parser.parse_args().prompts)
    most = max(n for n, _ in SIZES)
    if len(questions) < most:
        parser.error(f"--prompts holds {len(questions)} prompts; the largest trace needs {most}")
    for n, tokens in SIZES:
        spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, prompts=tuple(questions[:n]),
                             batch_size=8, k=5, max_new_tokens=tokens, device="cpu",
                             faults=("bsp-like",))
        trace = run(spec)
        size = len(trace.to_json()) / 2**20
        for label, seq in (("default focus", None), ("last sequence", n - 1)):
            times = []
            for _ in range(5):
                t = time.perf_counter()
                out = render(trace, seq)
                for fig in out[5:7]:
                    fig.to_json()
                times.append(time.perf_counter() - t)
            focus, _ = views.resolve(trace, seq)
            print(f"{n:>3} sequences x {tokens} tokens ({len(trace.rows)} round-rows, trace "
                  f"{size:.1f} MiB), {label} (seq {focus.seq}): median "
                  f"{statistics.median(times):.3f} s, max {max(times):.3f} s")


if __name__ == "__main__":
    main()
