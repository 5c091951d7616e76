"""llama.cpp's llama-server, built from a pinned source (`make llama`), on the embedded pair:
without speculation in 1 and 4 slots, with the embedded draft converted to GGUF, with the target as
its own draft, and with ngram-simple prompt lookup. Each is asked in llama.cpp's own dialect,
compared with its own plain run and with the float32 reference, and judged against its own rounding
(its plain run is the control): a correct engine gets no engine-bug, and every verdict carries
its numbers."""
import json

import httpx
import pytest
from conftest import ENGINE_THREADS, attribute_every_fork

from specviz.engines.dialects import LlamaCpp
from specviz.engines.llamacpp import llama_server
from specviz.engines.server import from_server
from specviz.run import check
from specviz.spec.prompts import builtin_set
from specviz.spec.run import RunSpec
from specviz.trace import metrics

NEW_TOKENS = 48
K = 5
# Spec-Bench questions where llama.cpp's outputs with and without speculation part
# (batch-shape rounding).
PROMPTS = tuple(builtin_set("spec-bench")[8:16])
# name -> (mode, slots): the control of every 4-slot configuration is "plain, 4 slots".
CONFIGS = {"plain, 1 slot": ("none", 1), "plain, 4 slots": ("none", 4), "draft": ("draft", 4),
           "draft = target": ("self", 4), "ngram-simple": ("ngram", 4)}
# declared to draft with the check's draft model: its acceptance judged
DRAFTS_WITH_THE_PAIRS_DRAFT = ("draft",)
SPECULATIVE = ("draft", "draft = target", "ngram-simple")


@pytest.fixture(scope="module")
def llama(embedded, tmp_path_factory):
    """Every configuration's run on the same prompts, one server at a time: (spec, prompt ids, name
    -> run, the draft configuration's run with stop strings)."""
    logs = tmp_path_factory.mktemp("llama")
    spec = RunSpec.build(prompts=PROMPTS, method="engine", max_new_tokens=NEW_TOKENS, device="cpu",
                         k=K)
    ids = embedded.encode(PROMPTS)
    runs = {}
    for name, (mode, slots) in CONFIGS.items():
        with llama_server(mode, logs / f"{mode}-{slots}.log", slots=slots, k=K,
                          threads=ENGINE_THREADS) as server:
            runs[name] = from_server(server.url, None, ids, NEW_TOKENS, concurrency=slots,
                                     tokenizer=embedded.tokenizer, launch=server.launch,
                                     drafter="model" if name in DRAFTS_WITH_THE_PAIRS_DRAFT
                                     else None)
            if mode == "draft":
                stopped = from_server(server.url, None, ids, NEW_TOKENS, concurrency=slots,
                                      tokenizer=embedded.tokenizer, stop=STOPS)
    return spec, ids, runs, stopped


STOPS = (", ", ".\n")


def test_with_stop_strings_its_ids_end_at_the_token_that_completes_one(llama, embedded):
    """Sent stop strings, llama.cpp (speculating with the draft) ends its ids at the token whose
    text completes one, that token kept, as vLLM's do and specviz reads them."""
    from specviz.decoding.stops import Stops

    stops = Stops.of(embedded, STOPS)
    at_stop = [out for out in llama[3].outputs
               if out.finish_reason == "stop" and out.ids[-1] not in embedded.eos_ids]
    assert at_stop, "a stop string ends some output"
    for out in at_stop:
        assert stops.end(out.ids) == len(out.ids), out.ids


def test_llama_cpp_is_asked_in_its_own_dialect_and_answers_with_ids(llama, embedded):
    runs = llama[2]
    for name, run in runs.items():
        assert run.name == "llama.cpp" and run.version and run.settings["api"] == "llama.cpp", name
        for out in run.outputs:
            assert (out.error, out.approximate) == (None, False), (name, out.error)
            assert 0 < len(out.ids) <= NEW_TOKENS  # the EOS id included, where it stopped on one
            assert out.finish_reason == ("stop" if out.ids[-1] in embedded.eos_ids else "length")
            # speculating, llama.cpp gives none past a request's first drafted round
            if out.logprobs is None:
                assert name in SPECULATIVE and out.top_logprobs is None and out.drafts
                continue
            assert len(out.logprobs) == len(out.top_logprobs) == len(out.ids)
            # Greedy: each token is the most likely of the alternatives llama.cpp reports, by id.
            assert all(max(top, key=top.get) == tok for tok, top in zip(out.ids, out.top_logprobs))
        counters = run.settings["spec_decode"]
        # a request it drafted nothing for says nothing
        drafts = sum(o.drafts or 0 for o in run.outputs)
        # speculation ran: drafts offered, some accepted, counted per request and in total
        if name in SPECULATIVE:
            assert drafts > 0 and counters["draft_tokens"] == drafts
            assert (0 < counters["accepted_tokens"]
                    == sum(o.accepted or 0 for o in run.outputs) <= drafts)
        else:
            assert drafts == 0 and counters.get("draft_tokens", 0) == 0


