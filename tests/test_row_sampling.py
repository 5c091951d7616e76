"""Per-request sampling settings in one batch (RunSpec.rows): greedy requests beside sampled ones,
seeded beside unseeded. A greedy row is exactly the batch-size-1 greedy reference, a sampled row
draws the same tokens whatever its batch, two requests with the same seed and prompt the same
tokens; and each of the field's bugs in per-request sampling, planted as a fault, is named by the
decision it gets wrong. On the tiny pair: cheap."""
import functools

import pytest

from specviz.cli.args import spec_of
from specviz.decoding.decoders import Job, decode_job
from specviz.decoding.reference import reference
from specviz.models.pairs import load_pair
from specviz.run.runner import run
from specviz.spec.rows import RowSampling, rows_as_text, rows_from_text
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics
from specviz.trace.share import Link
from specviz.trace.share import decode_link
from specviz.trace.share import encode_link

PROMPTS = ("Write a short poem about the sea.", "Explain recursion.", "List three fruits.")
# Prompt i gets ROWS[i % 3], and with three prompts the same one each time: sequences 2 and 5 are
# the same seeded request, 1 and 4 the same unseeded one.
ROWS = ({"temperature": 0}, {"temperature": 0.8, "top_p": 0.95}, {"top_k": 20, "seed": 7})
GREEDY_SEQS = (0, 3)


def _spec(dtype="float32", **fields) -> RunSpec:
    fields = {"method": "eqspec", "batch_size": 3, "k": 3, "max_new_tokens": 12,
              "prompts": PROMPTS * 2, "rows": ROWS, **fields}
    return RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype=dtype, device="cpu", **fields)


@functools.cache
def _ids(spec: RunSpec) -> list[list[int]]:
    """The spec's tokens, decoded alone (no trace, no judge), once per spec."""
    pair = load_pair(spec.target, spec.draft, dtype=spec.dtype, device="cpu")
    return [o.ids
            for o in decode_job(Job(spec, pair, pair.encode(list(spec.prompts)),
                                    record=False)).outputs]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_greedy_rows_beside_sampled_ones_are_the_greedy_reference(dtype):
    spec = _spec(dtype)
    pair = load_pair(spec.target, spec.draft, dtype=dtype, device="cpu")
    greedy = [pair.encode(list(spec.prompts))[i] for i in GREEDY_SEQS]
    want = [o.ids for o in reference(pair, greedy, spec.max_new_tokens).outputs]
    for method in ("eqspec", "exspec"):
        got = _ids(_spec(dtype, method=method))
        assert [got[i] for i in GREEDY_SEQS] == want, method


def test_sampled_rows_draw_the_same_tokens_whatever_their_batch():
    """In float64 (batching changes no probability that matters): batch sizes 1, 3 and 8 emit the
    same tokens; the two requests seeded alike with one prompt emit the same tokens, the two
    unseeded ones with one prompt do not."""
    ids = [_ids(_spec("float64", batch_size=bs)) for bs in (1, 3, 8)]
    assert ids[0] == ids[1] == ids[2]
    assert ids[0][2] == ids[0][5] and ids[0][1] != ids[0][4]


def test_a_run_with_per_request_settings_is_judged_consistent_and_its_link_carries_them():
    trace = run(_spec())
    assert (trace.distribution.verdict == "consistent"
            and not trace.distribution.settings), trace.distribution
    assert metrics.sampled_verdict(trace)[0] == "consistent"
    assert decode_link(encode_link(Link(trace.manifest.spec))).spec == trace.manifest.spec


@pytest.mark.parametrize("rows,problem", [
    (({"temperature": 0, "top_k": 5},), "greedy request"),
    (({"temperature": -1},), "greater than or equal to 0"),
    (({"seed": "x"},), "seed"),
    (({"temp": 1},), "temp"),
])
def test_bad_per_request_settings_are_refused(rows, problem):
    with pytest.raises(SpecError, match=problem):
        _spec(rows=rows)


def test_per_request_settings_replace_the_runs_and_their_faults_need_them():
    with pytest.raises(SpecError, match="replace the run's temperature"):
        _spec(temperature=0.5)
    with pytest.raises(SpecError, match="need per-request sampling settings"):
        _spec(rows=(), temperature=0.8, faults=("settings-from-first-row",))
    with pytest.raises(SpecError, match="temperature above 0 in some request"):
        _spec(rows=({"temperature": 0},), faults=("unseeded-noise-to-copy",))
    assert _spec(rows=({"temperature": 0},)).greedy and not _spec().greedy


