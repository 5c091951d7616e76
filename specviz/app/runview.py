"""The Run view's handlers: from the controls (or a share link, or an uploaded trace) to a trace, and from a trace
and a focus (a sequence and one of its rounds) to every view. Decoding, shrinking and engine checks go through
the serving layer (serving.py); the views are drawn from the trace alone.
"""
from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from specviz.app import panel, plots, serving, summary, tokens, views
from specviz.app.glossary import glossary as glossary_text
from specviz.run.settings import Settings
from specviz.spec.drafters import DEFAULT_DRAFTER, DRAFTER_OPTIONS, DRAFTERS
from specviz.spec.methods import METHODS
from specviz.spec.prompts import builtin_sets, parse_prompts
from specviz.spec.run import ENGINE, PRESETS, RunSpec, SpecError, rows_as_text, rows_from_text
from specviz.trace import share
from specviz.trace.schema import MAX_TRACE_BYTES, Trace

CUSTOM = "custom (type ids below)"


MAX_PROMPT_FILE_BYTES = 4 * 2**20


# Each example opens straight onto a case worth seeing. Values follow CONTROLS below.
_EMBEDDED = {"pair": "embedded", "prompt_set": "quick", "method": "eqspec", "faults": [], "batch_size": 4, "k": 5,
             "max_new_tokens": 32, "dtype": "float32"}


_SAMPLED = {**_EMBEDDED, "k": 3, "max_new_tokens": 24, "temperature": 0.8, "top_p": 0.95}


EXAMPLES = {
    "clean eqspec": _EMBEDDED,
    "bsp-like decay": {**_EMBEDDED, "faults": ["bsp-like"]},
    "dsd-like collapse": {**_EMBEDDED, "faults": ["dsd-like"]},
    "numerics near-tie": {"pair": "tiny", "prompt_set": "all", "method": "eqspec", "faults": [], "batch_size": 4,
                          "k": 5, "max_new_tokens": 48, "dtype": "bfloat16"},
    # Sampled runs have no token-by-token reference: the distribution panel judges them. k 3 and 24 tokens keep
    # them quick on a CPU (no reference to decode either); the fault still emits tokens outside the target's nucleus.
    "sampled eqspec": {**_SAMPLED, "faults": []},
    "sampling fault: draft-only temperature": {**_SAMPLED, "faults": ["temperature-draft-only"]},
    # Audited, a sampled run's corrupt state is named in the round it went wrong: every row checked every round.
    "audited sampling: bsp-like state": {**_SAMPLED, "faults": ["bsp-like"], "audit": True},
    # Answers that copy from their prompt (summaries, code, code edits): prompt lookup drafts them with no draft
    # model. Batch size 1 against the batch-size-1 reference: no batching in the speed-up the summary states. On a
    # busy 2-core CPU at one thread (k 5, 32 tokens) n-grams 2-3 ran 1.00-1.12x the reference's tokens/s over three
    # runs; in one sweep 1-3 ran 1.04x (a 1-gram matches often, and wrongly), 2-4 1.13x, 3-4 1.11x and the draft
    # model 0.60x. The page says what each run measured.
    "prompt lookup: summaries and code edits": {**_EMBEDDED, "prompt_set": "summarize+code", "batch_size": 1,
                                                "drafter": "lookup", "ngram_min": 2, "ngram_max": 3},
    # Four candidates a position, verified as one token tree; the fault takes the token after an accepted path at
    # the node listed at its length (a chain's index), which is wrong once the path leaves the first branch.
    "token trees: bonus from the wrong node": {**_EMBEDDED, "tree_width": 4, "faults": ["tree-bonus-by-index"]},
}


# The controls, in the order of spec_from_controls' arguments (less prompt_file, which follows "typed").
DEFAULTS = {"pair": "embedded", "target": "", "draft": "", "prompt_set": "quick", "typed": "", "method": "eqspec",
            "faults": [], "batch_size": 4, "k": 5, "max_new_tokens": 48, "dtype": "float32", "seed": 0, "window": 0,
            "max_wait": 4, "audit": False, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "draft_temperature": None,
            "draft_top_k": None, "draft_top_p": None, "drafter": DEFAULT_DRAFTER, "ngram_min": 1, "ngram_max": 3, "rows": "",
            "repetition_penalty": 1.0, "presence_penalty": 0.0, "logprobs": False, "stop": "", "chat_template": True,
            "tree_width": 1}


FIRST_PAGE = "bsp-like decay"