@pytest.fixture(scope="module")
def judged(llama, embedded):
    """Each 4-slot configuration checked with its plain run as the control (plain, 4 slots: the
    1-slot run), its forks not attributed: name -> trace."""
    spec, ids, runs, _ = llama
    # the forks are attributed on purpose in test_no_fork_of_a_correct_configuration_is_attributed
    no_replays = check.Judging(attribute=False)
    control = {"plain, 4 slots": "plain, 1 slot"} | {name: "plain, 4 slots" for name in SPECULATIVE}
    return {name: check.check(spec, embedded, ids, runs[name], runs[of], no_replays)
            for name, of in control.items()}


def test_every_configuration_against_its_plain_run_and_the_reference(llama, judged, capsys):
    """Equal counts and acceptance for the record; then each judged with its plain run as the
    control: a correct engine's forks are its own numerics (or unexplained, saying why), never an
    engine-bug; and the one declared to draft with the check's draft model drafts its own proposals
    by its counters."""
    _, ids, runs, _ = llama
    plain, traces = runs["plain, 4 slots"], judged
    # proved or decoded: the bs-1 reference
    ref = [s.reference_ids for s in traces["plain, 4 slots"].sequences]
    with capsys.disabled():
        print(f"\nllama.cpp {runs['plain, 1 slot'].version}, embedded Q4_1 target, {len(ids)} "
              f"prompts, {NEW_TOKENS} tokens")
        for name, run in runs.items():
            same = sum(a.ids == b.ids for a, b in zip(run.outputs, plain.outputs))
            equal = sum(a.ids == r for a, r in zip(run.outputs, ref))
            c = run.settings["spec_decode"]
            acceptance = (f"{c['accepted_tokens']:.0f}/{c['draft_tokens']:.0f}"
                          if c.get("draft_tokens") else "-")
            print(f"  {name:<16} equal to plain 4 slots {same:>2}/{len(ids)}, to the float32 "
                  f"reference {equal:>2}/{len(ids)}, drafts accepted {acceptance}")
        for name in DRAFTS_WITH_THE_PAIRS_DRAFT:
            a = traces[name].acceptance
            print(f"  {name}: by its counters {a.accepted}/{a.compared} drafts accepted, the "
                  f"float32 draft's replay at k = {K} {a.accepted_fresh}/{a.offered_fresh}: "
                  f"{a.verdict or 'its own drafts'}")
    for name, trace in traces.items():
        a = trace.acceptance
        # a correct engine's drafts are not short of its draft model's own
        if name in DRAFTS_WITH_THE_PAIRS_DRAFT:
            assert a.counters and a.verdict is None and a.per_position == [], a.explanation
        else:
            assert a is None, name
        noise = trace.manifest.yardstick.engine
        assert (noise.source == "control" and noise.truth == "float64" and noise.tolerance > 0
                and not noise.outliers)
        engine, control_fidelity = trace.manifest.fidelity
        # A quantized engine departs from the model with and without speculation: reported,
        # not a verdict.
        assert engine.departures > 0 and control_fidelity.departures > 0
        for s in trace.sequences:
            f = s.forensics
            if f is None:
                continue
            assert f.verdict in ("numerics", "unexplained"), (name, s.seq, f.explanation)
            assert f.tolerance == noise.tolerance and f"{f.tolerance:.3g}" in f.explanation


def test_no_fork_of_a_correct_configuration_is_attributed(llama, judged, embedded, capsys):
    """Every fork of llama.cpp with the draft model (its quantized kernels' rounding) among its
    first 4 prompts (one batch of its 4 slots), attributed on purpose: no mechanism of the
    catalogue is named. (The other 4 prompts' forks, and ngram-simple's, are the same kernels'
    rounding; attributing them too cost CI another 240 s.)"""
    spec, ids, _, _ = llama
    declared = {"draft": {"drafter": "model", "k": K}}
    for name, settings in declared.items():
        trace = judged[name].model_copy(deep=True)  # attribution is recorded into it
        with capsys.disabled():
            _, named = attribute_every_fork(trace, spec, embedded, ids, settings, 4,
                                            f"llama.cpp {name}", rows=4)
        assert not named, (name, named)


