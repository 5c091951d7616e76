"""The Run view's handlers: from the controls (or a share link, or an uploaded trace) to a trace,
and from a trace and a focus (a sequence and one of its rounds) to every view. Decoding, shrinking
and engine checks go through the serving layer (serving.py); the views are drawn
from the trace alone.
"""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from specviz.app import panel, plots, serving, summary, tokens, views
from specviz.app.form import (CUSTOM, ENGINE_DEFAULTS, INPUTS, by_name, controls_of, filled,
                              spec_from_controls)
from specviz.app.glossary import glossary as glossary_text
from specviz.run.settings import Settings
from specviz.spec.drafters import DEFAULT_DRAFTER, DRAFTER_OPTIONS, DRAFTERS, JUDGED_DRAFTERS
from specviz.spec.methods import METHODS
from specviz.spec.prompts import builtin_sets
from specviz.spec.run import ENGINE, PAIR_PRESETS, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import share
from specviz.trace.schema import MAX_TRACE_BYTES, Trace

# Each example opens straight onto a case worth seeing: the controls it sets, over form.DEFAULTS.
_EMBEDDED = {"max_new_tokens": 32}


_SAMPLED = {**_EMBEDDED, "k": 3, "max_new_tokens": 24, "temperature": 0.8, "top_p": 0.95}


EXAMPLES = {
    "clean eqspec": _EMBEDDED,
    "bsp-like decay": {**_EMBEDDED, "faults": ["bsp-like"]},
    "dsd-like collapse": {**_EMBEDDED, "faults": ["dsd-like"]},
    "numerics near-tie": {"pair": "tiny", "prompt_set": "all", "dtype": "bfloat16"},
    # Sampled runs have no token-by-token reference: the distribution panel judges them. k 3 and 24
    # tokens keep them quick on a CPU (no reference to decode either); the fault still emits tokens
    # outside the target's nucleus.
    "sampled eqspec": _SAMPLED,
    "sampling fault: draft-only temperature": {**_SAMPLED, "faults": ["temperature-draft-only"]},
    # Audited, a sampled run's corrupt state is named in the round it went wrong: every row checked
    # every round.
    "audited sampling: bsp-like state": {**_SAMPLED, "faults": ["bsp-like"], "audit": True},
    # Answers that copy from their prompt (summaries, code, code edits): prompt lookup drafts them
    # with no draft model. Batch size 1 against the batch-size-1 reference: no batching in the
    # speed-up the summary states. On a busy 2-core CPU at one thread (k 5, 32 tokens) n-grams 2-3
    # ran 1.00-1.12x the reference's tokens/s over three runs; in one sweep 1-3 ran 1.04x (a 1-gram
    # matches often, and wrongly), 2-4 1.13x, 3-4 1.11x and the draft model 0.60x. The page says
    # what each run measured.
    "prompt lookup: summaries and code edits": {**_EMBEDDED, "prompt_set": "summarize+code",
                                                "batch_size": 1, "drafter": "lookup",
                                                "ngram_min": 2, "ngram_max": 3},
    # Four candidates a position, verified as one token tree; the fault takes the token after an
    # accepted path at the node listed at its length (a chain's index), which is wrong once the path
    # leaves the first branch.
    "token trees: bonus from the wrong node": {**_EMBEDDED, "tree_width": 4,
                                               "faults": ["tree-bonus-by-index"]},
}


FIRST_PAGE = "bsp-like decay"


WELCOME = ("**You are looking at a real case, bundled with specviz:** {what}, recorded by its own "
           "engine. The red outline in the grid is the round that wrote a sequence's first "
           "divergent token; the panel beside it says why. **To run your own,** set the controls "
           "under \"Run a method\" (or pick an example) and press Run; the Sweep tab runs a table "
           "of methods, faults, batch sizes and k.")


BUNDLED_WHAT = {
    "bsp-like decay": ("the bsp-like faults (position ids counted from cache slots, pads and "
                       "rejected drafts included) decaying batch speculative decoding on the "
                       "embedded pair"),
    "numerics near-tie": ("clean batch speculative decoding in bfloat16 on the tiny pair, where "
                          "near-ties tip under floating point (numerics, not a bug)"),
}


