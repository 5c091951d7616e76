"""The reference proved by teacher forcing (forensics/proof.py) is the reference decoded token by
token: the same ids, forks and verdicts, on correct engines and on every catalogued fault, in
float32 and bfloat16; and it decodes exactly where a proof cannot reach (a fork, a near-tie, an
output that stops short)."""
import json
import re

import pytest
import torch

from specviz.cli import main as cli
from specviz.decoding.eqspec import eqspec
from specviz.decoding.reference import batched_reference
from specviz.engines.base import EngineRun
from specviz.forensics import enginenoise, proof
from specviz.forensics.recompute import fresh_logits
from specviz.models.pairs import load_pair
from specviz.run import check
from specviz.run.runner import reference_for
from specviz.spec.faults import FAULT_PRESETS, of_kind
from specviz.spec.prompts import builtin_set
from specviz.spec.run import ENGINE, TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.trace.records import EngineOutput
from specviz.trace.schema import Trace

BUDGET = 24
PROMPTS = builtin_set("chat") + builtin_set("code")
SYNC_FAULTS = list(of_kind("breaking", "wasteful"))


def _engine(name: str, outputs: list[list[int]]) -> EngineRun:
    return EngineRun(name=name, source="callable",
                     outputs=[EngineOutput(ids=ids) for ids in outputs])


def _both_ways(pair, engine: EngineRun, control: EngineRun | None = None, prompts=PROMPTS,
               **spec) -> tuple[Trace, Trace]:
    run = RunSpec.build(target=pair.info["target"], draft=pair.info["draft"],
                        dtype=str(pair.dtype).removeprefix("torch."),
                        device="cpu", prompts=tuple(prompts), method=ENGINE, max_new_tokens=BUDGET,
                        **spec)
    ids = pair.encode(prompts)
    return (check.check(run, pair, ids, engine, control, check.Judging(decode_reference=True)),
            check.check(run, pair, ids, engine, control))


def _assert_agree(decoded: Trace, proved: Trace) -> None:
    for d, p in zip(decoded.sequences, proved.sequences, strict=True):
        assert d.reference_proof is None and p.reference_proof is not None
        assert p.reference_ids == d.reference_ids, p.seq
        assert (p.first_divergence, p.equivalent) == (d.first_divergence, d.equivalent), p.seq
        assert (p.forensics and p.forensics.verdict) == (d.forensics and d.forensics.verdict), p.seq
        assert p.reference_proof.proved + p.reference_proof.decoded == len(p.reference_ids)


# Every fault in float32; in bfloat16 (whose near-ties the proof decodes, tested below) the
# presets, which combine six of the single faults (each single one there cost CI 20 s more).
CASES = [*((f, "float32") for f in [(), *((f,) for f in SYNC_FAULTS)]),
         *(((p,), dtype) for p in FAULT_PRESETS for dtype in ("float32", "bfloat16")),
         ((), "bfloat16")]


@pytest.mark.parametrize("faults, dtype", CASES, ids=str)
def test_a_proved_reference_is_the_decoded_one_with_the_same_verdicts(faults, dtype):
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype=dtype, device="cpu")
    ids = pair.encode(PROMPTS)
    engine = _engine("eqspec",
                     [o.ids for o in eqspec(pair, ids, 4, 4, BUDGET, faults=faults).outputs])
    control = _engine("batched", [o.ids for o in batched_reference(pair, ids, 4, BUDGET).outputs])
    decoded, proved = _both_ways(pair, engine, control, k=4)
    _assert_agree(decoded, proved)
    # a correct engine in float32: its whole output is the reference, proved
    if not faults and dtype == "float32":
        assert all(s.reference_proof.decoded == 0 for s in proved.sequences)


def test_in_bfloat16_where_the_tolerance_covers_most_margins_near_ties_are_decoded_from_prompts():
    """In bfloat16 the tolerance covers most of the tiny pair's margins: proofs stop at near-ties
    within a token or two, and a reference decoded on from a proved prefix could round otherwise
    than the plain one (it did, before near-ties were decoded from the prompt)."""
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype="bfloat16", device="cpu")
    prompts = builtin_set("all")
    ids = pair.encode(prompts)
    engine = _engine("batched", [o.ids for o in batched_reference(pair, ids, 4, BUDGET).outputs])
    decoded, proved = _both_ways(pair, engine, prompts=prompts, k=4)
    _assert_agree(decoded, proved)
    past_the_first = [s.reference_proof for s in proved.sequences
                      if re.match(r"a near-tie at token [1-9]", s.reference_proof.stop)]
    # proved past token 0, then decoded whole from the prompt
    assert past_the_first and all(p.proved == 0 for p in past_the_first)


