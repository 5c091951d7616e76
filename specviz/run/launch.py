"""The processes of one `accelerate launch` (GPUs, or CPU processes on one machine or several): who
this process is, its share of a list, and the few meetings a sharded sweep or check needs. With one
process (no launch) every function is the plain single-process case and nothing is started.
"""
from __future__ import annotations

import atexit
import functools
import math
import os
from collections.abc import Callable
from typing import TypeVar

import torch

from specviz.spec.strict import SpecError

Value = TypeVar("Value")


def world_size() -> int:
    """Processes in this launch (`accelerate launch` and torchrun set WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


@functools.cache
def _state():
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())  # gloo between CPU processes, else NCCL
    # The group must close while the interpreter is alive: gloo's threads still hold tensors, and a
    # process that left them to its teardown died with SIGABRT ("terminate called without an active
    # exception", pytorch#190489).
    atexit.register(state.destroy_process_group)
    return state


def rank() -> int:
    return 0 if world_size() == 1 else _state().process_index


def is_main() -> bool:
    """Whether this process reports. Call it before loading models: under a launch it sets this
    process's GPU."""
    return rank() == 0


def share(n: int, batch_size: int, rank: int, world: int) -> range:
    """The items of process `rank`: a run of whole static batches of `batch_size` (the last may
    be short)."""
    batches = math.ceil(n / batch_size)
    lo, hi = rank * batches // world, (rank + 1) * batches // world
    return range(min(lo * batch_size, n), min(hi * batch_size, n))


def my_share(n: int, batch_size: int = 1) -> range:
    """This process's share of `n` items."""
    return share(n, batch_size, rank(), world_size())


def on_main(work: Callable[[], Value]) -> Value:
    """`work()`, done by the main process alone and handed to every process: what must be the same
    everywhere (a server's answers, asked once) or costs more than it is worth to repeat
    (a calibration)."""
    if world_size() == 1:
        return work()
    from accelerate.utils import broadcast_object_list

    box: list = [None]
    if is_main():
        try:
            box[0] = (work(), None)
        except Exception as e:  # the others must hear of it, or they would wait for ever
            box[0] = (None, f"{type(e).__name__}: {e}")
            broadcast_object_list(box)
            raise
    broadcast_object_list(box)
    result, error = box[0]
    if error is not None:
        raise SpecError(f"the main process failed: {error}")
    return result


def gather_from_ranks(mine: Value) -> list[Value]:
    """Every process's `mine`, in rank order, handed to every process."""
    if world_size() == 1:
        return [mine]
    from accelerate.utils import gather_object

    return gather_object([mine])


def wait_for_everyone() -> None:
    if world_size() > 1:
        _state().wait_for_everyone()