WELCOME = ("**You are looking at a real case, bundled with specviz:** {what}, recorded by its own engine. The red "
           "outline in the grid is the round that wrote a sequence's first divergent token; the panel beside it says "
           "why. **To run your own,** set the controls under \"Run a method\" (or pick an example) and press Run; the "
           "Sweep tab runs a table of methods, faults, batch sizes and k.")


BUNDLED_WHAT = {"bsp-like decay": "the bsp-like faults (position ids counted from cache slots, pads and rejected "
                                  "drafts included) decaying batch speculative decoding on the embedded pair",
                "numerics near-tie": "clean batch speculative decoding in bfloat16 on the tiny pair, where near-ties "
                                     "tip under floating point (numerics, not a bug)"}


TEMPERATURE_MAX = 2.0  # the slider's range; a link may carry up to spec.MAX_TEMPERATURE


TOP_P_MIN = 0.05


def spec_from_controls(pair, target, draft, prompt_set, typed, prompt_file, method, faults, batch_size, k,
                       max_new_tokens, dtype, seed, window, max_wait, audit, temperature=0.0, top_k=0, top_p=1.0,
                       draft_temperature=None, draft_top_k=None, draft_top_p=None, drafter=DEFAULT_DRAFTER, ngram_min=1,
                       ngram_max=3, rows="", repetition_penalty=1.0, presence_penalty=0.0, logprobs=False,
                       stop="", chat_template=True, tree_width=1) -> RunSpec:
    """The run the controls describe. Prompts: typed ones, else the uploaded file, else the built-in set.
    Sampling: temperature 0 is greedy; top-k 0 and top-p 1 are off; a blank draft setting is the target's; `rows`,
    where typed, each request's own settings (one a line, key=value pairs), in place of the target's. `stop`:
    stop strings, one a line (spaces kept). `chat_template`: each prompt wrapped in the model's chat template.
    The n-gram sizes belong to prompt lookup: with the draft model they are not read (the page hides them); a
    tree's width to the drafters that grow trees."""
    if pair == CUSTOM:
        if not (target or "").strip() or not (draft or "").strip():
            raise SpecError("a custom pair needs both a target and a draft model id")
    else:
        target, draft = PRESETS[pair]
    if (typed or "").strip():
        prompts = parse_prompts(typed, "typed prompts")
    elif prompt_file:
        prompts = parse_prompts(serving.read_upload(prompt_file, MAX_PROMPT_FILE_BYTES), Path(prompt_file).name)
    else:
        prompts = builtin_sets()[prompt_set]
    return RunSpec.build(target=target.strip(), draft=draft.strip(), prompts=tuple(prompts), method=method,
                         faults=tuple(faults or ()), batch_size=int(batch_size), k=int(k),
                         max_new_tokens=int(max_new_tokens), dtype=dtype, seed=int(seed),
                         window=int(window) or None, max_wait=int(max_wait),
                         audit=int(batch_size) if audit else 0, temperature=_real(temperature, 0.0),
                         top_k=int(top_k or 0), top_p=_real(top_p, 1.0), draft_temperature=_real(draft_temperature),
                         draft_top_k=None if draft_top_k is None else int(draft_top_k),
                         draft_top_p=_real(draft_top_p), drafter=drafter or DEFAULT_DRAFTER, rows=rows_from_text(rows),
                         repetition_penalty=_real(repetition_penalty, 1.0),
                         presence_penalty=_real(presence_penalty, 0.0), logprobs=bool(logprobs),
                         stop=tuple(s for s in (stop or "").replace("\r\n", "\n").split("\n") if s),
                         chat_template=bool(chat_template),
                         **_drafter_options(drafter, ngram_min=ngram_min, ngram_max=ngram_max, tree_width=tree_width))


def _drafter_options(drafter: str | None, **values) -> dict:
    """The option controls' values that the drafter reads (spec/drafters.py): the others stay at their defaults."""
    return {f: int(v) for f, v in values.items() if f in DRAFTERS[drafter or DEFAULT_DRAFTER].options}


def _real(value, blank: float | None = None) -> float | None:
    """A slider's or number box's value, rounded past a slider's float noise (0.15000000000000002: 0.15)."""
    return blank if value is None else round(float(value), 6)


def shrink_focused(settings: Settings, trace: Trace | None, seq, progress=gr.Progress(), request: gr.Request = None):
    """The forensic panel's button: the smallest run that still shows what the focused sequence shows (its fork;
    sampled, its corrupt state or a token the target could not draw)."""
    if trace is None:
        raise gr.Error("run something or open a trace first")
    if trace.manifest.engine is not None:
        raise gr.Error("an engine check cannot be shrunk here: shrinking decodes smaller runs again, and the "
                       "engine is not here; run `specviz shrink` on a trace of our own engine instead")
    with serving.as_page_errors("cannot shrink this run here: ", stopped="nothing was kept"):
        settings.check(trace.manifest.spec)
        return serving.shrink_fork(trace, int(seq or 0), settings, progress, request.session_hash if request else "")