def test_the_proof_stops_at_a_fork_and_the_rest_is_decoded(tiny):
    ids = tiny.encode(PROMPTS)
    truth = reference_for(tiny, ids, BUDGET).outputs
    planted = [list(o.ids) for o in truth]
    planted[1][5] = (planted[1][5] + 1) % tiny.vocab_size  # a token the target would not write
    decoded, proved = _both_ways(tiny, _engine("planted", planted))
    _assert_agree(decoded, proved)
    p = proved.sequences[1].reference_proof
    assert (p.proved, p.source) == (5, "engine") and p.stop.startswith("a fork at token 5")
    assert p.decoded == len(truth[1].ids) - 5 and proved.sequences[1].reference_ids == truth[1].ids
    assert proved.sequences[1].first_divergence == 5 and proved.sequences[1].forensics is not None


def test_a_short_output_is_proved_as_far_as_it_goes(tiny):
    ids = tiny.encode(PROMPTS)
    truth = reference_for(tiny, ids, BUDGET).outputs
    decoded, proved = _both_ways(tiny, _engine("cut short", [o.ids[:10] for o in truth]))
    _assert_agree(decoded, proved)
    for s, t in zip(proved.sequences, truth):
        assert s.reference_ids == t.ids and s.reference_proof.proved == min(10, len(t.ids))
        if len(t.ids) > 10:
            assert "short of the budget" in s.reference_proof.stop and s.first_divergence == 10


def test_near_ties_are_decoded_not_proved(tiny, monkeypatch):
    """A tolerance wider than every margin (a dtype that rounds that coarsely) proves nothing: every
    token is a near-tie, and the reference decoded from the prompt on is the plain one."""
    ids = tiny.encode(PROMPTS)
    truth = reference_for(tiny, ids, BUDGET).outputs
    monkeypatch.setattr(check, "calibrated_tolerance", lambda spec, pair: 1e9)
    decoded, proved = _both_ways(tiny, _engine("reference", [o.ids for o in truth]))
    _assert_agree(decoded, proved)
    for s in proved.sequences:
        assert (s.reference_proof.proved == 0
                and s.reference_proof.stop.startswith("a near-tie at token 0"))


def test_the_longer_proof_of_engine_and_control_is_taken_and_recorded_in_the_trace(tiny):
    ids = tiny.encode(PROMPTS)
    truth = [o.ids for o in reference_for(tiny, ids, BUDGET).outputs]
    broken = [t[:3] + [(t[3] + 1) % tiny.vocab_size] + t[4:] if len(t) > 3 else t for t in truth]
    _, proved = _both_ways(tiny, _engine("broken", broken), _engine("control", truth))
    back = Trace.from_json(proved.to_json())
    for s, t in zip(back.sequences, truth):
        assert (s.reference_proof.source == "control" and s.reference_proof.decoded == 0
                and s.reference_ids == t)
        assert s.reference_proof.smallest_margin > s.reference_proof.tolerance
    old = json.loads(proved.to_json()) | {"schema_version": 6}
    for s in old["sequences"]:
        s.pop("reference_proof")
    assert all(s.reference_proof is None for s in Trace.from_json(json.dumps(old)).sequences)


def _cli_check(tmp_path, *extra) -> Trace:
    out = tmp_path / "check.json"
    assert cli.main(["check", "--pair", "tiny", "--dtype", "float32", "--device", "cpu",
                     "--prompt-set", "chat", "--max-new-tokens", str(BUDGET), "--engine",
                     "test_check:dsd_like", "--control-engine",
                     "test_check:no_speculation", "--trace", str(out), *extra]) == 0
    return Trace.from_json(out.read_text())


def test_a_check_that_stops_resumes_from_its_checkpoint_and_judges_alike(tmp_path, monkeypatch,
                                                                         tiny):
    whole = _cli_check(tmp_path)
    saved, forced = tmp_path / "rows.jsonl", []
    real = enginenoise.force

    def crash_on_the_fourth_prompt(forcing, prompt, output):
        forced.append(prompt)
        if len({tuple(p) for p in forced}) == 4:
            raise MemoryError  # the machine ran out, mid-check
        return real(forcing, prompt, output)

    monkeypatch.setattr(enginenoise, "force", crash_on_the_fourth_prompt)
    with pytest.raises(MemoryError):
        _cli_check(tmp_path, "--checkpoint", str(saved))
    assert len(saved.read_text().splitlines()) == 1 + 3  # the header, and the three prompts judged
    with saved.open("a") as f:
        f.write('{"seq": 3, "outputs": {"engine": [1, 2')  # a line the stop cut short
    forced.clear()
    monkeypatch.setattr(enginenoise, "force", lambda *a: forced.append(a[1]) or real(*a))
    resumed = _cli_check(tmp_path, "--checkpoint", str(saved))
    # only the prompts left
    assert {tuple(p) for p in forced} == {tuple(p.ids) for p in whole.prompts[3:]}
    for a, b in zip(whole.sequences, resumed.sequences, strict=True):
        assert (a.reference_ids, a.gaps, a.forensics, a.reference_proof) == (b.reference_ids,
                                                                             b.gaps, b.forensics,
                                                                            b.reference_proof)