def shrink_focused(settings: Settings, trace: Trace | None, seq, progress=gr.Progress(),
                   request: gr.Request = None):
    """The forensic panel's button: the smallest run that still shows what the focused sequence
    shows (its fork; sampled, its corrupt state or a token the target could not draw)."""
    if trace is None:
        raise gr.Error("run something or open a trace first")
    if trace.manifest.engine is not None:
        raise gr.Error("an engine check cannot be shrunk here: shrinking decodes smaller runs "
                       "again, and the engine is not here; run `specviz shrink` on a trace of our "
                       "own engine instead")
    with serving.as_page_errors("cannot shrink this run here: ", stopped="nothing was kept"):
        settings.check(trace.manifest.spec)
        return serving.shrink_fork(trace, int(seq or 0), settings, progress,
                                   request.session_hash if request else "")


@by_name(INPUTS)
def run_controls(settings: Settings, progress=gr.Progress(), request: gr.Request = None,
                 **controls):
    """Run button and examples: decode what the controls say (spec_from_controls'; an API client may
    leave any out: the draft's own sampling settings default to blank, the drafter
    to the draft model)."""
    session = request.session_hash if request else ""
    with serving.as_page_errors():
        spec = spec_from_controls(**controls)
        trace, timing = serving.served_trace(spec, settings, progress, session)
    return trace, serving.served_headline(trace, timing), serving.save(trace), None


@by_name(ENGINE_DEFAULTS)
def check_engine(settings: Settings, progress=gr.Progress(), **controls):
    """The check tab (ENGINE_DEFAULTS' controls): an outputs file (and a control file), or, where
    the operator allows it, a server (asked every prompt twice more with `determinism`); greedy, or
    sampled at `temperature` and `top_p` (each prompt's request seeded from `seed`).
    `engine_drafter`: what the engine drafts with (its acceptance is judged), a published head from
    its folder `engine_head`."""
    c = filled(ENGINE_DEFAULTS, controls)
    outputs, control = c["outputs"], c["control"]
    server, control_server = (c["server"] or "").strip(), (c["control_server"] or "").strip()
    with serving.as_page_errors():
        if c["pair"] == CUSTOM:
            target = (c["target"] or "").strip()
            if not target:
                raise SpecError("a custom reference needs a target model id")
            draft = target  # no draft: the reference is the target alone
        else:
            target, draft = PAIR_PRESETS[c["pair"]]
        files = None
        if outputs:
            files = ((serving.read_upload(outputs, MAX_TRACE_BYTES).encode(), Path(outputs).name),
                     (serving.read_upload(control, MAX_TRACE_BYTES).encode(), Path(control).name)
                     if control else None)
        elif server:
            settings.check_server(server)
            if control_server:
                settings.check_server(control_server)
        else:
            servers_allowed = settings.engine_servers and not settings.public
            raise SpecError("upload the engine's outputs file"
                            + (", or give a server URL" if servers_allowed else ""))
        drafter = c["engine_drafter"] or None
        if drafter and drafter not in JUDGED_DRAFTERS:
            raise SpecError(f"the engine's drafter is one of {', '.join(JUDGED_DRAFTERS)}, "
                            f"not {drafter!r}")
        # a head's folder, read for a head's drafter only (RunSpec asks for it there)
        published = bool(drafter) and "head" in DRAFTERS[drafter].options
        head = (c["engine_head"] or "").strip() if published else ""
        # A blank box (an API client's None) is the control's default.
        spec = RunSpec.build(
            **({"drafter": drafter} if drafter else {}), **({"head": head} if head else {}),
            target=target, draft=draft, method=ENGINE, dtype=c["dtype"],
            prompts=tuple(builtin_sets()[c["prompt_set"] or ENGINE_DEFAULTS["prompt_set"]]),
            max_new_tokens=int(c["max_new_tokens"] or ENGINE_DEFAULTS["max_new_tokens"]),
            temperature=float(c["temperature"] or ENGINE_DEFAULTS["temperature"]),
            top_p=float(ENGINE_DEFAULTS["top_p"] if c["top_p"] is None else c["top_p"]),
            seed=int(c["seed"] or ENGINE_DEFAULTS["seed"]))
        if files is None:
            settings.check(spec)
        elif head:  # loaded on this server
            settings.check_head(head)
        progress(0, desc="the outputs teacher-forced through the target, then the reference where "
                         "they do not prove it")
        served = (c["served_model"] or "").strip() or None
        servers = None if files else ((server, served),
                                      (control_server, served) if control_server else None)
        trace = serving.check_engine_trace(spec, settings, files, servers,
                                           bool(c["determinism"]) and files is None,
                                           progress, drafter)
    return trace, summary.headline(trace), serving.save(trace), None