def run_controls(settings: Settings, pair, target, draft, prompt_set, typed, prompt_file, method, faults, batch_size,
                 k, max_new_tokens, dtype, seed, window, max_wait, audit=False, temperature=0.0, top_k=0, top_p=1.0,
                 draft_temperature=None, draft_top_k=None, draft_top_p=None, drafter=DEFAULT_DRAFTER, ngram_min=1,
                 ngram_max=3, rows="", repetition_penalty=1.0, presence_penalty=0.0, logprobs=False, stop="",
                 chat_template=True, tree_width=1, progress=gr.Progress(), request: gr.Request = None):
    """Run button and examples: decode what the controls say. The parameters are spec_from_controls'; those with
    defaults may be left out by an API client (the draft's own sampling settings default to blank, the drafter
    to the draft model)."""
    session = request.session_hash if request else ""
    with serving.as_page_errors():
        spec = spec_from_controls(pair, target, draft, prompt_set, typed, prompt_file, method, faults, batch_size, k,
                                  max_new_tokens, dtype, seed, window, max_wait, audit, temperature, top_k, top_p,
                                  draft_temperature, draft_top_k, draft_top_p, drafter, ngram_min, ngram_max, rows,
                                  repetition_penalty, presence_penalty, logprobs, stop, chat_template, tree_width)
        trace, timing = serving.decode(spec, settings, progress, session)
    return trace, serving.headline(trace, timing), serving.save(trace), None


def check_engine(settings: Settings, pair, target, dtype, outputs, control, server, served_model, control_server,
                 prompt_set, max_new_tokens, determinism=False, temperature=0, top_p=1, seed=0, same_draft=False,
                 progress=gr.Progress()):
    """The check tab: an outputs file (and a control file), or, where the operator allows it, a server (asked every
    prompt twice more with `determinism`); greedy, or sampled at `temperature` and `top_p` (each prompt's request
    seeded from `seed`). `same_draft`: the engine drafts with the pair's draft model (its acceptance is judged)."""
    with serving.as_page_errors():
        if pair == CUSTOM:
            target = (target or "").strip()
            if not target:
                raise SpecError("a custom reference needs a target model id")
            draft = target  # no draft: the reference is the target alone
        else:
            target, draft = PRESETS[pair]
        files = None
        if outputs:
            files = ((serving.read_upload(outputs, MAX_TRACE_BYTES).encode(), Path(outputs).name),
                     (serving.read_upload(control, MAX_TRACE_BYTES).encode(), Path(control).name) if control else None)
        elif (server or "").strip():
            settings.check_server(server.strip())
            if (control_server or "").strip():
                settings.check_server(control_server.strip())
        else:
            raise SpecError("upload the engine's outputs file" + (", or give a server URL" if settings.engine_servers
                                                                   and not settings.public else ""))
        prompts = builtin_sets()[prompt_set or "quick"]
        spec = RunSpec.build(target=target, draft=draft, prompts=tuple(prompts), method=ENGINE, dtype=dtype,
                             max_new_tokens=int(max_new_tokens or 48), temperature=float(temperature or 0),
                             top_p=float(1 if top_p is None else top_p), seed=int(seed or 0))
        if files is None:
            settings.check(spec)
        progress(0, desc="the outputs teacher-forced through the target, then the reference where they do not prove it")
        servers = None if files else ((server.strip(), (served_model or "").strip() or None),
                                      (control_server.strip(), (served_model or "").strip() or None)
                                      if (control_server or "").strip() else None)
        drafter = next(n for n, d in DRAFTERS.items() if d.draft_model) if same_draft else None
        trace = serving.check_engine(spec, settings, files, servers, bool(determinism) and files is None, progress,
                                     drafter)
    return trace, summary.headline(trace), serving.save(trace), None


def open_trace(path: str | None):
    """Upload: view a trace file without loading any model."""
    trace = serving.uploaded(path, serving.read_trace)
    return trace, summary.headline(trace, " (opened from a file)"), serving.save(trace), None


