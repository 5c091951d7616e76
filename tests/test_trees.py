"""Token trees (decoding/trees.py): several candidates per position, verified in one target pass.
Every output is the batch-size-1 reference's, for chains (width 1) and trees of width 2 and 4, at
depths up to 5, for the draft model, the EAGLE-style head and prompt lookup, in eqspec and exspec at
batch sizes 1, 3 and 8. Each node's logits in the verify pass are a fresh batch-size-1 pass over the
row's tokens and the node's own ancestors (float64), and each tree fault is named by the state or
decision it breaks."""
import json
import re

import pytest
import torch

from specviz.decoding.batch import left_pad
from specviz.decoding.drafters import EagleDrafter, ModelDrafter, PromptLookup
from specviz.decoding.eqspec import eqspec
from specviz.decoding.exspec import exspec
from specviz.decoding.faults import Policy
from specviz.decoding.paging import Memory
from specviz.decoding.reference import reference
from specviz.decoding.round import prefill, verify
from specviz.decoding.sampling import GREEDY
from specviz.decoding.stages import Decoding
from specviz.decoding.trees import Tree, main_line, walk
from specviz.forensics.recompute import fresh_logits
from specviz.models.pairs import load_pair
from specviz.run.runner import run
from specviz.spec.faults import FAULTS, of_kind
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_HYBRID, TINY_HYBRID_DRAFT, TINY_TARGET, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics
from specviz.trace.schema import Trace

NEW, DEPTH = 24, 5
TREE_FAULTS = list(of_kind("tree"))


def _ids(pair, n: int) -> list[list[int]]:
    return [pair.tokenizer(p).input_ids for p in builtin_set("all")[:n]]


@pytest.fixture(scope="module")
def prompts(tiny):
    ids = _ids(tiny, 9)
    return ids, [o.ids for o in reference(tiny, ids, NEW).outputs]


def _decode(decoder, pair, prompts, batch_size, drafter):
    kw = dict(window=2 * batch_size, max_wait=4) if decoder is exspec else {}
    return decoder(pair, prompts, batch_size, DEPTH, NEW, drafter=drafter, **kw)


DRAFTERS = {"model": lambda pair, w: ModelDrafter(pair, w),
            "eagle": lambda pair, w: EagleDrafter(pair, DEPTH, w)}


@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("decoder", [eqspec, exspec])
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_trees_of_every_width_decode_to_the_reference_exactly_in_float64(tiny, prompts, drafter,
                                                                         decoder, batch_size):
    ids, ref = prompts
    accepted = {}
    for width in (1, 2, 4):
        out = _decode(decoder, tiny, ids, batch_size, DRAFTERS[drafter](tiny, width))
        assert [o.ids for o in out.outputs] == ref, width
        for rd in out.rounds:
            assert all(bool(ok.all()) for ok in rd.checks.values()), {
                n for n, ok in rd.checks.items() if not ok.all()}
        accepted[width] = sum(int(rd.ints["accepted"].sum()) for rd in out.rounds)
        if width > 1:  # some row accepted a node off its chain: the tree, not a chain, was walked
            assert any(bool((rd.ints["tree_path"] >= DEPTH).any()) for rd in out.rounds
                       if "tree_path" in rd.ints)
    # wider keeps more
    assert accepted[1] <= accepted[2] <= accepted[4] and accepted[1] < accepted[4], accepted


@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("decoder", [eqspec, exspec])
def test_trees_decode_to_the_reference_exactly_in_float32(decoder, batch_size):
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype="float32", device="cpu")
    ids = _ids(pair, 9)
    ref = [o.ids for o in reference(pair, ids, NEW).outputs]
    for width in (2, 4):
        assert [o.ids
                for o in _decode(decoder, pair, ids, batch_size,
                                 ModelDrafter(pair, width)).outputs] == ref


@pytest.fixture(scope="module")
def embedded64():
    """The embedded pair in float64: a real model copies from its prompt, so that lookup's drafts
    are accepted."""
    return load_pair(dtype="float64", device="cpu")


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("decoder", [eqspec, exspec])
def test_lookup_tries_decode_to_the_reference_exactly(embedded64, decoder, batch_size):
    texts = builtin_set("code")[-3:-1] + builtin_set("summarize")[:1]
    ids = embedded64.encode(texts)
    ref = [o.ids for o in reference(embedded64, ids, NEW).outputs]
    for width in (2, 4):
        out = _decode(decoder, embedded64, ids, batch_size, PromptLookup(embedded64, 1, 3, width))
        assert [o.ids for o in out.outputs] == ref, width
        trees = [rd for rd in out.rounds if "tree_path" in rd.ints]
        # it drafted what the model then wrote
        assert sum(int(rd.ints["accepted"].sum()) for rd in trees) >= 10
        # several matches: branches
        assert any(bool((rd.ints["tree_offered"] > DEPTH).any()) for rd in trees)


