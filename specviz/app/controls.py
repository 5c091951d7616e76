"""The page's controls: the Run view's (a run spec's fields) and the Check tab's (an engine to
judge), built inside the caller's layout, each named as its form (form.py) names it and set to its
default there; page.py places and wires them, runview.py reads their values.
"""
from __future__ import annotations

import gradio as gr

from specviz.app.form import CUSTOM, DEFAULTS, ENGINE_DEFAULTS, TEMPERATURE_MAX, TOP_P_MIN
from specviz.run.settings import Settings
from specviz.spec.drafters import DRAFTERS, JUDGED_DRAFTERS
from specviz.spec.faults import FAULTS
from specviz.spec.faults import FAULT_PRESETS
from specviz.spec.methods import METHODS
from specviz.spec.prompts import builtin_sets
from specviz.spec.run import (DTYPES, FITTED_HEAD, MAX_NGRAM, MAX_PRESENCE_PENALTY,
                              MAX_REPETITION_PENALTY, MAX_TEMPERATURE, MAX_TREE_WIDTH,
                              PAIR_PRESETS)

# Pixels of a file box: Gradio's drop zone ("Drop File Here - or - Click to Upload") is cut below
# about 120.
UPLOAD_HEIGHT = 124


def run_controls_of(settings: Settings) -> dict:
    """The Run view's controls, by name (form.INPUTS': form.DEFAULTS' names and the prompt file)."""
    c = {}
    c["pair"] = gr.Dropdown([*PAIR_PRESETS, CUSTOM], value=DEFAULTS["pair"], label="model pair",
                            info="embedded: SmolLM2-135M-Instruct and its draft, offline; tiny: a "
                                 "random 3-layer test pair")
    with gr.Accordion("custom pair (Hub ids or local paths)", open=False):
        c["target"] = gr.Textbox(DEFAULTS["target"], label="target model")
        c["draft"] = gr.Textbox(DEFAULTS["draft"], label="draft model")
    c["prompt_set"] = gr.Dropdown(list(builtin_sets()), value=DEFAULTS["prompt_set"],
                                  label="built-in prompts")
    c["typed"] = gr.Textbox(DEFAULTS["typed"], lines=3, label="or type prompts",
                            info="one a line, or Spec-Bench JSONL; used when not empty")
    c["prompt_file"] = gr.File(label="or upload prompts (text or Spec-Bench .jsonl)",
                               file_types=[".txt", ".jsonl"], type="filepath", height=UPLOAD_HEIGHT)
    c["chat_template"] = gr.Checkbox(value=DEFAULTS["chat_template"], label="chat template",
                                     info="each prompt wrapped in the model's chat template (off: "
                                          "its text as typed)")
    c["method"] = gr.Dropdown(list(METHODS), value=DEFAULTS["method"], label="method",
                              info=METHODS[DEFAULTS["method"]].summary, elem_id="sv-method")
    c["drafter"] = gr.Dropdown(list(DRAFTERS), value=DEFAULTS["drafter"], label="drafter",
                               info=DRAFTERS[DEFAULTS["drafter"]].summary, elem_id="sv-drafter")
    with gr.Row():
        options = DRAFTERS[DEFAULTS["drafter"]].options  # shown where the drafter reads them
        c["ngram_min"] = gr.Slider(1, MAX_NGRAM, value=DEFAULTS["ngram_min"], step=1,
                                   label="shortest n-gram", visible="ngram_min" in options,
                                   elem_id="sv-ngram-min")
        c["ngram_max"] = gr.Slider(1, MAX_NGRAM, value=DEFAULTS["ngram_max"], step=1,
                                   label="longest n-gram (tried first)",
                                   visible="ngram_max" in options, elem_id="sv-ngram-max")
        c["tree_width"] = gr.Slider(1, MAX_TREE_WIDTH, value=DEFAULTS["tree_width"], step=1,
                                    label="tree width",
                                    info="candidates per position, verified as one token tree "
                                         "(1: a chain)",
                                    visible="tree_width" in options, elem_id="sv-tree-width")
        c["head"] = gr.Textbox(DEFAULTS["head"], label="published head's folder",
                               info="its config.json and safetensors, as published; "
                                    f"{FITTED_HEAD}: specviz's fitted one of a built-in target",
                               visible="head" in options, elem_id="sv-head")
    with_faults = " and ".join(n for n, m in METHODS.items() if m.faults)
    c["faults"] = gr.Dropdown([*FAULTS, *FAULT_PRESETS], value=DEFAULTS["faults"], multiselect=True,
                              label=f"faults ({with_faults} only)",
                              info="re-create a published engine's bug; the sampling faults need "
                                   "a temperature above 0",
                              interactive=METHODS[DEFAULTS["method"]].faults, elem_id="sv-faults")
    with gr.Row():
        c["batch_size"] = gr.Slider(1, settings.max_batch_size, value=DEFAULTS["batch_size"],
                                    step=1, label="batch size")
        c["k"] = gr.Slider(1, settings.max_k, value=DEFAULTS["k"], step=1,
                           label="k (drafts a round)")
    with gr.Row():
        c["max_new_tokens"] = gr.Slider(1, settings.max_new_tokens,
                                        value=DEFAULTS["max_new_tokens"], step=1,
                                        label="max new tokens")
        c["dtype"] = gr.Dropdown(list(DTYPES), value=DEFAULTS["dtype"], label="dtype")
    c["temperature"] = gr.Slider(0, TEMPERATURE_MAX, value=DEFAULTS["temperature"], step=0.05,
                                 label="temperature",
                                 info="0: greedy, checked token by token against the reference; "
                                      "above 0: speculative sampling, judged by the distribution "
                                      "of its tokens",
                                 elem_id="sv-temperature")
    with gr.Row():
        c["top_k"] = gr.Number(value=DEFAULTS["top_k"], precision=0, minimum=0,
                               label="top-k (0: off)", elem_id="sv-top-k")
        c["top_p"] = gr.Slider(TOP_P_MIN, 1, value=DEFAULTS["top_p"], step=0.01,
                               label="top-p (1: off)", elem_id="sv-top-p")
    with gr.Accordion("the draft's own sampling (blank: the target's)", open=False):
        c["draft_temperature"] = gr.Number(value=DEFAULTS["draft_temperature"], minimum=0,
                                           maximum=MAX_TEMPERATURE, label="draft temperature")
        c["draft_top_k"] = gr.Number(value=DEFAULTS["draft_top_k"], precision=0, minimum=0,
                                     label="draft top-k (0: off)")
        c["draft_top_p"] = gr.Number(value=DEFAULTS["draft_top_p"], minimum=0, maximum=1,
                                     label="draft top-p (1: off)")
    with gr.Accordion("each request's own sampling (blank: the settings above for all)",
                      open=False):
        c["rows"] = gr.Textbox(value=DEFAULTS["rows"], lines=3, label="per-request settings",
                               elem_id="sv-rows",
                               info="one request a line, given to the prompts in turn: key=value "
                                    "pairs of temperature (unset: 1), top_k, top_p, seed (unset: "
                                    "the run's stream), e.g. temperature=0.8,top_p=0.95,seed=7; "
                                    "they replace temperature, top-k and top-p")
    with gr.Accordion("penalties, log-probabilities, stop strings and structured output",
                      open=False):
        with gr.Row():
            c["repetition_penalty"] = gr.Number(value=DEFAULTS["repetition_penalty"], minimum=1,
                                                maximum=MAX_REPETITION_PENALTY,
                                                label="repetition penalty (1: off)")
            c["presence_penalty"] = gr.Number(value=DEFAULTS["presence_penalty"], minimum=0,
                                              maximum=MAX_PRESENCE_PENALTY,
                                              label="presence penalty (0: off)")
        c["logprobs"] = gr.Checkbox(value=DEFAULTS["logprobs"], label="log-probabilities",
                                    info="record each token's, and judge them against a fresh "
                                         "float64 recomputation")
        c["stop"] = gr.Textbox(value=DEFAULTS["stop"], lines=2, label="stop strings",
                               elem_id="sv-stop",
                               info="one a line: an output ends at the token that completes one, "
                                    "that token kept")
        c["json_schema"] = gr.Code(value=DEFAULTS["json_schema"], language="json", lines=4,
                                   label="structured output: a JSON schema every answer follows "
                                         "(empty: off; docs/structured.md)")
        c["reasoning_end"] = gr.Textbox(value=DEFAULTS["reasoning_end"], max_lines=1,
                                        label="reasoning end",
                                        info="with a schema: the token ending a reasoning model's "
                                             "thinking (its </think>); the grammar starts after it")
    with gr.Accordion("seed and exspec", open=False):
        c["seed"] = gr.Number(value=DEFAULTS["seed"], precision=0, label="seed")
        c["window"] = gr.Number(value=DEFAULTS["window"], precision=0,
                                label="exspec window (0: 2 × batch size)")
        c["max_wait"] = gr.Number(value=DEFAULTS["max_wait"], precision=0,
                                  label="exspec max wait (rounds)")
    with gr.Accordion("KV layout", open=False):
        c["kv_block_size"] = gr.Number(value=DEFAULTS["kv_block_size"], precision=0, minimum=0,
                                       label="KV block size (0: each row contiguous)",
                                       info="page eqspec's and exspec's caches in blocks of this "
                                            "many tokens, as serving engines do")
        c["prefix_caching"] = gr.Checkbox(value=DEFAULTS["prefix_caching"],
                                          label="prefix caching",
                                          info="share prompts' full blocks across requests "
                                               "(copy-on-write); needs a block size")
        c["kv_blocks"] = gr.Number(value=DEFAULTS["kv_blocks"], precision=0, minimum=0,
                                   label="KV blocks per pool (0: as many as needed)",
                                   info="a miss then evicts the prefix cache's idle blocks")
    c["audit"] = gr.Checkbox(value=DEFAULTS["audit"], label="audit every round",
                             info="check every row's state against a fresh recomputation each "
                                  "round, fork or not (about one extra batch-size-1 pass of each "
                                  "model per row and round)")
    c["batch_invariant"] = gr.Checkbox(value=DEFAULTS["batch_invariant"],
                                       label="batch-invariant (zero tolerance)",
                                       info="a row's logits the same bits in any batch, so any "
                                            "difference from a fresh recomputation is a bug; about "
                                            "1.5 to 4 times slower (docs/batch_invariant.md)")
    return c