def open_link(query: str):
    """Page load: fill the controls from a share link, to be replayed; without one (or with a bad one, which
    gets a message), open the first bundled trace at once: no decode, no queue."""
    keep = [gr.skip()] * len(DEFAULTS)
    try:
        link = share.decode(query or "")
    except SpecError as e:
        return *keep, *_first_page(f"**That share link could not be used:** {views.md(str(e))}.")
    if link is None:
        tab = share.other_tab(query or "")  # the Sweep or Compare tab opens it (sweeptab.open_*_link)
        if tab == "sweep":
            return (*keep, gr.skip(), gr.skip(), None,
                    "This link is a sweep's: see the Sweep tab; click a cell there to open its run here.")
        if tab == "compare":
            return *keep, gr.skip(), gr.skip(), None, "This link compares two runs: see the Compare tab."
        return *keep, *_first_page()
    s = link.spec
    pending = {"spec": s.canonical_json(), "fp": link.fingerprint, "env": link.env, "seq": link.seq,
               "round": link.round}
    return *controls_of(s), gr.skip(), gr.skip(), pending, "Replaying the shared run…"


def controls_of(s: RunSpec) -> list:
    """The controls' values that describe the run `s` (spec_from_controls reads them back), in DEFAULTS' order."""
    preset = next((name for name, ids in PRESETS.items() if ids == (s.target, s.draft)), CUSTOM)
    named = next((name for name, ps in builtin_sets().items() if tuple(ps) == s.prompts), None)
    typed = "" if named else _prompts_as_text(s.prompts)
    values = {"pair": preset, "target": s.target, "draft": s.draft, "prompt_set": named or "quick", "typed": typed,
              "method": s.method, "faults": list(s.faults), "batch_size": s.batch_size, "k": s.k,
              "max_new_tokens": s.max_new_tokens, "dtype": s.dtype, "seed": s.seed, "window": s.window or 0,
              "max_wait": s.max_wait, "audit": s.audit > 0, "top_k": s.top_k, "draft_temperature": s.draft_temperature,
              "draft_top_k": s.draft_top_k, "draft_top_p": s.draft_top_p, "drafter": s.drafter,
              "ngram_min": s.ngram_min, "ngram_max": s.ngram_max, "rows": rows_as_text(s.rows),
              "repetition_penalty": s.repetition_penalty, "presence_penalty": s.presence_penalty,
              "logprobs": s.logprobs, "stop": "\n".join(s.stop), "chat_template": s.chat_template,
              "tree_width": s.tree_width,
              # A link may carry what the sliders do not reach (the CLI's temperature 5): they widen to it.
              "temperature": s.temperature if s.temperature <= TEMPERATURE_MAX else gr.update(
                  value=s.temperature, maximum=s.temperature),
              "top_p": s.top_p if s.top_p >= TOP_P_MIN else gr.update(value=s.top_p, minimum=s.top_p)}
    return [values[n] for n in DEFAULTS]



def _first_page(problem: str = "") -> tuple[Trace, str, None, str]:
    """The trace, download, pending replay (none) and status of the page a visitor first sees: the FIRST_PAGE
    bundled trace."""
    trace = serving.bundled()[FIRST_PAGE]
    status = WELCOME.format(what=BUNDLED_WHAT[FIRST_PAGE]) + "\n\n" + serving.headline(trace, "bundled")
    return trace, serving.save(trace), None, (f"{problem} Showing a bundled case instead.\n\n" if problem else "") + status


def _prompts_as_text(prompts: tuple[str, ...]) -> str:
    """Prompts for the typed box: one a line, or Spec-Bench JSONL when a prompt spans lines."""
    if any("\n" in p for p in prompts):
        return "\n".join(json.dumps({"turns": [p]}) for p in prompts)
    return "\n".join(prompts)


def replay(settings: Settings, pending: dict | None, progress=gr.Progress(), request: gr.Request = None):
    """Decode the linked run (exactly its spec) and say whether it matched the original."""
    if not pending:
        return gr.skip(), gr.skip(), gr.skip(), None
    session = request.session_hash if request else ""
    with serving.as_page_errors("the shared run cannot be replayed here: "):
        trace, timing = serving.decode(RunSpec.model_validate_json(pending["spec"]), settings, progress, session)
    return trace, serving.headline(trace, timing) + "\n\n" + _replay_report(trace, pending), serving.save(trace), pending


