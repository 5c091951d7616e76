"""One request's own sampling settings, as a serving engine takes them per request, and the text
they are typed in."""
from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from specviz.spec.strict import SpecError, Strict, cut

MAX_TEMPERATURE = 10.0
# a request that sets no temperature samples at the serving engines' default (vLLM, OpenAI)
UNSET_TEMPERATURE = 1.0


class RowSampling(Strict):
    """One request's own sampling settings, as a serving engine takes them per request: its
    temperature (0: greedy; None: unset, the engines' default 1.0), top-k (0: off), top-p (1: off)
    and seed (None: unseeded, it draws from the run's stream for its sequence; set: from its own
    seed's stream, whatever its sequence)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE)
    top_k: int = Field(0, ge=0, le=2**20)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _greedy(self) -> RowSampling:
        if self.temperature == 0 and (self.top_k or self.top_p < 1):
            raise ValueError("a greedy request (temperature 0) takes no top-k or top-p")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def target(self) -> tuple[float, int, float]:
        """The temperature (an unset one the default), top-k and top-p the target samples this
        request with."""
        return (UNSET_TEMPERATURE if self.temperature is None else self.temperature, self.top_k,
                self.top_p)


def row_fields(text: str) -> dict[str, str]:
    """One request's settings as typed: comma-separated key=value pairs of RowSampling's fields
    (RowSampling validates the values)."""
    pairs = [x.strip().partition("=") for x in text.split(",") if x.strip()]
    bad = [k for k, eq, _ in pairs if not eq or k.strip() not in RowSampling.model_fields]
    if bad or not pairs:
        raise SpecError("a request's settings are key=value pairs of "
                        f"{', '.join(RowSampling.model_fields)}; got {cut(text, 80)!r}")
    return {k.strip(): v.strip() for k, _, v in pairs}


def rows_from_text(text: str) -> tuple[dict[str, str], ...]:
    """Per-request settings typed one request a line (blank lines skipped)."""
    return tuple(row_fields(line) for line in (text or "").splitlines() if line.strip())


def rows_as_text(rows: tuple[RowSampling, ...]) -> str:
    """What rows_from_text reads back: each request's fields that are set, one request a line."""
    return "\n".join(",".join(f"{k}={v}" for k, v in r.model_dump(exclude_none=True).items())
                     for r in rows)
