"""The Gradio page: its Run view, its layout and its wiring (the Sweep and Compare tabs are sweeptab.py's, the
decodes and files all handlers share serving.py's). Gradio is imported by these three modules only; they read
traces only.

One focus (a sequence and one of its rounds) links every view; clicks on the
grid, the timeline or the table move it. The page URL always carries the run
spec and the focus (share.py); opening such a link replays the run.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import gradio as gr

from . import check, plots, serving, share, sweeptab, views
from .decoding.catalogue import FAULTS
from .decoding.catalogue import PRESETS as FAULT_PRESETS
from .gpu import ZEROGPU, gpu
from .methods import DRAFTERS, METHODS
from .models import PRESETS, pair_for
from .prompts import builtin_sets, parse_prompts
from .settings import Settings
from .shrink import MAX_TRIALS, Shrunk, shrink, size
from .spec import DTYPES, ENGINE, MAX_NGRAM, MAX_TEMPERATURE, RunSpec, SpecError
from .trace import MAX_TRACE_BYTES, Trace

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
    # Answers that copy from their prompt (summaries, code, code edits): prompt lookup drafts them with no draft
    # model. Batch size 1 against the batch-size-1 reference: no batching in the speed-up the summary states. On a
    # busy 2-core CPU at one thread (k 5, 32 tokens) n-grams 2-3 ran 1.00-1.12x the reference's tokens/s over three
    # runs; in one sweep 1-3 ran 1.04x (a 1-gram matches often, and wrongly), 2-4 1.13x, 3-4 1.11x and the draft
    # model 0.60x. The page says what each run measured.
    "prompt lookup: summaries and code edits": {**_EMBEDDED, "prompt_set": "summarize+code", "batch_size": 1,
                                                "drafter": "lookup", "ngram_min": 2, "ngram_max": 3},
}
# The controls, in the order of spec_from_controls' arguments (less prompt_file, which follows "typed").
DEFAULTS = {"pair": "embedded", "target": "", "draft": "", "prompt_set": "quick", "typed": "", "method": "eqspec",
            "faults": [], "batch_size": 4, "k": 5, "max_new_tokens": 48, "dtype": "float32", "seed": 0, "window": 0,
            "max_wait": 4, "audit": False, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "draft_temperature": None,
            "draft_top_k": None, "draft_top_p": None, "drafter": "model", "ngram_min": 1, "ngram_max": 3}
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


# ---------------------------------------------------------------- from controls to a spec and a trace


def spec_from_controls(pair, target, draft, prompt_set, typed, prompt_file, method, faults, batch_size, k,
                       max_new_tokens, dtype, seed, window, max_wait, audit, temperature=0.0, top_k=0, top_p=1.0,
                       draft_temperature=None, draft_top_k=None, draft_top_p=None, drafter="model", ngram_min=1,
                       ngram_max=3) -> RunSpec:
    """The run the controls describe. Prompts: typed ones, else the uploaded file, else the built-in set.
    Sampling: temperature 0 is greedy; top-k 0 and top-p 1 are off; a blank draft setting is the target's.
    The n-gram sizes belong to prompt lookup: with the draft model they are not read (the page hides them)."""
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
                         draft_top_p=_real(draft_top_p), drafter=drafter or "model",
                         **({"ngram_min": int(ngram_min), "ngram_max": int(ngram_max)} if drafter == "lookup" else {}))


def _real(value, blank: float | None = None) -> float | None:
    """A slider's or number box's value, rounded past a slider's float noise (0.15000000000000002: 0.15)."""
    return blank if value is None else round(float(value), 6)


@gpu(runs=8)
def shrink_on_gpu(spec: RunSpec, seq: int, fork: int, token: int | None, settings: Settings, progress=None) -> Shrunk:
    """All GPU work of a shrink (many small runs); returns plain data only."""
    pair = pair_for(spec, settings.trust_remote_code)
    return shrink(spec, seq, fork, token, pair, progress, limits=settings)