def open_trace(path: str | None):
    """Upload: view a trace file without loading any model."""
    trace = serving.uploaded(path, serving.read_trace)
    return trace, summary.headline(trace, " (opened from a file)"), serving.save(trace), None


def open_link(query: str) -> dict:
    """Page load, by name (form.DEFAULTS' controls, "trace", "download", "pending" and "status"):
    the controls filled from a share link, to be replayed; without one (or with a bad one, which
    gets a message), the first bundled trace at once: no decode, no queue. What it leaves
    out stays."""
    try:
        link = share.decode_link(query or "")
    except SpecError as e:
        return _first_page(f"**That share link could not be used:** {views.md(str(e))}.")
    if link is None:
        # the Sweep or Compare tab opens it (sweeptab.open_*_link)
        tab = share.other_tab(query or "")
        if tab == "sweep":
            return {"pending": None, "status": "This link is a sweep's: see the Sweep tab; click a "
                                               "cell there to open its run here."}
        if tab == "compare":
            return {"pending": None, "status": "This link compares two runs: see the Compare tab."}
        return _first_page()
    s = link.spec
    pending = {"spec": s.canonical_json(), "fp": link.fingerprint, "env": link.env, "seq": link.seq,
               "round": link.round}
    return {**controls_of(s), "pending": pending, "status": "Replaying the shared run…"}


def _first_page(problem: str = "") -> dict:
    """The trace, download, pending replay (none) and status of the page a visitor first sees: the
    FIRST_PAGE bundled trace."""
    trace = serving.bundled()[FIRST_PAGE]
    status = (WELCOME.format(what=BUNDLED_WHAT[FIRST_PAGE]) + "\n\n"
              + serving.served_headline(trace, "bundled"))
    if problem:
        status = f"{problem} Showing a bundled case instead.\n\n" + status
    return {"trace": trace, "download": serving.save(trace), "pending": None, "status": status}


def replay(settings: Settings, pending: dict | None, progress=gr.Progress(),
           request: gr.Request = None):
    """Decode the linked run (exactly its spec) and say whether it matched the original."""
    if not pending:
        return gr.skip(), gr.skip(), gr.skip(), None
    session = request.session_hash if request else ""
    with serving.as_page_errors("the shared run cannot be replayed here: "):
        trace, timing = serving.served_trace(RunSpec.model_validate_json(pending["spec"]), settings,
                                             progress, session)
    return (trace,
            serving.served_headline(trace, timing) + "\n\n" + _replay_report(trace, pending),
            serving.save(trace), pending)


def _replay_report(trace: Trace, pending: dict) -> str:
    """Markdown: whether the replay matched, and the two environments (the link's
    is a stranger's text)."""
    m = trace.manifest
    here = share.environment(m)
    if pending.get("fp") is None:
        verdict = "The link carried no fingerprint to compare with."
    elif pending["fp"] == m.fingerprint:
        verdict = f"**Replay matched the shared run exactly** (fingerprint `{m.fingerprint}`)."
        if not m.spec.greedy:
            verdict += (" Every draw fell the same way: the same tokens and the same "
                        "accept/reject decisions.")
    else:
        verdict = (f"**Replay drifted from the shared run:** fingerprint `{m.fingerprint}` here, "
                   f"`{pending['fp']}` in the link: "  # both: 16 hex digits
                   "some token or acceptance decision differs. ")
        if not m.spec.greedy:
            verdict += ("This run samples, but its random numbers are counter-based (the seed, the "
                        "sequence, the token's index), the same in every environment: a drift "
                        "means some probability was computed differently here and a draw fell on "
                        "its other side. Each run's sample is judged on its own (the distribution "
                        "verdict above is this replay's). ")
        verdict += "Compare the environments:"
    there = {k: str(v) for k, v in (pending.get("env") or {}).items()}
    keys = list(dict.fromkeys([*there, *here]))
    same = [f"{views.md(k)} {views.md(here[k])}" for k in keys if there.get(k) == here.get(k)]
    differ = [k for k in keys if there.get(k) != here.get(k)]
    text = verdict + "\n\nThe same in both environments: " + (", ".join(same) or "nothing") + "."
    if differ:
        text += "\n\n| differs | shared run | this replay |\n|---|---|---|\n" + "".join(
            f"| {views.md(k)} | {views.md(there.get(k, '?'))} | {views.md(here.get(k, '?'))} |\n"
            for k in differ)
    return text


