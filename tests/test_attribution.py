"""Attribution (run/attribution.py): which known mechanism writes another engine's fork, from its
ids alone.

The engine is tests/independent_decoder.py, a batch speculative decoder over transformers that
shares no code with specviz, with bugs from the casebook planted by hand in its own code. Its
outputs file is checked with `specviz check --outputs`, as a user checks any engine's: each planted
bug must be named by its own mechanism, on every row it forks, and the correct decoder's rows, and a
bug outside the catalogue, must be named by none.
"""
import copy

import pytest
import torch
from cached_decoder import decode_one
from independent_decoder import BUGS, SAMPLING_BUGS, decode, write_outputs

from specviz.app.panel import forensics_html
from specviz.app.views import Focus
from specviz.cli.main import main as cli
from specviz.forensics import rules
from specviz.run import attribution, check
from specviz.spec.faults import expand
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.trace.schema import Trace

K, BATCH, BUDGET = 4, 4, 24
TEXTS = ("Hi", "The quick brown fox jumps over the lazy dog. The quick brown fox",
         "one two three one two three one two",
         "Once upon a time", "def f(x): return x + 1\ndef g(x): return f(x) * 2\ndef h(x):",
         "a b a b a b a b")
# tokens the tiny target writes mid-output: its end-of-sequence tokens for the stop bug
EOS = (35373, 15491, 25223)
# bug -> (drafter, what else the engine and the check share); each forks some rows of TEXTS under it
SETTINGS = {"draft-bonus": ("model", {}), "bonus-from-another-row": ("ngram", {}),
            "verify-positions-not-advanced": ("model", {}),
            "stop-at-last-token": ("model", {"eos": EOS}), "min-crop": ("model", {}),
            "rollback-by-draft-list": ("ngram", {})}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One torch thread while this file runs (as under `make test`): the independent decoder
    and specviz's replays of it then split their reductions alike; restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def prompts(tiny):
    return tiny.encode(list(TEXTS), chat_template=False)


@pytest.fixture(scope="module")
def eos_pair(tiny, tmp_path_factory):
    """The tiny pair saved as a user's local models, whose end-of-sequence tokens the target writes
    mid-output: (target folder, draft folder)."""
    folders = []
    for name, model in (("target", tiny.target), ("draft", tiny.draft)):
        path = tmp_path_factory.mktemp("eos") / name
        own, model.generation_config.eos_token_id = model.generation_config.eos_token_id, list(EOS)
        try:
            model.save_pretrained(path)
        finally:
            model.generation_config.eos_token_id = own
        tiny.tokenizer.save_pretrained(path)
        folders.append(path)
    return folders


def _engine(tiny, prompts, bug, drafter, eos=(), dtype=torch.float64):
    # another dtype on copies: the session's tiny pair must keep its float64 weights
    target, draft = (tiny.target, tiny.draft) if dtype == torch.float64 else \
        (copy.deepcopy(tiny.target).to(dtype), copy.deepcopy(tiny.draft).to(dtype))
    return decode(target, draft if drafter == "model" else None, prompts, k=K,
                  max_new_tokens=BUDGET, batch_size=BATCH, drafter=drafter,
                  eos_ids=tuple(sorted(set(eos) | set(tiny.eos_ids))), bug=bug)


def _check(tmp_path, outputs_file, pair=(TINY_TARGET, TINY_DRAFT), *extra) -> Trace:
    trace = tmp_path / "check.json"
    assert cli(["check", "--outputs", str(outputs_file), "--target", str(pair[0]), "--draft",
                str(pair[1]), "--dtype", "float64", "--device", "cpu", "--k", str(K),
                "--no-chat-template", "--trace", str(trace), *extra]) == 0
    return Trace.from_json(trace.read_text())