def shrink_focused(settings: Settings, trace: Trace | None, seq, progress=gr.Progress(), request: gr.Request = None):
    """The forensic panel's button: the smallest run that still forks where the focused sequence forks."""
    session = request.session_hash if request else ""
    if trace is None:
        raise gr.Error("run something or open a trace first")
    seq = int(seq or 0)
    s = trace.sequences[seq] if 0 <= seq < len(trace.sequences) else None
    if s is not None and s.reference_ids is None and trace.manifest.spec.temperature > 0:
        raise gr.Error("a sampled run has no token-by-token reference to diverge from: nothing to shrink (its "
                       "distribution panel judges it)")
    if s is None or s.equivalent is not False:
        raise gr.Error(f"sequence {seq} does not diverge from the reference: nothing to shrink")
    spec = trace.manifest.spec
    fork = s.first_divergence
    token = s.output_ids[fork] if fork < len(s.output_ids) else None

    def tick(n: int) -> None:
        if session in serving.CANCELLED:
            raise serving.Cancelled
        progress(n / MAX_TRIALS, desc=f"shrink: candidate run {n} of at most {MAX_TRIALS}")

    serving.CANCELLED.discard(session)
    try:
        settings.check(spec)
        with serving.LOCK:
            found = shrink_on_gpu(spec, seq, fork, token, settings, None if ZEROGPU else tick)
    except SpecError as e:
        raise serving.error(f"cannot shrink this run here: {e}") from None
    except serving.Cancelled:
        raise gr.Error("stopped; nothing was kept", title="Stopped") from None
    small = found.trace
    serving.remember(small)  # the link below then opens at once
    verdict = small.sequences[found.seq].forensics.verdict
    return (f"**Smallest run found** ({found.trials} candidate runs): {size(spec)} → {size(small.manifest.spec)}; "
            f"its sequence {found.seq} still forks at token {found.fork} (`{verdict}`). "
            f"[Open it]({found.link()}), or copy the link.")


# ---------------------------------------------------------------- event handlers


def run_controls(settings: Settings, pair, target, draft, prompt_set, typed, prompt_file, method, faults, batch_size,
                 k, max_new_tokens, dtype, seed, window, max_wait, audit=False, temperature=0.0, top_k=0, top_p=1.0,
                 draft_temperature=None, draft_top_k=None, draft_top_p=None, drafter="model", ngram_min=1,
                 ngram_max=3, progress=gr.Progress(), request: gr.Request = None):
    """Run button and examples: decode what the controls say. The parameters are spec_from_controls'; those with
    defaults may be left out by an API client (the draft's own sampling settings default to blank, the drafter
    to the draft model)."""
    session = request.session_hash if request else ""
    try:
        spec = spec_from_controls(pair, target, draft, prompt_set, typed, prompt_file, method, faults, batch_size, k,
                                  max_new_tokens, dtype, seed, window, max_wait, audit, temperature, top_k, top_p,
                                  draft_temperature, draft_top_k, draft_top_p, drafter, ngram_min, ngram_max)
        trace, timing = serving.decode(spec, settings, progress, session)
    except SpecError as e:
        raise serving.error(str(e)) from None
    except serving.Cancelled:
        raise gr.Error("stopped; nothing was recorded", title="Stopped") from None
    return trace, serving.headline(trace, timing), serving.save(trace), None


@gpu
def check_on_gpu(spec: RunSpec, settings: Settings, outputs: tuple[bytes, str] | None,
                 control: tuple[bytes, str] | None, servers: tuple[tuple[str, str | None], tuple | None] | None) -> Trace:
    """All work of an engine check (the reference, the judging passes); returns plain data only."""
    pair = pair_for(spec, settings.trust_remote_code)
    if outputs is not None:
        return check.from_files(spec, pair, outputs, control, limits=settings)
    engine, control_server = servers
    return check.from_servers(spec, pair, engine, control_server, concurrency=8, timeout=300, limits=settings)


def check_engine(settings: Settings, pair, target, dtype, outputs, control, server, served_model, control_server,
                 prompt_set, max_new_tokens, progress=gr.Progress()):
    """The check tab: an outputs file (and a control file), or, where the operator allows it, a server."""
    try:
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
                             max_new_tokens=int(max_new_tokens or 48))
        if files is None:
            settings.check(spec)
        progress(0, desc="the reference, then the judging passes")
        servers = None if files else ((server.strip(), (served_model or "").strip() or None),
                                      (control_server.strip(), (served_model or "").strip() or None)
                                      if (control_server or "").strip() else None)
        with serving.LOCK:
            trace = check_on_gpu(spec, settings, *(files or (None, None)), servers)
    except SpecError as e:
        raise serving.error(str(e)) from None
    return trace, views.headline(trace), serving.save(trace), None


