"""The counters judge: do a run's rounds count the tokens its output holds?

A round emits its accepted drafts and one token of the target's, unless a stop inside the block
ends the row there: then the tokens past the stop are not emitted. An engine that counts the whole
block before the stop trims it reports tokens per round (vLLM's mean acceptance length, vLLM #56101)
or usage (SGLang #39826) that its output does not hold, though every token is right. So each
sequence's rounds, as the run's counters took them (a row's `counted`), are summed and set against
its output: more counted than held is `decision-bug:counters`, on the round that counted past it.
"""
from __future__ import annotations

from collections import defaultdict

from specviz.trace.evidence import RunForensics
from specviz.trace.findings import Findings
from specviz.trace.schema import Trace


def judge_counters(trace: Trace) -> Findings:
    """`forensics` of every sequence no other verdict named whose rounds count more tokens than its
    output holds."""
    found = Findings()
    rows = defaultdict(list)
    for r in sorted(trace.rows, key=lambda r: r.round):
        rows[r.seq].append(r)
    for s in trace.sequences:
        mine, held = rows.get(s.seq, []), len(s.output_ids)
        counts = [len(r.emitted) if r.counted is None else r.counted for r in mine]
        if s.forensics is not None or sum(counts) <= held:
            continue
        before, over, count = 0, mine[-1], counts[-1]
        for r, n in zip(mine, counts):  # the first round whose count runs past the output's end
            if before + n > held:
                over, count = r, n
                break
            before += n
        kept = held - before
        found.of(s.seq)["forensics"] = RunForensics(
            verdict="decision-bug:counters", fork=max(held - 1, 0), round=over.round, row=over.row,
            output_token=s.output_ids[-1] if s.output_ids else None,
            explanation=(f"The tokens are right, but the run's counters count {sum(counts)} tokens "
                         f"where the output holds {held}: round {over.round} counted {count} "
                         f"emitted tokens (its {over.accepted} accepted drafts and the token after "
                         f"them) where the output kept {kept}, up to its stop. "
                         "The counters built on them (tokens per round, the mean acceptance "
                         "length) count tokens no one received."))
    return found
