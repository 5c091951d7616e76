"""Hostile input for tests and benchmarks/fuzz.py: script-carrying strings, a trace with one in
every string field, and seeded generators of malformed share links and trace files."""
from __future__ import annotations

import base64
import codecs
import functools
import gzip
import json
import random
import zlib
from collections.abc import Iterator
from html.parser import HTMLParser
from urllib.parse import quote

EVIL = "http://evil.invalid"  # another origin: the page must never ask it for anything
PAYLOADS = (
    '<img src=x onerror="window.__pwned=1">',
    "<script>window.__pwned=1</script>",
    '"><svg onload=window.__pwned=1>',
    "' onmouseover='window.__pwned=1' x='",
    "javascript:window.__pwned=1",
    f"![x]({EVIL}/md.png) [click](javascript:window.__pwned=1) <{EVIL}/auto> {EVIL}/bare "
    "www.evil.invalid",
    f'<img src="{EVIL}/img.png"><iframe src="{EVIL}/"></iframe><link rel=stylesheet '
    f'href="{EVIL}/x.css">',
    f'<a href="{EVIL}/" style="background:url({EVIL}/bg.png)">a</a><style>@import '
    f'"{EVIL}/s.css";</style>',
    "| cell | `code` **bold** # heading\n- item $$\\href{javascript:1}{x}$$ &lt;b&gt; &amp; \\",
)
HOSTILE = " ".join(PAYLOADS)


# ----------------------------------------------------------- a trace with a payload in every string


