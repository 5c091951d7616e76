"""The page's forms by name. The Run view's controls are named after RunSpec's fields (and the
prompts' sources): `spec_from_controls` reads them into a RunSpec, `controls_of` fills them back
from one, and their defaults are RunSpec's own. The Check tab's are an engine check's. A handler
takes its controls as keywords (`by_name`), so that Gradio's API names its parameters after them: a
client calls /run with pair=..., k=..., and leaves out any it does not set.
"""
from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from pathlib import Path

import gradio as gr

from specviz.app import serving
from specviz.spec.defaults import default_of
from specviz.spec.drafters import DRAFTERS
from specviz.spec.prompts import DEFAULT_SET, builtin_sets, parse_prompts
from specviz.spec.rows import rows_as_text, rows_from_text
from specviz.spec.run import PAIR_PRESETS, RunSpec
from specviz.spec.strict import SpecError

CUSTOM = "custom (type ids below)"
MAX_PROMPT_FILE_BYTES = 4 * 2**20
TEMPERATURE_MAX = 2.0  # the slider's range; a link may carry up to spec.MAX_TEMPERATURE
TOP_P_MIN = 0.05


def controls_of(s: RunSpec) -> dict:
    """The Run view's controls' values that describe the run `s`, by name (spec_from_controls reads
    them back). The prompt file is not among them: a spec names no file."""
    pair = (s.target, s.draft)
    preset = next((name for name, ids in PAIR_PRESETS.items() if ids == pair), CUSTOM)
    named = next((name for name, ps in builtin_sets().items() if tuple(ps) == s.prompts), None)
    return {"pair": preset, "target": s.target, "draft": s.draft,
            "prompt_set": named or DEFAULT_SET,
            "typed": "" if named else _prompts_as_text(s.prompts), "method": s.method,
            "faults": list(s.faults), "batch_size": s.batch_size, "k": s.k,
            "max_new_tokens": s.max_new_tokens, "dtype": s.dtype, "seed": s.seed,
            "window": s.window or 0, "max_wait": s.max_wait, "audit": s.audit > 0,
            # A link may carry what the sliders do not reach (the CLI's temperature 5): they widen.
            "temperature": (s.temperature if s.temperature <= TEMPERATURE_MAX
                            else gr.update(value=s.temperature, maximum=s.temperature)),
            "top_k": s.top_k,
            "top_p": s.top_p if s.top_p >= TOP_P_MIN else gr.update(value=s.top_p, minimum=s.top_p),
            "draft_temperature": s.draft_temperature, "draft_top_k": s.draft_top_k,
            "draft_top_p": s.draft_top_p, "drafter": s.drafter, "ngram_min": s.ngram_min,
            "ngram_max": s.ngram_max, "rows": rows_as_text(s.rows),
            "repetition_penalty": s.repetition_penalty, "presence_penalty": s.presence_penalty,
            "logprobs": s.logprobs, "stop": "\n".join(s.stop), "chat_template": s.chat_template,
            "tree_width": s.tree_width, "json_schema": s.json_schema or "",
            "reasoning_end": s.reasoning_end or "", "batch_invariant": s.batch_invariant,
            "head": s.head or "", "kv_block_size": s.kv_block_size,
            "prefix_caching": s.prefix_caching, "kv_blocks": s.kv_blocks}


# The controls a spec fills, at RunSpec's defaults (on the default prompt set), in the API's order;
# the custom pair's boxes start blank (a preset names its models).
DEFAULTS = {**controls_of(RunSpec(prompts=tuple(builtin_sets()[DEFAULT_SET]))),
            "target": "", "draft": ""}
# Every control a run reads: those and the uploaded prompt file.
INPUTS = {**DEFAULTS, "prompt_file": None}
# The Check tab's controls: the reference's pair and settings (RunSpec's), and the engine's outputs
# or servers.
ENGINE_DEFAULTS = {"pair": DEFAULTS["pair"], "target": "", "dtype": DEFAULTS["dtype"],
                   "outputs": None, "control": None, "server": "", "served_model": "",
                   "control_server": "", "prompt_set": DEFAULT_SET,
                   "max_new_tokens": DEFAULTS["max_new_tokens"], "determinism": False,
                   "temperature": DEFAULTS["temperature"], "top_p": DEFAULTS["top_p"],
                   "seed": DEFAULTS["seed"], "engine_drafter": "", "engine_head": ""}


def by_name(defaults: Mapping[str, object]) -> Callable[[Callable], Callable]:
    """Decorate a handler that takes its controls as `**controls`: Gradio (which reads a handler's
    signature) sees a keyword parameter for each control in `defaults`, named after it and
    defaulting to its default. page.py passes the controls with inputs_kwargs, so the endpoint's API
    parameters bear their names."""
    def named(handler: Callable) -> Callable:
        signature = inspect.signature(handler)
        fixed = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        controls = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d)
                    for n, d in defaults.items()]
        handler.__signature__ = signature.replace(parameters=[*fixed, *controls])
        return handler
    return named