def open_trace(path: str | None):
    """Upload: view a trace file without loading any model."""
    trace = serving.uploaded(path, Trace.from_json)
    return trace, views.headline(trace, " (opened from a file)"), serving.save(trace), None


def open_link(query: str):
    """Page load: fill the controls from a share link, to be replayed; without one (or with a bad one, which
    gets a message), open the first bundled trace at once: no decode, no queue."""
    keep = [gr.skip()] * len(DEFAULTS)
    try:
        link = share.decode(query or "")
    except SpecError as e:
        return *keep, *_first_page(f"**That share link could not be used:** {views.md(str(e))}.")
    if link is None:
        if share.is_sweep(query or ""):  # the Sweep tab opens it (sweeptab.open_sweep_link)
            return (*keep, gr.skip(), gr.skip(), None,
                    "This link is a sweep's: see the Sweep tab; click a cell there to open its run here.")
        return *keep, *_first_page()
    s = link.spec
    preset = next((name for name, ids in PRESETS.items() if ids == (s.target, s.draft)), CUSTOM)
    named = next((name for name, ps in builtin_sets().items() if tuple(ps) == s.prompts), None)
    typed = "" if named else _prompts_as_text(s.prompts)
    values = {"pair": preset, "target": s.target, "draft": s.draft, "prompt_set": named or "quick", "typed": typed,
              "method": s.method, "faults": list(s.faults), "batch_size": s.batch_size, "k": s.k,
              "max_new_tokens": s.max_new_tokens, "dtype": s.dtype, "seed": s.seed, "window": s.window or 0,
              "max_wait": s.max_wait, "audit": s.audit > 0, "top_k": s.top_k, "draft_temperature": s.draft_temperature,
              "draft_top_k": s.draft_top_k, "draft_top_p": s.draft_top_p, "drafter": s.drafter,
              "ngram_min": s.ngram_min, "ngram_max": s.ngram_max,
              # A link may carry what the sliders do not reach (the CLI's temperature 5): they widen to it.
              "temperature": s.temperature if s.temperature <= TEMPERATURE_MAX else gr.update(
                  value=s.temperature, maximum=s.temperature),
              "top_p": s.top_p if s.top_p >= TOP_P_MIN else gr.update(value=s.top_p, minimum=s.top_p)}
    pending = {"spec": s.canonical_json(), "fp": link.fingerprint, "env": link.env, "seq": link.seq,
               "round": link.round}
    return *[values[n] for n in DEFAULTS], gr.skip(), gr.skip(), pending, "Replaying the shared run…"


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
    try:
        trace, timing = serving.decode(RunSpec.model_validate_json(pending["spec"]), settings, progress, session)
    except SpecError as e:
        raise serving.error(f"the shared run cannot be replayed here: {e}") from None
    except serving.Cancelled:
        raise gr.Error("stopped; nothing was recorded", title="Stopped") from None
    return trace, serving.headline(trace, timing) + "\n\n" + _replay_report(trace, pending), serving.save(trace), pending


def _replay_report(trace: Trace, pending: dict) -> str:
    """Markdown: whether the replay matched, and the two environments (the link's is a stranger's text)."""
    m = trace.manifest
    here = share.environment(m)
    if pending.get("fp") is None:
        verdict = "The link carried no fingerprint to compare with."
    elif pending["fp"] == m.fingerprint:
        verdict = f"**Replay matched the shared run exactly** (fingerprint `{m.fingerprint}`)."
        if m.spec.temperature > 0:
            verdict += " Every draw fell the same way: the same tokens and the same accept/reject decisions."
    else:
        verdict = (f"**Replay drifted from the shared run:** fingerprint `{m.fingerprint}` here, "
                   f"`{pending['fp']}` in the link: some token or acceptance decision differs. ")  # both: 16 hex digits
        if m.spec.temperature > 0:
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
    frame = views.summary_frame(trace)
    return (
        gr.update(value=frame, column_widths=views.column_widths(frame)), views.timeline_html(trace, focus),
        views.grid_html(trace, focus),
        views.compare_html(trace, focus), views.forensics_html(trace, focus), plots.kv_lanes(trace, focus),
        plots.phase_timings(trace), views.glossary(trace), focus.seq, focus.round, link,
        (note + " " + moved).strip(), plots.pit_histograms(trace), views.distribution_md(trace),
        plots.yardstick(trace, focus),
    )


