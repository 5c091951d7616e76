"""The faults are declared once: one record each (spec/faults.py), and one module that acts on them.

Where a fault's name may appear in specviz/ as a string literal (presets' names alike):
- in spec/faults.py, its declaration (the records, read from spec/faults.toml; the presets);
- in decoding/faults.py, its behaviour (`Policy`, asked by what it decides, never by name);
- as data, in the modules DATA lists: a value the way a user would give it (an example run's or a
  sweep's fault list), or the key a card or an independent model of the fault is filed under.
Anywhere outside the first two, a name is data only: an element of a list, tuple, set or dict, or
an argument to a record's constructor; never compared, looked up by subscript, or passed to a
method (`policy.has("...")`): a decision about a fault is its record's property, or its Policy's.

The records' groups are checked against the tables they replaced, written out once below.
"""
import ast
import re
from pathlib import Path

import specviz
from specviz.spec.drafters import DRAFTERS
from specviz.spec.faults import FAULTS, FAULT_PRESETS, expand, needing, of_kind
from specviz.spec.fits import FAULT_KINDS, NEEDS
from specviz.spec.methods import METHODS
from specviz.spec.threads import REPOS
from specviz.spec.verdicts import VERDICTS

PACKAGE = Path(specviz.__file__).parent
DOCS = PACKAGE.parent / "docs"
DECLARED = {"spec/faults.py", "decoding/faults.py"}
DATA = {  # module -> the data its fault names are
    "app/runview.py": "the page's example runs",
    "app/sweeptab.py": "the Sweep tab's default fault sets",
    "spec/casebook.py": "each card's fault (Case.fault)",
    "forensics/rules.py": "each sampling fault's likelihood, modelled apart from the engine's code",
}
DATA_PARENTS = (ast.List, ast.Tuple, ast.Set, ast.Dict)


def _named(names: set[str]) -> list[tuple[str, int, str, ast.AST]]:
    """(module, line, name, parent node) of each string literal in specviz/ that is in `names`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text())
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                if isinstance(child, ast.Constant) and child.value in names:
                    found.append((module, child.lineno, child.value, parent))
    return found


def _data(parent: ast.AST) -> bool:
    """A literal held as data: in a display, or an argument to a record's constructor."""
    constructor = isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
    return isinstance(parent, DATA_PARENTS) or constructor and parent.func.id[0].isupper()


def test_a_faults_name_is_a_literal_only_where_it_is_declared_acted_on_or_data():
    names = {*FAULTS, *FAULT_PRESETS}
    found = _named(names)
    assert {m for m, *_ in found} >= DECLARED  # the scan sees both homes of the faults
    stray = [f"{m}:{line} {name}" for m, line, name, parent in found
             if m not in DECLARED and (m not in DATA or not _data(parent))]
    assert not stray, stray


def test_the_scan_catches_a_name_tested_outside_its_module():
    planted = ast.parse('if policy.has("min-crop") or fault == "no-mask": pass')
    parents = [p for p in ast.walk(planted) for c in ast.iter_child_nodes(p)
               if isinstance(c, ast.Constant) and c.value in FAULTS]
    assert len(parents) == 2 and not any(map(_data, parents))


def test_every_record_names_registered_verdicts_kinds_needs_and_repositories():
    for f in FAULTS.values():
        assert f.kind in FAULT_KINDS, f.name
        assert f.verdict is None or f.verdict in VERDICTS, f.name
        assert f.acceptance is None or f.acceptance in VERDICTS, f.name
        assert set(f.needs) <= set(NEEDS), f.name
        assert all(t.repo in REPOS for t in f.threads), f.name
    assert all(set(k.needs) <= set(NEEDS) for k in FAULT_KINDS.values())


def test_every_fit_rule_is_met_by_a_known_method_and_drafter():
    faulted = [m for m in METHODS.values() if m.faults]
    assert faulted
    met = {  # a need of the run's -> whether some method that takes faults can meet it
        "tree": any(m.trees for m in faulted) and any(d.trees for d in DRAFTERS.values()),
        "sampled": any(m.samples for m in faulted),
        "penalty": any(m.penalties for m in faulted),
        "logprobs": any(m.logprobs for m in faulted),
        "stop": any(m.stop_strings for m in faulted),
    }
    for f in FAULTS.values():
        assert all(met.get(n, True) for n in f.needs), f.name
        assert any(all(_drafter_meets(DRAFTERS[d], n) for n in f.needs)
                   for m in faulted for d in m.drafters), f.name


