"""The traces bundled in assets/traces: the page opens on them without decoding, so they must still
load under today's schema and still be what today's engine writes for their spec (`make traces`
records them anew)."""
import json

import pytest

from specviz.app import runview as ui
from specviz.app import serving
from specviz.app.form import DEFAULTS, spec_from_controls
from specviz.run.runner import run
from specviz.run.settings import Settings
from specviz.trace import share
from specviz.trace.migrations import SCHEMA_VERSION
from specviz.trace.schema import Trace

NAMES = list(serving.BUNDLED)


@pytest.mark.parametrize("name", NAMES)
def test_a_bundled_trace_is_current_and_is_what_the_engine_writes_today(name):
    raw = (serving.ASSETS / "traces" / serving.BUNDLED[name]).read_text(encoding="utf-8")
    assert (json.loads(raw)["schema_version"]
            == SCHEMA_VERSION), "the schema moved on: run `make traces`"
    bundled = Trace.from_json(raw)
    today = run(bundled.manifest.spec)
    kinds = [{s.forensics.verdict.split(":")[0] for s in t.sequences if s.forensics}
             for t in (bundled, today)]
    assert kinds[0] and kinds[1] <= kinds[0], "the engine tells another story: run `make traces`"
    # Other vector kernels (an AVX-512 CPU against the AVX2 one that recorded them) round float32
    # and bfloat16 logits otherwise, and a near-tie may fall the other way: token for token only on
    # the kernels that wrote it.
    if (bundled.manifest.spec.dtype == "float64"
            or today.manifest.device_name == bundled.manifest.device_name):
        assert (today.manifest.fingerprint
                == bundled.manifest.fingerprint), "the engine moved on: run `make traces`"
        for b, t in zip(bundled.sequences, today.sequences, strict=True):
            assert (b.output_ids, b.reference_ids, b.first_divergence) == (t.output_ids,
                                                                           t.reference_ids,
                                                                           t.first_divergence)
            assert (b.forensics and b.forensics.verdict) == (t.forensics and t.forensics.verdict)
    # The page's example of the same name is this spec: it opens at once.
    example = spec_from_controls(**ui.EXAMPLES[name])
    assert example.key() == bundled.manifest.spec.key()


def test_the_bundled_cases_are_what_their_names_say():
    traces = serving.bundled()
    decay = [s.forensics.verdict for s in traces["bsp-like decay"].sequences if s.forensics]
    assert decay and all(v.startswith("sync-bug") for v in decay)
    ties = [s.forensics.verdict for s in traces["numerics near-tie"].sequences if s.forensics]
    assert ties and all(v.startswith("numerics") for v in ties)


def test_the_first_page_opens_the_bundled_decay_at_its_fork_and_its_link_replays_it_at_once():
    opened = ui.open_link("")
    trace, download, pending, status = (opened[n]
                                        for n in ("trace", "download", "pending", "status"))
    # The controls untouched (left out), nothing to replay.
    assert not set(opened) & set(DEFAULTS) and pending is None
    assert (trace is serving.bundled()[ui.FIRST_PAGE]
            and Trace.from_json(open(download).read()) == trace)
    assert status.startswith("**You are looking at a real case") and "To run your own" in status
    assert "bundled with specviz" in status
    views = ui.render(trace)
    first = next(s for s in trace.sequences if s.equivalent is False)
    assert views["focus_seq"] == first.seq  # focused on the first divergent sequence, at its fork
    assert f'class="sv-cell sv-fork sv-sel" data-seq="{first.seq}"' in views["grid"]
    assert "sync-bug" in views["forensics"]

    # Its share link replays from the bundle: the same fingerprint, no decode.
    link = views["link_query"]
    pending, note = (ui.open_link(link)[n] for n in ("pending", "status"))
    assert note == "Replaying the shared run…"
    replayed, report, _, _ = ui.replay(Settings(), pending)
    assert replayed is trace and "matched the shared run exactly" in report
    assert share.decode_link(link).seq == first.seq


def test_a_bad_link_says_so_and_still_opens_the_bundled_case():
    trace, pending, status = (ui.open_link("?run=@@@@")[n] for n in ("trace", "pending", "status"))
    assert trace is serving.bundled()[ui.FIRST_PAGE] and pending is None
    assert (status.startswith("**That share link could not be used")
            and "Showing a bundled case instead" in status)