@pytest.mark.parametrize("fault", ["settings-from-first-row", "unset-temperature-greedy"])
def test_a_row_sampled_with_settings_not_its_own_is_named_by_its_settings(fault):
    """Each flagged sequence fits settings not its own; an unset temperature read as greedy flags
    exactly the request that left it unset, and greedy decoding fits it."""
    trace = run(_spec(faults=(fault,)))
    assert (metrics.sampled_verdict(trace)[0]
            == "decision-bug:settings"), metrics.sampled_verdict(trace)
    fits = trace.distribution.settings
    assert fits and all((f.temperature, f.top_k, f.top_p) != RowSampling(**ROWS[f.seq % 3]).target()
                        for f in fits)
    if fault == "unset-temperature-greedy":
        assert {f.seq for f in fits} == {2, 5} and {f.temperature for f in fits} == {0}


def test_unseeded_noise_never_written_breaks_only_the_unseeded_rows_of_a_mixed_batch():
    """The greedy requests are unseeded too: their residual, drawn with 0, is token 0 (vLLM #9441
    hit them)."""
    trace = run(_spec(faults=("unseeded-noise-to-copy",)))
    assert (metrics.sampled_verdict(trace)[0]
            == "decision-bug:stream"), metrics.sampled_verdict(trace)
    right, ids = _ids(_spec()), [s.output_ids for s in trace.sequences]
    seeded = {i for i in range(len(ids)) if i % 3 == 2}
    assert (all(ids[i] == right[i] for i in seeded)
            and not seeded & {s for _, s, _ in trace.decisions.stream_first})
    assert any(ids[i] != right[i] for i in set(range(len(ids))) - seeded)
    # no seeded request: nothing breaks
    unmixed = {"rows": ROWS[1:2], "prompts": PROMPTS, "max_new_tokens": 8}
    assert _ids(_spec(faults=("unseeded-noise-to-copy",), **unmixed)) == _ids(_spec(**unmixed))


def test_a_stream_advanced_for_a_row_without_drafts_keeps_the_distribution_and_is_named_by_stream():
    """Prompt lookup drafts for the repeating prompt and for no other: in its rounds the others'
    streams advance. Their tokens stay the target's distribution; only their draws, checked against
    their own streams, show it."""
    prompts = ("one two one two one two one two one two", "Explain recursion.",
               "List three fruits.")
    fields = {"drafter": "lookup", "prompts": prompts * 2, "rows": ROWS[1:], "chat_template": False}
    trace = run(_spec(faults=("stream-advanced-for-zero-draft",), **fields))
    assert trace.distribution.verdict == "consistent", trace.distribution
    assert (metrics.sampled_verdict(trace)[0]
            == "decision-bug:stream"), metrics.sampled_verdict(trace)
    # never in another's round
    alone = {**fields, "prompts": prompts[:2], "batch_size": 1, "max_new_tokens": 8}
    assert _ids(_spec(faults=("stream-advanced-for-zero-draft",), **alone)) == _ids(_spec(**alone))


def test_target_probabilities_zeroed_in_place_reject_every_draft_and_break_the_distribution():
    """Every row audited: its states clean and its decisions following their record, the rule
    is to blame."""
    trace = run(_spec(faults=("target-probs-mutated",), prompts=PROMPTS, max_new_tokens=8, audit=3))
    assert trace.distribution.verdict == "not the target's distribution", trace.distribution
    assert all(r.accepted == 0 for r in trace.rows) and trace.decisions.mismatches == 0
    assert metrics.sampled_verdict(trace)[0] == "sampler-bug:rule", metrics.sampled_verdict(trace)


def test_the_command_line_and_the_page_take_per_request_settings():
    from specviz.app.form import spec_from_controls
    from specviz.cli.main import parser

    args = parser().parse_args(["run", "--pair", "tiny", "--row", "temperature=0", "--row",
                                "top_k=20,seed=7"])
    assert spec_of(args).rows == (RowSampling(temperature=0), RowSampling(top_k=20, seed=7))
    spec = spec_from_controls(pair="tiny", rows=rows_as_text(spec_of(args).rows))
    assert spec.rows == spec_of(args).rows
    with pytest.raises(SystemExit):
        parser().parse_args(["run", "--row", "temperature"])
    with pytest.raises(SpecError, match="key=value pairs"):
        rows_from_text("temperature=0.5\nhot=1")


def test_runs_without_per_request_settings_keep_their_keys_and_a_subset_keeps_each_request():
    assert ("rows" not in _spec(rows=(), temperature=0.8).canonical_json()
            and "rows" in _spec().canonical_json())
    spec = _spec(prompts=("a", "b", "c", "d"))
    assert spec.on_prompts(["b", "d"]).rows == (spec.rows[1], spec.rows[0])