VIEW_NAMES = ("table", "timeline", "grid", "compare", "forensics", "lanes", "phases", "glossary", "focus_seq",
              "focus_round", "link_query", "focus_note", "pit", "pit_verdict", "yardstick")


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


# ---------------------------------------------------------------- layout

CLICKS = """
element.addEventListener('click', (e) => {
  const c = e.target.closest('[data-round]');
  if (c && c.dataset.round !== '') trigger('click', {seq: Number(c.dataset.seq), round: Number(c.dataset.round)});
});
"""
# After every render: put the link in the address bar and the share box.
UPDATE_URL = """
(q) => {
  if (!q) return '';
  history.replaceState(null, '', location.pathname + q);
  return location.origin + location.pathname + q;
}
"""
INTRO = """# specviz
Batch speculative decoding, checked token by token against the target model alone — or, for a sampled run
(temperature above 0), by whether its tokens are drawn from the target's distribution. Pick an example or set up
a run; every view below follows one focused sequence and round — click a grid cell, a round in the timeline or a
table row to move it. The address bar is always a share link."""
LEGEND = ('<div class="sv-legend"><span class="sv-tok sv-draft">accepted draft</span>'
          '<span class="sv-tok sv-correction">target correction</span><span class="sv-tok sv-bonus">bonus</span>'
          '<span class="sv-tok sv-rejected">rejected draft</span><span class="sv-tok sv-fork">first divergence</span>'
          '<span class="sv-tok sv-impossible">impossible under the target</span>'
          '<span class="sv-tok sv-mismatch">decision against its draw</span>'
          '<span class="sv-nodraft">no drafts offered: the target\'s own token follows</span>'
          "</div>")


def example_api_name(name: str) -> str:
    """An example's API name: its first word ("bsp-like decay": example_bsp_like; "sampling fault: …":
    example_sampling)."""
    return "example_" + re.sub(r"\W+", "_", name.split()[0]).strip("_")


