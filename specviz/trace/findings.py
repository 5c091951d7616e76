"""What a judge found, returned to its caller: the fields it sets on a trace's sequences and on the
run. The judges (forensics/) read a trace and never edit it; the caller that owns the trace records
their findings, in the order it judges (a later judge may read what an earlier one found).
Findings.record is the one place a built trace is changed."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from specviz.trace.schema import Trace


@dataclass
class Findings:
    # seq -> SequenceRecord fields
    sequences: dict[int, dict[str, object]] = field(default_factory=dict)
    # Trace fields; a nested one by its path: "manifest.engine", "distribution.attribution"
    run: dict[str, object] = field(default_factory=dict)

    def of(self, seq: int) -> dict[str, object]:
        """The fields found for sequence `seq` (to add to)."""
        return self.sequences.setdefault(seq, {})

    def record(self, trace: Trace) -> Trace:
        """Write the findings into `trace` (the caller's): returns it, judged."""
        for s in trace.sequences:
            for name, value in self.sequences.get(s.seq, {}).items():
                setattr(s, name, value)
        for name, value in self.run.items():
            *path, attr = name.split(".")
            setattr(functools.reduce(getattr, path, trace), attr, value)
        return trace
