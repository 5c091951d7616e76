"""Share links: a run spec and a focus in a URL query string, and back; and a sweep the same way.

`?run=<spec, fingerprint and environment: JSON, zlib, base64url>&seq=3&round=12`; `?sweep=<the
sweep: its base spec, axes and listed runs, packed the same way>&cell=4` (cell: the run picked in
it); `?compare=<two run specs, packed the same way>&seq=2`: the Compare tab on those runs, at that
sequence. The focus stays readable; the spec is compressed because prompts are long. Anything a link
carries is untrusted: every failure is one readable SpecError.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlencode

from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.spec.untrusted import parse_json
from specviz.trace.schema import FINGERPRINT
from specviz.trace.sweep import AXIS_FIELDS, Sweep

MAX_LINK_CHARS = 16_000  # browsers and servers handle this much reliably
# after decompression; what a 16,000-character link of real prompts inflates to, ×4
MAX_PAYLOAD_BYTES = 256 * 2**10
MAX_ENV_ITEMS, MAX_ENV_CHARS = 32, 200  # the environment a link records: a few short, flat fields


@dataclass(frozen=True)
class Link:
    spec: RunSpec
    seq: int | None = None
    round: int | None = None
    fingerprint: str | None = None  # of the run the link was made from
    env: dict = field(default_factory=dict)  # versions and device of that run


def environment(manifest) -> dict[str, str]:
    """What a link records of where its run ran: device, library versions, determinism flags (a
    trace's manifest)."""
    return {"device": manifest.device, "device_name": manifest.device_name, **manifest.versions,
            **{k: str(v) for k, v in manifest.deterministic.items()}}


def encode_link(link: Link) -> str:
    """The query string (with its leading '?') for `link`."""
    if not _flat(link.env):
        raise SpecError(f"a link records at most {MAX_ENV_ITEMS} environment fields of "
                        f"{MAX_ENV_CHARS} characters")
    payload = {"spec": json.loads(link.spec.canonical_json()), "fp": link.fingerprint,
               "env": link.env}
    return _query("run", payload, (("seq", link.seq), ("round", link.round)), "this run's prompts",
                  "trace file")


def encode_sweep(sweep: Sweep, cell: int | None = None) -> str:
    """The query string (with its leading '?') for `sweep`, with run `cell` picked in it."""
    payload = {"base": json.loads(sweep.base.canonical_json()),
               **sweep.model_dump(mode="json",
                                  include={*AXIS_FIELDS, *(("runs",) if sweep.runs else ())})}
    return _query("sweep", payload, (("cell", cell),), "this sweep's prompts", "report file")


def encode_compare(a: RunSpec, b: RunSpec, seq: int = 0) -> str:
    """The query string (with its leading '?') that compares runs `a` and `b` at sequence `seq`."""
    payload = {"a": json.loads(a.canonical_json()), "b": json.loads(b.canonical_json())}
    return _query("compare", payload, (("seq", seq),), "these runs' prompts", "trace files")


def _query(name: str, payload: dict, readable: tuple, what: str, instead: str) -> str:
    raw = json.dumps(payload, separators=(",", ":")).encode()
    query = {name: base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")}
    query.update({k: v for k, v in readable if v is not None})
    text = "?" + urlencode(query)
    if len(text) > MAX_LINK_CHARS:
        raise SpecError(f"{what} make a {len(text)}-character link (the limit is "
                        f"{MAX_LINK_CHARS}); share the {instead} instead")
    if len(raw) > MAX_PAYLOAD_BYTES:  # so that every link made here opens
        raise SpecError(f"{what} make a link of {len(raw) // 2**10} KiB uncompressed (the limit is "
                        f"{MAX_PAYLOAD_BYTES // 2**10} KiB); share the {instead} instead")
    return text


def decode_link(query: str) -> Link | None:
    """The link in a query string; None when it carries no run (a plain visit,
    or a sweep's link)."""
    params = _params(query)
    if "run" not in params:
        return None
    payload = _payload(params, "run", "spec", "run spec")
    spec = RunSpec.build(**payload["spec"])
    fp, env = payload.get("fp"), payload.get("env") or {}
    if fp is not None and not (isinstance(fp, str)
                               and re.fullmatch(FINGERPRINT, fp)) or not _flat(env):
        raise SpecError("the link's fingerprint or environment is malformed")
    return Link(spec, _index(params, "seq"), _index(params, "round"), fp, env)


def decode_sweep(query: str) -> tuple[Sweep, int | None] | None:
    """The sweep in a query string and the run picked in it; None when it carries no sweep."""
    params = _params(query)
    if "sweep" not in params:
        return None
    payload = _payload(params, "sweep", "base", "base run spec")
    base = RunSpec.build(**payload.pop("base"))
    # a link made before the axis: every run at the base's
    payload.setdefault("temperatures", [base.temperature])
    return Sweep.build(base=base, **payload), _index(params, "cell")


def decode_compare(query: str) -> tuple[RunSpec, RunSpec, int | None] | None:
    """The two runs a query string compares and the sequence picked; None when it compares none."""
    params = _params(query)
    if "compare" not in params:
        return None
    payload = _payload(params, "compare", "a", "run spec A")
    if not isinstance(payload.get("b"), dict):
        raise SpecError("the link's compare holds no run spec B")
    return RunSpec.build(**payload["a"]), RunSpec.build(**payload["b"]), _index(params, "seq")


def other_tab(query: str) -> str | None:
    """The tab whose link a query string is, where it is not the Run view's: "sweep" (decode_sweep
    reads it), "compare" (decode_compare), else None."""
    params = _params(query)
    return next((name for name in ("sweep", "compare") if name in params), None)


def _params(query: str) -> dict:
    if len(query) > MAX_LINK_CHARS:
        raise SpecError(f"the link is {len(query)} characters long; the limit is {MAX_LINK_CHARS}")
    return parse_qs(query.lstrip("?"), keep_blank_values=True)


def _payload(params: dict, name: str, key: str, what: str) -> dict:
    """The JSON object packed in the link's `name` parameter, which must hold `key` (`what`)
    as an object."""
    damaged = SpecError(f"the link's {name} is damaged (was it cut off when copied?)")
    try:
        packed = base64.urlsafe_b64decode(params[name][0] + "=" * (-len(params[name][0]) % 4))
        inflater = zlib.decompressobj()
        raw = inflater.decompress(packed, MAX_PAYLOAD_BYTES)
    except (binascii.Error, ValueError, zlib.error):
        raise damaged from None
    if inflater.unconsumed_tail:
        raise SpecError(f"the link's {name} is too large")
    try:
        payload = parse_json(raw)
    except SpecError:
        raise damaged from None
    if not isinstance(payload, dict) or not isinstance(payload.get(key), dict):
        raise SpecError(f"the link's {name} holds no {what}")
    return payload


def _flat(env: object) -> bool:
    """A few short text fields, as `ui` records them; anything else a link carries is not ours."""
    return isinstance(env, dict) and len(env) <= MAX_ENV_ITEMS and all(
        isinstance(v, str) and len(k) <= MAX_ENV_CHARS and len(v) <= MAX_ENV_CHARS
        for k, v in env.items())


def _index(params: dict, name: str) -> int | None:
    if name not in params:
        return None
    text = params[name][0]
    # not "٣" or "²", which isdigit() accepts
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise SpecError(f"the link's {name} must be a whole number ≥ 0, not {text[:20]!r}")
    return int(text)