def engine_controls(settings: Settings) -> dict:
    """The Check tab's controls, by name (form.ENGINE_DEFAULTS')."""
    e, d = {}, ENGINE_DEFAULTS
    gr.Markdown("An engine's outputs (vLLM, SGLang, TGI, llama.cpp, your own) against the "
                "batch-size-1 reference of the same weights: every difference judged numerics or a "
                "bug, from the engine's token ids alone. The file format is in docs/engines.md "
                "(`specviz schema --outputs`).")
    e["pair"] = gr.Dropdown([*PAIR_PRESETS, CUSTOM], value=d["pair"],
                            label="reference: the engine's target weights")
    e["target"] = gr.Textbox(d["target"], label="custom target (Hub id or local path)",
                             visible=True)
    e["dtype"] = gr.Dropdown(list(DTYPES), value=d["dtype"], label="reference dtype")
    e["outputs"] = gr.File(label="the engine's outputs (JSONL)",
                           file_types=[".jsonl", ".json", ".txt"],
                           type="filepath", height=UPLOAD_HEIGHT)
    e["control"] = gr.File(label="optional: the same engine without speculation "
                                 "(JSONL, the same prompts)",
                           file_types=[".jsonl", ".json", ".txt"], type="filepath",
                           height=UPLOAD_HEIGHT)
    servers = bool(settings.engine_servers) and not settings.public
    with gr.Accordion("or ask a server (llama.cpp, vLLM or any OpenAI-compatible)", open=False,
                      visible=servers):
        e["server"] = gr.Textbox(d["server"], label="server URL",
                                 info=("allowed: " + (", ".join(settings.engine_servers) or "none")
                                       + "; llama.cpp's llama-server is asked in its own API, any "
                                         "other as OpenAI's"))
        e["served_model"] = gr.Textbox(d["served_model"],
                                       label="served model (blank: the server's only model)")
        e["control_server"] = gr.Textbox(
            d["control_server"], label="optional: a server of the same engine without speculation")
        e["prompt_set"] = gr.Dropdown(list(builtin_sets()), value=d["prompt_set"],
                                      label="prompts to send")
        e["max_new_tokens"] = gr.Slider(1, settings.max_new_tokens, value=d["max_new_tokens"],
                                        step=1, label="max new tokens")
        e["determinism"] = gr.Checkbox(d["determinism"], label="ask every prompt twice more",
                                       info="the same requests again, then in reverse order (other "
                                            "slots, other batch company): every prompt answered "
                                            "otherwise is reported with its fork")
    # what the engine sampled with: a server is asked with them; a file is judged under them
    with gr.Row():
        e["temperature"] = gr.Slider(0, TEMPERATURE_MAX, value=d["temperature"], step=0.05,
                                     label="the engine's temperature",
                                     info="0: greedy, checked token by token; above 0: judged by "
                                          "the distribution of its tokens under the target at "
                                          "these settings")
        e["top_p"] = gr.Slider(TOP_P_MIN, 1, value=d["top_p"], step=0.01,
                               label="its top-p (1: off)")
        e["seed"] = gr.Number(value=d["seed"], precision=0, minimum=0,
                              label="seed (a server gets one a prompt from it)")
    # what the engine drafts with, where the user says: its acceptance is judged on that replay
    with gr.Row():
        e["engine_drafter"] = gr.Dropdown(
            [("not said", ""), *((d.noun, n) for n, d in JUDGED_DRAFTERS.items())],
            value=d["engine_drafter"], label="the engine drafts with",
            info="its acceptance is then judged against that drafter's own replay on its "
                 "outputs: per request from the file's drafts and accepted counts, or from a "
                 "server's counters (per draft position too)", elem_id="sv-engine-drafter")
        e["engine_head"] = gr.Textbox(d["engine_head"], label="the engine's published head",
                                      info="the folder it serves (config.json and safetensors), "
                                           f"or {FITTED_HEAD}", visible=False,
                                      elem_id="sv-engine-head")
    return e