@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_bug_of_an_independent_engine_is_named_by_its_mechanism(bug, tiny, prompts,
                                                                             eos_pair, tmp_path,
                                                                             capsys):
    drafter, more = SETTINGS[bug]
    outputs = _engine(tiny, prompts, bug, drafter, **more)
    path = tmp_path / "engine.jsonl"
    write_outputs(path, prompts, outputs, {"k": K, "batch_size": BATCH,
                                           "drafter": "lookup" if drafter == "ngram" else "model"})
    trace = _check(tmp_path, path, eos_pair if "eos" in more else (TINY_TARGET, TINY_DRAFT))
    printed = capsys.readouterr().out
    forked = [s for s in trace.sequences if s.first_divergence is not None]
    assert forked, f"{bug} forks no row here"
    # A bonus from the draft keeps a draft the target rejected: its departing tokens are the draft
    # model's own choices, which any accept rule that keeps refused drafts writes (the test below).
    keeps_drafts = bug == "draft-bonus"
    for s in forked:
        a = s.attribution
        assert a is not None, (bug, s.seq, s.forensics.verdict)
        assert ("cannot tell which accept rule kept them" in a.explanation) == keeps_drafts
        # (said as established only where the fork is judged a bug: without a control, a fork that
        # only the engine's rounding could explain is not)
        assert not a.rejected_draft_kept
        named = [h for h in a.hypotheses if h.named]
        # Named (or, for drafts kept, the first to write them all, and said in the finding); beside
        # it only what these tokens cannot tell from it (a preset holding it; a fault whose replay
        # writes the very same tokens here), said in the report.
        best = (a.hypotheses[0] if keeps_drafts
                else next(h for h in named if bug in expand(h.faults)))
        assert bug in expand(best.faults) and (not named) == keeps_drafts
        assert (best.explained == a.tokens
                and best.beyond == len(a.departing) >= a.threshold > a.correct.beyond == 0)
        assert all(h.replay_ids == best.replay_ids for h in named), (bug, s.seq, a.explanation)
        assert best.round is not None and best.replay_ids[a.fork] == s.engine.ids[a.fork]
        assert bug in a.explanation
    assert ("cannot tell which accept rule kept them" if keeps_drafts
            else "named " + bug) in printed


def test_a_kept_rejected_draft_is_said_and_no_rule_that_keeps_drafts_is_named_for_it(
        tiny, prompts, tmp_path):
    """The converse of a wrong rejection, seen from outside: an accept rule of no fault keeps its
    drafts up to the last one the target chose, past a mismatch. Its forks are the draft model's
    own choices where the target chose otherwise. The finding says that rejected drafts were kept
    and that the tokens cannot tell which accept rule kept them; no mechanism of the catalogue is
    named for it, though some write its tokens (a bonus from the draft, dsd-like, a rule on the
    untempered softmaxes)."""
    settings = {"k": K, "batch_size": BATCH, "drafter": "model"}
    path, control = tmp_path / "engine.jsonl", tmp_path / "control.jsonl"
    write_outputs(path, prompts, _engine(tiny, prompts, "keep-to-last-match", "model"), settings)
    # its control: the same engine's correct rule, whose rounding bounds the engine's
    write_outputs(control, prompts, _engine(tiny, prompts, None, "model"), settings)
    trace = _check(tmp_path, path, (TINY_TARGET, TINY_DRAFT), "--control", str(control))
    forked = [s for s in trace.sequences if s.first_divergence is not None]
    assert forked, "the rule forks no row here"
    for s in forked:
        a = s.attribution
        assert s.forensics.verdict == "engine-bug" and a.rejected_draft_kept, a.explanation
        assert "kept drafts the target rejected: decisions it got wrong" in a.explanation
        assert "cannot tell which accept rule kept them" in a.explanation
        assert not any(h.named for h in a.hypotheses), a.explanation


@pytest.mark.parametrize("two",
        [("min-crop", "verify-positions-not-advanced"), ("draft-bonus", "min-crop")])