def render(trace: Trace | None, seq=None, round=None, note: str = "") -> dict:
    """Every view for `trace` at the focus nearest (seq, round), and the share link for it,
    by name (VIEW_NAMES)."""
    if trace is None:
        return dict.fromkeys(VIEW_NAMES, gr.skip())
    focus, moved = views.resolve(trace, None if seq is None else int(seq),
                                 None if round is None else int(round))
    m = trace.manifest
    try:
        if m.engine is not None:
            raise SpecError("an engine check cannot be replayed from a link (the engine is not "
                            "here): share its trace file")
        link = share.encode_link(share.Link(m.spec, focus.seq, focus.round, m.fingerprint,
                                            share.environment(m)))
    except SpecError as e:
        link, moved = "", moved + str(e)
    frame = summary.summary_frame(trace)
    return {
        "table": gr.update(value=frame, column_widths=summary.column_widths(frame)),
        "timeline": tokens.timeline_html(trace, focus), "grid": tokens.grid_html(trace, focus),
        "compare": tokens.compare_html(trace, focus),
        "forensics": panel.forensics_html(trace, focus),
        "lanes": plots.kv_lanes(trace, focus), "phases": plots.phase_timings(trace),
        "glossary": glossary_text(trace), "focus_seq": focus.seq, "focus_round": focus.round,
        "link_query": link, "focus_note": (note + " " + moved).strip(),
        "pit": plots.pit_histograms(trace), "pit_verdict": summary.distribution_md(trace),
        "yardstick": plots.yardstick(trace, focus), "drafts": plots.draft_slots(trace),
    }


# render's views, in the order of the page's API outputs.
VIEW_NAMES = ("table", "timeline", "grid", "compare", "forensics", "lanes", "phases", "glossary",
              "focus_seq", "focus_round", "link_query", "focus_note", "pit", "pit_verdict",
              "yardstick", "drafts")


def render_replayed(trace, pending) -> dict:
    """After a replay: every view at the link's focus (nothing was replayed: nothing to show)."""
    if not pending:
        return dict.fromkeys(VIEW_NAMES, gr.skip())
    return render(trace, pending.get("seq"), pending.get("round"))


def pick(trace, evt: gr.EventData):
    """A click on a grid cell, a sequence label or a timeline round."""
    data = evt._data or {}
    return render(trace, data.get("seq"), data.get("round"))


def pick_row(trace, table, evt: gr.SelectData):
    """A click on the summary table: focus that sequence."""
    return render(trace, int(table.iloc[evt.index[0]]["seq"]))


def method_allows(method: str, drafter: str):
    """What the method registry (methods.py) lets `method` take, as updates of its info and of the
    faults, drafter and k controls: faults only where it declares them, a drafter and k only where
    it speculates. A value the method cannot take is reset, so that the page never holds a spec
    it refuses."""
    m = METHODS.get(method)
    if m is None:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    takes = m.drafters or (DEFAULT_DRAFTER,)
    return (gr.update(info=m.summary),
            gr.update(interactive=m.faults) if m.faults else gr.update(interactive=False, value=[]),
            gr.update(interactive=m.speculative) if drafter in takes
            else gr.update(interactive=m.speculative, value=takes[0]),
            gr.update(interactive=m.speculative))


def engine_head_shows(drafter: str):
    """The Check tab's head box, where the engine's drafter is a published head."""
    return gr.update(visible=drafter in DRAFTERS and "head" in DRAFTERS[drafter].options)


def drafter_shows(drafter: str):
    """The drafter's description, and its option controls (prompt lookup's n-gram sizes) where it
    reads them."""
    kind = DRAFTERS.get(drafter)
    return (gr.update(info=kind.summary if kind else ""),
            *(gr.update(visible=bool(kind) and f in kind.options) for f in DRAFTER_OPTIONS))
