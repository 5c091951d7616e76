"""Paged KV with prefix caching (decoding/paging.py): every method, drafter, tree and hybrid decodes
exactly what the batch-size-1 reference does, with the prefix cache hit; and the pool's
bookkeeping (blocks given back, copy-on-write, what the prefix cache may hold) held to account."""
import re

import pytest
import torch

from hybrids import save_pair
from specviz.decoding.drafters import drafter_for
from specviz.decoding.eqspec import eqspec
from specviz.decoding.exspec import exspec
from specviz.decoding.paging import KVLayout, Memory
from specviz.decoding.reference import reference
from specviz.models.pairs import load_pair
from specviz.run.runner import run
from specviz.spec.casebook import BY_FAULT
from specviz.spec.faults import FAULTS, of_kind
from specviz.spec.prompts import builtin_set
from specviz.spec.run import FITTED_HEAD, TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace.share import Link, decode_link, encode_link

NEW = 14
PAGED = KVLayout(4, prefix_caching=True)


def _shared_prefix_prompts() -> list[str]:
    """Short chats, then the same chats after one long shared passage: a later batch's requests
    start with blocks an earlier one registered."""
    chats = builtin_set("all")[:5]
    passage = max(builtin_set("all"), key=len)[:600]
    return chats + [f"{passage}\n\n{c}" for c in chats] + [f"{passage}\n\nAgain: {c}"
                                                           for c in chats[:3]]


@pytest.fixture(scope="module")
def prompts(tiny):
    return tiny.encode(_shared_prefix_prompts())


@pytest.fixture(scope="module")
def truth(tiny, prompts):
    return [o.ids for o in reference(tiny, prompts, NEW).outputs]


@pytest.fixture(scope="module")
def head():
    """specviz's fitted EAGLE-3 head of the tiny target: it drafts the target's own text, so its
    cache holds accepted drafts computed from its own guesses."""
    return FITTED_HEAD


def _spec(**fields) -> RunSpec:
    return RunSpec.build(prompts=("a",), target=TINY_TARGET, draft=TINY_DRAFT, **fields)


def _hits(result) -> int:
    return sum(p["hits"] for p in result.paging["pools"] if p["model"] == "target")


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
@pytest.mark.parametrize("drafting", [dict(), dict(tree_width=3), dict(drafter="lookup"),
                                      dict(drafter="eagle3")], ids=["model", "tree", "lookup",
                                                                    "head"])
def test_paged_decoding_with_prefix_caching_equals_the_reference(tiny, prompts, truth, head,
                                                                  method, drafting):
    fields = {**drafting, **({"head": head} if drafting.get("drafter") == "eagle3" else {})}
    drafter = drafter_for(_spec(**fields), tiny)
    if method == "eqspec":
        got = eqspec(tiny, prompts, 4, 4, NEW, drafter=drafter, kv=PAGED)
    else:
        got = exspec(tiny, prompts, 4, 4, NEW, window=8, max_wait=4, drafter=drafter, kv=PAGED)
    assert [o.ids for o in got.outputs] == truth
    assert _hits(got) > 0, got.paging
    # no alarm: every check holds, no paged check names a block; and a correct engine never
    # writes a shared block (a head's drafts from its own guesses are never registered)
    assert all(ok.all() for rd in got.rounds for ok in rd.checks.values())
    assert not any(rd.blocks for rd in got.rounds)
    assert all(p["copies"] == 0 for p in got.paging["pools"]), got.paging


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_every_block_size_pages_exactly_with_and_without_prefix_caching(tiny, prompts, truth,
                                                                        block_size):
    for caching in (False, True):
        got = eqspec(tiny, prompts, 3, 5, NEW, kv=KVLayout(block_size, caching))
        assert [o.ids for o in got.outputs] == truth
        assert (_hits(got) > 0) == caching