def test_two_bugs_at_once_are_named_as_the_pair(two, tiny, prompts, tmp_path):
    """No single fault writes such an engine's rows to their end: the pair does, and is named
    alone."""
    path = tmp_path / "engine.jsonl"
    write_outputs(path, prompts, _engine(tiny, prompts, two, "model"),
                  {"k": K, "batch_size": BATCH, "drafter": "model"})
    trace = _check(tmp_path, path)
    forked = [s for s in trace.sequences if s.first_divergence is not None]
    assert forked
    for s in forked:
        named = [h for h in s.attribution.hypotheses if h.named]
        assert [h.faults for h in named] == [list(two)], (s.seq, s.attribution.explanation)
        assert named[0].explained == s.attribution.tokens
        singles = [h for h in s.attribution.hypotheses if len(h.faults) == 1]
        assert max(h.explained for h in singles) < s.attribution.tokens


def test_the_correct_independent_engine_is_attributed_to_nothing_even_where_its_rounding_forks(tiny,
        prompts, tmp_path):
    """In float64 it writes the reference; in bfloat16 its rounding tips near-ties, and every such
    fork, attributed on purpose, is named by no mechanism: the threshold's false alarms, measured on
    an engine that is right."""
    exact = _engine(tiny, prompts, None, "model")
    path = tmp_path / "correct.jsonl"
    write_outputs(path, prompts, exact, {"k": K, "batch_size": BATCH, "drafter": "model"})
    trace = _check(tmp_path, path)
    assert all(s.equivalent and s.attribution is None for s in trace.sequences)

    rounded = _engine(tiny, prompts, None, "model", dtype=torch.bfloat16)
    write_outputs(path, prompts, rounded, {"k": K, "batch_size": BATCH, "drafter": "model"})
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, prompts=TEXTS, method="engine",
                         dtype="float64", device="cpu", k=K, chat_template=False)
    trace = check.from_files(spec, tiny, (path.read_bytes(), path.name),
                             judging=check.Judging(attribute=False))
    seqs = attribution.forks_to_attribute(trace, every_fork=True)
    assert seqs, "bfloat16 rounding should fork some row of the tiny pair"
    replaying = attribution.Replaying(spec, tiny, prompts, {"k": K}, BATCH)
    attribution.attribute(trace, replaying, seqs).record(trace)
    for seq in seqs:
        a = trace.sequences[seq].attribution
        assert not any(h.named for h in a.hypotheses), a.explanation
        assert not a.rejected_draft_kept  # rounding's forks are never said to keep drafts


def test_an_engine_that_stopped_early_has_nothing_to_attribute(tiny, prompts, tmp_path):
    """A row cut short forks where the engine wrote nothing: judged, not attributed."""
    outputs = _engine(tiny, prompts, None, "model")
    outputs[1] = outputs[1][:10]
    path = tmp_path / "short.jsonl"
    write_outputs(path, prompts, outputs, {"k": K, "batch_size": BATCH, "drafter": "model"})
    s = _check(tmp_path, path).sequences[1]
    assert s.first_divergence == 10 and s.forensics is not None and s.attribution is None


def _skips_its_last_token(tiny, prompt, budget, after):
    """A bug outside the catalogue: from token `after` on, the target is asked for the next token
    over a context without its last one (as if the token just written were never fed). Plain greedy,
    batch size 1."""
    out = []
    with torch.no_grad():
        while len(out) < budget:
            context = prompt + (out[:-1] if len(out) > after else out)
            out.append(int(tiny.target(torch.tensor([context])).logits[0, -1].argmax()))
    return out


def test_a_bug_outside_the_catalogue_is_named_by_none_and_its_state_fact_is_given(tiny, prompts,
                                                                                  tmp_path):
    outputs = [_skips_its_last_token(tiny, p, BUDGET, 3) for p in prompts[:4]]
    path = tmp_path / "unknown.jsonl"
    write_outputs(path, prompts[:4], outputs, {"k": K, "batch_size": BATCH, "drafter": "model"})
    trace = _check(tmp_path, path)
    forked = [s for s in trace.sequences if s.first_divergence is not None]
    assert forked
    for s in forked:
        a = s.attribution
        assert not any(h.named for h in a.hypotheses) and "outside the casebook" in a.explanation
        assert any("missing the token before it" in f for f in a.facts), a.facts
        assert a.correct.explained == 0 and a.replays > len(a.hypotheses)


