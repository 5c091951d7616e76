"""The serving layer: all the page's handlers reach decoding, shrinking and engine checks through
here, one at a time (on a GPU where one is lent); decodes are served from this process's cache of
traces or from the bundled ones where they can be; a way to stop them; visitors' uploads read within
limits; downloads written once.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import html
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import gradio as gr

from specviz.app import summary
from specviz.forensics.sampledrun import with_sampled_verdict
from specviz.models.pairs import pair_for
from specviz.run import check
from specviz.run.gpu import ZEROGPU, gpu
from specviz.run.runner import run
from specviz.run.settings import Settings
from specviz.run.shrink import MAX_TRIALS, Mark, Shrunk, mark_of, shrink, size
from specviz.spec.casebook import BY_FAULT, CASES
from specviz.spec.prompts import ASSETS
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace.schema import MAX_TRACE_BYTES, Trace

TRACES: OrderedDict[str, Trace] = OrderedDict()  # by spec key: a replayed link is served from here
# a sweep's runs (SPECVIZ_MAX_SWEEP_RUNS) stay, so its cells and its link open at once
MAX_TRACES = 64
CANCELLED: set[str] = set()  # sessions whose running decode should stop
LOCK = threading.Lock()  # every decode, shrink and check holds it: one at a time in this process
# Finished traces our own engine made (`make traces`), served without decoding: the first page opens
# on one, and the examples of the same spec open at once. tests/test_bundled.py keeps them equal to
# today's engine. The field cases' runs are bundled too (Case.trace), each parsed when first
# asked for.
BUNDLED = {"bsp-like decay": "bsp-like-decay.json", "numerics near-tie": "numerics-near-tie.json"}
PHASE_TEXT = {"reference": "reference (target alone, batch size 1)",
              "distribution": "distribution (each token scored under the target, batch size 1)"}


class Cancelled(Exception):
    pass


def read_trace(data: str | bytes) -> Trace:
    """A trace file, parsed; a sampled run's verdict as stored, or judged now where the file was
    written before it was stored (forensics/sampledrun.py: the trace layer cannot judge)."""
    return with_sampled_verdict(Trace.from_json(data))


def _read_bundled(file: str) -> Trace:
    return read_trace((ASSETS / "traces" / file).read_text(encoding="utf-8"))


@functools.cache
def bundled() -> dict[str, Trace]:
    """The bundled traces by example name, parsed once per process."""
    return {name: _read_bundled(file) for name, file in BUNDLED.items()}


@functools.cache
def bundled_case(fault: str) -> Trace:
    """The field case `fault`'s bundled run (spec/casebook.py), parsed once per process."""
    return _read_bundled(BY_FAULT[fault].trace)


@functools.cache
def _bundled_by_key() -> dict[str, Trace]:
    return {t.manifest.spec.key(): t for t in bundled().values()}


@functools.cache
def _cases_by_key() -> dict[str, str]:
    """The field cases by their replica's spec key: known without parsing their runs."""
    return {RunSpec.build(**case.spec_fields()).key(): case.fault for case in CASES}


def bundled_for(spec: RunSpec) -> Trace | None:
    key = spec.key()
    case = _cases_by_key().get(key)
    return bundled_case(case) if case else _bundled_by_key().get(key)


def served_headline(trace: Trace, timing: str | None, note: str = "") -> str:
    """summary.headline, saying so when the trace is a bundled one (its times are the file's)."""
    if timing == "bundled":
        note += (" (bundled with specviz; its times are from when it was recorded, `make traces` "
                 "records it anew)")
    return summary.headline(trace, note, timing=timing)


def error(message: str, **kwargs) -> gr.Error:
    """gr.Error shows its message as HTML (sanitized, yet an <img> still loads): it may quote
    a stranger."""
    return gr.Error(html.escape(message, quote=False), **kwargs)


@contextlib.contextmanager
def as_page_errors(refused: str = "", then: str = "", stopped: str = "nothing was recorded"):
    """A handler's SpecError as the page's error (between `refused` and `then`, escaped), and a Stop
    as "stopped; `stopped`"."""
    try:
        yield
    except SpecError as e:
        raise error(f"{refused}{e}{then}") from None
    except Cancelled:
        raise gr.Error(f"stopped; {stopped}", title="Stopped") from None


def read_upload(path: str, limit: int) -> str:
    """An uploaded file's text, refused when over `limit` bytes or not UTF-8."""
    p = Path(path)
    size = p.stat().st_size
    if size > limit:
        raise SpecError(f"{p.name} is {size / 2**20:.1f} MiB; the limit is {limit / 2**20:.0f} MiB")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{p.name} is not UTF-8 text") from None
    return text


@gpu
def decode_on_gpu(spec: RunSpec, settings: Settings, progress=None) -> Trace:
    """All GPU work of a run; returns plain data only (a ZeroGPU worker sends it back)."""
    return run(spec, progress=progress, trust_remote_code=settings.trust_remote_code,
               limits=settings)


def served_trace(spec: RunSpec, settings: Settings, progress: gr.Progress,
                 session: str) -> tuple[Trace, str | None]:
    """The trace for `spec`: from this process's cache, else decoded with progress and a way to
    stop; and where its times come from (summary.TIMING_TEXT): "cached", "now" (the reference
    decoded in this run too), "reused" (the reference from an earlier run of the same prompts),
    "bundled" (a trace shipped in assets/traces), None where the progress cannot tell (ZeroGPU)."""
    settings.check(spec)
    if (trace := bundled_for(spec)) is not None:
        return trace, "bundled"
    key = spec.key()
    if key in TRACES:
        TRACES.move_to_end(key)
        return TRACES[key], "cached"
    total = len(spec.prompts) * spec.max_new_tokens
    done: dict[str, int] = {}

    def tick(phase: str, n: int) -> None:
        if session in CANCELLED:
            raise Cancelled
        done[phase] = done.get(phase, 0) + n
        label = PHASE_TEXT.get(phase, phase)
        progress(min(done[phase] / total, 1.0), desc=f"{label}: {done[phase]} of ≤{total} tokens")

    CANCELLED.discard(session)
    progress(0, desc="loading the model pair")
    with LOCK:
        # A ZeroGPU worker is another process: the callback (progress, Stop) stays behind.
        trace = decode_on_gpu(spec, settings, None if ZEROGPU else tick)
    remember(trace)
    # the reference ticks unless cached
    return trace, None if ZEROGPU else "now" if "reference" in done else "reused"