def test_float32_pages_as_the_contiguous_layout_decodes(prompts):
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype="float32", device="cpu")
    truth = [o.ids for o in reference(pair, prompts, NEW).outputs]
    assert [o.ids for o in eqspec(pair, prompts, 4, 4, NEW).outputs] == truth
    got = eqspec(pair, prompts, 4, 4, NEW, kv=PAGED)
    assert [o.ids for o in got.outputs] == truth and _hits(got) > 0


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
def test_a_hybrid_pages_its_attention_and_keeps_its_recurrent_state(tmp_path_factory, method):
    target, draft = save_pair(tmp_path_factory.mktemp("hybrid"), "qwen3.5")
    pair = load_pair(target, draft, dtype="float64", device="cpu")
    ids = pair.encode(_shared_prefix_prompts()[3:9])
    truth = [o.ids for o in reference(pair, ids, 10).outputs]
    if method == "eqspec":
        got = eqspec(pair, ids, 2, 3, 10, kv=PAGED)
    else:
        got = exspec(pair, ids, 2, 3, 10, window=4, max_wait=4, kv=PAGED)
    assert [o.ids for o in got.outputs] == truth and _hits(got) > 0
    # every model's blocks kept its recurrent states, and the later requests started from them
    for pool in got.paging["pools"]:
        assert pool["states_saved"] > 0 and pool["states_restored"] > 0, got.paging
    assert all(ok.all() for rd in got.rounds for ok in rd.checks.values())
    assert not any(rd.blocks for rd in got.rounds)


def test_a_paged_runs_trace_says_what_its_pools_did(tiny):
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float64", device="cpu",
                         prompts=tuple(_shared_prefix_prompts()[3:9]), batch_size=2, k=3,
                         max_new_tokens=8, kv_block_size=8, prefix_caching=True)
    trace = run(spec)
    paging = trace.manifest.paging
    assert paging.block_size == 8 and [p.model for p in paging.pools] == ["target", "draft"]
    target = paging.pools[0]
    assert 0 < target.hits <= target.lookups and target.blocks > 0
    assert "blocks of 8 tokens with prefix caching" in paging.describe()
    assert all(s.equivalent for s in trace.sequences)
    # each row's block table covers what the round's passes wrote: the committed tokens, the drafts
    for r in trace.rows:
        written = sum(len(q.emitted) for q in trace.rows if q.seq == r.seq and q.round < r.round)
        fed = len(trace.prompts[r.seq].ids) + written
        assert len(r.block_table.blocks) * 8 >= fed + len(r.draft_tokens)
    assert run(spec.model_copy(update={"kv_block_size": 0, "prefix_caching": False})
               ).manifest.paging is None


def test_the_share_link_carries_the_layout():
    spec = _spec(kv_block_size=16, prefix_caching=True)
    back = decode_link(encode_link(Link(spec=spec)))
    assert (back.spec.kv_block_size, back.spec.prefix_caching) == (16, True)


@pytest.mark.parametrize("fields, says", [
    (dict(prefix_caching=True), "set a kv block size"),
    (dict(method="reference", kv_block_size=8), "reference keeps its cache contiguous"),
    (dict(method="hf-assisted", batch_size=1, kv_block_size=8), "eqspec and exspec page it"),
])
def test_a_layout_a_method_cannot_take_is_refused_with_the_reason(fields, says):
    with pytest.raises(SpecError, match=says):
        _spec(**fields)


@pytest.mark.parametrize("fault", [*of_kind("paged"), *of_kind("prefix")])
def test_a_paged_fault_is_named_by_its_block_and_the_request_that_wrote_it(fault):
    """On the tiny pair, or the case's own where the fault needs a hybrid."""
    fields = BY_FAULT[fault].spec_fields()
    if "recurrent" not in FAULTS[fault].needs:
        fields |= dict(target=TINY_TARGET, draft=TINY_DRAFT)
    spec = RunSpec.build(**fields)
    trace = run(spec)
    forked = [s.forensics for s in trace.sequences if s.forensics]
    assert forked and {f.verdict for f in forked} == {FAULTS[fault].verdict}
    named = [f.explanation for f in forked if "The paged cache's own check found" in f.explanation]
    assert named and all(re.search(r"block \d+ of the (target|draft)'s pool", e) for e in named)
    assert any(re.search(r"(written by|states) request \d+", e) for e in named), named
    # without the fault, the same paged run raises no alarm
    clean = run(spec.model_copy(update={"faults": ()}))
    assert all(s.equivalent for s in clean.sequences) and not any(rd.blocks for rd in clean.rounds)