def test_the_target_as_its_own_draft_is_accepted_but_where_batch_shapes_round_apart(llama):
    run = llama[2]["draft = target"]
    c = run.settings["spec_decode"]
    # the same weights: only rounding can reject a draft
    assert c["accepted_tokens"] >= 0.9 * c["draft_tokens"]


def test_a_file_of_raw_llama_cpp_answers_is_read_and_judged(llama, embedded, tmp_path):
    """A user's dump of requests and responses (sent one at a time: other batch shapes than the live
    run's, so other outputs in places), with a field specviz does not read: every answer read, none
    an engine-bug."""
    spec, ids, _, _ = llama
    ask = LlamaCpp("", NEW_TOKENS, 0.0, 1.0, 0, 5)
    with llama_server("ngram", tmp_path / "ngram.log", slots=4, k=K,
                      threads=ENGINE_THREADS) as server:
        dumps = [{"request": ask.request(p, None),
                  "response": httpx.post(f"{server.url}/completion", json=ask.request(p, None),
                                         timeout=300).json(),
                  "seq": i}
                 for i, p in enumerate(ids)]
    path = tmp_path / "dump.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in dumps))
    filed = check.from_files(spec, embedded, (path.read_bytes(), path.name),
                             judging=check.Judging(attribute=False))
    assert filed.manifest.engine.ignored == ["seq"]
    assert [s.output_ids for s in filed.sequences] == [d["response"]["tokens"] for d in dumps]
    assert [s.engine.drafts for s in filed.sequences] == [d["response"]["timings"].get("draft_n")
                                                          for d in dumps]
    [row] = metrics.engine_summary(filed)
    assert row["n"] == len(ids) and "engine-bug" not in row["verdicts"]


def test_the_determinism_check_asks_again_and_reports_what_differs(llama, embedded, tmp_path):
    spec = llama[0]
    with llama_server("ngram", tmp_path / "ngram.log", slots=4, k=K,
                      threads=ENGINE_THREADS) as server:
        # its forks are attributed in test_no_fork_of_a_correct_configuration_is_attributed
        trace = check.from_servers(spec, embedded, (server.url, None), None, concurrency=4,
                                   timeout=300, determinism=True,
                                   judging=check.Judging(attribute=False))
    d = trace.manifest.determinism
    assert set(d.runs) == {"again", "reordered"} and d.prompts == len(PROMPTS)
    for r in d.differing:  # any difference is reported with its fork and both tokens
        first = trace.sequences[r.seq].output_ids
        assert r.index == 0 or first[r.index - 1] is not None
        assert r.first == (first[r.index] if r.index < len(first) else None) and r.first != r.then
    print(d.describe())


def test_a_sampled_check_of_llama_cpp_speculating_with_the_draft_is_consistent(embedded, tmp_path):
    """At temperature 0.8, each request seeded, every other sampler off: llama.cpp's tokens, drafted
    by the embedded draft, judged by their distribution under the target. Top-p stays 1: the Q4_1
    engine's nucleus boundary is not the float32 target's, and at top-p 0.95 it emits, with or
    without speculation, about one token in 570 that the target's nucleus leaves
    out (docs/engines.md)."""
    spec = RunSpec.build(prompts=PROMPTS, method="engine", max_new_tokens=NEW_TOKENS, device="cpu",
                         k=K, temperature=0.8)
    with llama_server("draft", tmp_path / "draft.log", slots=4, k=K,
                      threads=ENGINE_THREADS) as server:
        trace = check.from_servers(spec, embedded, (server.url, None), None, concurrency=4,
                                   timeout=300, drafter="model")
    sent = trace.manifest.engine.settings["sampling"]
    assert ((sent["temperature"], sent["top_p"], sent["samplers"])
            == (0.8, 1.0, ["temperature", "top_k", "top_p"]))
    assert (sent["min_p"] == 0 and sent["top_k"] == 0
            and sum(s.engine.drafts or 0 for s in trace.sequences) > 0)
    d = trace.distribution
    assert d.verdict == "consistent" and d.impossible == 0, d
    # most of the budget judged (a sample may stop at EOS)
    assert d.tokens > len(PROMPTS) * NEW_TOKENS / 2, d
    # Its tokens scored under every acceptance rule of the catalogue: a correct sampler's name none.
    rules = d.attribution
    assert rules is not None and not any(h.named for h in rules.hypotheses), rules.explanation
    print("\nllama.cpp sampled with the draft: the likeliest wrong rule "
          f"{rules.hypotheses[0].fault} at {rules.hypotheses[0].log_ratio} nats over the correct "
          f"one (naming needs {rules.threshold:.1f})")