def _leaves(node, path=()):
    """Every string in a JSON-like tree: ("value", path) for values, ("key", path) for dict keys."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, (*path, k))
            if isinstance(k, str):  # after its value: renaming it then leaves no path stale
                yield "key", (*path, k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, (*path, i))
    elif isinstance(node, str):
        yield "value", path


def _replace(tree, where: tuple[str, tuple], new: str):
    """A copy of `tree` with the string at `where` (a value, or a dict key) replaced by `new`."""
    kind, path = where
    tree = json.loads(json.dumps(tree))
    *up, last = path
    parent = tree
    for p in up:
        parent = parent[p]
    if kind == "value":
        parent[last] = new
    else:
        parent[new] = parent.pop(last)
    return tree


def hostile_trace(trace):
    """`trace` with `HOSTILE` (numbered, so dict keys stay distinct) in every string the schema
    accepts there.

    The model is walked generically, each string tried alone. Values refused alone (the target id
    needs a draft id to match) are retried together with their refused siblings, less those pydantic
    names (a Literal, a pattern).
    """
    from pydantic import ValidationError

    tree = json.loads(trace.to_json())
    cls = type(trace)
    leaves = list(_leaves(tree))
    refused = []
    for n, where in enumerate(leaves):
        candidate = _replace(tree, where, f"{HOSTILE} #{n}")
        try:
            cls.model_validate(candidate)
            tree = candidate
        except ValidationError:
            refused.append(n)
    for parent in {leaves[n][1][:-1] for n in refused}:
        group = [n for n in refused if leaves[n][0] == "value" and leaves[n][1][:-1] == parent]
        while group:
            candidate = tree
            for n in group:
                candidate = _replace(candidate, leaves[n], f"{HOSTILE} #{n}")
            try:
                cls.model_validate(candidate)
                tree = candidate
                break
            except ValidationError as e:
                named = {tuple(err["loc"]) for err in e.errors()}
                if not any(leaves[n][1] in named for n in group):
                    break
                group = [n for n in group if leaves[n][1] not in named]
    return cls.model_validate(tree)


# ---------------------------------------------------------------- malformed links and trace files
# Input i of a seed comes from its own random generator, so a sample can be drawn without making
# the rest.

NASTY = (  # values of a surprising type or size, made only when drawn
    lambda: None, lambda: True, lambda: -1, lambda: 2**70, lambda: 1e308, lambda: 0.5, lambda: "",
    lambda: HOSTILE, lambda: "x" * 200_000, list, dict, lambda: [0] * 100_000, lambda: ["x"] * 5000,
    lambda: {str(i): i for i in range(20_000)}, lambda: _nested(50), lambda: {"": {"": [None]}},
    lambda: "\udc80\ud800", lambda: "\x00\n\t",
)


def _nasty(rng: random.Random):
    return rng.choice(NASTY)()


def _nested(depth: int) -> list:
    out: list = []
    for _ in range(depth):
        out = [out]
    return out


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*path, i))


def _mutate_tree(rng: random.Random, tree) -> str:
    """JSON text of `tree` with one node replaced (by a nasty value or a plausible one of its own
    type), dropped, renamed or nested deep, or a key added."""
    tree = json.loads(json.dumps(tree))
    path = rng.choice([p for p in _paths(tree) if p])
    *up, last = path
    parent = tree
    for p in up:
        parent = parent[p]
    op = rng.randrange(7)
    if op == 0:
        parent[last] = _nasty(rng)
    elif op >= 5:
        parent[last] = _plausible(rng, parent[last])
    elif op == 1 and isinstance(parent, dict):
        del parent[last]
    elif op == 2 and isinstance(parent, dict):
        parent[rng.choice([HOSTILE, "extra", last + "_", ""])] = parent.pop(last)
    elif op == 3:
        parent[last] = "\x00DEEP\x00"  # spliced in below, past json.dumps' own recursion limit
    else:
        (parent if isinstance(parent, dict) else tree)[
            rng.choice(["extra", HOSTILE, "__proto__"])] = _nasty(rng)
    text = json.dumps(tree, allow_nan=True)
    depth = rng.choice([100, 2000, 100_000])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    closing = rng.choice([closer * depth, ""])  # well closed, or left open
    return text.replace('"\\u0000DEEP\\u0000"', opener * depth + "1" + closing)


def _plausible(rng: random.Random, value):
    """Another value of `value`'s type: what a careless edit makes, and only a cross-check
    can catch."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([-1, 0, 1, 3, value + 1, 99, 2**31])
    if isinstance(value, float):
        return rng.choice([0.0, -0.0, -1.0, 1e-300, 1e308, value * 2])
    if isinstance(value, list) and value:
        i = rng.randrange(len(value))
        return rng.choice([value[:i] + value[i + 1:], value + value[i:i + 1], value[::-1], []])
    if isinstance(value, dict) and value:
        return dict(list(value.items())[: rng.randrange(len(value))])
    return rng.choice([HOSTILE, "", "sync-bug:kv", "cuda:0"]) if isinstance(value, str) else value


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """`data` cut, flipped, with a slice dropped, repeated or replaced by junk."""
    data = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 8])):
        i = rng.randrange(len(data) + 1)
        op = rng.randrange(5)
        if op == 0:
            del data[i:]
        elif op == 1 and i < len(data):
            data[i] ^= 1 << rng.randrange(8)
        elif op == 2:
            del data[i: i + rng.randrange(1, 64)]
        elif op == 3:
            data[i:i] = data[i: i + rng.randrange(1, 64)] * rng.choice([1, 2, 100])
        else:
            data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
        if not data:
            break
    return bytes(data)


def _bad_encoding(rng: random.Random, text: str) -> bytes:
    codec = rng.choice(["utf-16", "utf-32", "latin-1", "cp1252", "utf-8-sig", "utf-7"])
    data = (text.replace("Hi", "Hé 東京 🙂") if codec in ("utf-16", "utf-32", "utf-8-sig", "utf-7")
            else text.replace("Hi", "Hé")).encode(codec, errors="replace")
    if rng.random() < 0.3:
        data = codecs.BOM_UTF8 + data
    if rng.random() < 0.3:  # a lone surrogate, an overlong form, a stray continuation byte
        i = rng.randrange(len(data))
        data = (data[:i] + rng.choice([b"\xed\xa0\x80", b"\xc0\xaf", b"\x80", b"\xff\xfe"])
                + data[i:])
    return data


def _pack(data: bytes) -> str:
    return base64.urlsafe_b64encode(zlib.compress(data, 9)).decode().rstrip("=")


