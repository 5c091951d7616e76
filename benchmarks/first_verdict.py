"""What a new user waits for a first verdict, and what a later run waits: `specviz run --prompt "Hi"
--max-new-tokens 8` timed as a process of its own, side by side:

- cold: a fresh $SPECVIZ_CACHE, as on a new machine (the embedded model converted from its GGUF, the
  yardstick measured against float64);
- the yardstick cold: the same cache with its kept yardsticks deleted (the model already converted):
  what keeping the yardstick saves on its own;
- warm: the same cache again, everything kept (the yardstick read back, and said so).

    python benchmarks/first_verdict.py [--out benchmarks/results/first-verdict.md]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from publish import publish

ROOT = Path(__file__).resolve().parents[1]


def timed(cache: Path, argv: list[str]) -> tuple[float, str]:
    """Seconds for `specviz run` with `argv` in a fresh process over `cache`, and the line it
    prints about its yardstick."""
    env = {**os.environ, "SPECVIZ_CACHE": str(cache)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "specviz.cli.main", "run", *argv], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - start
    line = next((x for x in done.stdout.splitlines() if x.startswith("judged against")), "-")
    return seconds, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", default="Hi")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    argv = ["--prompt", args.prompt, "--max-new-tokens", str(args.max_new_tokens)]
    cpu = f"a {os.cpu_count()}-core CPU"
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder)
        for name in ("cold", "the yardstick cold", "warm"):
            if name == "the yardstick cold":
                shutil.rmtree(cache / "yardsticks")
            seconds, line = timed(cache, argv)
            rows.append((name, seconds, line))
            print(f"{name}: {seconds:.1f} s; {line}", flush=True)
    (_, cold, _), (_, measured, _), (_, warm, said) = rows
    lines = ["# First verdict: a cold `specviz run` against a warm one\n",
             (f"`specviz run --prompt {args.prompt!r} --max-new-tokens {args.max_new_tokens}` (the "
              f"embedded pair, its defaults), each a process of its own on {device}, one after the "
              "other over one $SPECVIZ_CACHE.\n"),
             "| run | what it finds in the cache | seconds |", "|---|---|---:|",
             f"| cold | nothing (a fresh folder) | {cold:.1f} |",
             f"| the yardstick cold | the converted model, no yardstick | {measured:.1f} |",
             f"| warm | the converted model and the yardstick | {warm:.1f} |", "",
             (f"Warm over cold: **{cold / warm:.1f}x** faster ({warm / cold:.0%} of the wait); "
              f"over the yardstick cold: **{measured / warm:.1f}x**."), "",
             f"The warm run printed: `{said}`"]
    publish("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
