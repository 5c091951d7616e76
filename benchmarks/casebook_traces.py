"""Record the field casebook's bundled runs (`make traces`): each case's replica (spec/casebook.py)
through the runner, written to assets/traces/case-<fault>.json, where the page's Field cases gallery
opens it without decoding and tests/test_gallery.py checks it. Faults named on the command line
record only those cases.

    python benchmarks/casebook_traces.py [FAULT ...]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

# this checkout's engine, whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specviz.app.serving import ASSETS  # noqa: E402
from specviz.run.runner import run  # noqa: E402
from specviz.spec.casebook import BY_FAULT, CASES  # noqa: E402
from specviz.spec.run import RunSpec  # noqa: E402


def main(faults: list[str]) -> None:
    torch.set_num_threads(1)  # as the tests run them (tests/conftest.py)
    for case in [BY_FAULT[f] for f in faults] if faults else CASES:
        start = time.perf_counter()
        trace = run(RunSpec.build(**case.spec_fields()))
        path = ASSETS / "traces" / case.trace
        path.write_text(trace.to_json(), encoding="utf-8")
        print(f"{path.name}: {path.stat().st_size / 1024:.0f} KiB, "
              f"{time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
