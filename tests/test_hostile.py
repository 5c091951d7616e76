"""A trace and a link with a script-carrying payload in every string field: every view the server
sends shows the payload as text, never as markup (tests/hostile.py says what may appear)."""
import base64
import json
import re
import zlib

import gradio as gr
import pytest
from gradio_client import Client, handle_file
from hostile import HOSTILE, PAYLOADS, live_markdown, live_markup, parse_html

from specviz.app import runview as ui
from specviz.app import summary, tokens, views
from specviz.run.settings import Settings
from specviz.spec.verdicts import VERDICTS
from specviz.trace import share
from specviz.trace.schema import FINGERPRINT, Trace

# What the views write, and nothing else.
VIEW_TAGS = {"div", "span", "p", "b", "h4", "table", "thead", "tbody", "tr", "th", "td", "mark"}
VIEW_ATTRIBUTES = {"class", "title", "style", "data-seq", "data-round", "data-index"}
HTML_VIEWS = ("timeline", "grid", "compare", "forensics")


def test_the_payload_is_in_every_string_field_the_schema_accepts(hostile):
    m, f = hostile.manifest, next(s.forensics for s in hostile.sequences if s.forensics)
    fields = [m.spec.target, m.spec.draft, *m.spec.prompts, m.device, m.device_name, *m.versions,
              *m.versions.values(), *m.pair, *m.deterministic, f.explanation,
              *f.failed_checks, *hostile.rows[0].checks,
              *hostile.vocab.values(), *(p.text for p in hostile.prompts)]
    assert all(HOSTILE in x for x in fields)
    # Closed sets and patterns refuse it: the method, the fault names, the verdict, the fingerprint.
    assert (m.spec.method == "eqspec" and m.spec.faults == ("bsp-like",)
            and f.verdict in VERDICTS and re.fullmatch(FINGERPRINT, m.fingerprint))


def _every_focus(trace):
    for s in trace.sequences:
        for r in [None, *sorted({r.round for r in trace.rows if r.seq == s.seq})]:
            yield s.seq, r


def test_every_view_at_every_focus_shows_the_payload_as_text(hostile):
    for seq, round_ in _every_focus(hostile):
        out = ui.render(hostile, seq, round_)
        for name in HTML_VIEWS:
            assert live_markup(out[name], VIEW_TAGS, VIEW_ATTRIBUTES) == [], name
        assert live_markdown(out["glossary"]) == [] and live_markdown(out["focus_note"]) == []
        # plotly reads <a href> and <img> in its texts: none may come
        for fig in (out["lanes"], out["phases"]):
            assert "__pwned" not in fig.to_json() and "evil" not in fig.to_json()
        # a Dataframe of datatype "str": text, whatever it holds
        cells = out["table"]["value"].to_numpy().ravel().tolist()
        assert any(PAYLOADS[0] in str(c) for c in cells)
    shown = "".join(parse_html(tokens.timeline_html(hostile, views.resolve(hostile)[0])).text)
    assert PAYLOADS[0] in shown  # seen, as text


def test_markdown_carries_stranger_text_inert(hostile):
    assert live_markdown(summary.headline(hostile)) == []
    env = {**share.environment(hostile.manifest),
           **{f"{HOSTILE[:150]} {i}": HOSTILE[:200] for i in range(3)}}
    env = {k[:200]: v[:200] for k, v in env.items()}  # a link's environment is short, flat text
    query = share.encode_link(share.Link(hostile.manifest.spec, 0, 1, "0123456789abcdef", env))
    pending = ui.open_link(query)["pending"]
    report = ui._replay_report(hostile, pending)
    assert "drifted" in report and live_markdown(report) == []
    bad = json.loads(hostile.manifest.spec.canonical_json()) | {HOSTILE[:150]: 1, "k": HOSTILE}
    run = base64.urlsafe_b64encode(zlib.compress(json.dumps({"spec": bad}).encode())).decode()
    status = ui.open_link("?run=" + run)["status"]
    assert ("could not be used" in status and "Extra inputs" in status
            and live_markdown(status) == [])


def test_error_messages_quoting_a_stranger_are_escaped(hostile, tmp_path):
    path = tmp_path / '<img src=x onerror="window.__pwned=1">.json'
    path.write_text('{"schema_version": 1, "' + HOSTILE.replace('"', "'") + '": 1}')
    with pytest.raises(gr.Error) as e:
        ui.open_trace(str(path))
    assert "onerror" in e.value.message and not parse_html(e.value.message).elements
    custom = {"pair": ui.CUSTOM, "target": PAYLOADS[0], "draft": "d", "prompt_set": "quick",
              "typed": "", "prompt_file": None, "method": "eqspec", "faults": [], "batch_size": 1,
              "k": 1, "max_new_tokens": 1, "dtype": "float32", "seed": 0, "window": 0,
              "max_wait": 4, "audit": False}
    with pytest.raises(gr.Error) as e:
        ui.run_controls(Settings(), **custom)
    assert ("is not allowed on this server" in e.value.message
            and not parse_html(e.value.message).elements)


def test_what_the_server_sends_has_no_live_markup(app_url, hostile, tmp_path):
    client = Client(app_url, verbose=False)
    path = tmp_path / "hostile.json"
    path.write_text(hostile.to_json())
    status, _ = client.predict(handle_file(str(path)), api_name="/open_trace")
    assert "opened from a file" in status and live_markdown(status) == []
    seq, round_ = next(f for f in _every_focus(hostile) if f[1] is not None)
    out = dict(zip(ui.VIEW_NAMES, client.predict(seq, round_, api_name="/focus_seq")))
    for name in HTML_VIEWS:
        assert out[name] and live_markup(out[name], VIEW_TAGS, VIEW_ATTRIBUTES) == [], name
    cells = [c for row in out["table"]["value"]["data"] for c in row]
    assert any(PAYLOADS[0] in str(c) for c in cells)  # the table's cells, as sent: plain strings
    assert Trace.from_json(path.read_text()) == hostile