def test_the_page_shows_the_hypotheses_aligned_from_the_fork_and_the_json_keeps_them(tiny, prompts,
        tmp_path, capsys):
    outputs = _engine(tiny, prompts, "verify-positions-not-advanced", "model")
    path = tmp_path / "engine.jsonl"
    write_outputs(path, prompts, outputs, {"k": K, "batch_size": BATCH, "drafter": "model"})
    trace = _check(tmp_path, path)
    s = next(s for s in trace.sequences if s.attribution)
    page = forensics_html(trace, Focus(s.seq, None))
    assert ('class="sv-attribution" data-named="true"' in page
            and "best: verify-positions-not-advanced" in page)
    # the aligned lines, the hypothesis's round and slot
    assert page.count("<tr>") >= 4 and "round" in page
    assert Trace.from_json(trace.to_json()).sequences[s.seq].attribution == s.attribution
    # --no-attribution: the same verdicts, no replays
    quiet = _check(tmp_path, path, (TINY_TARGET, TINY_DRAFT), "--no-attribution")
    assert all(q.attribution is None for q in quiet.sequences)
    assert [q.forensics for q in quiet.sequences] == [t.forensics for t in trace.sequences]


def test_a_trace_string_in_the_hypothesis_view_is_escaped(tiny, prompts, tmp_path):
    outputs = _engine(tiny, prompts, "draft-bonus", "model")
    path = tmp_path / "engine.jsonl"
    write_outputs(path, prompts, outputs, {"k": K, "batch_size": BATCH, "drafter": "model"})
    trace = _check(tmp_path, path)
    s = next(s for s in trace.sequences if s.attribution)
    s.attribution = s.attribution.model_copy(update={"facts": ["<script>alert(1)</script>"],
                                                     "explanation": "<b>x</b>"})
    page = forensics_html(trace, Focus(s.seq, None))
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;x" in page


def test_candidates_fit_the_engine_s_declared_method(tiny, prompts):
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, prompts=TEXTS, method="engine",
                         dtype="float64", device="cpu", k=K, chat_template=False)
    fits, skipped = attribution.candidates(attribution.Replaying(spec, tiny, prompts,
                                                                 {"drafter": "lookup"}, BATCH))
    tried = {f for faults in fits for f in faults}
    assert "rollback-by-draft-list" in tried and "bonus-from-another-row" in tried
    assert skipped["state-not-rolled-back"] == "the target keeps no recurrent state"
    assert skipped["window-full-keeps-rejected"] == "the target has no sliding window"
    assert "penalty-history-last-token" in skipped and "tree-siblings-visible" in skipped
    assert not tried & {"keep-rejected-kv", "draft-positions-off-by-one", "logprobs-from-draft"}
    assert attribution.layouts([1, 3, 6], 10, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert attribution.layouts([1, 6], 10, 1) == [[1], [6]]


def test_the_correct_engine_explains_what_it_writes(tiny, prompts):
    """The score itself: the correct engine replayed against its own tokens explains all of them."""
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, prompts=TEXTS, method="engine",
                         dtype="float64", device="cpu", k=K, chat_template=False,
                         max_new_tokens=BUDGET)
    r = attribution.Replaying(spec, tiny, prompts, {}, BATCH)
    own = _engine(tiny, prompts[:4], None, "model")
    found = attribution.replay_batch(r, attribution.replay_spec(r, ()), [0, 1, 2, 3],
                                     {1: (own[1], 5), 2: (own[2][:9] + [0], 9)})
    assert found[1].explained == BUDGET - 5 and found[1].failed_at is None
    assert (found[2].explained, found[2].failed_at) == (0, 9)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_the_correct_rule_s_likelihood_of_an_output_is_the_target_s(k):
    """Summed over every cut of an output into rounds, a lossless sampler's likelihood is the
    product of p: the forward pass checked against the closed form, on distributions and tokens
    drawn at random."""
    gen = torch.Generator().manual_seed(k)
    p = torch.randn(12, 30, generator=gen, dtype=torch.float64).mul(2).softmax(-1)
    q = torch.randn(12, 30, generator=gen, dtype=torch.float64).mul(2).softmax(-1)
    tokens = torch.multinomial(p, 1, generator=gen)[:, 0]
    ll = rules.log_likelihood(*rules.chances(rules.RULES["correct"], p, q, p, p, tokens), k)
    assert ll == pytest.approx(float(p.gather(1, tokens[:, None]).log().sum()), abs=1e-9)
    for rule in rules.RULES.values():  # every rule's chances are chances
        accept, redraw, bonus = rules.chances(rule, p, q, p, p, tokens)
        assert all(0 <= a <= 1 and 0 <= r <= 1 and 0 <= a + r <= 1 + 1e-12 and 0 <= b <= 1
                   for a, r, b in zip(accept, redraw, bonus))


