"""A corrupt state, named: the engine's own breaking checks and how they corroborate, the watch's
inspection of the emitting row as evidence, and which input of its pass was wrong (first token,
positions, mask, cache, recurrent state) or, every input right, the kernel (watch.py measures;
whitebox.py and sampledrun.py judge with this)."""
from __future__ import annotations

from specviz.trace.evidence import RunForensics
from specviz.trace.records import RowRecord
from specviz.trace.text import span
from specviz.trace.yardsticks import Rounding

# The engine's own checks whose failure puts the target's view out of step, by priority when several
# fail in the same round (positions also spoil the cache's provenance).
BREAKING = ("bonus", "positions", "mask", "kv", "recurrent")
EXPLAIN = {
    "bonus": ("a correction/bonus token was not the target's own (the argmax of the pass that "
              "chose it, or its draw when sampling) (I4)"),
    "accept": "the accept rule kept a draft the target did not choose (at temperature 0 a draft is "
              "kept only where it is the verifying pass's argmax)",
    "positions": "the position ids fed to the model did not count the row's real tokens (I2)",
    "mask": "the attention mask did not show exactly the row's real tokens",
    "kv": "the KV cache did not hold each real token's entry, computed at its own position (I3)",
    "recurrent": ("a recurrent layer's state (a hybrid's scan or convolution) did not hold exactly "
                  "the row's committed tokens: a rejected draft stayed in it, or accepted tokens "
                  "never reached it (I5)"),
    "state": "the row's state was corrupt, and no single input (first token, positions, mask, "
             "cache) explains it",
}


def failures(rows: list[RowRecord], until_round: int | None) -> dict[str, int]:
    """The engine's own breaking checks that failed up to `until_round` (None: any), each at its
    first round."""
    failed: dict[str, int] = {}
    for r in rows:
        if until_round is not None and r.round > until_round:
            break
        for c in BREAKING:
            if not r.checks.get(c, True):
                failed.setdefault(c, r.round)
    return failed


def corrupt(ev: RunForensics, rounding: Rounding, invariant: str | None, logits: str) -> None:
    """A state beyond the yardstick, the `logits` of its pass named: `kernel-bug` where every input
    was right and the pass rebuilt from them still departs, else `sync-bug:` the input
    that was wrong."""
    component = _component(ev, rounding)
    beyond = f"{logits} differ from a fresh batch-size-1 recomputation of the row by " + (
        f"{ev.state_diff:.3g}, where batch-invariant {rounding.dtype} allows no difference at all"
        if rounding.batch_invariant else
        f"{ev.state_diff:.3g}, {ev.state_diff / rounding.tolerance:.3g} times what rounding in "
        f"{rounding.dtype} allows ({rounding.tolerance:.3g}; two correct computations differ by "
        f"more with probability {rounding.alpha:.2g})")
    if component == "kernel":
        ev.verdict = "kernel-bug"
        ev.explanation = (f"{beyond}, though its first token, positions and mask were right. "
                          f"{rebuilt_pass_shows(ev, rounding)}")
    else:
        ev.verdict = f"sync-bug:{invariant if component == 'state' and invariant else component}"
        ev.explanation = f"{beyond}: the row's state was corrupt. {_why(ev, component)}"


def failed_check_sentence(ev: RunForensics, invariant: str | None) -> str:
    """The engine's own failed check, in a sentence: it corroborates the independent evidence."""
    return (f" The engine's own check found, in round {ev.failed_checks[invariant]}, that "
            f"{EXPLAIN[invariant]}."
            if invariant else "")


def first_invariant(ev: RunForensics) -> str | None:
    """The engine's own breaking check that failed first, at or before the fork (None:
    none failed)."""
    if not ev.failed_checks:
        return None
    first = min(ev.failed_checks.values())
    return next(c for c in BREAKING if ev.failed_checks.get(c) == first)


def fill_state(ev: RunForensics, fork) -> None:
    """The watch's inspection of the emitting row (watch.ForkState), as evidence."""
    ev.state_diff, ev.kv_diff, ev.tokens_fed_ok = fork.state_diff, fork.kv_diff, fork.tokens_ok
    ev.recurrent_diff = fork.recurrent_diff
    ev.kernel_diff, ev.kernel_diff_float64 = fork.kernel_diff, fork.kernel_diff_float64
    ev.written_at = fork.written_at
    ev.positions_fed, ev.positions_expected = fork.positions_fed, fork.positions_expected
    ev.visible, ev.visible_expected = fork.visible, fork.visible_expected
    ev.emitting_argmax, ev.margin_batched = fork.emitting_argmax, fork.emitting_margin


def kernel_departs(ev: RunForensics, rounding: Rounding) -> bool:
    """The pass rebuilt from correct inputs departs from a fresh one: in the run's dtype beyond its
    rounding, or in float64 (where rounding is nil) beyond float64's."""
    return (ev.kernel_diff is not None and ev.kernel_diff > rounding.tolerance
            or ev.kernel_diff_float64 is not None
            and rounding.float64_tolerance is not None
            and ev.kernel_diff_float64 > rounding.float64_tolerance)


