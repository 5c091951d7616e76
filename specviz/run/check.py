"""`specviz check`: did speculative decoding change an engine's outputs, and is each difference
numerics or a bug?

The engine (a file of its outputs, an OpenAI-compatible server, a Python callable; engines/) answers
the prompts; specviz teacher-forces its outputs through the target in float64, proves the
batch-size-1 reference of the same weights from them as far as their margins reach and decodes it
from there (forensics/proof.py), measures its own rounding (yardstick.py), and judges every
difference from outside (forensics.judge_engine). A control run of the same engine without
speculation, when given, measures that engine's own rounding (enginenoise.py): a fork within it is
the engine's numerics, one beyond it a bug. The result is a trace like any other,
of method `engine`.

A sampled check (the spec's temperature above 0, with its top-k, top-p and seed) has no token
reference: the engine samples (a server is asked with those settings, a callable is told them, a
file is taken as it is), and its tokens, by their ids alone, are scored under the target recomputed
at batch size 1 with the same temperature, top-k and top-p: their randomized PIT must
be uniform (distribution.judge_distribution).
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from specviz.decoding.recording import build_trace
from specviz.decoding.reference import reference
from specviz.decoding.result import DecodeResult, Progress, SequenceOutput
from specviz.decoding.sampling import greedy_of, sampling_of
from specviz.decoding.stops import Stops
from specviz.engines import jsonl, python, server
from specviz.engines.base import EngineRun
from specviz.engines.jsonl import OutputLine
from specviz.forensics import distribution, enginenoise, proof, repeats, rules
from specviz.forensics.engineacceptance import head_drafts, judge_engine_acceptance, model_drafts
from specviz.forensics.blackbox import force_outputs, judge_engine
from specviz.forensics.rejections import (engine_rounds, judge_rejections,
                                         judge_sampled_rejections, run_rounds)
from specviz.forensics.sampledrun import judge_sampled_run
from specviz.forensics.scores import judge_scores
from specviz.models.eagle3 import MISFEEDINGS
from specviz.models.pairs import ModelPair
from specviz.models.heads import head_for
from specviz.run import attribution
from specviz.run.checkpoint import Checkpoint
from specviz.run.launch import (gather_from_ranks, is_main, my_share, on_main, rank,
                                wait_for_everyone, world_size)
from specviz.run.runner import Phases, calibrated_tolerance, checked, encode, phase, yardsticks_for
from specviz.run.settings import Settings
from specviz.run.stopped import past_stops_cut
from specviz.spec.drafters import DRAFTERS
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError, describe_validation_error
from specviz.trace.findings import Findings
from specviz.trace.records import EngineInfo, RoundRecord, RowRecord
from specviz.trace.schema import Trace


def prompts_of_outputs(lines: list[OutputLine], pair: ModelPair,
                       chat_template: bool) -> tuple[list[str], list[list[int]]]:
    """The prompts of an outputs file, as text and as ids: ids as given, text through the tokenizer
    (and the chat template, as for any run)."""
    ids = [line.prompt_ids or pair.encode([line.prompt], chat_template)[0] for line in lines]
    texts = [line.prompt if line.prompt is not None else pair.tokenizer.decode(line.prompt_ids)
             for line in lines]
    return texts, ids


@dataclass(frozen=True)
class Judging:
    """How a check judges, whatever the engine's source."""

    # decode every reference token by token, as a run does, instead of proving it
    decode_reference: bool = False
    # (phase, n): n more tokens teacher-forced ("teacher forcing") or decoded ("reference")
    progress: Phases | None = None
    # keeps every prompt's work as it is done, for the same check run again
    checkpoint: Path | None = None
    # replay each fork not put down to rounding under the catalogue's faults (attribution.py)
    attribute: bool = True


