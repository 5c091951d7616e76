"""Structured output: a request's grammar (a JSON schema, compiled by llguidance, the grammar engine
vLLM and SGLang also run), the mask it puts on the target's logits, and its state kept in step with
the tokens a row keeps.

Under speculation the mask of a verify slot is the grammar's state after the row's kept tokens and
the drafts before that slot (vLLM's `grammar_bitmask` over the speculative tokens): the target can
only choose, and only accept, what the grammar allows there. The matcher walks the drafts to build
the masks and is rolled back after; it advances only over the tokens the row keeps. A draft the
grammar forbids ends the walk: the slots after it are never reached. The drafter proposes from its
own logits, unmasked, as vLLM's drafters do.

A reasoning model thinks before it answers: with a reasoning end (its `</think>`), the grammar
starts at the token after it, wherever that lands in a block, and every slot before is free.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import llguidance
import llguidance.hf
import torch

from specviz.spec.grammar import compile_schema
from specviz.spec.strict import SpecError

FREE = None  # the mask of a slot the grammar does not constrain (still thinking)


@dataclass(frozen=True)
class Grammar:
    schema: str  # a JSON schema, as text
    reasoning_end: str | None = None  # the token ending a reasoning model's thinking

    @functools.cached_property
    def compiled(self) -> str:
        return compile_schema(self.schema)

    def matcher(self, tokenizer, eos_ids: tuple[int, ...], vocab: int) -> Matcher:
        """A fresh matcher: the grammar's state before a request's first output token."""
        end = None if self.reasoning_end is None else one_token(tokenizer, self.reasoning_end)
        return Matcher(llguidance.LLMatcher(_tokenizer(tokenizer, eos_ids), self.compiled,
                                            log_level=0), end, vocab, eos_ids)


def grammar_of(spec) -> Grammar | None:
    """The grammar a RunSpec sets, if any."""
    return Grammar(spec.json_schema, spec.reasoning_end) if spec.json_schema else None


def one_token(tokenizer, text: str) -> int:
    """The id of `text`, which must be one token of the tokenizer."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise SpecError(f"the reasoning end {text!r} is {len(ids)} tokens of this tokenizer; "
                        "name one token (a reasoning model's </think>)")
    return ids[0]


@functools.cache
def _tokenizer(tokenizer, eos_ids: tuple[int, ...]) -> llguidance.LLTokenizer:
    """llguidance's view of a Hugging Face tokenizer (about 0.4 s to build, hence kept): the
    grammar's end allows every end-of-sequence id of the pair."""
    return llguidance.hf.from_tokenizer(tokenizer, eos_token=list(eos_ids))


class Matcher:
    """One request's grammar over its output so far: the state after its kept tokens."""

    def __init__(self, matcher: llguidance.LLMatcher, reasoning_end: int | None, vocab: int,
                 eos: tuple[int, ...]):
        self._m = matcher
        self._end = reasoning_end
        self.thinking = reasoning_end is not None
        self._vocab = vocab
        self._eos = eos
        self.walked: list[int] = []  # the tokens the last walk of drafts went past

    def mask(self) -> torch.Tensor | None:
        """(V,) the tokens the grammar allows next; FREE while the request thinks."""
        return FREE if self.thinking else self._allowed()

    def _allowed(self) -> torch.Tensor:
        words = torch.frombuffer(bytearray(self._m.compute_bitmask()), dtype=torch.int32)
        bits = (words[:, None] >> torch.arange(32, dtype=torch.int32)) & 1
        allowed = bits.flatten().bool()[: self._vocab]
        return torch.nn.functional.pad(allowed, (0, self._vocab - len(allowed)))

    def masks(self, path: list[int], per_block_thinking: bool = False,
              past_end: bool = False) -> list[torch.Tensor | None]:
        """The mask of each slot along `path` (len(path) + 1: before it, after its first token,
        ...); the state is left as it was, and `walked` holds the tokens of `path` the walk went
        past. Faulty engines: `per_block_thinking` decides whether the row thinks once, at the
        path's start; `past_end` walks on past the grammar's end, and asks a matcher that took an
        end-of-sequence token for the next mask (GrammarFailed)."""
        thinking, consumed, out = self.thinking, 0, []
        self.walked = []
        for t in path + [None]:
            if self.walked and self.walked[-1] in self._eos and not thinking:
                if past_end:
                    raise GrammarFailed("the matcher was asked for a mask after it terminated")
                break  # past the end of the sequence
            out.append(FREE if thinking else self._allowed())
            if t is None:
                break
            if thinking:
                thinking = per_block_thinking or t != self._end
            elif self._m.is_stopped() and not past_end or not out[-1][t]:
                break  # the slots after it are never reached
            else:
                self._m.consume_token(t)
                consumed += 1
            self.walked.append(t)
        out += out[-1:] * (len(path) + 1 - len(out))
        self._m.rollback(consumed)
        return out

    def advance(self, tokens: list[int]) -> None:
        """The row kept `tokens`: the grammar's state moves past them (a token the grammar forbids
        leaves it failed, as an engine's grammar is then)."""
        for t in tokens:
            if self.thinking:
                self.thinking = t != self._end
            elif not self._m.is_error():
                self._m.consume_token(t)

    @property
    def failed(self) -> bool:
        return self._m.is_error()

    @property
    def finished(self) -> bool:
        """The grammar is complete: its end may come next."""
        return not self.thinking and self._m.is_accepting()


def dense(mask: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """(V,) a slot's mask, every token allowed where it is FREE."""
    return torch.ones(vocab, dtype=torch.bool) if mask is FREE else mask


def masked(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """`logits` with every token the grammar forbids at the dtype's lowest value: never chosen, of
    probability 0, and every margin and log-probability still a number a trace can hold (JSON has
    no infinity)."""
    lowest = torch.finfo(logits.dtype).min
    return logits.masked_fill(~allowed.to(logits.device), lowest)


class GrammarFailed(RuntimeError):
    """The matcher was asked to go on where it cannot: an engine aborts the request."""
