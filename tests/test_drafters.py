"""Drafters behind one interface: prompt lookup proposes what transformers' and vLLM's prompt lookup
propose, batched with per-row draft counts (0 included), and eqspec and exspec verify whatever it
proposes to the token of the batch-size-1 reference."""
import random

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from specviz.decoding.batch import left_pad
from specviz.decoding.decoders import DECODERS
from specviz.decoding.drafters import PromptLookup
from specviz.decoding.eqspec import eqspec
from specviz.decoding.exspec import exspec
from specviz.decoding.faults import Policy
from specviz.decoding.paging import Memory
from specviz.decoding.reference import reference
from specviz.decoding.round import lay_out
from specviz.decoding.sampling import GREEDY
from specviz.models.pairs import load_pair
from specviz.run import gpu
from specviz.run.runner import run
from specviz.spec.faults import FAULTS, of_kind
from specviz.spec.methods import DRAFTERS, METHODS
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics

CORRECT = Policy(())


def _propose(pair, histories: list[list[int]], k: int, min_n: int, max_n: int):
    """PromptLookup's proposals for these rows, laid out as a padded batch: (tokens, counts)
    per row."""
    b = lay_out(pair, CORRECT, PromptLookup(pair, min_n, max_n), Memory(),
                list(range(len(histories))), *left_pad(histories, torch.device("cpu")))
    have = torch.zeros(len(histories), dtype=torch.long)
    prop = PromptLookup(pair, min_n, max_n).propose(CORRECT, b, k, GREEDY, have, have)
    return [row[:n] for row, n in zip(prop.tokens.tolist(), prop.counts.tolist())]


def _histories(seed: int, n: int) -> list[list[int]]:
    """Token rows over a small alphabet, so that n-grams recur; lengths 1 to 40."""
    rng = random.Random(seed)
    return [[rng.randrange(6) for _ in range(rng.randrange(1, 41))] for _ in range(n)]


@pytest.mark.parametrize("k,max_n", [(1, 1), (3, 2), (5, 3), (8, 4)])
def test_lookup_proposes_what_transformers_proposes(tiny, k, max_n):
    """One row at a time against transformers' PromptLookupCandidateGenerator (min n 1, the earliest
    match of the longest n), and all rows at once in one padded batch: the same proposals."""
    rows = _histories(k, 64)
    hf = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=max_n,
                                        max_length=10_000)
    want = []
    for row in rows:
        ids = torch.tensor([row])
        got, _ = hf.get_candidates(ids)
        want.append(got[0, len(row):].tolist())
    # matches and misses both occur
    assert sum(map(bool, want)) > 32 and sum(not w for w in want) > 0
    assert [_propose(tiny, [row], k, 1, max_n)[0] for row in rows] == want
    assert _propose(tiny, rows, k, 1, max_n) == want


def test_lookup_min_n_and_the_earliest_of_the_longest_match(tiny):
    row = [1, 2, 3, 9, 2, 3, 7, 5, 2, 3]
    # "2 3" occurs at 1 and 4: the earliest wins; no 3-gram "5 2 3" recurs
    assert _propose(tiny, [row], 3, 1, 3) == [[9, 2, 3]]
    assert _propose(tiny, [row + [7]], 4, 1, 3) == [[5, 2, 3, 7]]  # "2 3 7" at 4 beats "7" alone
    # only a 1-gram recurs: below min n
    assert _propose(tiny, [[1, 2, 3, 4, 5, 3]], 3, 2, 3) == [[]]
    # the match runs into the row's end: fewer tokens
    assert _propose(tiny, [[4, 4]], 3, 1, 3) == [[4]]