def _crafted_payload(rng: random.Random, payload: dict) -> bytes:
    """Link payloads built to hurt: deep, huge, of the wrong type, in a bad encoding, bombs."""
    spec = payload["spec"]
    n = rng.choice([10, 1000, 30_000])  # the largest is over the inflated limit when it is a bomb
    depth = rng.choice([100, 1000, 100_000])
    kind = rng.randrange(12)
    if kind == 0:
        return (rng.choice(["[", '{"a":', '[{"a":']) * depth).encode()
    if kind in (1, 2):  # deep where a list or a flat dict belongs
        where = ({**payload, "spec": {**spec, "prompts": "\x00"}} if kind == 1
                 else {**payload, "env": {"a": "\x00"}})
        return json.dumps(where).replace('"\\u0000"', "[" * depth + "]" * depth).encode()
    if kind == 3:
        return json.dumps({**payload, "spec": {**spec, "prompts": [0] * n}}).encode()
    if kind == 4:
        return json.dumps({**payload, "spec": {**spec, "prompts": ["p"] * n}}).encode()
    if kind == 5:
        return json.dumps({**payload, "env": {f"k{i}": "v" * 10 for i in range(n)}}).encode()
    if kind == 6:
        # a zip bomb, of some shape
        return rng.choice([b" ", b"0", b"[", b"\x00", b'"a']) * (n * 10)
    if kind == 7:
        return json.dumps(rng.choice([None, 1, "spec", [payload], {"spec": [spec]},
                                      {"spec": None}])).encode()
    if kind == 8:
        return _bad_encoding(rng, json.dumps(payload, ensure_ascii=False))
    if kind == 9:
        return rng.choice([b'{"spec": 1e999999}', b'{"spec": {"k": ' + b"9" * 5000 + b"}}", b"NaN",
                           b"-Infinity", b'{"spec": {"seed": 1' + b"0" * 400 + b"}}",
                           b'{"spec": {}, "spec": {}}', b'{"spec": "\\ud800\\udc00\\ud800"}',
                           b"\xef\xbb\xbf{}"])
    if kind == 10:
        return gzip.compress(json.dumps(payload).encode())  # the wrong compression
    key = rng.choice(["k", "batch_size", "seed", "window", "max_wait", "temperature", "faults",
                      "prompts", "dtype"])
    return json.dumps({**payload, "spec": {**spec, key: _nasty(rng)}}, allow_nan=True).encode()


def malformed_link(seed: int, i: int, real: str) -> str:
    """Malformed share link (a query string) number `i`: even ones mutate the `real` link, odd ones
    are crafted."""
    rng = random.Random(seed * 1_000_003 + i)
    run = real.split("run=")[1].split("&")[0]
    packed = base64.urlsafe_b64decode(run + "=" * (-len(run) % 4))
    payload = json.loads(zlib.decompress(packed))
    op = rng.randrange(6) if i % 2 == 0 else 6
    if op == 0:  # the text of the link, damaged (cut off when copied, typed over)
        return "?" + _mutate_bytes(rng, real.lstrip("?").encode()).decode("latin-1")
    if op == 1:  # damaged compressed bytes
        return (f"?run={base64.urlsafe_b64encode(_mutate_bytes(rng, packed)).decode().rstrip('=')}"
                "&seq=0")
    if op == 2:  # damaged JSON, well compressed
        return f"?run={_pack(_mutate_bytes(rng, json.dumps(payload).encode()))}&round=1"
    if op == 3:  # a value of the wrong type or size somewhere in the payload
        return f"?run={_pack(_mutate_tree(rng, payload).encode('utf-8', 'surrogatepass'))}"
    if op == 4:  # the focus
        value = rng.choice(["-1", "1e3", "٣", "²", "9" * 30, "", "0x10", quote(HOSTILE), "1&seq=2",
                            "%ff", "\x00"])
        return (real.replace("seq=0", f"seq={value}")
                + rng.choice(["", f"&round={value}", "&run=", f"&run={run}"]))
    if op == 5:  # junk where the run goes
        junk = rng.choice(["", "=", "%%", "A", "AAAA" * 3000, quote(HOSTILE), "é東🙂", "\x00" * 10,
                           run[::-1]])
        return f"?run={junk}"
    return f"?run={_pack(_crafted_payload(rng, payload))}"


@functools.cache
def _big(kind: int) -> str:
    """Deep nesting or a huge array (a few MB), to put where a list belongs."""
    return ("[" * 200_000, "[" * 5000 + "]" * 5000, "[" + "0," * 2_000_000 + "0]",
            "[" + '"x",' * 500_000 + '"x"]',
            "{" + ",".join(f'"{i}":{i}' for i in range(300_000)) + "}")[kind]


