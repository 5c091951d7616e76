"""Verdicts that a bug cannot fool: bugs planted outside the fault catalogue, by editing the
engine's source in the test (never as new faults), must each be called a sync bug, never numerics,
and the audit must see the corruption at or before the fork.

Each mutant replaces one snippet of one engine function with a plausible mistake. Several sit where
the engine's own invariant checks are blind (the checks share the mutated code), so only the
independent evidence (watch.py, forensics.py) can catch them.
"""
import inspect
import textwrap

import pytest

from specviz.decoding import batch, drafters, exspec, faults, modelstate, recording, round, treestep
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import RunSpec

# name -> (module, function, snippet, its mutation, modules that imported the function
# by name, method)
MUTANTS = {
    # cache-layout arithmetic: when rows move, each cache takes each slot from one slot too far left
    "layout-off-by-one": (modelstate.ModelState, "rearranged",
                          "kvcache.gather(self.cache, rows, src[:, :slots], valid[:, :slots])",
                          "kvcache.gather(self.cache, rows, (src[:, :slots] - 1).clamp(min=0), "
                          "valid[:, :slots])", (), "eqspec"),
    # interference between rows: a realignment gathers each row's cache from another row
    "rows-interfere": (modelstate.ModelState, "rearranged",
                       "kvcache.gather(self.cache, rows, src[:, :slots], valid[:, :slots])",
                       "kvcache.gather(self.cache, rows.flip(0), src[:, :slots], "
                       "valid[:, :slots])", (), "eqspec"),
    # stale state after a row finishes: the rows after it keep last round's tokens and caches
    "stale-after-finish": (exspec, "_split_back",
                           "gen[s.seq].finished_at = time.perf_counter() - start\n"
                           "            continue",
                           "gen[s.seq].finished_at = time.perf_counter() - start\n"
                           "            break", (), "exspec"),
    # wrong row order after a batch shrinks: the first rows' caches are kept instead
    # of the survivors'
    "shrink-row-order": (modelstate.ModelState, "rearranged",
                         "kvcache.select_rows(self.cache, rows)",
                         "kvcache.select_rows(self.cache, torch.arange(len(rows), "
                         "device=rows.device))", (), "eqspec"),
    # a corrupted bonus index: the target's token is written one slot late, leaving the rejected
    # draft in place
    "bonus-index": (round, "commit",
                    "emitted = torch.cat([D[:, :k], g[:, k:]], 1).scatter(1, a[:, None], pick)",
                    "emitted = torch.cat([D[:, :k], g[:, k:]], 1)"
                    ".scatter(1, (a[:, None] + 1).clamp(max=k), pick)", (), "eqspec"),
    # positions counted from the first slot on padded rows: shared by the engine's own checks, so
    # they agree
    "positions-off-by-one": (batch, "positions", "(valid.long().cumsum(dim=1) - 1).clamp(min=0)",
                             "(valid.long().cumsum(dim=1) - valid[:, :1].long()).clamp(min=0)",
                             (faults, recording, treestep), "eqspec"),
    # the mask lets the pad slot just before a row's tokens through; the engine's mask check never
    # sees it
    "mask-leaks-a-pad": (batch, "attention_bias", "shown = valid[:, None, :] if among is None",
                         "shown = (valid | valid.roll(-1, 1))[:, None, :] if among is None", (),
                         "eqspec"),
}
# An off-by-one in the draft's catch-up: it re-feeds its last token twice instead of the last two.
# Greedy output cannot fork on a draft bug (the target picks every token), but the draft's state
# is corrupt.
DRAFT_MUTANT = (drafters.ModelDrafter, "propose",
                'run_model(self.pair, policy, "draft", tok, val, stl,',
                'run_model(self.pair, policy, "draft", torch.cat([tok[:, :-2], tok[:, -1:], '
                'tok[:, -1:]], 1) if j == 0 else tok, val, stl,', (), "eqspec")


