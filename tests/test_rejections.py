"""Drafts a round refused though the target chose them (forensics/rejections.py). Such a round
writes the target's token where it refused the draft, and that token is the draft: every output
stays the reference's, and only the rounds show the acceptance lost. A correct run refuses no such
draft; a wrong accept count, planted in specviz's engine or in a decoder written apart from it and
judged from the rounds it reports, is named with what it cost; its drafts, the draft model's own,
are not blamed."""
import json

import pytest

from independent_decoder import decode, write_outputs
from specviz.app.glossary import glossary
from specviz.app.summary import headline
from specviz.app.views import md
from specviz.cli.main import main as cli
from specviz.engines import jsonl
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics
from specviz.trace.schema import Trace
from specviz.trace.sweep import row_of

FAULT = "accept-count-one-short"
NAMED = f"**Decisions: {md('decision-bug:reject')}.**"  # as the page's summary says it
K, BATCH, BUDGET = 4, 4, 24
TEXTS = ("The quick brown fox jumps over the lazy dog. The quick brown fox",
         "one two three one two three one two", "Once upon a time",
         "def f(x): return x + 1\ndef g(x): return f(x) * 2\ndef h(x):")


def _spec(pair: str, **fields) -> RunSpec:
    """A run on the tiny pair, the target drafting for itself, or on the embedded pair."""
    pair_fields = ({"target": TINY_TARGET, "draft": TINY_TARGET} if pair == "tiny" else {})
    return RunSpec.build(**{**pair_fields, "dtype": "float32", "device": "cpu",
                            "prompts": tuple(builtin_set("all")[:4]), "batch_size": 4, "k": 4,
                            "max_new_tokens": 24, **fields})


@pytest.mark.parametrize("method, drafter", [("eqspec", "model"), ("exspec", "model"),
                                             ("eqspec", "lookup"), ("exspec", "lookup")])
def test_a_correct_run_on_the_embedded_pair_refuses_no_draft_the_target_chose(method, drafter,
                                                                               embedded):
    trace = run(_spec("embedded", method=method, drafter=drafter))
    r = trace.rejections
    assert r.verdict is None and r.wrong == 0 and r.judged > 0 and r.accepted > 0, r.explanation
    assert r.kept == r.accepted and r.source == "the run's"


# (pair, drafter, tree width): the tiny pair's lookup finds no draft the target takes
PLANTED = [("tiny", "model", 1), ("tiny", "model", 2), ("embedded", "lookup", 1)]


@pytest.mark.parametrize("pair, drafter, tree_width", PLANTED,
                         ids=["draft-model", "tree", "lookup"])
def test_a_wrong_accept_count_keeps_the_output_and_is_named_with_its_cost(pair, drafter,
                                                                           tree_width, tiny,
                                                                           embedded):
    spec = _spec(pair, drafter=drafter, tree_width=tree_width, faults=(FAULT,))
    trace = run(spec)
    assert metrics.equivalence(trace)["exact"] == 1  # lossless: every output is the reference
    r = trace.rejections
    assert r.verdict == "decision-bug:reject" and r.wrong > 0 and r.first is not None
    # each round that refused a draft the target chose lost it and those after it
    assert r.kept >= r.accepted + r.wrong, r.explanation
    assert r.accepted == sum(x.accepted for x in trace.rows if x.round < max(
        y.round for y in trace.rows if y.seq == x.seq))
    assert "the output is unharmed" in r.explanation
    if drafter == "model":  # the drafts were the draft model's own: only the decisions were wrong
        assert trace.acceptance.verdict is None, trace.acceptance.explanation
    # it does not look healthy anywhere: the sweep's row and the page's summary name it
    row = row_of(spec, trace)
    assert row.exact_pct == 100 and row.rejections_verdict == "decision-bug:reject"
    assert row.rejections_kept == [r.accepted, r.kept]
    assert NAMED in headline(trace)
    assert f"here **{r.wrong} of {r.judged} rounds" in glossary(trace)


@pytest.fixture(scope="module")
def decoded(tiny):
    """The independent decoder's outputs and rounds, correct and with the wrong accept count."""
    prompts = tiny.encode(list(TEXTS), chat_template=False)
    found = {}
    for bug in (None, FAULT):
        rounds = []
        outputs = decode(tiny.target, tiny.draft, prompts, k=K, max_new_tokens=BUDGET,
                         batch_size=BATCH, eos_ids=tuple(tiny.eos_ids), bug=bug, rounds=rounds)
        found[bug] = (outputs, rounds)
    return prompts, found


def _check(tmp_path, path) -> Trace:
    """`specviz check` of the outputs file at `path`, declared to draft with the tiny draft."""
    trace = tmp_path / "check.json"
    assert cli(["check", "--outputs", str(path), "--target", str(TINY_TARGET), "--draft",
                str(TINY_DRAFT), "--dtype", "float64", "--device", "cpu", "--k", str(K),
                "--no-chat-template", "--no-attribution", "--trace", str(trace)]) == 0
    return Trace.from_json(trace.read_text())