def malformed_trace(seed: int, i: int, real: str) -> bytes:
    """Malformed trace file number `i`: a mutation of the `real` trace's JSON, or a crafted one."""
    rng = random.Random(seed * 1_000_003 + i)
    data = real.encode()
    op = rng.randrange(6)
    if op == 0:
        return _mutate_bytes(rng, data)
    if op in (1, 2):
        return _mutate_tree(rng, json.loads(real)).encode("utf-8", "surrogatepass")
    if op == 3:
        return _bad_encoding(rng, real)
    if op == 4:
        field = rng.choice(["rows", "sequences", "prompts", "rounds"])
        return real.replace(f'"{field}":[', f'"{field}":[{_big(rng.randrange(5))},', 1).encode()
    return rng.choice([b"", b"null", b"[]", b"{}", b"\x00" * 1000, b" " * 3_000_000,
                       gzip.compress(data), b'{"schema_version": 1e999}',
                       b'{"schema_version": ' + b"1" * 5000 + b"}",
                       zlib.compress(data), b"\xef\xbb\xbf" + data, data + b"\x00", data * 2])


def real_link_and_trace() -> tuple[str, str]:
    """A real share link and trace file to mutate: the tiny pair with a fault, so that every field
    has content."""
    from specviz.run.runner import run
    from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
    from specviz.trace import share

    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float64", device="cpu",
                         faults=("bsp-like",), prompts=("Hi!", "Name three rivers."), batch_size=2,
                         k=3, max_new_tokens=12)
    trace = run(spec)
    # Clock readings fixed: the same seed then makes the same inputs, run after run.
    m = trace.manifest.model_copy(update={"created": "2026-01-01T00:00:00+00:00",
                                          "decode_seconds": 1.0, "reference_seconds": 1.0})
    rounds = [rd.model_copy(update={"timings": dict.fromkeys(rd.timings, 0.001)})
              for rd in trace.rounds]
    sequences = [s.model_copy(update={"completion_seconds": 0.5}) for s in trace.sequences]
    trace = trace.model_copy(update={"manifest": m, "rounds": rounds, "sequences": sequences})
    link = share.Link(spec, 0, 1, m.fingerprint, share.environment(trace.manifest))
    return share.encode_link(link), trace.to_json()


def malformed_links(seed: int, n: int, real: str) -> Iterator[str]:
    return (malformed_link(seed, i, real) for i in range(n))


def malformed_traces(seed: int, n: int, real: str) -> Iterator[bytes]:
    return (malformed_trace(seed, i, real) for i in range(n))


# ---------------------------------------------------------------- what a page may contain


class _Markup(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, list]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, attrs))

    def handle_data(self, data):
        self.text.append(data)


def parse_html(page: str) -> _Markup:
    parsed = _Markup()
    parsed.feed(page)
    parsed.close()
    return parsed


def live_markup(page: str, tags: set[str],
                attributes: set[str] = frozenset({"class", "title"})) -> list[str]:
    """Whatever in `page` could act: an element or attribute outside the given ones (so no `on*`
    handler, and no `href` or `src` to hold a script URL), a style that loads something."""
    found = []
    for tag, attrs in parse_html(page).elements:
        if tag not in tags:
            found.append(f"<{tag}>")
        for name, value in attrs:
            value = (value or "").lower()
            if name not in attributes or name == "style" and ("url(" in value or "@" in value):
                found.append(f"<{tag} {name}={value[:40]!r}>")
    return found


def markdown_html(source: str) -> str:
    """`source` as a CommonMark renderer with tables and raw HTML (as Gradio's) makes it."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(source)


def live_markdown(source: str) -> list[str]:
    """What in a Markdown component's value would act: any element Markdown makes beyond text
    formatting, and a bare URL (Gradio's renderer links those, GFM-style)."""
    found = live_markup(markdown_html(source),
                        {"p", "strong", "em", "code", "ul", "li", "table", "thead", "tbody",
                         "tr", "th", "td", "h1", "h3"}, {"style"})
    return found + [url for url in ("://", "www.") if url in source]


def markdown_text(source: str) -> str:
    """What a reader sees of Markdown `source`, whitespace collapsed (table cells one
    space apart)."""
    return " ".join("".join(parse_html(markdown_html(source)).text).split())
