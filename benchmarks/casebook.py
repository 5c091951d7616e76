"""The field casebook's table (docs/casebook.md), read off the bundled runs of its cases
(spec/casebook.py; `make traces` records them): each case's threads, fault, mechanism, the verdict
its replica got, and where it first forked (round, and the slot of that round's block that emitted
the token) or, for a lossless case, the drafts its run accepted against those the draft model's own
proposals would have had. No decoding.

    python benchmarks/casebook.py
"""
from __future__ import annotations

import sys
from pathlib import Path

# this checkout's engine, whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specviz.app.serving import ASSETS, read_trace  # noqa: E402
from specviz.spec.casebook import CASES  # noqa: E402
from specviz.trace import metrics  # noqa: E402
from specviz.trace.schema import Trace  # noqa: E402


def _shown(case, trace: Trace) -> tuple[str, str]:
    """(verdict, where it shows) of one case's bundled run."""
    if case.lossless:
        a = trace.acceptance
        return a.verdict, f"{a.accepted} of {a.accepted_fresh} drafts accepted (lossless)"
    sampled = metrics.sampled_verdict(trace)
    # no token reference: the first evidence of the decision, beside the distribution test
    if sampled:
        d, decided, drafts = trace.distribution, trace.decisions, trace.proposals
        first = (f"sequence {d.settings[0].seq} fits another request's settings; " if d.settings
                 else f"round {decided.stream_first[0][0]}: a draw not its row's stream's; "
                 if decided and decided.stream_first
                 else f"round {drafts.first[0][0]}: {drafts.q_off + drafts.draw_off} drafts off "
                 f"their q or their draw, of {drafts.checked}; "
                 if drafts and drafts.first else "")
        return sampled[0], f"{first}distribution {d.verdict} (p = {d.p:.2g})"
    forked = sorted((s for s in trace.sequences if s.forensics),
                    key=lambda s: (s.forensics.round or 0, s.seq))
    if not forked:
        return "-", "no fork"
    s, f = forked[0], forked[0].forensics
    seen = sum(len(r.emitted) for r in trace.rows if r.seq == s.seq and r.round < (f.round or 0))
    return f.verdict, f"round {f.round}, slot {f.fork - seen}"


def main() -> None:
    print("| field case (thread) | fault | mechanism | verdict | first fork, or drafts accepted "
          "|\n|---|---|---|---|---|")
    for case in CASES:
        trace = read_trace((ASSETS / "traces" / case.trace).read_text(encoding="utf-8"))
        verdict, where = _shown(case, trace)
        threads = "; ".join(f"[{t.label}]({t.url})" for t in case.threads)
        print(f"| {threads} | `{case.fault}` | {case.mechanism.splitlines()[0]} | `{verdict}` | "
              f"{where} |")


if __name__ == "__main__":
    main()