@pytest.mark.parametrize("bug", [None, FAULT], ids=["correct", FAULT])
def test_an_engines_rounds_show_its_decisions(bug, decoded, tmp_path, capsys):
    prompts, found = decoded
    outputs, rounds = found[bug]
    assert outputs == found[None][0]  # the bug keeps every output
    path = tmp_path / "outputs.jsonl"
    write_outputs(path, prompts, outputs, {"drafter": "model", "k": K}, rounds)
    trace = _check(tmp_path, path)
    assert all(s.equivalent for s in trace.sequences)
    r, a = trace.rejections, trace.acceptance
    assert r.source == "the engine's" and r.judged == sum(len(x) - 1 for x in rounds)
    # its counters, from its rounds
    assert a.compared == sum(len(x["drafts"]) for y in rounds for x in y)
    assert a.accepted == r.accepted + sum(y[-1]["accepted"] for y in rounds)
    # the drafts were the draft model's own either way: the drafter is not blamed
    assert a.verdict is None, a.explanation
    printed = capsys.readouterr().out
    if bug is None:
        assert r.verdict is None and r.kept == r.accepted, r.explanation
        assert "decisions: the target refused every draft refused" in printed
    else:
        assert r.verdict == "decision-bug:reject" and r.wrong > 0 and r.first, r.explanation
        assert r.kept > 1.3 * r.accepted  # a draft lost in most rounds
        assert "right decisions would have accepted" in a.explanation
        assert NAMED in headline(trace)
        assert "decisions: decision-bug:reject" in printed


def test_rounds_that_do_not_cut_the_output_are_refused_by_line(decoded, tmp_path):
    prompts, found = decoded
    outputs, rounds = found[None]
    cut = json.loads(json.dumps(rounds))
    cut[1] = cut[1][:-1]  # a round missing: they emit fewer tokens than the output has
    path = tmp_path / "outputs.jsonl"
    write_outputs(path, prompts, outputs, {"drafter": "model"}, cut)
    with pytest.raises(SpecError, match=r"prompt 1: .*do not cut an output"):
        _judged_file(path)
    wrong = json.loads(json.dumps(rounds))
    first = next(r for r in wrong[0] if r["accepted"] > 0)
    first["drafts"][0] += 1  # an accepted draft that is not the output's token there
    write_outputs(path, prompts, outputs, {"drafter": "model"}, wrong)
    with pytest.raises(SpecError, match=r"prompt 0: .*accepted drafts are not the output"):
        _judged_file(path)


def _judged_file(path):
    header, lines, ignored = jsonl.parse(path.read_text(), path.name)
    return jsonl.from_lines(header, lines, None, path.name, ignored)


def test_the_one_short_count_is_the_only_difference(tiny):
    """The fault changes the count alone: its outputs and the drafts of its first round are the
    correct engine's."""
    correct, short = run(_spec("tiny")), run(_spec("tiny", faults=(FAULT,)))
    assert [s.output_ids for s in correct.sequences] == [s.output_ids for s in short.sequences]
    first = [(r.draft_tokens, r.accepted) for r in correct.rows if r.round == 0]
    planted = [(r.draft_tokens, r.accepted) for r in short.rows if r.round == 0]
    assert [d for d, _ in first] == [d for d, _ in planted]
    assert [max(a - 1, 0) for _, a in first] == [a for _, a in planted]


def test_counters_alone_cannot_tell_the_decisions_from_the_drafts(decoded, tmp_path):
    """The same engine reporting only its counters (drafts offered and accepted per prompt): the
    shortfall shows, and the finding says that counters cannot tell whose it is."""
    prompts, found = decoded
    outputs, rounds = found[FAULT]
    path = tmp_path / "outputs.jsonl"
    write_outputs(path, prompts, outputs, {"drafter": "model", "k": K})
    counted = [json.loads(line) for line in path.read_text().splitlines()]
    for line, own in zip(counted[1:], rounds):
        line.update(drafts=sum(len(r["drafts"]) for r in own),
                    accepted=sum(r["accepted"] for r in own))
    path.write_text("".join(json.dumps(line) + "\n" for line in counted))
    judged = _check(tmp_path, path)
    assert judged.rejections is None  # no rounds: its decisions are not seen
    a = judged.acceptance
    assert a.verdict == "draft-bug:acceptance", a.explanation
    assert "counters cannot tell which" in a.explanation


@pytest.mark.parametrize("bug", [None, FAULT], ids=["correct", FAULT])
def test_a_sampling_engines_counts_alone_show_its_decisions(bug, tiny, tmp_path, capsys):
    """At temperature 1 an engine reports its rounds' drafts and counts, not its draws: together,
    its decided drafts must be kept as often as min(1, p/q) keeps them. A round count one short is
    named; the correct sampler is not."""
    prompts = tiny.encode(list(TEXTS), chat_template=False)
    rounds = []
    outputs = decode(tiny.target, tiny.draft, prompts, k=K, max_new_tokens=BUDGET,
                     batch_size=BATCH, temperature=1.0, seed=3, eos_ids=tuple(tiny.eos_ids),
                     bug=bug, rounds=rounds)
    path = tmp_path / "sampled.jsonl"
    write_outputs(path, prompts, outputs, {"drafter": "model", "k": K}, rounds)
    trace = tmp_path / "check.json"
    assert cli(["check", "--outputs", str(path), "--target", str(TINY_TARGET), "--draft",
                str(TINY_DRAFT), "--dtype", "float64", "--device", "cpu", "--k", str(K),
                "--temperature", "1", "--no-chat-template", "--trace", str(trace)]) == 0
    r = Trace.from_json(trace.read_text()).rejections
    assert r.source == "the engine's" and r.judged == sum(len(x) - 1 for x in rounds)
    assert r.accepted == sum(x["accepted"] for y in rounds for x in y[:-1])
    printed = capsys.readouterr().out
    if bug is None:
        assert r.verdict is None and r.tail >= 1e-3, r.explanation
        assert "decisions: as many drafts kept as the rule keeps" in printed
    else:
        assert r.verdict == "decision-bug:reject" and r.tail < 1e-3, r.explanation
        assert r.expected > 1.3 * r.accepted
        assert "decisions: decision-bug:reject" in printed