def _component(ev: RunForensics, rounding: Rounding) -> str:
    """Which input of the emitting pass was wrong, checked against the truth one at a time."""
    if ev.tokens_fed_ok is False:
        return "state"  # it was fed another token than its own last one: rows mixed up
    if ev.positions_fed is not None and ev.positions_fed != ev.positions_expected:
        return "positions"
    if ev.visible is not None and ev.visible != ev.visible_expected:
        return "mask"
    if kernel_departs(ev, rounding):
        return "kernel"  # right inputs, wrong logits: the computation itself
    if ev.kv_diff is not None and ev.kv_diff > rounding.tolerance:
        if _downstream_of_recurrent(ev):
            return "recurrent"
        # Most ill-fitting entries fit their own token at another position: the positions were wrong
        # when they were computed. Entries of other tokens: the cache itself was laid out wrong.
        at_other_positions = sum(at >= 0 for _, at in ev.written_at)
        return "positions" if at_other_positions > len(ev.written_at) / 2 else "kv"
    if ev.recurrent_diff is not None and ev.recurrent_diff > rounding.tolerance:
        return "recurrent"
    return "state"


def _downstream_of_recurrent(ev: RunForensics) -> bool:
    """Whether a hybrid's ill-fitting cache entries were written after its recurrent state went out
    of step while its cache held its own tokens: the engine's checks found a recurrent state wrong
    in an earlier round than the fork's, and no cache entry out of place. An attention layer's K/V
    is computed from the layers below it, so entries written over a wrong state fit no fresh
    prefill, though the cache itself was kept right."""
    checks = ev.failed_checks or {}
    went = checks.get("recurrent")
    return went is not None and "kv" not in checks and ev.round is not None and went < ev.round


def rebuilt_pass_shows(ev: RunForensics, rounding: Rounding) -> str:
    """What the pass rebuilt from correct inputs shows: a computation the model itself does
    not make."""
    where = []
    if ev.kernel_diff_float64 is not None and rounding.float64_tolerance is not None \
            and ev.kernel_diff_float64 > rounding.float64_tolerance:
        where.append(f"in float64 by {ev.kernel_diff_float64:.3g}, where rounding explains "
                     f"{rounding.float64_tolerance:.2g}")
    if ev.kernel_diff is not None and ev.kernel_diff > rounding.tolerance:
        where.append(f"in {rounding.dtype} by {ev.kernel_diff:.3g}")
    return ("Rebuilt from correct inputs (each row's cache from a fresh prefill of its real "
            "tokens, true positions, a plain mask), the same pass still departs from a fresh one, "
            f"{' and '.join(where)}: the batched verify computes logits the model itself does not. "
            "A bug in the kernels of a pass of several queries over a cache, not in the state.")


def _why(ev: RunForensics, state: str) -> str:
    if state == "positions" and ev.positions_fed == ev.positions_expected:
        wrong = [(i, at) for i, at in ev.written_at if at >= 0]
        return ("Its cache held entries computed at the wrong positions in earlier passes: "
                + ", ".join(f"the token at position {i} was computed at {at}" for i, at in wrong)
                + ".")
    if state == "positions":
        return (f"It was fed position ids {span(ev.positions_fed)} where its tokens sit at "
                f"{span(ev.positions_expected)}.")
    if state == "mask":
        return (f"Its mask let its verified slots see {span(ev.visible)} key slots where it has "
                f"{span(ev.visible_expected)} real tokens.")
    if state == "kv":
        return ("Replayed alone over only the cache entries its mask showed, with true positions, "
                f"it still differs by {ev.kv_diff:.3g}: the cache held the wrong entries.")
    if state == "recurrent" and _downstream_of_recurrent(ev) \
            and not (ev.recurrent_diff is not None and ev.recurrent_diff > ev.tolerance):
        return ("Replayed alone over only the cache entries its mask showed, with true positions, "
                f"it still differs by {ev.kv_diff:.3g}: its cache entries fit no fresh prefill of "
                f"its tokens. They were written after round {ev.failed_checks['recurrent']}, where "
                f"{EXPLAIN['recurrent']}, and every cache slot held its own token: a hybrid's "
                "attention entries computed over a wrong recurrent state are wrong too.")
    if state == "recurrent":
        kv_fits = ev.kv_diff is None or ev.kv_diff <= ev.tolerance
        return ("Replayed over fresh K/V of its tokens with its own recurrent states, it still "
                f"differs by {ev.recurrent_diff:.3g}, where the same replay over its own visible "
                f"K/V and fresh states {'does not' if kv_fits else f'differs by {ev.kv_diff:.3g}'}:"
                f" {EXPLAIN['recurrent']}.")
    if ev.tokens_fed_ok is False:
        return ("The first token it was fed is not the sequence's last token: the row was given "
                "another sequence's state.")
    return ("Its first token, positions, mask and visible cache entries each check out alone: "
            + EXPLAIN["state"] + ".")