def _drafter_meets(d, need: str) -> bool:
    """Whether the drafter `d` meets a need (a need of the run's: any drafter does)."""
    return {"draft-model": d.draft_model, "hidden": "hidden" in d.hears}.get(need, True)


def test_unfit_reason_names_the_first_need_a_run_lacks():
    fault = FAULTS["state-not-rolled-back"]
    assert fault.unfit_reason({"recurrent": False}) == "the target keeps no recurrent state"
    assert fault.unfit_reason({"recurrent": True}) is None
    assert fault.unfit_reason({}) is None  # a need left out is not judged
    assert FAULTS["no-mask"].unfit_reason({n: False for n in NEEDS}) is None


KINDS_BEFORE = {  # kind -> its faults, as the old table FAULTS said
    "breaking": ["positions-from-slots", "no-mask", "draft-bonus", "no-kv-shift", "min-crop",
                 "verify-positions-not-advanced", "bonus-from-another-row"],
    "wasteful": ["keep-rejected-kv", "growing-padding", "right-padding"],
    "ragged": ["rollback-by-draft-list"],
    "greedy": ["accept-on-raw-softmax"],
    "recurrent": ["state-not-rolled-back", "state-after-zero-draft",
                  "state-kept-when-all-rejected", "state-from-another-rows-count",
                  "conv-state-off-by-one"],  # (the third and fourth since)
    "window": ["window-full-keeps-rejected", "window-kept-on-verify"],  # (the latter since)
    "stop": ["stop-at-last-token", "cap-before-stop"],  # (the latter since)
    "penalty": ["penalty-history-last-token"],
    "logprobs": ["logprobs-from-draft"],
    "counters": ["counted-before-stop-trim"],  # (since)
    "lossless": ["draft-positions-off-by-one", "drafts-to-another-row", "draft-misses-target-token",
                 "head-hidden-off-by-one", "head-keeps-own-guesses",
                 "draft-window-as-full",  # (since)
                 # (since: published EAGLE-3 heads fed wrongly)
                 "head-aux-one-early", "head-aux-fallback", "head-features-norm-flipped",
                 "head-vocab-as-ids", "head-vocab-map-dropped"],
    "tree": ["tree-siblings-visible", "tree-positions-by-index", "tree-rejected-branch-kept",
             "tree-bonus-by-index"],
    "sampling": ["residual-from-draft", "residual-unclamped", "residual-unnormalised",
                 "accept-q-over-p", "temperature-draft-only", "top-p-not-in-residual",
                 "shared-stream", "target-probs-mutated",
                 # (since: the field's newer threads)
                 "processors-on-bonus-only", "draft-probs-unprocessed", "draft-drawn-in-bfloat16"],
    "requests": ["settings-from-first-row", "settings-never-written", "unset-temperature-greedy",
                 "unseeded-noise-to-copy"],  # (the second since)
    # (the first since)
    "streams": ["draft-draw-shared-with-verify", "stream-advanced-for-zero-draft"],
    "rejecting": ["accept-count-one-short"],  # (since: forensics/rejections.py names it)
    # (since: structured output, decoding/grammar.py)
    "grammar": ["grammar-unmasked-past-reasoning-end", "grammar-advanced-over-rejected",
                "grammar-mask-after-terminated"],
    # (since: paged KV, decoding/paging.py)
    "paged": ["slots-assumed-contiguous"],
    "prefix": ["lookahead-into-shared-block",
               "state-saved-over-drafts"],  # (the second since: boundarystates.py)
}
VERDICTS_BEFORE = {  # the old VERDICT_OF, and the two cases' own verdicts (spec/casebook.py)
    "sync-bug:positions": ["positions-from-slots", "verify-positions-not-advanced",
                           "tree-positions-by-index"],
    "sync-bug:mask": ["no-mask", "tree-siblings-visible", "window-kept-on-verify"],
    "sync-bug:bonus": ["draft-bonus", "bonus-from-another-row", "tree-bonus-by-index"],
    "sync-bug:kv": ["no-kv-shift", "min-crop", "rollback-by-draft-list",
                    "window-full-keeps-rejected", "tree-rejected-branch-kept",
                    *KINDS_BEFORE["paged"], KINDS_BEFORE["prefix"][0]],  # (the last two since)
    "sync-bug:recurrent": ["state-not-rolled-back", "state-after-zero-draft",
                           "conv-state-off-by-one", "state-kept-when-all-rejected",
                           "state-from-another-rows-count", KINDS_BEFORE["prefix"][1]],
    "decision-bug:accept": ["accept-on-raw-softmax"],
    "decision-bug:stop": ["stop-at-last-token", "cap-before-stop"],
    "decision-bug:penalty": ["penalty-history-last-token"],
    "decision-bug:logprobs": ["logprobs-from-draft"],
    "decision-bug:counters": ["counted-before-stop-trim"],  # (since)
    "decision-bug:settings": ["settings-from-first-row", "unset-temperature-greedy",
                              "settings-never-written"],
    "decision-bug:stream": ["unseeded-noise-to-copy", "stream-advanced-for-zero-draft",
                            "shared-stream", "draft-draw-shared-with-verify"],
    "sampler-bug:rule": ["target-probs-mutated", "processors-on-bonus-only"],
    "sampler-bug:proposal": ["draft-probs-unprocessed", "draft-drawn-in-bfloat16"],  # (since)
    "decision-bug:reject": ["accept-count-one-short"],  # (since)
    "decision-bug:grammar": KINDS_BEFORE["grammar"],  # (since)
}
ACCEPTANCE_BEFORE = {  # the old ACCEPTANCE_OF
    "draft-positions-off-by-one": "draft-bug:positions",
    "draft-misses-target-token": "draft-bug:first-token",
    "drafts-to-another-row": "draft-bug:rows",
    "head-hidden-off-by-one": "draft-bug:hidden",
    "head-keeps-own-guesses": "draft-bug:cache",
    "draft-window-as-full": "draft-bug:window",  # (since)
    # (since: published EAGLE-3 heads fed wrongly)
    **dict.fromkeys(("head-aux-one-early", "head-aux-fallback", "head-features-norm-flipped"),
                    "draft-bug:features"),
    **dict.fromkeys(("head-vocab-as-ids", "head-vocab-map-dropped"), "draft-bug:vocabulary"),
}


