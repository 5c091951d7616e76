"""Sharded sweeps: a list of runs split between the processes of `accelerate
launch` (GPUs or nodes), reported once by the main process, exactly as one
process would report them.

Static-batch methods split their prompts on batch boundaries, so every batch
holds the rows, padding and numerics it holds in a single process; a method
that refills its batch (exspec, batched-reference) schedules across its whole
pool, so each of its runs stays whole on one process. The batch-size-1
reference is split prompt by prompt, once for all runs, and every process
watches its shares against it (watch.py). The main process gathers the decoded
outputs and what the watches found, measures the rounding yardstick and
explains every trace itself.

Sampled runs have no reference: each share draws from its sequences' own
streams, numbered as in the whole prompt list, so it draws exactly what one
process would; audited, each process watches its rows against the yardstick
of the built-in prompts, and the main process judges the distribution.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from specviz.decoding.reference import reference
from specviz.decoding.result import DecodeResult
from specviz.decoding.sampling import greedy_of
from specviz.models.pairs import ONE_DEVICE, Placement, pair_for
from specviz.run.launch import gather_from_ranks, is_main, my_share, rank, world_size
from specviz.run.runner import decode, encode, explain, explain_sampled, run, sampled_yardsticks
from specviz.spec.methods import METHODS
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace.schema import Trace


def sweep(runs: list[tuple[RunSpec, bool]], trust_remote_code: bool = False,
          placement: Placement = ONE_DEVICE) -> Iterator[Trace]:
    """The trace of each (spec, record) in `runs`, in order. Under a launch of N > 1
    processes every process decodes its share, and only the main one yields."""
    if world_size() == 1:
        for spec, record in runs:
            yield run(spec, record=record, trust_remote_code=trust_remote_code, placement=placement)
        return
    first = runs[0][0]
    same = ("target", "draft", "target_revision", "draft_revision", "prompts", "chat_template",
            "max_new_tokens", "dtype", "device", "repetition_penalty", "presence_penalty")
    if any(getattr(spec, f) != getattr(first, f) for spec, _ in runs for f in same):
        raise SpecError("a sharded sweep runs one pair on one prompt list with one token budget "
                        "and one penalty")
    if placement.spread:
        raise SpecError("a sharded sweep cannot spread the target over GPUs: every process would "
                        "use every GPU")
    pair = pair_for(first, trust_remote_code)
    prompt_ids = encode(first, pair)
    n = len(prompt_ids)

    # The reference first, split prompt by prompt and gathered by every process: each watches its
    # own share of every other run against it.
    ref = None
    if any(spec.greedy for spec, _ in runs):
        rows = my_share(n)
        ref = _merged_shares(gather_from_ranks(
            (rows, 1, reference(pair, [prompt_ids[j] for j in rows], first.max_new_tokens,
                                sampling=greedy_of(first)))))
    mine = []  # (rows, batch size, result) of every other run
    for i, (spec, record) in enumerate(runs):
        if spec.method == "reference" and spec.greedy:
            continue  # the reference above is that run
        # its schedule spans the whole pool: one process runs it all
        if METHODS[spec.method].refills:
            rows = range(n) if i % world_size() == rank() else range(0)
        else:
            rows = my_share(n, spec.batch_size)
        prompts = [prompt_ids[j] for j in rows]
        if spec.greedy:
            result = decode(spec, pair, prompts, record,
                            reference=DecodeResult([ref.outputs[j] for j in rows], ref.seconds))
        else:
            result = decode(spec, pair, prompts, record, yardsticks=sampled_yardsticks(spec, pair),
                            first_seq=rows.start)
        mine.append((rows, spec.batch_size, result))
    shares = gather_from_ranks(mine)  # every process's list, in rank order
    if not is_main():
        return
    merged = iter(_merged_shares([s[j] for s in shares]) for j in range(len(mine)))
    for spec, _ in runs:
        if not spec.greedy:
            yield explain_sampled(spec, pair, prompt_ids, next(merged),
                                  sampled_yardsticks(spec, pair))
        else:
            yield explain(spec, pair, prompt_ids,
                          ref if spec.method == "reference" else next(merged), ref)


def _merged_shares(shares: list[tuple[range, int, DecodeResult]]) -> DecodeResult:
    """One DecodeResult from the processes' shares of a run: sequence ids, round and static-batch
    indices made global."""
    outputs, rounds, forks, audit = [], [], {}, {}
    for rows, batch_size, result in shares:
        offset = len(rounds)
        outputs += result.outputs
        for rd in result.rounds:
            # exspec's is -1
            batch = rd.batch + rows.start // batch_size if rd.batch >= 0 else rd.batch
            rounds.append(dataclasses.replace(rd, seqs=[rows.start + s for s in rd.seqs],
                                              batch=batch))
        forks.update({rows.start + s: dataclasses.replace(f, round=f.round + offset)
                      for s, f in result.forks.items()})
        audit.update({(r + offset, rows.start + s): v for (r, s), v in result.audit.items()})
    return DecodeResult(outputs, max(result.seconds for _, _, result in shares), rounds, forks,
                        audit)
