"""Verdicts are declared once (spec/verdicts.py): every name a judge can give is there, with its
meaning and evidence, and the glossary and the fault catalogue ask it."""
import re
from pathlib import Path

from specviz.app import glossary
from specviz.forensics import corruption, whitebox
from specviz.spec.faults import FAULTS
from specviz.spec.verdicts import VERDICTS, state_bug, verdict

JUDGES = [*Path(whitebox.__file__).parent.glob("*.py"),
          Path(whitebox.__file__).parents[1] / "trace" / "metrics.py"]
NAME = re.compile(r'"((?:sync|decision|draft|sampler|kernel|engine)-bug(?::[a-z-]+)?'
                  r'|numerics|unexplained)"')


def test_every_name_a_judge_writes_is_declared():
    written = {m for path in JUDGES for m in NAME.findall(path.read_text())}
    assert {"numerics", "unexplained", "kernel-bug", "engine-bug", "decision-bug:stop",
            "draft-bug:cache"} <= written
    assert written <= set(VERDICTS), written - set(VERDICTS)
    # The white-box judge composes `sync-bug:` with the engine's breaking checks and the inputs
    # it tests.
    assert {f"sync-bug:{c}" for c in (*corruption.BREAKING, "state")} <= set(VERDICTS)


def test_every_fault_that_breaks_names_a_declared_verdict():
    assert {f.verdict for f in FAULTS.values() if f.verdict} <= set(VERDICTS)
    assert all(f.verdict for f in FAULTS.values()
               if f.kind in ("breaking", "recurrent", "stop", "tree"))
    lossless = {n for n, f in FAULTS.items() if f.kind == "lossless"}
    assert {n for n, f in FAULTS.items() if f.acceptance} == lossless
    assert {f.acceptance for f in FAULTS.values() if f.acceptance} <= set(VERDICTS)


def test_each_verdict_says_what_it_means_and_what_it_rests_on():
    assert all(v.meaning and v.evidence for v in VERDICTS.values())
    assert [n for n, v in VERDICTS.items() if not v.bug] == ["numerics", "unexplained"]
    assert (state_bug("sync-bug:kv") and state_bug("decision-bug:stop")
            and not state_bug("kernel-bug"))
    # A name no judge gives, from a hand-edited trace, is never a bug.
    assert not verdict("made-up").bug and not state_bug("sync-bug:made-up")
    text = glossary.glossary(None)
    assert all(f"`{name}`" in text for name in VERDICTS)