def build(settings: Settings | None = None) -> gr.Blocks:
    """The page, under `settings` (default: the operator's SPECVIZ_* environment)."""
    settings = settings or Settings.from_env()
    with gr.Blocks(title="specviz") as demo:
        trace_state = gr.State(None)
        pending = gr.State(None)
        sides = gr.State({})  # the runs shown so far, for the compare tab: label -> sidebyside.Side
        gr.Markdown(INTRO)
        with gr.Tabs(elem_id="sv-tabs") as tabs:
            with gr.Tab("Run view", id="run"), gr.Row():
                with gr.Column(scale=1, min_width=300):
                    with gr.Tabs():
                        with gr.Tab("Run a method"):
                            c = _controls(settings)
                            with gr.Row():
                                run_btn = gr.Button("Run", variant="primary")
                                stop_btn = gr.Button("Stop", variant="stop")
                            gr.Markdown("**Examples**")
                            example_btns = {name: gr.Button(name, size="sm") for name in EXAMPLES}
                        with gr.Tab("Check an engine", elem_id="sv-check-tab"):
                            e = _engine_controls(settings)
                            check_btn = gr.Button("Check", variant="primary")
                    with gr.Accordion("Limits on this server", open=False):
                        gr.Markdown(settings.describe())
                    with gr.Accordion("Trace files", open=False):
                        download = gr.DownloadButton("Download this trace (JSON)", value=None)
                        upload = gr.File(label=f"open a trace (JSON, up to {MAX_TRACE_BYTES // 2**20} MiB; no model "
                                               "needed)", file_types=[".json"], type="filepath", elem_id="sv-upload")
                with gr.Column(scale=3, elem_id="sv-views"):
                    # Stranger text reaches the status escaped (views.md); no $$ in it may become LaTeX either.
                    status = gr.Markdown("Run something, pick an example, or open a trace file.", elem_id="sv-status",
                                         latex_delimiters=[])
                    link_box = gr.Textbox(label="share link (opens this run at this focus)", interactive=False, lines=1,
                                          max_lines=1, buttons=["copy"], elem_id="sv-link")
                    table = gr.Dataframe(label="sequences (click one to focus it)", interactive=False, wrap=True,
                                         max_height=320, elem_id="sv-table", datatype="str")  # cells as plain text
                    with gr.Row():
                        focus_seq = gr.Number(label="focused sequence", precision=0, minimum=0)
                        focus_round = gr.Number(label="focused round", precision=0, minimum=0)
                        focus_note = gr.Markdown()
                    gr.Markdown("### Acceptance grid — sequences × their rounds, accepted / drafts offered (click a cell)\n"
                                "Each cell counts against the drafts its own row was offered, which prompt lookup and "
                                "the token budget make differ between rows; a hatched — cell: no drafts offered, the "
                                "target's own token alone. Red outline: the round that emitted a sequence's first "
                                "divergence. Violet corner "
                                "(audited runs): the round a row's state first left rounding. Sampled runs: a "
                                "red corner marks a round that emitted a token impossible under the target, a dotted "
                                "violet outline a decision that does not follow its draw.")
                    with gr.Row():
                        grid = gr.HTML(js_on_load=CLICKS, elem_id="sv-grid", padding=False)
                        with gr.Column():
                            forensics = gr.HTML(elem_id="sv-forensics", js_on_load=None)
                            with gr.Accordion("The yardstick: where this fork falls on it", open=True,
                                              elem_id="sv-yardstick-box"):
                                yardstick_plot = gr.Plot(show_label=False, elem_id="sv-yardstick")
                            shrink_btn = gr.Button("Shrink the focused divergence to a minimal reproducer", size="sm")
                            shrink_note = gr.Markdown(elem_id="sv-shrink")
                    with gr.Accordion("Distribution (sampled runs): are the tokens drawn from the target's distribution?",
                                      open=True, elem_id="sv-distribution"):
                        pit_verdict = gr.Markdown(views.distribution_md(None), elem_id="sv-pit-verdict",
                                                  latex_delimiters=[])
                        pit_plot = gr.Plot(show_label=False, elem_id="sv-pit")
                    gr.Markdown("### Token timeline of the focused sequence (click a round)")
                    gr.HTML(LEGEND, js_on_load=None)
                    timeline = gr.HTML(js_on_load=CLICKS, elem_id="sv-timeline")
                    gr.Markdown("### Reference and speculative text")
                    compare = gr.HTML(elem_id="sv-compare", js_on_load=None)
                    with gr.Tabs():
                        with gr.Tab("KV and padding lanes"):
                            lanes = gr.Plot(show_label=False, elem_id="sv-lanes")
                        with gr.Tab("Phase timings"):
                            phases = gr.Plot(show_label=False)
                        with gr.Tab("Glossary"):
                            glossary = gr.Markdown(views.glossary(None))
            with gr.Tab("Sweep", id="sweep", elem_id="sv-sweep-tab"):
                w = sweeptab.sweep_tab(settings)
            with gr.Tab("Compare two runs", id="compare", elem_id="sv-compare-tab"):
                p = sweeptab.compare_tab()
        link_query = gr.Textbox(visible=False)

        controls = [c[n] for n in DEFAULTS]
        shown = [table, timeline, grid, compare, forensics, lanes, phases, glossary, focus_seq, focus_round,
                 link_query, focus_note, pit_plot, pit_verdict, yardstick_plot]
        opened = [trace_state, status, download, pending]

        def show_link(event):
            return event.then(None, [link_query], [link_box], js=UPDATE_URL, api_visibility="private")

        def then_show(event, fn=render, inputs=(trace_state,)):
            shown_run = event.success(fn, list(inputs), shown, api_visibility="private")
            show_link(shown_run)
            shown_run.then(sweeptab.remember_sides, [sides, trace_state], [sides, p["a"], p["b"]], api_visibility="private")
            return shown_run

        run_inputs = [*controls[:5], c["prompt_file"], *controls[5:]]
        run_here = functools.partial(run_controls, settings)
        go = run_btn.click(run_here, run_inputs, opened, api_name="run", concurrency_id="decode")
        then_show(go)
        running = [go]
        for name, btn in example_btns.items():
            values = {**DEFAULTS, **EXAMPLES[name]}
            filled = btn.click(lambda v=values: [v[n] for n in DEFAULTS], None, controls,
                               api_name=example_api_name(name))
            ex = filled.then(run_here, run_inputs, opened, api_visibility="private", concurrency_id="decode")
            then_show(ex)
            running.append(ex)
        engine_inputs = [e[n] for n in ENGINE_CONTROLS]
        checked = check_btn.click(functools.partial(check_engine, settings), engine_inputs, opened,
                                  api_name="check_engine", concurrency_id="decode")
        then_show(checked)
        running.append(checked)
        running.append(shrink_btn.click(functools.partial(shrink_focused, settings), [trace_state, focus_seq],
                                        [shrink_note], api_name="shrink", concurrency_id="decode"))
        stop_btn.click(serving.stop, None, None, cancels=running, api_name="stop")

        then_show(upload.upload(open_trace, [upload], opened, api_name="open_trace"))
        show_link(grid.click(pick, [trace_state], shown, api_name="pick_cell"))
        show_link(timeline.click(pick, [trace_state], shown, api_name="pick_round"))
        show_link(table.select(pick_row, [trace_state, table], shown, api_name="pick_sequence"))
        for name, box in (("seq", focus_seq), ("round", focus_round)):
            show_link(box.submit(render, [trace_state, focus_seq, focus_round], shown, api_name=f"focus_{name}"))

        c["method"].change(method_allows, [c["method"], c["drafter"]], [c["method"], c["faults"], c["drafter"], c["k"]],
                           api_visibility="private", queue=False, show_progress="hidden")
        c["drafter"].change(drafter_shows, [c["drafter"]], [c["drafter"], c["ngram_min"], c["ngram_max"]],
                            api_visibility="private", queue=False, show_progress="hidden")
        loaded = demo.load(open_link, [link_query], [*controls, trace_state, download, pending, status],
                           js="() => location.search", api_name="open_link")
        then_show(loaded)  # the first page's bundled trace (a link's run is shown once replayed)
        replayed = loaded.then(functools.partial(replay, settings), [pending], opened, api_visibility="private", concurrency_id="decode")
        then_show(replayed, fn=render_replayed, inputs=(trace_state, pending))

        # The Sweep tab: run or open a report, show it, click a cell into the run view.
        sweep_controls = [w[n] for n in sweeptab.SWEEP_DEFAULTS]
        found_out = [w["report"], w["download"], w["cell"]]
        sweep_shown = [w[n] for n in sweeptab.SWEEP_VIEW_NAMES]

        def then_show_sweep(event):
            shown_sweep = event.success(functools.partial(sweeptab.render_sweep, settings), [w["report"], w["cell"]],
                                        sweep_shown, api_visibility="private")
            shown_sweep.then(None, [w["link_query"]], [w["link_box"]], js=UPDATE_URL, api_visibility="private")
            shown_sweep.then(sweeptab.remember_sides, [sides, w["report"]], [sides, p["a"], p["b"]], api_visibility="private")

        swept = w["run"].click(functools.partial(sweeptab.run_sweep, settings), sweep_controls, found_out, api_name="sweep",
                               concurrency_id="decode")
        then_show_sweep(swept)
        w["stop"].click(serving.stop, None, None, cancels=[swept], api_visibility="private")
        then_show_sweep(w["upload"].upload(sweeptab.open_report, [w["upload"]], found_out, api_name="open_report"))
        def open_cell_here(found, evt: gr.EventData, progress=gr.Progress(), request: gr.Request = None):
            return sweeptab.open_cell(settings, found, evt, progress, request)  # gradio finds EventData in no partial

        for heatmap in (w["exact"], w["prefix"]):
            opened_cell = heatmap.click(open_cell_here, [w["report"]], [*opened, tabs, w["cell"], w["status"]],
                                        api_name="open_cell" if heatmap is w["exact"] else None,
                                        api_visibility="public" if heatmap is w["exact"] else "private",
                                        concurrency_id="decode")
            then_show(opened_cell)
            opened_cell.success(sweeptab.outline_cell, [w["report"], w["cell"]], [w["exact"], w["prefix"]],
                                api_visibility="private")
        sweep_loaded = demo.load(sweeptab.open_sweep_link, [w["link_query"]], [*sweep_controls, w["pending"], w["status"], tabs],
                                 js="() => location.search", api_name="open_sweep_link")
        then_show_sweep(sweep_loaded.then(functools.partial(sweeptab.replay_sweep, settings), [w["pending"]],
                                          [*found_out, w["status"]], api_visibility="private",
                                          concurrency_id="decode"))

        # The compare tab: any two runs shown so far.
        compared = [sides, p["a"], p["b"], p["seq"]]
        for picker in (p["a"], p["b"], p["seq"]):
            picker.change(sweeptab.compare_runs, compared, [p["summary"], p["aligned"]], api_visibility="private",
                          show_progress="hidden")
    return demo


