"""Where an output ends: at an end-of-sequence token, or at the token whose text completes one of
the run's stop strings (the `stop` of vLLM, llama.cpp and the OpenAI API). The output keeps that
token, as those engines' token ids do, and nothing after it.

A stop string is looked for in the output's text from its start, token by token, so one split across
tokens, or across the tokens of one accepted block, ends the output at the same token as a
token-by-token decode: a speculative engine must look inside every accepted block, not only at its
end (transformers #47912)."""
from __future__ import annotations

from dataclasses import dataclass

from specviz.models.pairs import ModelPair


@dataclass(frozen=True)
class Stops:
    eos_ids: tuple[int, ...]
    strings: tuple[str, ...] = ()
    tokenizer: object = None  # decodes the output's text, where there are strings to look for

    @classmethod
    def of(cls, pair: ModelPair, strings: tuple[str, ...] = ()) -> Stops:
        return cls(tuple(pair.eos_ids), tuple(strings), pair.tokenizer)

    def text_end(self, ids: list[int], start: int = 0) -> int | None:
        """The length of `ids` up to the first token at or after `start` whose text completes a stop
        string (the tokens before `start` completed none). The text is the output's, special tokens
        left out, as the engines' detokenizers write it."""
        for n in range(start + 1, len(ids) + 1) if self.strings else ():
            text = self.tokenizer.decode(ids[:n], skip_special_tokens=True)
            if any(s in text for s in self.strings):
                return n
        return None

    def end(self, ids: list[int], start: int = 0) -> int | None:
        """The length of `ids` up to its first stop at or after token `start`: an end-of-sequence
        token, or the token that completes a stop string; None where none is there."""
        eos = next((i + 1 for i in range(start, len(ids)) if ids[i] in self.eos_ids), None)
        return self.text_end(ids[:eos], start) or eos

    def ended(self, ids: list[int]) -> bool:
        """Whether the output ends at its last token."""
        return bool(ids) and self.end(ids, len(ids) - 1) == len(ids)

    def what(self, ids: list[int], n: int) -> str:
        """The stop that ends `ids[:n]`, in words."""
        if ids[n - 1] in self.eos_ids:
            return f"an end-of-sequence token (id {ids[n - 1]})"
        text = self.tokenizer.decode(ids[:n], skip_special_tokens=True)
        return "the stop string " + " or ".join(repr(s) for s in self.strings if s in text)