# ---------------------------------------------------------------------------- the pool's books


def _fed(memory: Memory, rows: list[list[int]], model: str = "target"):
    """A fresh batch's pages after a pass over these left-padded rows, its K/V each token's id."""
    width = max(map(len, rows))
    tokens = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    valid = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    pages = memory.pages(list(range(len(rows))), model, tokens, valid)
    pages.feed(tokens, valid, 0)
    kv = tokens[:, None, :, None].double().expand(-1, 1, -1, 2)
    pages.write(0, kv, kv)
    return pages, valid


def _read(pages) -> list[list[int]]:
    keys, _ = pages.read(0)
    return keys[:, 0, :, 0].long().tolist()


def test_a_row_reads_its_own_tokens_and_pads_read_zeros():
    pages, _ = _fed(Memory(KVLayout(2)), [[5, 6, 7], [8, 9, 10, 11, 12]])
    assert _read(pages) == [[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]]
    assert len(pages.tables[0]) == 2 and len(pages.tables[1]) == 3


def test_rejected_drafts_blocks_go_back_to_the_pool_and_are_never_cached():
    memory = Memory(KVLayout(2, prefix_caching=True))
    pages, valid = _fed(memory, [[5, 6, 7, 8, 9, 10, 11]])
    pool = memory.pools["target"]
    held = pool.refs.count(1)
    # the round kept 3 of the 7 tokens: the blocks past the 3rd go back
    keep = torch.tensor([[True] * 3 + [False] * 4])
    pages.realign(torch.tensor([0]), None, keep)
    assert pool.refs.count(1) == held - 2 and len(pool.free) == 2
    assert len(pool.cached) == 1  # [5, 6]: the only full block of kept tokens
    assert _read(pages)[0][:3] == [5, 6, 7]


def test_a_later_request_hits_the_prefix_and_a_writer_copies_a_shared_block_first():
    memory = Memory(KVLayout(2, prefix_caching=True))
    first, valid = _fed(memory, [[5, 6, 7, 8, 9]])
    first.realign(torch.tensor([0]), None, valid)  # committed: [5, 6] and [7, 8] registered
    pool = memory.pools["target"]
    second, _ = _fed(memory, [[5, 6, 7, 8, 1]])
    assert pool.stats.hits == 2 and second.tables[0][:2] == first.tables[0][:2]
    assert second.hits == [4] and pool.stats.copies == 0  # the hit positions are read, not written
    # the first row re-feeds position 3 (as a head re-feeds its last slots): the block it would
    # write is shared, so it writes a copy of its own
    shared = first.tables[0][1]
    first.realign(torch.tensor([0]), None, None, 3)
    first.feed(torch.tensor([[5, 6, 7, 4]]), torch.ones(1, 4, dtype=torch.bool), 3)
    kv = torch.full((1, 1, 1, 2), 4.0, dtype=torch.float64)
    first.write(0, kv, kv)
    assert first.tables[0][1] != shared and pool.stats.copies == 1
    assert _read(first)[0] == [5, 6, 7, 4] and _read(second)[0] == [5, 6, 7, 8, 1]


def test_a_full_pool_evicts_the_least_recently_let_go_cached_block():
    memory = Memory(KVLayout(2, prefix_caching=True))
    pages, valid = _fed(memory, [[5, 6, 7, 8]])
    pages.realign(torch.tensor([0]), None, valid)
    pool = memory.pools["target"]
    pages.realign(torch.arange(0), None, None)  # the request left: its blocks stay cached, idle
    assert len(pool.idle) == 2 and len(pool.cached) == 2
    pool.capacity = pool.blocks  # (a run's --kv-blocks)
    _fed(memory, [[1, 2]])  # a miss takes the oldest idle block's room
    assert pool.stats.evicted == 1 and len(pool.cached) == 1
    with pytest.raises(SpecError, match="blocks are all held"):
        _fed(memory, [[3, 4, 1, 2]])
