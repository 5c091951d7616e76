"""A check's judged rows, kept as each is done, so that a check that stops (a crash, Ctrl-C, a lost
machine) resumes where it stopped: `specviz check --checkpoint FILE`, run again.

JSON lines: a header naming the check (the pair, dtype, device, budget, k, the prompts' ids, the way
references are obtained), then one line per prompt: the outputs it judged (the engine's and the
control's ids), each teacher-forced (enginenoise.Forced), and its reference with how it was
obtained. A resumed check takes a row only under the same header and for the same outputs: an engine
asked again that answers otherwise is judged again. A line cut short by the stop is ignored. Under
`accelerate launch` each process keeps its rows in a part file of its own beside FILE and every part
is read back. Read with pydantic, never unpickled.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
from pathlib import Path

from pydantic import ValidationError

from specviz.decoding.result import SequenceOutput
from specviz.forensics.enginenoise import Forced
from specviz.spec.strict import Many, Map, SpecError, Strict
from specviz.trace.records import ReferenceProof

CHECKPOINT_VERSION = 2  # 2: each forced output keeps its tokens' ranks


class ForcedRecord(Strict):
    gaps: Many[float]
    margins: Many[float]
    logprobs: Many[float]
    spreads: Many[float]
    ranks: Many[int]


class CheckpointRow(Strict):
    seq: int
    outputs: Map[str, Many[int]]  # role -> the ids judged
    forced: Map[str, ForcedRecord]
    reference: Many[int]
    margins: Many[float]
    proof: ReferenceProof | None = None


class Checkpoint:
    """The rows of one check in `path`: those found there (under the same header), and those put as
    they are done."""

    def __init__(self, path: Path, check: dict, part: int | None = None):
        """`part`: the number of this process under `accelerate launch`, which writes `path`.part<N>
        and reads every part, so that a check resumes whatever the number of processes it ran
        on before."""
        self.path = path if part is None else path.with_name(f"{path.name}.part{part}")
        self.header = {"specviz_check": CHECKPOINT_VERSION,
                       "check": hashlib.sha256(json.dumps(check, sort_keys=True).encode())
                       .hexdigest()}
        self.rows: dict[int, CheckpointRow] = {}
        for found in [path, *sorted(path.parent.glob(f"{glob.escape(path.name)}.part*"))]:
            if found.exists() and found.stat().st_size:
                self._load(found)

    def _load(self, path: Path) -> None:
        with path.open(encoding="utf-8", errors="replace") as f:
            first = f.readline()
            try:
                header = json.loads(first)
            except ValueError:
                header = None
            if header != self.header:
                raise SpecError(f"{path} is not this check's checkpoint (another engine, pair, "
                                "prompt list or budget, or an earlier specviz's): remove it, or "
                                "name another file")
            for line in f:
                try:
                    row = CheckpointRow.model_validate_json(line)
                except ValidationError:
                    continue  # the line a stop cut short
                self.rows[row.seq] = row

    def get(self, seq: int,
            outputs: dict[str, list[int]]) -> tuple[dict[str, Forced], SequenceOutput] | None:
        """Row `seq`'s forced outputs and reference, when it was judged for these same outputs."""
        row = self.rows.get(seq)
        if row is None or row.outputs != outputs:
            return None
        forced = {role: Forced(**f.model_dump()) for role, f in row.forced.items()}
        return forced, SequenceOutput(list(row.reference), list(row.margins), proof=row.proof)

    def put(self, seq: int, outputs: dict[str, list[int]], forced: dict[str, Forced],
            ref: SequenceOutput) -> None:
        row = CheckpointRow(
            seq=seq, outputs=outputs,
            forced={r: ForcedRecord(**dataclasses.asdict(f)) for r, f in forced.items()},
            reference=ref.ids, margins=ref.margins, proof=ref.proof)
        self.rows[seq] = row
        new = not self.path.exists() or not self.path.stat().st_size
        with self.path.open("a", encoding="utf-8") as f:
            f.write((json.dumps(self.header) + "\n" if new else "") + row.model_dump_json() + "\n")
