"""Hostile input for tests: script-carrying strings, a trace with one in every string field, and what a
page showing them may contain."""
from __future__ import annotations

import json
from html.parser import HTMLParser

EVIL = "http://evil.invalid"  # another origin: the page must never ask it for anything
PAYLOADS = (
    '<img src=x onerror="window.__pwned=1">',
    "<script>window.__pwned=1</script>",
    '"><svg onload=window.__pwned=1>',
    "' onmouseover='window.__pwned=1' x='",
    "javascript:window.__pwned=1",
    f"![x]({EVIL}/md.png) [click](javascript:window.__pwned=1) <{EVIL}/auto> {EVIL}/bare www.evil.invalid",
    f'<img src="{EVIL}/img.png"><iframe src="{EVIL}/"></iframe><link rel=stylesheet href="{EVIL}/x.css">',
    f'<a href="{EVIL}/" style="background:url({EVIL}/bg.png)">a</a><style>@import "{EVIL}/s.css";</style>',
    "| cell | `code` **bold** # heading\n- item $$\\href{javascript:1}{x}$$ &lt;b&gt; &amp; \\",
)
HOSTILE = " ".join(PAYLOADS)


# ---------------------------------------------------------------- a trace with a payload in every string


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
    """`trace` with `HOSTILE` (numbered, so dict keys stay distinct) in every string the schema accepts there.

    The model is walked generically, each string tried alone. Values refused alone (the target id needs a
    draft id to match) are retried together with their refused siblings, less those pydantic names (a
    Literal, a pattern).
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


def live_markup(page: str, tags: set[str], attributes: set[str] = frozenset({"class", "title"})) -> list[str]:
    """Whatever in `page` could act: an element or attribute outside the given ones (so no `on*` handler, and
    no `href` or `src` to hold a script URL), a style that loads something."""
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
    """What in a Markdown component's value would act: any element Markdown makes beyond text formatting,
    and a bare URL (Gradio's renderer links those, GFM-style)."""
    found = live_markup(markdown_html(source), {"p", "strong", "em", "code", "ul", "li", "table", "thead", "tbody",
                                                 "tr", "th", "td", "h1", "h3"}, {"style"})
    return found + [url for url in ("://", "www.") if url in source]


def markdown_text(source: str) -> str:
    """What a reader sees of Markdown `source`, whitespace collapsed (table cells one space apart)."""
    return " ".join("".join(parse_html(markdown_html(source)).text).split())