def from_files(spec: RunSpec, pair: ModelPair, outputs: tuple[bytes, str],
               control: tuple[bytes, str] | None = None,
               limits: Settings | None = None, judging: Judging = Judging(),
               drafter: str | None = None) -> Trace | None:
    """Check an engine from its outputs file ((content, name); docs/engines.md), and its control
    run's file. The prompts are the file's; the reference's budget is its longest output. `drafter`:
    what the engine drafts with (spec/drafters.DRAFTERS), where its header does
    not say otherwise."""
    header, lines, ignored = jsonl.parse(*outputs)
    texts, ids = prompts_of_outputs(lines, pair, spec.chat_template)
    if limits:
        limits.check_prompt_ids(ids)
    engine = jsonl.from_lines(header, lines, pair.tokenizer, outputs[1], ignored, drafter)
    # the engine's budget, as far as the file shows it
    budget = max(1, *(len(o.ids) for o in engine.outputs))
    spec = RunSpec.build(**{**spec.model_dump(), "prompts": tuple(texts), "max_new_tokens": budget})
    if limits:
        limits.check(spec)
    control_run = None
    if control is not None:
        c_header, c_lines, c_ignored = jsonl.parse(*control)
        if prompts_of_outputs(c_lines, pair, spec.chat_template)[1] != ids:
            raise SpecError(f"{control[1]} does not hold the same prompts, in the same order, as "
                            f"{outputs[1]}")
        control_run = jsonl.from_lines(c_header, c_lines, pair.tokenizer, control[1], c_ignored)
    return check(spec, pair, ids, engine, control_run, judging)


def from_servers(spec: RunSpec, pair: ModelPair, engine: tuple[str, str | None],
                 control: tuple[str, str | None] | None,
                 concurrency: int, timeout: float, limits: Settings | None = None,
                 determinism: bool = False, judging: Judging = Judging(),
                 drafter: str | None = None, stream: bool = False) -> Trace | None:
    """Check an engine behind a server (OpenAI-compatible or llama.cpp: (url, served model)), and
    its control run's server. `determinism`: ask the engine every prompt twice more (repeats.py) and
    record what differs. `drafter`: what the engine drafts with (spec/drafters.DRAFTERS; a server
    does not say). `stream`: its answers streamed, their chunks its rounds (server.py)."""
    ids = encode(spec, pair, limits)

    def ask(url: str, model: str | None, order: list[int] | None = None,
            drafter: str | None = None, stream: bool = False) -> EngineRun:
        asked = server.from_server(url, model, ids, spec.max_new_tokens, concurrency=concurrency,
                                   timeout=timeout, tokenizer=pair.tokenizer, order=order,
                                   drafter=drafter, stream=stream, k=spec.k, stop=spec.stop,
                                   **sampling_settings(spec))
        return past_stops_cut(asked, Stops.of(pair, spec.stop))

    def answers() -> tuple[EngineRun, dict[str, EngineRun], EngineRun | None]:
        first = ask(*engine, drafter=drafter, stream=stream)
        again = ({"again": ask(*engine),
                  "reordered": ask(*engine, order=list(reversed(range(len(ids)))))}
                 if determinism else {})
        return first, again, ask(*control) if control else None

    first, again, control_run = on_main(answers)  # under a launch, the server is asked once
    return record_repeats(check(spec, pair, ids, first, control_run, judging, batch=concurrency),
                          first, again)


def record_repeats(trace: Trace | None, first: EngineRun,
                   again: dict[str, EngineRun]) -> Trace | None:
    """`trace` with what the engine answered otherwise when asked `again` (repeats.py), where it
    was asked again."""
    if trace and again:
        asked = repeats.compare(first.outputs, {name: run.outputs for name, run in again.items()})
        Findings(run={"manifest.determinism": asked}).record(trace)
    return trace


def from_callables(spec: RunSpec, pair: ModelPair, engine: str, control: str | None,
                   judging: Judging = Judging(), drafter: str | None = None) -> Trace | None:
    """Check a Python callable module:function (engines/python.py), and a control callable.
    `drafter`: what the engine drafts with (spec/drafters.DRAFTERS), where the settings it returns
    do not say otherwise."""
    ids = encode(spec, pair)
    settings = {"max_new_tokens": spec.max_new_tokens, "k": spec.k, "dtype": spec.dtype,
                "device": str(pair.device), "eos_ids": list(pair.eos_ids),
                **({"stop": list(spec.stop)} if spec.stop else {}), **sampling_settings(spec)}
    answered, control_run = on_main(lambda: (python.from_callable(engine, ids, settings, drafter),
                                             python.from_callable(control, ids, settings) if control
                                             else None))
    return check(spec, pair, ids, answered, control_run, judging)