def method_allows(method: str, drafter: str):
    """What the method registry (methods.py) lets `method` take, as updates of its info and of the faults,
    drafter and k controls: faults only where it declares them, a drafter and k only where it speculates. A value
    the method cannot take is reset, so that the page never holds a spec it refuses."""
    m = METHODS.get(method)
    if m is None:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    takes = m.drafters or ("model",)
    return (gr.update(info=m.summary),
            gr.update(interactive=m.faults) if m.faults else gr.update(interactive=False, value=[]),
            gr.update(interactive=m.speculative) if drafter in takes else gr.update(interactive=m.speculative,
                                                                                  value=takes[0]),
            gr.update(interactive=m.speculative))


def drafter_shows(drafter: str):
    """The drafter's description, and the n-gram sizes where they apply (prompt lookup)."""
    lookup = drafter == "lookup"
    return gr.update(info=DRAFTERS.get(drafter, "")), gr.update(visible=lookup), gr.update(visible=lookup)


def _controls(settings: Settings) -> dict:
    c = {}
    c["pair"] = gr.Dropdown([*PRESETS, CUSTOM], value=DEFAULTS["pair"], label="model pair",
                            info="embedded: SmolLM2-135M-Instruct and its draft, offline; tiny: a random 3-layer test pair")
    with gr.Accordion("custom pair (Hub ids or local paths)", open=False):
        c["target"] = gr.Textbox(label="target model")
        c["draft"] = gr.Textbox(label="draft model")
    c["prompt_set"] = gr.Dropdown(list(builtin_sets()), value=DEFAULTS["prompt_set"], label="built-in prompts")
    c["typed"] = gr.Textbox(lines=3, label="or type prompts", info="one a line, or Spec-Bench JSONL; used when not empty")
    c["prompt_file"] = gr.File(label="or upload prompts (text or Spec-Bench .jsonl)", file_types=[".txt", ".jsonl"],
                               type="filepath", height=90)
    c["method"] = gr.Dropdown(list(METHODS), value=DEFAULTS["method"], label="method",
                              info=METHODS[DEFAULTS["method"]].summary, elem_id="sv-method")
    c["drafter"] = gr.Dropdown(list(DRAFTERS), value=DEFAULTS["drafter"], label="drafter",
                               info=DRAFTERS[DEFAULTS["drafter"]], elem_id="sv-drafter")
    with gr.Row():
        lookup = DEFAULTS["drafter"] == "lookup"
        c["ngram_min"] = gr.Slider(1, MAX_NGRAM, value=DEFAULTS["ngram_min"], step=1, label="shortest n-gram",
                                   visible=lookup, elem_id="sv-ngram-min")
        c["ngram_max"] = gr.Slider(1, MAX_NGRAM, value=DEFAULTS["ngram_max"], step=1, label="longest n-gram (tried first)",
                                   visible=lookup, elem_id="sv-ngram-max")
    with_faults = " and ".join(n for n, m in METHODS.items() if m.faults)
    c["faults"] = gr.Dropdown([*FAULTS, *FAULT_PRESETS], value=[], multiselect=True, label=f"faults ({with_faults} only)",
                              info="re-create a published engine's bug; the sampling faults need a temperature above 0",
                              interactive=METHODS[DEFAULTS["method"]].faults, elem_id="sv-faults")
    with gr.Row():
        c["batch_size"] = gr.Slider(1, settings.max_batch_size, value=DEFAULTS["batch_size"], step=1, label="batch size")
        c["k"] = gr.Slider(1, settings.max_k, value=DEFAULTS["k"], step=1, label="k (drafts a round)")
    with gr.Row():
        c["max_new_tokens"] = gr.Slider(1, settings.max_new_tokens, value=DEFAULTS["max_new_tokens"], step=1, label="max new tokens")
        c["dtype"] = gr.Dropdown(list(DTYPES), value=DEFAULTS["dtype"], label="dtype")
    c["temperature"] = gr.Slider(0, TEMPERATURE_MAX, value=DEFAULTS["temperature"], step=0.05, label="temperature",
                                 info="0: greedy, checked token by token against the reference; above 0: speculative "
                                      "sampling, judged by the distribution of its tokens", elem_id="sv-temperature")
    with gr.Row():
        c["top_k"] = gr.Number(value=DEFAULTS["top_k"], precision=0, minimum=0, label="top-k (0: off)",
                               elem_id="sv-top-k")
        c["top_p"] = gr.Slider(TOP_P_MIN, 1, value=DEFAULTS["top_p"], step=0.01, label="top-p (1: off)",
                               elem_id="sv-top-p")
    with gr.Accordion("the draft's own sampling (blank: the target's)", open=False):
        c["draft_temperature"] = gr.Number(value=None, minimum=0, maximum=MAX_TEMPERATURE, label="draft temperature")
        c["draft_top_k"] = gr.Number(value=None, precision=0, minimum=0, label="draft top-k (0: off)")
        c["draft_top_p"] = gr.Number(value=None, minimum=0, maximum=1, label="draft top-p (1: off)")
    with gr.Accordion("seed and exspec", open=False):
        c["seed"] = gr.Number(value=DEFAULTS["seed"], precision=0, label="seed")
        c["window"] = gr.Number(value=DEFAULTS["window"], precision=0, label="exspec window (0: 2 × batch size)")
        c["max_wait"] = gr.Number(value=DEFAULTS["max_wait"], precision=0, label="exspec max wait (rounds)")
    c["audit"] = gr.Checkbox(value=DEFAULTS["audit"], label="audit every round",
                             info="check every row's state against a fresh recomputation each round, fork or not "
                                  "(about one extra batch-size-1 pass of each model per row and round)")
    return c