def test_the_derived_groups_are_what_the_old_tables_said():
    assert set(FAULT_KINDS) == set(KINDS_BEFORE)
    assert {k: sorted(of_kind(k)) for k in KINDS_BEFORE} == {
        k: sorted(v) for k, v in KINDS_BEFORE.items()}
    assert {f.name: f.verdict for f in FAULTS.values() if f.verdict} == {
        f: v for v, faults in VERDICTS_BEFORE.items() for f in faults}
    assert {f.name: f.acceptance for f in FAULTS.values() if f.acceptance} == ACCEPTANCE_BEFORE
    assert needing("sampled") == (*of_kind("sampling"), *of_kind("requests"), *of_kind("streams"))
    assert needing("greedy") == ("accept-on-raw-softmax", "accept-count-one-short")
    assert needing("rows") == ("settings-from-first-row", "settings-never-written",
                               "unset-temperature-greedy", "unseeded-noise-to-copy")
    assert needing("tree") == tuple(KINDS_BEFORE["tree"])
    assert needing("draft-model") == ("draft-positions-off-by-one", "draft-misses-target-token",
                                      "draft-window-as-full")
    assert needing("hidden") == ("head-hidden-off-by-one", "head-keeps-own-guesses")
    # (since: the prefix cache's recurrent states)
    assert needing("recurrent") == (*KINDS_BEFORE["recurrent"], "state-saved-over-drafts")
    changes = ("breaking", "ragged", "greedy", "recurrent", "window", "stop", "penalty", "tree",
               "grammar", "paged", "prefix")
    assert {n for n, f in FAULTS.items() if f.changes_tokens} == set(of_kind(*changes))
    assert needing("penalty", ["dsd-like", "penalty-history-last-token"]) == (
        "penalty-history-last-token",)
    assert needing("grammar") == tuple(KINDS_BEFORE["grammar"])
    assert needing("reasoning") == ("grammar-unmasked-past-reasoning-end",)
    assert expand(["dsd-like"]) == ("no-mask", "draft-bonus", "growing-padding")


def test_the_docs_fault_table_lists_records_of_their_kind_and_every_fault_is_documented():
    """docs/forensics.md's table of faults is checked against the records: each row a record, of
    the kind it says; every record is named in the docs that describe the faults."""
    rows = re.findall(r"^\| `([a-z-]+)` \| ([a-z]+) \|", (DOCS / "forensics.md").read_text(), re.M)
    assert rows and all(name in FAULTS and FAULTS[name].kind == kind for name, kind in rows), rows
    docs = "".join((DOCS / f).read_text() for f in ("forensics.md", "sampling.md", "drafters.md"))
    assert [f for f in FAULTS if f"`{f}`" not in docs] == []