def check(spec: RunSpec, pair: ModelPair, prompt_ids: list[list[int]], engine: EngineRun,
          control: EngineRun | None = None, judging: Judging = Judging(),
          batch: int | None = None) -> Trace | None:
    """The trace of `engine`'s outputs for `prompt_ids`, judged against the reference (`spec`:
    method engine).

    Prompt by prompt, the outputs are teacher-forced through the target in float64, and the
    reference is proved from them where their margins allow (forensics/proof.py) and decoded from
    where they do not (Judging). Under `accelerate launch` every process judges its share of the
    prompts, and the main one alone returns the trace (None on the others). Each fork not put down
    to rounding is then attributed (attribution.py) by replays in batches of the engine's declared
    `batch_size`, else `batch` (a server's concurrency), else alone."""
    for run, role in ((engine, "engine"), (control, "control run")):
        if run is not None and len(run.outputs) != len(prompt_ids):
            raise SpecError(f"the {role} answered {len(run.outputs)} prompts of {len(prompt_ids)}")
    # judged by the main process alone: one pass per token, no reference to decode
    if not spec.greedy:
        return (check_sampled(spec, pair, prompt_ids, engine, control, judging.attribute)
                if is_main() else None)
    model, truth = enginenoise.truth_model(pair)
    forcing = enginenoise.TeacherForcing(model, pair.vocab_size, functools.partial(checked, pair))
    tolerance = None if judging.decode_reference or truth != "float64" else on_main(
        lambda: calibrated_tolerance(spec, pair))
    judged = _judge_rows(spec, pair, prompt_ids, {"engine": engine, "control": control}, forcing,
                         tolerance, judging)
    if judged is None:  # this process judged its share for the main one
        return None
    scored, ref, yardsticks = judged
    answered = DecodeResult([SequenceOutput(o.ids) for o in engine.outputs], engine.seconds or 0.0)
    trace = build_trace(spec, pair, prompt_ids, answered, ref, yardsticks)
    trace = _answered(trace, engine, control)
    for s in trace.sequences:
        if s.engine.error:  # no answer: nothing to compare
            Findings({s.seq: {"equivalent": None, "first_divergence": None}}).record(trace)
        elif (s.engine.approximate
              and pair.tokenizer.decode(s.output_ids) == pair.tokenizer.decode(s.reference_ids)):
            # re-tokenized text: the same text is the same answer
            Findings({s.seq: {"equivalent": True, "first_divergence": None}}).record(trace)
    judge_engine(trace, forcing, truth, scored, Stops.of(pair, spec.stop)).record(trace)
    judge_scores(trace, scored).record(trace)  # where it reports its sequences' scores
    # its rounds, where it reports them: its decisions
    rounds = run_rounds(trace) if trace.rows else engine_rounds(trace)
    decided = judge_rejections(trace, rounds, model, pair.vocab_size, "the engine's")
    drafts_at = _drafter_replay(trace, spec, pair, engine.settings.get("drafter"))
    # it says it drafts with the check's draft model, or head: its counters
    drafts = (judge_engine_acceptance(trace, drafts_at[0], drafts_at[1], spec.k, decided,
                                      drafts_at[2]) if drafts_at else None)
    Findings(run={"acceptance": drafts, "rejections": decided}).record(trace)
    if judging.attribute:
        replaying = attribution.Replaying(spec, pair, prompt_ids, engine.settings,
                                          int(engine.settings.get("batch_size") or batch or 1))
        attribution.attribute(trace, replaying, attribution.forks_to_attribute(trace),
                              phase(judging.progress, "attribution")).record(trace)
    return trace


