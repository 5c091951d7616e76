"""Tidy pandas views of a trace, for analysis in a notebook: one line per (round, row), one per
emitted token."""
from __future__ import annotations

import pandas as pd

from specviz.trace.schema import Trace


def rows_frame(trace: Trace) -> pd.DataFrame:
    """One line per (round, row); checks as boolean columns `check_<name>`."""
    records = []
    for r in trace.rows:
        d = r.model_dump(exclude={"checks"})
        d.update({f"check_{n}": v for n, v in r.checks.items()})
        records.append(d)
    return pd.DataFrame.from_records(records)


def tokens_frame(trace: Trace) -> pd.DataFrame:
    """One line per emitted token: where it came from and what both models thought of it."""
    records, index = [], {}
    for r in trace.rows:
        for j, (tok, src) in enumerate(zip(r.emitted, r.sources)):
            i = index.get(r.seq, 0)
            index[r.seq] = i + 1
            records.append({
                "seq": r.seq, "index": i, "token": tok, "source": src, "round": r.round,
                "row": r.row, "draft_prob": r.draft_probs[j] if src == "draft" else None,
                "target_prob": r.target_probs[j], "target_margin": r.target_margins[j],
                "target_kv": r.target_kv_before + 1 + j,
            })
    return pd.DataFrame.from_records(records)