ENGINE_CONTROLS = ("pair", "target", "dtype", "outputs", "control", "server", "served_model", "control_server",
                   "prompt_set", "max_new_tokens")


def _engine_controls(settings: Settings) -> dict:
    e = {}
    gr.Markdown("An engine's outputs (vLLM, SGLang, TGI, llama.cpp, your own) against the batch-size-1 reference of "
                "the same weights: every difference judged numerics or a bug, from the engine's token ids alone. "
                "The file format is in docs/engines.md (`specviz schema --outputs`).")
    e["pair"] = gr.Dropdown([*PRESETS, CUSTOM], value=DEFAULTS["pair"], label="reference: the engine's target weights")
    e["target"] = gr.Textbox(label="custom target (Hub id or local path)", visible=True)
    e["dtype"] = gr.Dropdown(list(DTYPES), value="float32", label="reference dtype")
    e["outputs"] = gr.File(label="the engine's outputs (JSONL)", file_types=[".jsonl", ".json", ".txt"],
                           type="filepath", height=90)
    e["control"] = gr.File(label="optional: the same engine without speculation (JSONL, the same prompts)",
                           file_types=[".jsonl", ".json", ".txt"], type="filepath", height=90)
    servers = bool(settings.engine_servers) and not settings.public
    with gr.Accordion("or ask a server (OpenAI-compatible)", open=False, visible=servers):
        e["server"] = gr.Textbox(label="server URL", info="allowed: " + (", ".join(settings.engine_servers) or "none"))
        e["served_model"] = gr.Textbox(label="served model (blank: the server's only model)")
        e["control_server"] = gr.Textbox(label="optional: a server of the same engine without speculation")
        e["prompt_set"] = gr.Dropdown(list(builtin_sets()), value="quick", label="prompts to send")
        e["max_new_tokens"] = gr.Slider(1, settings.max_new_tokens, value=48, step=1, label="max new tokens")
    return e


def serve(settings: Settings | None = None, **launch_kwargs) -> gr.Blocks:
    """Build the page and serve it: one decode at a time, a bounded queue, uploads capped, the page's CSS."""
    settings = settings or Settings.from_env()
    demo = build(settings)
    demo.queue(default_concurrency_limit=1, max_size=settings.queue_size)
    demo.launch(css_paths=[serving.ASSETS / "specviz.css"], max_file_size=MAX_TRACE_BYTES, **launch_kwargs)
    return demo