def plant(monkeypatch, holder, name, snippet, mutation, importers):
    """Replace `snippet` by `mutation` in the source of holder.name (a module's function or a
    class's method), for the holder and the modules that imported it (under whatever name they
    gave it)."""
    original = getattr(holder, name)
    source = textwrap.dedent(inspect.getsource(original))
    assert (source.count(snippet)
            == 1), f"the mutant's snippet is no longer in {holder.__name__}.{name}"
    module = inspect.getmodule(original)
    namespace = dict(vars(module))
    # our own source, edited
    mutated = compile(source.replace(snippet, mutation), inspect.getsourcefile(module), "exec")
    exec(mutated, namespace)  # noqa: S102
    for m in (holder, *importers):
        for alias in [n for n, v in vars(m).items() if v is original]:
            monkeypatch.setattr(m, alias, namespace[name])


def _run(method, dtype="float32", **kw):
    spec = RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype=dtype,
                         device="cpu", prompts=tuple(builtin_set("all")[:12]), method=method,
                         batch_size=4, k=5, max_new_tokens=32, audit=4, **kw)
    return run(spec)


@pytest.fixture(scope="module")
def clean_yardstick(tiny):
    return _run("eqspec").manifest.yardstick


@pytest.mark.parametrize("name", MUTANTS)
def test_every_divergence_of_a_planted_bug_is_a_sync_bug(name, monkeypatch, clean_yardstick):
    *where, method = MUTANTS[name]
    plant(monkeypatch, *where)
    trace = _run(method)
    # measured without the engine: a bug cannot raise it
    assert trace.manifest.yardstick == clean_yardstick
    tolerance = trace.manifest.yardstick.target.tolerance
    divergent = [s for s in trace.sequences if s.equivalent is False]
    assert divergent, "the planted bug must change some output"
    for s in divergent:
        f = s.forensics
        assert f.verdict.startswith("sync-bug:"), (s.seq, f.verdict, f.explanation)
        # The audit saw the corruption at or before the round that emitted the fork.
        # a misplaced token corrupts no state: the state check clears it
        if f.verdict != "sync-bug:bonus":
            assert s.audit_round is not None and s.audit_round <= f.round, (s.seq, s.audit_round,
                                                                            f.round)
            assert f.state_diff > tolerance
        else:
            assert f.output_token != f.emitting_argmax


@pytest.mark.parametrize("name, state",
                         [("positions-off-by-one", "positions"), ("mask-leaks-a-pad", "mask"),
                          ("bonus-index", "bonus"), ("stale-after-finish", "state")])
def test_the_state_is_named_where_one_input_explains_it(name, state, monkeypatch, tiny):
    *where, method = MUTANTS[name]
    plant(monkeypatch, *where)
    verdicts = {s.forensics.verdict for s in _run(method).sequences if s.forensics}
    assert verdicts == {f"sync-bug:{state}"}


def test_a_draft_only_bug_forks_nothing_but_the_audit_sees_it(monkeypatch, tiny):
    *where, method = DRAFT_MUTANT
    plant(monkeypatch, *where)
    trace = _run(method)
    assert all(s.equivalent for s in trace.sequences)  # greedy: the target chooses every token
    assert all(s.audit_round is None for s in trace.sequences)  # the target's state stayed clean
    # from its first round on: the first draft pass is already fed the wrong token
    for s in trace.sequences:
        assert s.audit_draft_round == min(r.round for r in trace.rows if r.seq == s.seq)


def test_a_correct_run_audits_clean(tiny):
    for method in ("eqspec", "exspec", "batched-reference"):
        trace = _run(method)
        assert all(s.equivalent for s in trace.sequences)
        assert all(s.audit_round is None and s.audit_draft_round is None for s in trace.sequences)
        # audit 4: every row of bs 4
        assert sum(r.audit is not None for r in trace.rows) == len(trace.rows)