def _judge_rows(spec: RunSpec, pair: ModelPair, prompt_ids: list[list[int]],
                runs: dict[str, EngineRun | None],
                forcing: enginenoise.TeacherForcing, tolerance: float | None, judging: Judging):
    """Prompt by prompt (each kept in the checkpoint as it is done; under a launch, this process's
    share): the outputs teacher-forced, (role, seq) -> Forced, and the reference; then, on the main
    process, the yardsticks, every proof checked against their final tolerance. None
    on the other processes."""
    progress = judging.progress
    saved = judging.checkpoint and Checkpoint(
        judging.checkpoint,
        {"pair": pair.info, "dtype": spec.dtype, "device": str(pair.device),
         "budget": spec.max_new_tokens, "k": spec.k,
         "prompts": prompt_ids, "reference": "proved" if tolerance is not None else "decoded",
         **({"stop": list(spec.stop)} if spec.stop else {})},
        part=rank() if world_size() > 1 else None)
    # every process has read the checkpoint's files before any process writes its own
    wait_for_everyone()
    mine, start = {}, time.perf_counter()
    for seq in my_share(len(prompt_ids)):
        prompt = prompt_ids[seq]
        outputs = {role: run.outputs[seq].ids for role, run in runs.items() if run
                   and run.outputs[seq].error is None}
        done = saved and saved.get(seq, outputs)
        # kept under a narrower yardstick
        if done and tolerance is not None and not proof.holds(done[1], tolerance):
            done = done[0], _prompt_reference(spec, pair, prompt, outputs, done[0], tolerance,
                                              phase(progress, "reference"))
        if not done:
            forced = force_outputs(forcing, prompt, outputs, phase(progress, "teacher forcing"))
            done = forced, _prompt_reference(spec, pair, prompt, outputs, forced, tolerance,
                                             phase(progress, "reference"))
            if saved:
                saved.put(seq, outputs, *done)
        mine[seq] = done
    judged = {seq: done for share in gather_from_ranks(mine) for seq, done in share.items()}
    if not is_main():
        return None
    scored = {(role, seq): f for seq, (forced, _) in judged.items() for role, f in forced.items()}
    refs = [judged[seq][1] for seq in range(len(prompt_ids))]
    # teacher forcing included: it proves the reference
    ref = DecodeResult(refs, time.perf_counter() - start)
    yardsticks = yardsticks_for(spec, pair, prompt_ids, ref)
    while tolerance is not None and yardsticks.target.tolerance > tolerance:
        # The reference's continuations widened the yardstick: every proof must clear
        # the wider tolerance.
        tolerance = yardsticks.target.tolerance
        for seq, out in enumerate(refs):
            if not proof.holds(out, tolerance):
                outputs = {role: run.outputs[seq].ids for role, run in runs.items()
                           if (role, seq) in scored}
                refs[seq] = _prompt_reference(spec, pair, prompt_ids[seq], outputs,
                                              {r: scored[r, seq] for r in outputs},
                                              tolerance, phase(progress, "reference"))
        yardsticks = yardsticks_for(spec, pair, prompt_ids, ref)
    return scored, ref, yardsticks


def _prompt_reference(spec: RunSpec, pair: ModelPair, prompt: list[int],
                      outputs: dict[str, list[int]], forced: dict,
                      tolerance: float | None, progress: Progress | None) -> SequenceOutput:
    """One prompt's reference: proved from its outputs as far as `tolerance` allows, else
    (None) decoded."""
    budget, greedy = spec.max_new_tokens, greedy_of(spec)
    if tolerance is None:
        return reference(pair, [prompt], budget, progress, greedy).outputs[0]
    candidates = [{role: (ids, forced[role]) for role, ids in outputs.items()}]
    return proof.proved_reference(pair, [prompt], candidates, budget, tolerance, progress,
                                  functools.partial(checked, pair), greedy).outputs[0]


def sampling_settings(spec: RunSpec) -> dict:
    """What an engine is told of a sampled check: temperature, top-p, top-k (0: off) and the seed;
    nothing for a greedy one (its engines are asked as they always were)."""
    if spec.greedy:
        return {}
    return {"temperature": spec.temperature, "top_p": spec.top_p, "top_k": spec.top_k,
            "seed": spec.seed}