def test_every_nodes_logits_are_a_fresh_pass_over_its_own_ancestors(tiny):
    """One verify pass over a ragged batch of trees, against the truth: for each node, the target
    alone at batch size 1, with no cache, over the row's tokens and the node's ancestors.
    Independent of the walk and the compaction: it judges the positions and the mask."""
    ids = _ids(tiny, 3)
    drafter, policy = ModelDrafter(tiny, 3), Policy(())
    d = Decoding(tiny, policy, drafter, NEW)
    b = prefill(tiny, policy, drafter, Memory(), [0, 1, 2],
                *left_pad(ids, tiny.device, min_width=3))
    have = torch.zeros(3, dtype=torch.long)
    prop = drafter.propose(policy, b, 4, GREEDY, GREEDY.streams([0, 1, 2]), have)
    tree = Tree.of(prop.parents)
    v = verify(d, b, prop.tokens, have, tree)
    for row, prompt in enumerate(ids):
        for node in range(prop.tokens.shape[1]):
            line = [int(prop.tokens[row, j]) for j in range(node + 1)
                    if tree.ancestors[row, node, j]]
            fresh = fresh_logits(tiny.target, prompt + line, 1, tiny.vocab_size)[0]
            assert (v.logits[row, node + 1].double() - fresh).abs().max() < 1e-9, (row, node)


def test_a_tree_is_walked_along_the_targets_choices():
    # two branches from the root; node 4 a sibling of node 1
    parents = torch.tensor([[-1, 0, 1, -1, 0, 3]])
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10]])
    tree = Tree.of(parents)
    assert tree.depth.tolist() == [[1, 2, 3, 1, 2, 2]]
    assert tree.ancestors[0, 5].nonzero().flatten().tolist() == [3, 5]
    # the target chooses 5 at the root, then 9 (node 4, not node 1), then 1 (no child of node
    # 4 is 1)
    argmax = torch.tensor([[5, 9, 0, 0, 0, 1, 0]])
    path, length, refused = walk(tokens, tree, torch.tensor([6]), argmax)
    # node 4 is a leaf
    assert (path[0, :2].tolist(), int(length), bool(refused)) == ([0, 4], 2, False)
    # the root's choice is the second branch; node 3's children are 10, not its choice 2
    argmax[0, 0] = 8
    argmax[0, 4] = 2
    path, length, refused = walk(tokens, tree, torch.tensor([6]), argmax)
    # node 5 was refused
    assert (path[0, :2].tolist(), int(length), bool(refused)) == ([3, 5], 1, True)
    assert main_line(3, 2, "cpu").tolist() == [-1, 0, 1, -1, 0, 1]


@pytest.fixture(scope="module")
def tree_run_spec():
    return dict(target=TINY_TARGET, draft=TINY_DRAFT, prompts=tuple(builtin_set("all")[:9]),
                drafter="model", tree_width=4, batch_size=4, k=4, max_new_tokens=NEW,
                dtype="float64", device="cpu")


@pytest.fixture(scope="module")
def tree_trace(tree_run_spec):
    return run(RunSpec.build(**tree_run_spec))


def test_a_tree_runs_trace_records_every_rows_tree_and_path(tree_trace, tmp_path):
    trace = tree_trace
    assert metrics.equivalence(trace)["exact"] == 1
    a = trace.acceptance  # each draft is the draft model's own candidate of its rank, fresh
    assert a.verdict is None and a.beyond == 0 and a.compared > 0, a.explanation
    for r in trace.rows:
        assert r.tree is not None and len(r.tree.path) == r.accepted
        assert ([r.tree.tokens[n] for n in r.tree.path]
                == r.draft_tokens[:r.accepted] == r.emitted[:r.accepted])
    path = tmp_path / "tree.json"
    path.write_text(trace.model_dump_json())
    assert Trace.from_json(path.read_bytes()).rows == trace.rows
    old = json.loads(path.read_text())  # a version-9 trace verified chains only: it loads as one
    old["schema_version"] = 9
    for r in old["rows"]:
        del r["tree"]
    assert all(r.tree is None for r in Trace.from_json(json.dumps(old).encode()).rows)
    bad = json.loads(path.read_text())
    bad["rows"][0]["tree"]["parents"][0] = 3  # a node listed before its parent
    with pytest.raises(SpecError, match="each node after its parent"):
        Trace.from_json(json.dumps(bad).encode())


# The one fork a mask fault may leave for a later round: a node that saw its sibling was accepted,
# and the K/V it wrote then are read later; the cache is then what was wrong (the explanation cites
# the mask check that failed).
LATER = {"tree-siblings-visible": {"sync-bug:kv"}}