@pytest.mark.parametrize("bug", [None, *SAMPLING_BUGS])
def test_a_sampling_engine_s_acceptance_rule_is_named_by_the_likelihood_of_its_tokens(bug, tiny,
        tmp_path, capsys):
    """The independent decoder sampling at temperature 0.5 (its own generator: nothing of specviz's
    streams), with its residual drawn from the draft's q, or its verify at temperature 1: the rule
    is named by the likelihood ratio of its tokens; the correct sampler's tokens name none."""
    texts = builtin_set("all")[:16]
    prompts = tiny.encode(texts)
    outputs = decode(tiny.target, tiny.draft, prompts, k=K, max_new_tokens=48, batch_size=BATCH,
                     temperature=0.5, seed=1, bug=bug)
    path = tmp_path / "sampled.jsonl"
    write_outputs(path, prompts, outputs, {"k": K, "batch_size": BATCH, "drafter": "model"})
    trace = tmp_path / "check.json"
    assert cli(["check", "--outputs", str(path), "--pair", "tiny", "--dtype", "float64", "--device",
                "cpu", "--k", str(K), "--temperature", "0.5", "--trace", str(trace)]) == 0
    a = Trace.from_json(trace.read_text()).distribution.attribution
    named = [h.fault for h in a.hypotheses if h.named]
    assert named == ([bug] if bug else []), a.explanation
    printed = capsys.readouterr().out
    assert "attribution: " in printed and (f"named {bug}" in printed) == bool(bug)
    if bug is None:  # the correct sampler: no rule comes near the threshold
        assert all(not h.possible or h.log_ratio < a.threshold / 2 for h in a.hypotheses)


def test_a_casebook_mechanism_written_apart_in_a_cached_engine_is_named_on_its_forks(tiny, prompts,
                                                                                      tmp_path):
    """oMLX PR #2363's bug written into another engine (tests/cached_decoder.py: batch size 1, k 5,
    a KV cache, its prompt prefilled apart) is named on most of its forks; the same engine
    without it forks nowhere. The replica once exempted its first round, verified with the
    prefill, and was named on 2 of 12 such forks."""
    def outputs(bug):
        return [decode_one(tiny.target, tiny.draft, p, 5, BUDGET, set(tiny.eos_ids), bug)
                for p in prompts]
    settings = {"k": 5, "batch_size": 1, "drafter": "model"}
    for bug in (False, True):
        path = tmp_path / f"cached-{bug}.jsonl"
        write_outputs(path, prompts, outputs(bug), settings)
        trace = _check(tmp_path, path, (TINY_TARGET, TINY_DRAFT), "--k", "5")
        forked = [s for s in trace.sequences if s.first_divergence is not None]
        if not bug:
            assert not forked
            continue
        mechanism = ["verify-positions-not-advanced"]
        named = [s for s in forked if any(h.named and list(h.faults) == mechanism
                                          for h in s.attribution.hypotheses)]
        assert len(forked) >= 3 and len(named) > len(forked) / 2, (len(named), len(forked))
