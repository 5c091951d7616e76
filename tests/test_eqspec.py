import dataclasses
from collections import Counter

import pytest

from specviz.decoding.assisted import hf_assisted
from specviz.decoding.eqspec import eqspec
from specviz.decoding.reference import reference
from specviz.models.draft import layer_subset


@pytest.fixture(scope="module")
def early_eos(tiny, mixed_prompts):
    """The tiny pair with an extra EOS id: a token its reference emits early in
    some rows, so that rows finish at different rounds."""
    ref = reference(tiny, mixed_prompts[:10], 20)
    counts = Counter(t for o in ref.outputs for t in o.ids[2:12])
    extra = counts.most_common(1)[0][0]
    pair = dataclasses.replace(tiny, eos_ids=tuple(sorted({*tiny.eos_ids, extra})))
    return pair, reference(pair, mixed_prompts[:10], 20)


@pytest.mark.parametrize("k", [1, 2, 5, 8])
@pytest.mark.parametrize("batch_size", [1, 2, 3, 4, 8])
def test_eqspec_equals_reference_in_float64(early_eos, mixed_prompts, batch_size, k):
    pair, ref = early_eos
    got = eqspec(pair, mixed_prompts[:10], batch_size, k, 20)
    assert [o.ids for o in got.outputs] == [o.ids for o in ref.outputs]
    assert any(len(o.ids) < 20 for o in ref.outputs), "some rows must hit EOS early"
    for rd in got.rounds:
        for name, ok in rd.checks.items():
            assert ok.all(), f"invariant {name} failed in a round"


def test_long_and_short_prompts_share_a_batch(tiny, mixed_prompts):
    long = max(mixed_prompts, key=len)
    short = min(mixed_prompts, key=len)
    assert len(long) > 300 and len(short) <= 7
    prompts = [short, long, short, mixed_prompts[5]]
    ref = reference(tiny, prompts, 24)
    got = eqspec(tiny, prompts, 4, 5, 24)
    assert [o.ids for o in got.outputs] == [o.ids for o in ref.outputs]
    assert any(rd.realigned for rd in got.rounds)


def test_no_token_after_eos_and_finished_rows_leave(early_eos, mixed_prompts):
    pair, _ = early_eos
    got = eqspec(pair, mixed_prompts[:8], 8, 5, 20)
    for o in got.outputs:
        stops = [i for i, t in enumerate(o.ids) if t in pair.eos_ids]
        assert not stops or stops[0] == len(o.ids) - 1
    sizes = [len(rd.seqs) for rd in got.rounds]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0]


def test_self_speculation_accepts_everything(tiny, mixed_prompts):
    """draft = target: acceptance 100%, every round emits k+1 tokens per active row."""
    same = dataclasses.replace(tiny, draft=layer_subset(tiny.target, [0, 1, 2]))
    k, n = 4, 21
    # equal lengths: no realignment at all
    prompts = [p[:12] for p in mixed_prompts[:4] if len(p) >= 12]
    got = eqspec(same, prompts, 4, k, n)
    # 21 = 4 rounds of k+1, then one token left: the last round drafts only 1, and each row, with
    # room for no draft, takes the target's own token
    assert [rd.k for rd in got.rounds] == [k, k, k, k, 1]
    rows = len(prompts)
    assert [rd.ints["drafts"].tolist() for rd in got.rounds] == [[k] * rows] * 4 + [[0] * rows]
    for rd in got.rounds:
        assert (rd.ints["accepted"] == rd.ints["drafts"]).all()
        n_em = rd.ints["n_emitted"]
        assert ((n_em == rd.k + 1) | (rd.ints["finished"] == 1)).all()
        assert not rd.realigned
    assert [o.ids for o in got.outputs] == [o.ids for o in reference(tiny, prompts, n).outputs]


def test_eqspec_at_batch_size_1_equals_hf_assisted(tiny, mixed_prompts):
    prompts = mixed_prompts[:4]
    ours = eqspec(tiny, prompts, 1, 3, 16)
    theirs = hf_assisted(tiny, prompts, 3, 16)
    assert [o.ids for o in ours.outputs] == [o.ids for o in theirs.outputs]


def test_recording_off_changes_nothing(tiny, mixed_prompts):
    on = eqspec(tiny, mixed_prompts[:5], 3, 4, 16, record=True)
    off = eqspec(tiny, mixed_prompts[:5], 3, 4, 16, record=False)
    assert [o.ids for o in on.outputs] == [o.ids for o in off.outputs]
    assert on.rounds and not off.rounds


def test_embedded_pair_end_to_end(embedded):
    prompts = embedded.encode(["What is the capital of France?", "List three colours.", "Hi!",
                               "Write a haiku about the sea."])
    ref = reference(embedded, prompts, 24)
    got = eqspec(embedded, prompts, 4, 5, 24)
    assert [o.ids for o in got.outputs] == [o.ids for o in ref.outputs]