def test_the_same_outputs_checked_again_are_neither_forced_nor_decoded_again_and_are_judged_alike(
        tiny,
                                                                                                 monkeypatch):
    """A user checks the same file twice, or another engine beside the same control: what the first
    check read of each output and decoded of each reference is kept for the process (run/runner.py),
    not computed again."""
    ids = tiny.encode(PROMPTS)
    planted = [list(o.ids) for o in reference_for(tiny, ids, BUDGET).outputs]
    # a fork: the reference is decoded on after it
    planted[1][5] = (planted[1][5] + 1) % tiny.vocab_size
    planted[2] = planted[2][:3]  # an output cut short: decoded on after it too
    engine = _engine("planted", planted)
    first = _both_ways(tiny, engine)[1]
    assert sum(s.reference_proof.decoded > 0 for s in first.sequences) >= 2

    def again(*args, **kwargs):
        raise AssertionError("computed again")

    monkeypatch.setattr(enginenoise.TeacherForcing, "__call__", again)
    monkeypatch.setattr(proof.decoding, "reference", again)
    run = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float64", device="cpu",
                        prompts=PROMPTS, method=ENGINE, max_new_tokens=BUDGET)
    second = check.check(run, tiny, ids, engine)
    for a, b in zip(first.sequences, second.sequences, strict=True):
        assert (a.reference_ids, a.gaps, a.forensics, a.reference_proof) == (b.reference_ids,
                                                                             b.gaps, b.forensics,
                                                                            b.reference_proof)


def test_a_checkpoint_of_another_check_is_refused_and_changed_answers_are_judged_again(tmp_path,
        capsys, tiny):
    saved = tmp_path / "rows.jsonl"
    _cli_check(tmp_path, "--checkpoint", str(saved))
    assert cli.main(["check", "--pair", "tiny", "--dtype", "float32", "--device", "cpu",
                     "--prompt-set", "code", "--engine", "test_check:correct", "--checkpoint",
                     str(saved)]) == 2
    assert "not this check's checkpoint" in capsys.readouterr().err
    rows = [json.loads(line) for line in saved.read_text().splitlines()]
    # the engine answered otherwise, then
    rows[1]["outputs"]["engine"] = rows[1]["outputs"]["engine"][:-1]
    saved.write_text("".join(json.dumps(r) + "\n" for r in rows))
    resumed = _cli_check(tmp_path, "--checkpoint", str(saved))
    again = [json.loads(line) for line in saved.read_text().splitlines()[len(rows):]]
    assert [r["seq"] for r in again] == [0]  # judged again: the one row whose outputs differ
    assert resumed.sequences[0].output_ids == again[0]["outputs"]["engine"]


def test_teacher_forcing_keeps_the_prefix_of_the_last_prompt_and_reads_what_a_fresh_pass_reads(
        tiny):
    """The chat template's prefix is computed once for a run of prompts, each prompt's own tokens in
    its first output's pass, and each output's logits are still those of one fresh pass over its
    prompt and output."""
    model = tiny.target
    fed = []
    handle = model.register_forward_pre_hook(
        lambda m, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    forcing = enginenoise.TeacherForcing(model, tiny.vocab_size)
    a, b = tiny.encode(["Name three primes.", "Why is the sky blue?"])
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert shared > 10  # the chat template's system prompt and turn header
    output = [100, 200, 300, 42, 7]
    try:
        for prompt, prefilled in ((a, len(a) - 1), (b, len(b) - 1 - shared), (b[:shared + 1], 0)):
            fed.clear()
            logits = forcing(prompt, output)
            assert fed == [prefilled + len(output)]
            fresh = fresh_logits(model, prompt + output[:-1], len(output), tiny.vocab_size)
            assert torch.allclose(logits, fresh, rtol=0, atol=1e-9)
    finally:
        handle.remove()
