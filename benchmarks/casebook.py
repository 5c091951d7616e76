"""The field cases replayed on the embedded pair: where each fault first shows and what specviz names it.

Each fault that replicates a field bug (spec/faults.py) runs alone through eqspec, greedy, float32, on the
quick prompts with "What is the capital of France?" added (its answer ends inside a block), batch size 4, k 4,
32 tokens. A lossless fault runs with the target as its own draft, where a correct drafter's every draft is
accepted. The recurrent faults need a hybrid model: they run on tests/hybrids.py's random Qwen 3.5-style pair
(lookup drafts for the zero-draft case). Printed: the verdict of the first forked sequence and its fork (round,
slot: the draft slot of that round that emitted it), or for a lossless fault the drafts accepted against the
draft model's own proposals. docs/casebook.md reports this table.

    python benchmarks/casebook.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hybrids import save_pair  # noqa: E402

from specviz.run.runner import run  # noqa: E402
from specviz.spec.faults import ACCEPTANCE_OF, FAULTS, SAMPLED, VERDICT_OF  # noqa: E402
from specviz.spec.prompts import builtin_set  # noqa: E402
from specviz.spec.run import EMBEDDED_TARGET, RunSpec  # noqa: E402

PAPER = ("positions-from-slots", "no-mask", "draft-bonus", "no-kv-shift", "min-crop")  # our own, not the field's
PROMPTS = ("What is the capital of France?", *builtin_set("quick"))


def _fork(trace) -> str:
    forked = sorted((s for s in trace.sequences if s.forensics), key=lambda s: (s.forensics.round or 0, s.seq))
    if not forked:
        return "no fork | -"
    f = forked[0].forensics
    seen = sum(len(r.emitted) for r in trace.rows if r.seq == forked[0].seq and r.round < (f.round or 0))
    return f"{f.verdict} | round {f.round}, slot {f.fork - seen} (sequence {forked[0].seq}, token {f.fork})"


def main() -> None:
    hybrid = save_pair(Path(tempfile.mkdtemp()), "qwen3.5", loops=True)
    print("| fault | kind | verdict | first fork, or drafts accepted |\n|---|---|---|---|")
    for fault in [*VERDICT_OF, *ACCEPTANCE_OF]:
        if fault in PAPER or fault in SAMPLED:  # the sampled cases: tests/test_row_sampling.py, on the tiny pair
            continue
        kind = FAULTS[fault][0]
        kw = dict(prompts=PROMPTS, dtype="float32", device="cpu", batch_size=4, k=4, max_new_tokens=32,
                  faults=(fault,))
        if kind == "recurrent":
            kw.update(target=hybrid[0], draft=hybrid[1], prompts=tuple(builtin_set("chat")[:4]))
            if fault == "state-after-zero-draft":
                kw.update(drafter="lookup", ngram_min=1)
        elif kind == "lossless":
            kw.update(target=EMBEDDED_TARGET, draft=EMBEDDED_TARGET)
        trace = run(RunSpec.build(**kw))
        if kind == "lossless":
            a = trace.acceptance
            shown = f"{a.verdict} | {a.accepted} of the {a.accepted_fresh} the draft model's own would have had"
        else:
            shown = _fork(trace)
        print(f"| `{fault}` | {kind} | {shown} |", flush=True)


if __name__ == "__main__":
    main()
