"""The Gradio page. The only module that imports gradio; it reads traces only."""
from __future__ import annotations

import gradio as gr
import pandas as pd

from . import metrics
from .decoding.faults import FAULTS
from .decoding.faults import PRESETS as FAULT_PRESETS
from .models import PRESETS, pair_for
from .prompts import builtin_set, builtin_sets
from .runner import run
from .spec import METHODS, RunSpec, SpecError


def _summary(trace, tokenizer) -> pd.DataFrame:
    rows = []
    for s, p in zip(trace.sequences, trace.prompts):
        rows.append({
            "seq": s.seq,
            "prompt": p.text[:60],
            "output": tokenizer.decode(s.output_ids),
            "tokens": len(s.output_ids),
            "equivalent": {True: "yes", False: "no", None: "-"}[s.equivalent],
            "first divergence": "" if s.first_divergence is None else s.first_divergence,
            "verdict": s.forensics.verdict if s.forensics else "",
            "why": s.forensics.explanation if s.forensics else "",
        })
    return pd.DataFrame(rows)


def decode(pair_name, prompt_set, typed, method, faults, batch_size, k, max_new_tokens, dtype,
           progress=gr.Progress()):
    try:
        prompts = [ln for ln in (typed or "").splitlines() if ln.strip()] or builtin_set(prompt_set)
        target, draft = PRESETS[pair_name]
        spec = RunSpec.build(target=target, draft=draft, prompts=tuple(prompts), method=method, faults=tuple(faults),
                             batch_size=int(batch_size), k=int(k), max_new_tokens=int(max_new_tokens), dtype=dtype)
        total = len(prompts) * spec.max_new_tokens
        done = [0]

        def tick(n):
            done[0] += n
            progress(min(done[0] / total, 1.0), desc=f"{done[0]} tokens")

        trace = run(spec, progress=tick)
    except SpecError as e:
        raise gr.Error(str(e)) from None
    eq = metrics.equivalence(trace)
    line = f"**{spec.method}**: {sum(len(s.output_ids) for s in trace.sequences)} tokens in {trace.manifest.decode_seconds:.1f} s"
    if trace.rows:
        line += f"; acceptance rate {metrics.acceptance_rate(trace):.2f}; {metrics.tokens_per_round(trace):.2f} tokens per round"
    if eq:
        line += f"; {eq['exact']:.0%} of sequences equal the batch-size-1 reference"
    return line, _summary(trace, pair_for(spec).tokenizer)


def build() -> gr.Blocks:
    with gr.Blocks(title="specviz") as demo:
        gr.Markdown("# specviz\nBatch speculative decoding, checked token by token against the target alone.")
        with gr.Row():
            pair = gr.Dropdown(list(PRESETS), value="embedded", label="model pair")
            prompt_set = gr.Dropdown(list(builtin_sets()), value="quick", label="built-in prompts")
            method = gr.Dropdown(list(METHODS), value="eqspec", label="method")
            faults = gr.Dropdown([*FAULTS, *FAULT_PRESETS], value=[], multiselect=True, label="faults (eqspec)")
            dtype = gr.Dropdown(["float32", "bfloat16", "float64"], value="float32", label="dtype")
        typed = gr.Textbox(lines=3, label="or type prompts (one a line)")
        with gr.Row():
            batch_size = gr.Slider(1, 16, value=4, step=1, label="batch size")
            k = gr.Slider(1, 16, value=5, step=1, label="k (draft tokens a round)")
            max_new = gr.Slider(1, 256, value=48, step=1, label="max new tokens")
        go = gr.Button("Run", variant="primary")
        status = gr.Markdown()
        table = gr.Dataframe(label="sequences", wrap=True)
        go.click(decode, [pair, prompt_set, typed, method, faults, batch_size, k, max_new, dtype], [status, table],
                 api_name="run")
    return demo