def filled(defaults: Mapping[str, object], controls: Mapping[str, object]) -> dict:
    """`controls` over `defaults`; a name not among the defaults is refused (a misspelt one would
    be lost)."""
    if unknown := set(controls) - set(defaults):
        raise TypeError(f"no such control: {', '.join(sorted(unknown))}; "
                        f"the controls are {', '.join(defaults)}")
    return {**defaults, **controls}


def spec_from_controls(**controls) -> RunSpec:
    """The run the controls (INPUTS' names; those left out at their defaults) describe. Prompts:
    typed ones, else the uploaded file, else the built-in set. Sampling: temperature 0 is greedy;
    top-k 0 and top-p 1 are off; a blank draft setting is the target's; `rows`, where typed, each
    request's own settings (one a line, key=value pairs), in place of the target's. `stop`: stop
    strings, one a line (spaces kept). `chat_template`: each prompt wrapped in the model's chat
    template. The n-gram sizes belong to prompt lookup: with the draft model they are not read (the
    page hides them); a tree's width to the drafters that grow trees."""
    c = filled(INPUTS, controls)
    if c["pair"] == CUSTOM:
        target, draft = (c["target"] or "").strip(), (c["draft"] or "").strip()
        if not target or not draft:
            raise SpecError("a custom pair needs both a target and a draft model id")
    else:
        target, draft = PAIR_PRESETS[c["pair"]]
    if (c["typed"] or "").strip():
        prompts = parse_prompts(c["typed"], "typed prompts")
    elif c["prompt_file"]:
        text = serving.read_upload(c["prompt_file"], MAX_PROMPT_FILE_BYTES)
        prompts = parse_prompts(text, Path(c["prompt_file"]).name)
    else:
        prompts = builtin_sets()[c["prompt_set"]]
    drafter = c["drafter"] or DEFAULTS["drafter"]
    return RunSpec.build(
        target=target, draft=draft, prompts=tuple(prompts), method=c["method"],
        faults=tuple(c["faults"] or ()), batch_size=int(c["batch_size"]), k=int(c["k"]),
        max_new_tokens=int(c["max_new_tokens"]), dtype=c["dtype"], seed=int(c["seed"]),
        window=int(c["window"]) or None, max_wait=int(c["max_wait"]),
        audit=int(c["batch_size"]) if c["audit"] else 0,
        temperature=_real(c["temperature"], default_of("temperature")),
        top_k=int(c["top_k"] or 0), top_p=_real(c["top_p"], default_of("top_p")),
        draft_temperature=_real(c["draft_temperature"]),
        draft_top_k=None if c["draft_top_k"] is None else int(c["draft_top_k"]),
        draft_top_p=_real(c["draft_top_p"]), drafter=drafter, rows=rows_from_text(c["rows"]),
        repetition_penalty=_real(c["repetition_penalty"], default_of("repetition_penalty")),
        presence_penalty=_real(c["presence_penalty"], default_of("presence_penalty")),
        logprobs=bool(c["logprobs"]),
        stop=tuple(s for s in (c["stop"] or "").replace("\r\n", "\n").split("\n") if s),
        chat_template=bool(c["chat_template"]),
        json_schema=(c["json_schema"] or "").strip() or None,
        reasoning_end=c["reasoning_end"] or None, batch_invariant=bool(c["batch_invariant"]),
        kv_block_size=int(c["kv_block_size"] or 0), prefix_caching=bool(c["prefix_caching"]),
        kv_blocks=int(c["kv_blocks"] or 0),
        # The option controls that the drafter reads (spec/drafters.py): the rest stay at defaults.
        **{f: _drafter_option(f, c[f]) for f in DRAFTERS[drafter].options})


def _drafter_option(field: str, value):
    """A drafter option's control value as the spec takes it: a head's folder as typed (None when
    blank), else a count."""
    return (str(value or "").strip() or None) if field == "head" else int(value)


def _real(value, blank: float | None = None) -> float | None:
    """A slider's or number box's value, rounded past a slider's float noise
    (0.15000000000000002: 0.15)."""
    return blank if value is None else round(float(value), 6)


def _prompts_as_text(prompts: tuple[str, ...]) -> str:
    """Prompts for the typed box: one a line, or Spec-Bench JSONL when a prompt spans lines."""
    if any("\n" in p for p in prompts):
        return "\n".join(json.dumps({"turns": [p]}) for p in prompts)
    return "\n".join(prompts)