@pytest.fixture(scope="module")
def repeating(tiny, mixed_prompts):
    """Prompts that repeat a stretch of themselves, so that lookup proposes often, beside
    the usual mix."""
    prompts = [p + p[len(p) // 3: len(p) // 2] for p in mixed_prompts[:10]]
    return prompts, reference(tiny, prompts, 20)


def _row_drafts(rounds):
    return [r.ints["drafts"].tolist() for r in rounds]


@pytest.mark.parametrize("k", [1, 2, 5, 8])
@pytest.mark.parametrize("batch_size", [1, 2, 3, 4, 8])
def test_lookup_eqspec_and_exspec_equal_the_reference_in_float64(tiny, repeating, batch_size, k):
    prompts, ref = repeating
    drafter = PromptLookup(tiny, 1, 3)
    for got in (eqspec(tiny, prompts, batch_size, k, 20, drafter=drafter),
                exspec(tiny, prompts, batch_size, k, 20, window=batch_size + 2, max_wait=2,
                       drafter=drafter)):
        assert [o.ids for o in got.outputs] == [o.ids for o in ref.outputs]
        for rd in got.rounds:
            for name, ok in rd.checks.items():
                assert ok.all(), f"invariant {name} failed in a round"
        counts = [n for row in _row_drafts(got.rounds) for n in row]
        assert 0 in counts and max(counts) == k  # rows that drafted nothing, and full drafts
        # per-row k: in one round, a row offered nothing beside a row offered drafts
        if batch_size > 1:
            assert any(0 in row and max(row) > 0 for row in _row_drafts(got.rounds))


@pytest.fixture(scope="module")
def embedded64():
    """The embedded pair in float64: a real model, which copies from its prompt,
    and exact equality."""
    return load_pair(dtype="float64", device="cpu")


@pytest.fixture(scope="module")
def copying(embedded64):
    """Prompts whose answers copy from them: two code edits and a summary."""
    texts = builtin_set("code")[-3:-1] + builtin_set("summarize")[:1]
    ids = embedded64.encode(texts)
    return texts, ids, reference(embedded64, ids, 24)


def test_lookup_accepts_on_a_real_model_and_stays_exact(embedded64, copying):
    _, ids, ref = copying
    drafter = PromptLookup(embedded64, 2, 3)
    for got in (eqspec(embedded64, ids, 3, 5, 24, drafter=drafter),
                exspec(embedded64, ids, 2, 5, 24, window=3, max_wait=1, drafter=drafter)):
        assert [o.ids for o in got.outputs] == [o.ids for o in ref.outputs]
        accepted = sum(int(r.ints["accepted"].sum()) for r in got.rounds)
        assert accepted >= 12  # copied stretches are proposed and accepted
        # fewer rounds than tokens
        assert len(got.rounds) < 24 * len(ids) / got.rounds[0].ints["drafts"].numel()


def test_transformers_prompt_lookup_is_the_anchor_at_batch_size_1(embedded64, copying):
    """transformers' own prompt lookup (`prompt_lookup_num_tokens`, the same n and k) and ours at
    batch size 1 give the reference's ids."""
    texts, _, ref = copying
    common = dict(dtype="float64", device="cpu", prompts=tuple(texts), batch_size=1, k=4,
                  max_new_tokens=24, drafter="lookup", ngram_min=1, ngram_max=2)
    # Their ids against the fixture's reference: the runs need no reference or yardstick
    # of their own.
    ours = run(RunSpec.build(method="eqspec", **common), with_reference=False)
    theirs = run(RunSpec.build(method="hf-assisted", **common), with_reference=False)
    want = [o.ids for o in ref.outputs]
    assert [s.output_ids for s in ours.sequences] == want
    assert [s.output_ids for s in theirs.sequences] == want
    assert metrics.acceptance_rate(ours) > 0


def _faulty_lookup_run(faults: tuple[str, ...]):
    """The embedded pair (the tiny one copies nothing, so its rows would stay in step): code edits
    and a summary, whose rows accept lookup drafts raggedly. The short summary: the long one (~400
    tokens) only makes every float64 recomputation of the forensics longer."""
    texts = builtin_set("code")[-3:] + builtin_set("summarize")[1:]
    return run(RunSpec.build(prompts=tuple(texts), drafter="lookup", ngram_min=2, k=5,
                             max_new_tokens=20, batch_size=4, faults=faults, device="cpu"))


BREAKING = list(of_kind("breaking"))


@pytest.mark.parametrize("fault", BREAKING)
def test_faults_compose_with_lookup_and_are_named(fault):
    trace = _faulty_lookup_run((fault,))
    assert metrics.equivalence(trace)["exact"] < 1
    verdicts = [s.forensics.verdict for s in trace.sequences if s.forensics]
    assert verdicts and all(v == FAULTS[fault].verdict for v in verdicts), verdicts


@pytest.mark.parametrize("preset", ["bsp-like", "dsd-like"])
def test_presets_break_with_lookup_drafts(preset):
    trace = _faulty_lookup_run((preset,))
    assert metrics.equivalence(trace)["exact"] < 1
    verdicts = {s.forensics.verdict for s in trace.sequences if s.forensics}
    assert verdicts and all(v.startswith("sync-bug:") for v in verdicts), verdicts


def test_a_row_that_drafted_nothing_is_in_the_trace():
    trace = run(RunSpec.build(
        target=TINY_TARGET, draft=TINY_DRAFT, dtype="float64", device="cpu", drafter="lookup",
        prompts=("Hi", "Name three rivers. Name three rivers. Name three rivers."),
        chat_template=False, batch_size=2, k=5, max_new_tokens=4))
    assert metrics.equivalence(trace)["exact"] == 1
    by_round: dict[int, list] = {}
    for r in trace.rows:
        by_round.setdefault(r.round, []).append(r)
    assert any(not r.draft_tokens and r.emitted == r.target_tokens[:1] and r.accepted == 0
               for r in trace.rows)
    assert any(min(map(len, (r.draft_tokens for r in rows))) == 0
               < max(len(r.draft_tokens) for r in rows)
               for rows in by_round.values())
    # lookup keeps no cache
    assert all(r.draft_kv_before == 0 and r.draft_kv_after in (0, None) for r in trace.rows)


def test_spec_says_what_a_drafter_needs():
    base = dict(prompts=("a",))
    assert (RunSpec.build(**base).canonical_json()
            == RunSpec.build(**base, drafter="model").canonical_json())
    assert '"drafter":"lookup"' in RunSpec.build(**base, drafter="lookup").canonical_json()
    for bad, says in [(dict(method="reference", drafter="lookup"), "drafts nothing"),
                      (dict(ngram_max=4), "lookup drafter"),
                      (dict(drafter="lookup", ngram_min=3, ngram_max=2), "must not exceed"),
                      (dict(method="hf-assisted", batch_size=1, drafter="lookup", ngram_min=2),
                       "ngram_min 1"),
                      (dict(method="hf-assisted", batch_size=2), "batch size 1")]:
        with pytest.raises(SpecError, match=says):
            RunSpec.build(**base, **bad)
    # faults stay allowed with lookup drafts
    RunSpec.build(**base, drafter="lookup", faults=("bsp-like",))


def test_every_declared_method_runs_and_nothing_undeclared():
    assert DECODERS.keys() == METHODS.keys()
    assert {d for m in METHODS.values() for d in m.drafters} == set(DRAFTERS)


def test_lookup_costs_no_draft_passes_in_the_gpu_estimate():
    spec = dict(prompts=("a", "b", "c", "d"), method="eqspec", batch_size=4, k=5, max_new_tokens=32)
    assert gpu.forward_passes(RunSpec.build(**spec)) == 4 * 32 + 16 * 6
    assert gpu.forward_passes(RunSpec.build(**spec, drafter="lookup")) == 4 * 32 + 16