@pytest.mark.parametrize("fault", TREE_FAULTS)
def test_every_tree_fault_is_named_by_the_state_or_decision_it_breaks(tree_run_spec, fault):
    trace = run(RunSpec.build(**tree_run_spec, faults=(fault,)))
    assert metrics.equivalence(trace)["exact"] < 1
    verdicts = [s.forensics.verdict for s in trace.sequences if s.forensics]
    assert verdicts and set(verdicts) <= {FAULTS[fault].verdict, *LATER.get(fault, ())}, verdicts
    assert verdicts.count(FAULTS[fault].verdict) > len(verdicts) / 2


# a flat q: a chain's draft often refused
SAMPLED = dict(temperature=0.8, top_p=0.95, draft_temperature=2.0)
SAMPLED_PROMPTS = ("Write a short poem about the sea.", "Explain recursion.", "List three fruits.",
                   "What is 2+2?") * 4


@pytest.mark.parametrize("method", ["eqspec", "exspec"])
def test_sampled_trees_are_the_targets_distribution(method):
    """SpecInfer's multi-candidate speculative sampling is lossless: every token's PIT under the
    target is uniform, each recorded decision follows its draw, and rows accept candidates off
    the chain."""
    trace = run(RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, prompts=SAMPLED_PROMPTS,
                              method=method, tree_width=4, batch_size=4, k=4, max_new_tokens=48,
                              seed=1, device="cpu", **SAMPLED))
    d = trace.distribution
    assert d.verdict == "consistent" and d.impossible == 0, d
    assert trace.decisions.checked > 0 and trace.decisions.mismatches == 0
    assert any(r.tree.candidate(n)[0] > 1 for r in trace.rows for n in r.tree.path)


def test_a_sampled_tree_draws_the_same_tokens_whatever_its_batch(tiny):
    from specviz.decoding.sampling import Sampler, Sampling

    ids = _ids(tiny, 9)
    sampling = Sampling(target=Sampler(temperature=0.8, top_p=0.95), draft=Sampler(temperature=2.0),
                        seed=3)
    outs = [[o.ids for o in decoder(tiny, ids, bs, 4, NEW, sampling=sampling,
                                    drafter=ModelDrafter(tiny, 4),
                                    **(dict(window=2 * bs, max_wait=4) if decoder is exspec
                                       else {})).outputs]
            for decoder in (eqspec, exspec) for bs in (1, 3, 8)]
    assert all(o == outs[0] for o in outs)


@pytest.mark.parametrize("fields, refusal", [
    (dict(tree_width=2, temperature=0.8, faults=("residual-from-draft",)),
     "a token tree's are SpecInfer's"),
    (dict(tree_width=2, method="hf-assisted", batch_size=1), "verifies chains only"),
    (dict(tree_width=2, repetition_penalty=1.2), "penalty"),
    (dict(faults=("tree-bonus-by-index",)), "set tree_width above 1"),
])
def test_what_trees_cannot_do_is_refused_with_the_reason(fields, refusal):
    with pytest.raises(ValueError, match=refusal):
        RunSpec.build(prompts=("a",), **fields)


def test_a_hybrid_target_refuses_trees_and_says_why():
    spec = RunSpec.build(target=TINY_HYBRID, draft=TINY_HYBRID_DRAFT, prompts=("a",), tree_width=2,
                         dtype="float64", device="cpu")
    with pytest.raises(SpecError, match="recurrent state"):
        run(spec)


def test_the_page_draws_each_rows_tree_and_marks_tokens_off_the_first_branch(tree_trace):
    from hostile import hostile_trace, live_markup

    from specviz.app import runview

    off = next(r for r in tree_trace.rows if any(r.tree.candidate(n)[0] > 1 for n in r.tree.path))
    out = runview.render(tree_trace, off.seq, off.round)
    picture = re.search(r"<svg class=\"sv-tree\".*?</svg>", out["forensics"]).group(0)
    assert picture.count("<g ") == len(off.tree.tokens)  # a box for every node
    assert (picture.count('class="sv-node-path"') == off.accepted
            and "candidate 2 of" in out["forensics"])
    assert "sv-branch" in out["timeline"] and "off the first branch" in out["timeline"]
    assert "sv-tree-cell" in out["grid"] and "a token tree of" in out["grid"]
    # every node's text is in the trace, for its label
    assert set(off.tree.tokens) <= set(tree_trace.vocab)
    # every token's text a stranger's: shown as text, in the picture too
    hostile = hostile_trace(tree_trace)
    for seq in range(len(hostile.sequences)):
        for name, page in runview.render(hostile, seq, off.round).items():
            if name in ("timeline", "grid", "forensics"):
                assert live_markup(
                    page,
                    {"div", "span", "p", "b", "h4", "table", "thead", "tbody", "tr", "th", "td",
                     "svg", "g", "rect", "line", "text", "title"},
                    {"class", "title", "style", "data-seq", "data-round", "data-index", "role",
                     "width", "height", "viewbox", "aria-label", "x", "y", "x1", "y1", "x2",
                     "y2", "rx"}) == [], name
