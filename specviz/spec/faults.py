"""The fault catalogue, declared once: one record per fault (spec/faults.toml, read here into
`Fault`s), with its name, kind, description, the field threads it cites, the verdict its forks get,
what the acceptance judge names its drafts, and what it needs of a run to act (its kind's needs and
any of its own: spec/fits.py). Every group of faults a reader asks for is computed from the
records; the presets are named sets of records (FAULT_PRESETS).

A fault's field case, where it has one, is spec/casebook.py's card for it (`BY_FAULT[name]`: what
the users saw, the replica's run). Its behaviour is decoding/faults.py's `Policy`, the one module
besides this one that names a fault (tests/test_fault_records.py checks it). Plain data: a RunSpec
checks its fault names here, so specs and trace files validate without torch.
"""
from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from specviz.spec.fits import FAULT_KINDS, NEEDS
from specviz.spec.threads import Thread


@dataclass(frozen=True)
class Fault:
    name: str
    kind: str  # a name of spec/fits.py's FAULT_KINDS
    description: str  # what it does, and where the field met it
    # The verdict (spec/verdicts.py) its forks get: the state it puts out of step, or the decision
    # it gets wrong (a sampled run's faults: where the sampled-run judges can name it; a rejecting
    # fault's: what the rejections judge names its rounds).
    verdict: str | None = None
    acceptance: str | None = None  # what the acceptance judge names its drafts (a lossless fault)
    also_needs: tuple[str, ...] = ()  # needs beyond its kind's: the drafter whose passes it breaks
    threads: tuple[Thread, ...] = ()  # the field's issues and pull requests it replays
    # a published head's wrong way of being fed that it is (models/eagle3.py's `mistaken`)
    misfeeds: str | None = None
    # where a paged cache writes elsewhere than its block table says (decoding/paging.py's Slips)
    slips: str | None = None

    @property
    def needs(self) -> tuple[str, ...]:
        """What a run needs for it to act (names of spec/fits.py's NEEDS)."""
        return FAULT_KINDS[self.kind].needs + self.also_needs

    @property
    def changes_tokens(self) -> bool:
        """Whether it changes a greedy row's tokens (else it wastes drafts, or changes samples or
        log-probabilities only)."""
        return FAULT_KINDS[self.kind].changes_tokens

    def unfit_reason(self, has: Mapping[str, bool]) -> str | None:
        """Why it cannot act on a run, judged on the facts `has` gives (need -> whether the run has
        it); None where it fits them. A need `has` leaves out is not judged here."""
        return next((NEEDS[n] for n in self.needs if not has.get(n, True)), None)


CATALOGUE = Path(__file__).with_name("faults.toml")


def _records(path: Path) -> dict[str, Fault]:
    """The catalogue's records, by name, in the file's order (a key `Fault` lacks raises)."""
    tables = tomllib.loads(path.read_text(encoding="utf-8"))
    return {name: Fault(name, **{**t, "also_needs": tuple(t.get("also_needs", ())),
                                 "threads": tuple(map(Thread.parse, t.get("threads", ())))})
            for name, t in tables.items()}


FAULTS: dict[str, Fault] = _records(CATALOGUE)
FAULT_PRESETS = {
    "bsp-like": ("positions-from-slots", "keep-rejected-kv", "right-padding"),
    "dsd-like": ("no-mask", "growing-padding", "draft-bonus"),
}


def of_kind(*kinds: str) -> tuple[str, ...]:
    """The faults of `kinds`, in catalogue order."""
    return tuple(name for name, f in FAULTS.items() if f.kind in kinds)


def misfeeding(way: str) -> Fault:
    """The fault that feeds a published head wrong way `way`."""
    return next(f for f in FAULTS.values() if f.misfeeds == way)


def needing(need: str, names: tuple[str, ...] | list[str] | None = None) -> tuple[str, ...]:
    """The faults that act only where a run has `need` (a name of spec/fits.py's NEEDS), in
    catalogue order: of `names` (presets expanded), or of the whole catalogue."""
    among = FAULTS if names is None else expand(names)
    return tuple(name for name in among if need in FAULTS[name].needs)


def expand(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Presets expanded, duplicates removed, in catalogue order; unknown names raise ValueError."""
    out = set()
    for n in names:
        if n in FAULT_PRESETS:
            out.update(FAULT_PRESETS[n])
        elif n in FAULTS:
            out.add(n)
        else:
            known = ', '.join([*FAULTS, *FAULT_PRESETS])
            raise ValueError(f"unknown fault {n!r}; choose from {known}")
    return tuple(f for f in FAULTS if f in out)


def mechanism(faults: tuple[str, ...] | list[str]) -> str:
    """A hypothesis about an engine's fork in words (run/attribution.py): each fault's description,
    its threads in it; () is the correct engine."""
    if not faults:
        return "the correct engine"
    unknown = "not in this version of the catalogue"
    return "; ".join(f"{f}: the preset {' + '.join(FAULT_PRESETS[f])}" if f in FAULT_PRESETS
                     else f"{f}: {FAULTS[f].description if f in FAULTS else unknown}"
                     for f in faults)


def threads(faults: tuple[str, ...] | list[str]) -> list[Thread]:
    """The field's threads a hypothesis's faults cite."""
    return [t for f in faults if f in FAULTS for t in FAULTS[f].threads]
