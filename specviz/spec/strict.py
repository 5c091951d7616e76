"""Strict models: what reads a stranger's input (a spec, a trace, an engine's answer) refuses
unknown fields and bad collections fast, and says what is wrong in a few words (SpecError).
"""
from __future__ import annotations

import itertools
from typing import Annotated, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MAX_PROBLEMS_LISTED = 3  # in one message about a stranger's input


class SpecError(ValueError):
    """A run that cannot be done as asked; the message says what to change."""


Item = TypeVar("Item")
Key = TypeVar("Key")
# Collections of a stranger's data stop validating at their first bad item: one in every item of a
# huge list would cost pydantic an error object each (18 s for 10 million).
Many = Annotated[list[Item], Field(fail_fast=True)]
Map = Annotated[dict[Key, Item], Field(fail_fast=True)]


class Strict(BaseModel):
    """Unknown fields are refused. pydantic reports each one, so an object with more keys than a few
    beyond the model's is refused in one error (a stranger's million keys would otherwise
    cost seconds)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: object) -> object:
        if isinstance(data, dict) and len(data) > len(cls.model_fields) + MAX_PROBLEMS_LISTED:
            unknown = itertools.islice((k for k in data if k not in cls.model_fields),
                                       MAX_PROBLEMS_LISTED)
            raise ValueError(f"{len(data)} fields, of {len(cls.model_fields)} known; unknown: "
                             + ", ".join(repr(k)[:40] for k in unknown) + ", …")
        return data

    @classmethod
    def build(cls, **fields) -> Self:
        """Validate `fields`, turning pydantic's report into one readable SpecError."""
        try:
            return cls(**fields)
        except ValidationError as e:
            raise SpecError(describe_validation_error(e)) from None


MAX_PROBLEMS_READ = 10_000  # each problem pydantic reports becomes a Python dict when read: ~2.5 µs


def describe_validation_error(e: ValidationError) -> str:
    """pydantic's report in a few words: the first problems and where they are, stranger text
    cut short."""
    n = e.error_count()
    if n > MAX_PROBLEMS_READ:
        return f"{n} problems, too many to list"
    parts = []
    for err in e.errors(include_url=False, include_context=False,
                        include_input=False)[:MAX_PROBLEMS_LISTED]:
        where = ".".join(cut(str(x), 40) for x in err["loc"])
        msg = cut(err["msg"].removeprefix("Value error, "), 200)
        parts.append(f"{where}: {msg}" if where else msg)
    if n > MAX_PROBLEMS_LISTED:
        parts.append(f"and {n - MAX_PROBLEMS_LISTED} more")
    return "; ".join(parts)


def cut(text: str, most: int) -> str:
    """`text`, cut to at most `most` characters (an ellipsis marks a cut)."""
    return text if len(text) <= most else text[: most - 1] + "…"
