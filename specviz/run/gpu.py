"""ZeroGPU: GPU work goes through `spaces.GPU` where the `spaces` package is
installed (a ZeroGPU Space), and runs as is everywhere else.

On ZeroGPU a GPU is lent per call, for a duration asked up front: too short
and the call is cut off, too long and the visitor waits behind others. The
duration is estimated from the run spec of each call. A GPU function runs in a
worker process and its result travels back to the page, so it must return CPU
data only: a Trace (plain data) or text, never a tensor, a model or a
DecodeResult.

ZeroGPU needs `spaces` imported before anything initializes CUDA: the app
imports this module first.

    from specviz.gpu import gpu

    @gpu
    def decode_on_gpu(spec: RunSpec, ...) -> Trace:  # the first argument is the RunSpec
        return run(spec, ...)
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

try:
    import spaces
except ImportError:
    spaces = None
ZEROGPU = spaces is not None  # GPU calls then run in a worker process

from specviz.spec.methods import METHODS  # noqa: E402 (after `spaces`; neither imports torch)
from specviz.spec.run import ENGINE  # noqa: E402

if TYPE_CHECKING:
    from specviz.spec.run import RunSpec

# A deliberately generous estimate, to be calibrated against decode_seconds of real GPU traces:
# a forward pass of a preset pair at the page's batch sizes, Python overhead included, and
# loading the pair in the GPU worker.
SECONDS_PER_PASS = 0.04
STARTUP_SECONDS = 20
MIN_SECONDS, MAX_SECONDS = 30, 300


def forward_passes(spec: RunSpec) -> int:
    """Forward passes a run costs: the batch-size-1 reference always runs beside it (prompts x new
    tokens), then the method's own (methods.py); an engine check costs teacher-forced passes over
    each output and its reference."""
    prompts, tokens = len(spec.prompts), spec.max_new_tokens
    own = prompts * 3 if spec.method == ENGINE else METHODS[spec.method].passes(spec)
    return prompts * tokens + own


def seconds(spec: RunSpec) -> int:
    """The GPU duration to ask for `spec`, clamped to [MIN_SECONDS, MAX_SECONDS]."""
    estimate = STARTUP_SECONDS + SECONDS_PER_PASS * forward_passes(spec)
    return int(min(MAX_SECONDS, max(MIN_SECONDS, math.ceil(estimate))))


def gpu(fn=None, *, runs: int = 1):
    """Run `fn(spec, ...)` on a ZeroGPU slice sized for `runs` runs of `spec`; `fn` itself where
    `spaces` is absent."""
    if fn is None:
        return functools.partial(gpu, runs=runs)
    if spaces is None:
        return fn
    # ZeroGPU calls a callable duration with the function's own arguments, at each call.
    return spaces.GPU(
        duration=lambda spec, *args, **kwargs: min(MAX_SECONDS, runs * seconds(spec)))(fn)
