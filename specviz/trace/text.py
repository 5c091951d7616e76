"""Text for people: token ids cut into whole characters, and text shortened between characters.

A byte-level tokenizer splits many characters (CJK, emoji, accented letters) over 2–4 tokens, each
of which decodes alone to U+FFFD. At trace-build time, with the tokenizer, each sequence is cut into
groups of tokens that decode to whole characters; a group's text goes on the token that completes it
and the tokens before it in the group get None. Views then join pieces and never need the tokenizer.
"""
from __future__ import annotations

import regex

REPLACEMENT = "\ufffd"
MAX_GROUP = 4  # a UTF-8 character is at most 4 bytes, so at most 4 byte tokens


def pieces(tokenizer, ids: list[int], before: int | None) -> list[str | None]:
    """Each token's share of the text of `ids`: whole characters on the token that completes them,
    None on the tokens that only start them. `before` is the token preceding `ids` (the prompt's
    last): decoding each group after the token before it keeps the leading space a SentencePiece
    tokenizer drops alone."""
    # a group at i follows ids[i - 1]
    context = [[] if before is None else [before], *([i] for i in ids)]

    def after(prefix: list[int], group: list[int]) -> str:
        return tokenizer.decode(prefix + group)[len(tokenizer.decode(prefix)):]

    heads = tokenizer.batch_decode(context[:-1])
    # the common case: one token
    alone = tokenizer.batch_decode([c + [i] for c, i in zip(context, ids)])
    out: list[str | None] = []
    i = 0
    while i < len(ids):
        n, text = 1, alone[i][len(heads[i]):]
        # A group ending in U+FFFD may end inside a character: take in the next token unless the
        # tokens ahead read the same with it as without it (then the bytes so far cannot be
        # completed, as after a stray byte).
        while text.endswith(REPLACEMENT) and n < MAX_GROUP and i + n < len(ids):
            group, ahead = ids[i: i + n], ids[i + n: i + n + MAX_GROUP]
            if text + after(group[-1:], ahead) == after(context[i], group + ahead):
                break
            n += 1
            text = after(context[i], ids[i: i + n])
        out += [None] * (n - 1) + [text]
        i += n
    return out


def joined(pieces: list[str | None]) -> str:
    return "".join(p for p in pieces if p)


def character_at(pieces: list[str | None], i: int) -> tuple[int, int]:
    """The token span [start, end) of the whole character(s) that token `i` is part of."""
    start = i
    while start > 0 and pieces[start - 1] is None:
        start -= 1
    end = i
    while end < len(pieces) and pieces[end] is None:
        end += 1
    return start, min(end + 1, len(pieces))


def clip(text: str, most: int) -> str:
    """`text` cut to at most `most` characters as a reader counts them (a flag or 👍🏽 is
    one), "…" if cut."""
    head = regex.match(rf"\X{{0,{most}}}", text).group()
    return text if len(head) == len(text) else head + "…"


def span(xs: list[int] | None) -> str:
    return "?" if not xs else str(xs[0]) if len(xs) == 1 else f"{xs[0]}…{xs[-1]}"
