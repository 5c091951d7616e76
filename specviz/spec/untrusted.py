"""JSON from strangers (share links, trace files), parsed at a cost bounded by its size.

Callers cap the size first. orjson then parses strict JSON (UTF-8, no NaN) and stops at 1024 levels
of nesting inside its own parser, so a page of `[` is refused in microseconds where Python's json
raised RecursionError. Parsing costs at most ~25 ms per MiB, measured on the worst
shapes (benchmarks/fuzz.py).
"""
from __future__ import annotations

import gc

import orjson

from specviz.spec.strict import SpecError


def parse_json(data: bytes | str) -> object:
    """The value `data` holds, or a SpecError saying why it is not JSON."""
    # Millions of small lists would each count towards a cyclic GC pass, making the parse ~6x
    # slower; a freshly parsed tree holds no cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise SpecError(f"invalid JSON ({e})") from None
    finally:
        if collecting:
            gc.enable()


def parse_file(data: bytes | str, what: str, limit: int) -> object:
    """A stranger's file of JSON (`what`: "trace file", "sweep report"), refused over
    `limit` bytes."""
    if len(data) > limit:
        raise SpecError(f"{what} is {len(data) / 2**20:.1f} MiB; the limit is {limit // 2**20} MiB")
    try:
        return parse_json(data)
    except SpecError as e:
        raise SpecError(f"not a {what}: {e}") from None


def shown(value: object) -> str:
    """A stranger's JSON value in a message: short, and never repr'd when nested (1000 levels
    break repr)."""
    if value is None or isinstance(value, (int, float, str)):
        return repr(value)[:40]
    return f"a JSON {'array' if isinstance(value, list) else 'object'}"