def check_sampled(spec: RunSpec, pair: ModelPair, prompt_ids: list[list[int]], engine: EngineRun,
                  control: EngineRun | None = None, attribute: bool = True) -> Trace:
    """The trace of a sampling engine's outputs, judged by their distribution: every token's
    randomized PIT under the target recomputed at batch size 1 with the spec's temperature, top-k
    and top-p (distribution.judge_distribution).

    Only the engine's own ids can be judged: an output re-tokenized from text (a server that gave
    text only, a file's `output_text`) is refused, since a tokenizer may split the text otherwise
    than the engine drew it, and the PIT would then test the tokenizer. So is an id outside the
    target's vocabulary, and a control run (there is no reference to depart from: check the engine
    without speculation on its own). The tokens of an engine that drafts with the check's draft
    model are scored under each acceptance rule of the catalogue too (forensics/rules.py): a
    likelihood ratio, which names a wrong rule where the PIT's test may not reject."""
    if control is not None:
        raise SpecError("a sampled check has no token reference, so no control run: check the "
                        "engine without speculation on its own, with the same settings, and "
                        "compare the two verdicts")
    answered = [o for o in engine.outputs if not o.error]
    text_only = sum(o.approximate for o in answered)
    if text_only:
        raise SpecError(f"{text_only} of the engine's {len(answered)} answers are text, "
                        "re-tokenized here: a sampled check judges each token the engine drew, so "
                        "it needs the engine's own token ids (an outputs file's output_ids; from a "
                        "server, return_token_ids)")
    outside = next(((i, t) for i, o in enumerate(engine.outputs) for t in o.ids
                    if not 0 <= t < pair.vocab_size), None)
    if outside:
        raise SpecError(f"output {outside[0]} holds token id {outside[1]}, outside the target's "
                        f"vocabulary (0-{pair.vocab_size - 1}): not this target's tokens")
    result = DecodeResult([SequenceOutput(o.ids) for o in engine.outputs], engine.seconds or 0.0)
    # an engine that reports its rounds in our schema: its PIT is split by slot and row too
    trace = _answered(build_trace(spec, pair, prompt_ids, result), engine)
    distribution.judge_distribution(trace, pair, prompt_ids).record(trace)
    drafter = DRAFTERS.get(engine.settings.get("drafter"))
    # a likelihood ratio test: stronger than the PIT's for these
    if attribute and drafter and drafter.draft_model:
        rule = rules.judge_rules(trace, pair, prompt_ids, int(engine.settings.get("k") or spec.k))
        Findings(run={"distribution.attribution": rule}).record(trace)
    if drafter and drafter.draft_model:  # its rounds' counts, where it reports them
        decided = judge_sampled_rejections(trace, engine_rounds(trace), pair, sampling_of(spec))
        Findings(run={"rejections": decided}).record(trace)
    return judge_sampled_run(trace).record(trace)


def _drafter_replay(trace: Trace, spec: RunSpec, pair: ModelPair, drafter: str | None):
    """(its own drafts on the engine's outputs, whose they are in words, the wrong ways of feeding
    it replayed alike) for the drafter an engine declares: the check's draft model, a published
    head from its files, or the target's own MTP layer (None: another, or none declared)."""
    kind = DRAFTERS.get(drafter)
    if not kind or not kind.engines_run:
        return None
    if kind.draft_model:
        return model_drafts(trace, pair.draft, pair.vocab_size), "the draft model's", None
    head, states = head_for(kind.name, pair.target, spec.target, spec.head), {}
    return (head_drafts(trace, pair.target, head, pair.vocab_size, states), f"{kind.noun}'s",
            {MISFEEDINGS[way]: head_drafts(trace, pair.target, fed, pair.vocab_size, states)
             for way, fed in head.mistaken().items()})


def sampled_summary(trace: Trace) -> dict:
    """A sampled check in one row: the engine, its answers and tokens, the verdict
    and its evidence."""
    d, info = trace.distribution, trace.manifest.engine
    answered = [s for s in trace.sequences if not s.engine.error]
    tokens = sum(len(s.output_ids) for s in answered)
    worst = min(d.splits, key=lambda x: x.p, default=None)
    return {"engine": " ".join(x for x in (info.name, info.version) if x), "n": len(answered),
            "errors": len(trace.sequences) - len(answered), "tokens": tokens, "verdict": d.verdict,
            "p": d.p, "alpha": d.alpha, "splits": len(d.splits),
            "worst_split": worst.name if worst else None,
            "worst_split_p": worst.p if worst else None, "impossible": d.impossible,
            "tokens_per_second": tokens / info.seconds if info.seconds else None}


def _answered(trace: Trace, engine: EngineRun, control: EngineRun | None = None) -> Trace:
    """The trace built from the engine's answers, with what the engine said of them: itself, each
    answer as it came, its control's, and its rounds where it reports them in our schema (they get
    the white-box views)."""
    try:
        rows = [RowRecord.model_validate(r) for r in engine.rows]
        rounds = [RoundRecord.model_validate(r) for r in engine.rounds]
    except ValidationError as e:
        raise SpecError("the engine's rounds are not in specviz's trace schema: "
                        f"{describe_validation_error(e)}") from None
    said = {s.seq: {"engine": engine.outputs[s.seq], "control": control and control.outputs[s.seq]}
            for s in trace.sequences}
    run = {"manifest.engine": _info(engine), "manifest.control": control and _info(control),
           "rows": rows, "rounds": rounds}
    return Findings(said, run).record(trace)


def _info(run: EngineRun) -> EngineInfo:
    return EngineInfo(**run.model_dump(include=set(EngineInfo.model_fields)))