def _replay_report(trace: Trace, pending: dict) -> str:
    """Markdown: whether the replay matched, and the two environments (the link's is a stranger's text)."""
    m = trace.manifest
    here = share.environment(m)
    if pending.get("fp") is None:
        verdict = "The link carried no fingerprint to compare with."
    elif pending["fp"] == m.fingerprint:
        verdict = f"**Replay matched the shared run exactly** (fingerprint `{m.fingerprint}`)."
        if not m.spec.greedy:
            verdict += " Every draw fell the same way: the same tokens and the same accept/reject decisions."
    else:
        verdict = (f"**Replay drifted from the shared run:** fingerprint `{m.fingerprint}` here, "
                   f"`{pending['fp']}` in the link: some token or acceptance decision differs. ")  # both: 16 hex digits
        if not m.spec.greedy:
            verdict += ("This run samples, but its random numbers are counter-based (the seed, the sequence, the "
                        "token's index), the same in every environment: a drift means some probability was computed "
                        "differently here and a draw fell on its other side. Each run's sample is judged on its own "
                        "(the distribution verdict above is this replay's). ")
        verdict += "Compare the environments:"
    there = {k: str(v) for k, v in (pending.get("env") or {}).items()}
    keys = list(dict.fromkeys([*there, *here]))
    same = [f"{views.md(k)} {views.md(here[k])}" for k in keys if there.get(k) == here.get(k)]
    differ = [k for k in keys if there.get(k) != here.get(k)]
    text = verdict + "\n\nThe same in both environments: " + (", ".join(same) or "nothing") + "."
    if differ:
        text += "\n\n| differs | shared run | this replay |\n|---|---|---|\n" + "".join(
            f"| {views.md(k)} | {views.md(there.get(k, '?'))} | {views.md(here.get(k, '?'))} |\n" for k in differ)
    return text


def render(trace: Trace | None, seq=None, round=None, note: str = ""):
    """Every view for `trace` at the focus nearest (seq, round), and the share link for it."""
    if trace is None:
        return [gr.skip()] * len(VIEW_NAMES)
    focus, moved = views.resolve(trace, None if seq is None else int(seq), None if round is None else int(round))
    m = trace.manifest
    try:
        if m.engine is not None:
            raise SpecError("an engine check cannot be replayed from a link (the engine is not here): share its trace file")
        link = share.encode(share.Link(m.spec, focus.seq, focus.round, m.fingerprint, share.environment(m)))
    except SpecError as e:
        link, moved = "", moved + str(e)
    frame = summary.summary_frame(trace)
    return (
        gr.update(value=frame, column_widths=summary.column_widths(frame)), tokens.timeline_html(trace, focus),
        tokens.grid_html(trace, focus),
        tokens.compare_html(trace, focus), panel.forensics_html(trace, focus), plots.kv_lanes(trace, focus),
        plots.phase_timings(trace), glossary_text(trace), focus.seq, focus.round, link,
        (note + " " + moved).strip(), plots.pit_histograms(trace), summary.distribution_md(trace),
        plots.yardstick(trace, focus), plots.draft_slots(trace),
    )


VIEW_NAMES = ("table", "timeline", "grid", "compare", "forensics", "lanes", "phases", "glossary", "focus_seq",
              "focus_round", "link_query", "focus_note", "pit", "pit_verdict", "yardstick", "drafts")


def render_replayed(trace, pending):
    """After a replay: every view at the link's focus (nothing was replayed: nothing to show)."""
    if not pending:
        return [gr.skip()] * len(VIEW_NAMES)
    return render(trace, pending.get("seq"), pending.get("round"))


def pick(trace, evt: gr.EventData):
    """A click on a grid cell, a sequence label or a timeline round."""
    data = evt._data or {}
    return render(trace, data.get("seq"), data.get("round"))


def pick_row(trace, table, evt: gr.SelectData):
    """A click on the summary table: focus that sequence."""
    return render(trace, int(table.iloc[evt.index[0]]["seq"]))


def method_allows(method: str, drafter: str):
    """What the method registry (methods.py) lets `method` take, as updates of its info and of the faults,
    drafter and k controls: faults only where it declares them, a drafter and k only where it speculates. A value
    the method cannot take is reset, so that the page never holds a spec it refuses."""
    m = METHODS.get(method)
    if m is None:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    takes = m.drafters or (DEFAULT_DRAFTER,)
    return (gr.update(info=m.summary),
            gr.update(interactive=m.faults) if m.faults else gr.update(interactive=False, value=[]),
            gr.update(interactive=m.speculative) if drafter in takes else gr.update(interactive=m.speculative,
                                                                                  value=takes[0]),
            gr.update(interactive=m.speculative))


def drafter_shows(drafter: str):
    """The drafter's description, and its option controls (prompt lookup's n-gram sizes) where it reads them."""
    kind = DRAFTERS.get(drafter)
    return (gr.update(info=kind.summary if kind else ""),
            *(gr.update(visible=bool(kind) and f in kind.options) for f in DRAFTER_OPTIONS))
