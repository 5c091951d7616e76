"""A row's token tree in one round, as a picture (an inline SVG) and in words: each node a box at
its depth, the accepted path green, the first child the target refused red, the pruned branches
grey (trace/records.TreeRecord)."""
from __future__ import annotations

import html

from specviz.app.views import token_text, visible_text
from specviz.trace.records import RowRecord, TreeRecord
from specviz.trace.schema import Trace

# pixels: a depth's column, a node's line, boxes
COLUMN, LINE, BOX_W, BOX_H, ROOT_W = 96, 26, 84, 20, 44


def refused(row: RowRecord) -> int | None:
    """The child of the accepted path's last node that the target refused first, where the row had
    one (the row's draft after its accepted ones)."""
    tree = row.tree
    children = tree.children(tree.path[-1] if tree.path else -1)
    return children[0] if children and row.accepted < len(row.draft_tokens) else None


def _layout(tree: TreeRecord) -> dict[int, tuple[int, int]]:
    """(column, line) of every node: depth-first from the root, each leaf on a line of its own (the
    first branch on the first line)."""
    at, line = {}, 0

    def place(node: int, depth: int) -> None:
        nonlocal line
        at[node] = (depth, line)
        kids = tree.children(node)
        if not kids:
            line += 1
        for kid in kids:
            place(kid, depth + 1)

    for top in tree.children(-1):
        place(top, 1)
    return at


def tree_svg(trace: Trace, row: RowRecord) -> str:
    """The row's tree as an inline SVG; empty for a chain's round."""
    tree = row.tree
    if tree is None:
        return ""
    at = _layout(tree)
    path, no = set(tree.path), refused(row)
    lines = max((y for _, y in at.values()), default=0) + 1
    left = lambda depth: ROOT_W + 10 + (depth - 1) * COLUMN  # noqa: E731
    middle = lambda line: 2 + line * LINE + BOX_H / 2  # noqa: E731
    width, height = left(max((x for x, _ in at.values()), default=1)) + BOX_W + 4, LINE * lines + 4
    parts = [f'<svg class="sv-tree" role="img" width="{width}" height="{height}" viewBox="0 0 '
             f'{width} {height}" aria-label="round {row.round}: a tree of {len(tree.tokens)} '
             f'nodes, {len(tree.path)} accepted">',
             f'<rect x="2" y="2" width="{ROOT_W - 2}" height="{BOX_H}" rx="4" '
             'class="sv-node-root"><title>the row\'s last committed token</title></rect>']
    for node, (x, y) in at.items():
        parent = tree.parents[node]
        x0, y0 = (ROOT_W, 0) if parent < 0 else (left(at[parent][0]) + BOX_W, at[parent][1])
        parts.append(f'<line x1="{x0}" y1="{middle(y0)}" x2="{left(x)}" y2="{middle(y)}" '
                     f'class="sv-edge{" sv-on-path" if node in path else ""}"/>')
    for node, (x, y) in at.items():
        kind = "path" if node in path else "refused" if node == no else "pruned"
        rank, of = tree.candidate(node)
        label = visible_text(token_text(trace, tree.tokens[node]))[:10]
        tip = (f"node {node} · depth {x} · candidate {rank} of {of} · id {tree.tokens[node]} · "
               + {"path": "accepted", "refused": "refused by the target",
                  "pruned": "pruned: off the accepted path"}[kind])
        parts.append(f'<g class="sv-node-{kind}"><title>{html.escape(tip)}</title>'
                     f'<rect x="{left(x)}" y="{2 + y * LINE}" '
                     f'width="{BOX_W}" height="{BOX_H}" rx="4"/>'
                     f'<text x="{left(x) + 4}" y="{16 + y * LINE}">{html.escape(label)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def tree_words(row: RowRecord) -> str:
    """The tree in a sentence, for a tooltip or a table."""
    tree = row.tree
    roots = sum(p < 0 for p in tree.parents)
    depth = _layout(tree)
    deepest = max((x for x, _ in depth.values()), default=0)
    off = tree.ranks(len(tree.path))
    where = "" if all(r == 1 for r in off) else ", through candidates " + "·".join(map(str, off))
    return (f"a token tree of {len(tree.tokens)} nodes, {roots} at the first depth, {deepest} "
            f"deep; its accepted path {len(tree.path)} long{where}")
