"""The Field cases tab: the field casebook (spec/casebook.py) as one card per case — what its users
saw, its threads, the mechanism in two lines, the verdict its replica gets — and, from a card's
button, the case's recorded run opened in the Run view from the bundle (assets/traces): no decode,
no queue. Every card is drawn from the casebook's data, so a new case needs no code here.
"""
from __future__ import annotations

import html

import gradio as gr

from specviz.app import serving
from specviz.app.form import controls_of
from specviz.spec.casebook import BY_FAULT, CASES, Case
from specviz.spec.drafters import DRAFTERS
from specviz.spec.faults import FAULTS
from specviz.spec.run import PAIR_PRESETS, RunSpec
from specviz.spec.verdicts import verdict

# A card's button: open its case.
CARD_CLICKS = """
element.addEventListener('click', (e) => {
  const b = e.target.closest('button[data-case]');
  if (b) trigger('click', {case: b.dataset.case});
});
"""
CASEBOOK_INTRO = ("Speculative-decoding bugs that hit real engines, each replayed by one fault of "
                  "specviz's engine: open a case to see its recorded run in the Run view, at the "
                  "round where it first parts from the reference (a lossless case has no fork: its "
                  "drafts show the shortfall). The Sweep tab runs them all as one sweep.")


def replica(case: Case) -> str:
    """The run that replays `case`, in words: its pair, its drafter where it is not the draft model,
    greedy or sampled, and its grammar."""
    s = RunSpec.build(**case.spec_fields())
    preset = next((name for name, ids in PAIR_PRESETS.items() if ids == (s.target, s.draft)), None)
    pair = (f"the {preset} pair" if preset
            else f"{s.target} as its own draft" if s.target == s.draft
            else f"{s.target} / {s.draft}")
    return ", ".join([
        pair,
        *([] if (kind := DRAFTERS[s.drafter]).draft_model else [f"drafts by {kind.noun}"]),
        "greedy" if s.greedy else f"temperature {s.temperature:g}" if s.temperature
        else "each request its own sampling settings",
        *(["under a JSON schema"] if s.json_schema else [])])


def expected(case: Case) -> tuple[str, str]:
    """What the replica's run is judged, and its family (the colour of its chip): a breaking case's
    verdict at its fork, a lossless case's on its drafts, a sampling case's distribution test."""
    if case.expected is None:
        return "distribution: not the target's", "distribution"
    return ("drafts: " if case.lossless else "") + case.expected, verdict(case.expected).family


def _card(case: Case) -> str:
    e = html.escape
    threads = " · ".join(f'<a href="{e(t.url)}" target="_blank" rel="noopener noreferrer">'
                         f'{e(t.label)}</a>' for t in case.threads)
    said, family = expected(case)
    return (f'<article class="sv-case sv-case-{e(family)}" id="sv-case-{e(case.fault)}">'
            f'<h3>{e(case.title)}</h3><p class="sv-case-threads">{threads}</p>'
            f'<p class="sv-case-mechanism">{"<br>".join(map(e, case.mechanism.splitlines()))}</p>'
            f'<p class="sv-case-replica"><code>{e(case.fault)}</code> '
            f'({e(FAULTS[case.fault].kind)}) on {e(replica(case))}</p>'
            f'<p><span class="sv-verdict sv-{e(family)}">{e(said)}</span></p>'
            f'<button class="sv-case-open" data-case="{e(case.fault)}">Open this case</button>'
            '</article>')


def cards_html() -> str:
    """Every case's card, in the casebook's order."""
    return '<div class="sv-cases">' + "".join(map(_card, CASES)) + "</div>"


def open_case(evt: gr.EventData) -> dict:
    """A card's button, by name: the Run controls set to its case's run (Run decodes it again), its
    bundled run for the Run view ("trace", "status", "download", no "pending" replay; opened on its
    first fork, a lossless case on its drafts per slot), the Run view's tab ("tabs"), and the tab
    of its views to show ("view_tabs")."""
    case = BY_FAULT.get((evt._data or {}).get("case"))
    if case is None:
        raise gr.Error("that is not a case of the field casebook")
    trace = serving.bundled_case(case.fault)
    threads = ", ".join(f"[{t.label}]({t.url})" for t in case.threads)
    said, _ = expected(case)
    status = (f"**Field case: {case.title}** ({threads}). {case.mechanism.replace(chr(10), ' ')} "
              f"Replayed by the fault `{case.fault}` on {replica(case)}; specviz judges it "
              f"`{said}`. The replica leaves out {case.leaves_out}\n\n"
              + serving.served_headline(trace, "bundled"))
    return {**controls_of(trace.manifest.spec), "trace": trace, "status": status,
            "download": serving.save(trace), "pending": None, "tabs": gr.Tabs(selected="run"),
            "view_tabs": gr.Tabs(selected="drafts") if case.lossless else gr.skip()}