@gpu(runs=8)
def _shrink_on_gpu(spec: RunSpec, seq: int, mark: Mark, settings: Settings,
                   progress=None) -> Shrunk:
    """All GPU work of a shrink (many small runs); returns plain data only."""
    pair = pair_for(spec, settings.trust_remote_code)
    return shrink(spec, seq, mark, pair, progress, limits=settings)


def shrink_fork(trace: Trace, seq: int, settings: Settings, progress: gr.Progress,
                session: str) -> str:
    """The smallest run found that still shows what sequence `seq` of `trace` shows (its fork;
    sampled, its corrupt state or impossible token), said in Markdown with its link (the trace it
    made is kept, so the link opens at once)."""
    spec, mark = trace.manifest.spec, mark_of(trace, seq)

    def tick(n: int) -> None:
        if session in CANCELLED:
            raise Cancelled
        progress(n / MAX_TRIALS, desc=f"shrink: candidate run {n} of at most {MAX_TRIALS}")

    CANCELLED.discard(session)
    with LOCK:
        found = _shrink_on_gpu(spec, seq, mark, settings, None if ZEROGPU else tick)
    small = found.trace
    remember(small)
    f = small.sequences[found.seq].forensics
    return (f"**Smallest run found** ({found.trials} candidate runs): {size(spec)} → "
            f"{size(small.manifest.spec)}; its sequence {found.seq} still {mark.describe()}"
            + (f" (`{f.verdict}`)" if f else "")
            + f". [Open it]({found.link()}), or copy the link.")


@gpu
def _check_on_gpu(spec: RunSpec, settings: Settings, outputs: tuple[bytes, str] | None,
                  control: tuple[bytes, str] | None,
                  servers: tuple[tuple[str, str | None], tuple | None] | None,
                  determinism: bool = False, progress=None, drafter: str | None = None) -> Trace:
    """All work of an engine check (the judging passes, the reference where they cannot prove it);
    returns plain data only."""
    pair = pair_for(spec, settings.trust_remote_code)
    if outputs is not None:
        return check.from_files(spec, pair, outputs, control, limits=settings,
                                judging=check.Judging(progress=progress), drafter=drafter)
    engine, control_server = servers
    return check.from_servers(spec, pair, engine, control_server, concurrency=8, timeout=300,
                              limits=settings, determinism=determinism,
                              judging=check.Judging(progress=progress), drafter=drafter)


def check_engine_trace(spec: RunSpec, settings: Settings, files: tuple | None,
                       servers: tuple | None, determinism: bool = False,
                       progress: gr.Progress | None = None, drafter: str | None = None) -> Trace:
    """An engine check: from its outputs file (and a control's), or from its servers' (asked every
    prompt twice more when `determinism`), its phases counted on `progress`; `drafter`, what the
    engine drafts with, where the user says (spec/drafters.py)."""
    done: dict[str, int] = {}

    def tick(phase: str, n: int) -> None:
        done[phase] = done.get(phase, 0) + n
        unit = "replays" if phase == "attribution" else "tokens"
        progress((done[phase], None), desc=f"{phase}: {done[phase]} {unit}", unit=unit)

    with LOCK:
        return _check_on_gpu(spec, settings, *(files or (None, None)), servers, determinism,
                             None if ZEROGPU or progress is None else tick, drafter)


def remember(trace: Trace) -> None:
    """Keep a decoded trace for replays of its spec (a link this process has already run opens
    at once)."""
    TRACES[trace.manifest.spec.key()] = trace
    if len(TRACES) > MAX_TRACES:
        TRACES.popitem(last=False)


@functools.cache
def _trace_dir() -> Path:
    """This process's own folder for downloads: private, not a fixed name in the shared
    temp folder."""
    return Path(tempfile.mkdtemp(prefix="specviz-traces-"))


def save(trace: Trace) -> str:
    """Write `trace` for download, named after its content's hash as well as its fingerprint: a file
    never holds another trace than the one its path was handed out for, whatever fingerprint a
    visitor's upload claims, and equal traces share one file."""
    text = trace.to_json()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return write_once(f"trace-{trace.manifest.fingerprint}-{digest}.json", text)


def write_once(name: str, text: str) -> str:
    """`text` in this process's download folder under `name` (unless already there),
    and its path."""
    path = _trace_dir() / name
    if not path.exists():
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, suffix=".tmp",
                                         delete=False) as f:
            f.write(text)
        os.replace(f.name, path)  # whole or not at all: another session may be handed the same file
    return str(path)


def stop(request: gr.Request = None):
    if request:
        CANCELLED.add(request.session_hash)
    gr.Info("stopping after the current round…")


def uploaded(path: str | None, parse):
    """A visitor's uploaded file, read (capped) and parsed by `parse` (a from_json); a bad one is a
    message naming the file."""
    if not path:
        raise gr.Error("no file")
    try:
        return parse(read_upload(path, MAX_TRACE_BYTES))
    except SpecError as e:
        raise error(f"{Path(path).name}: {e}") from None
