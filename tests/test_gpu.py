import importlib
import sys
import types

import pytest

from specviz.run import gpu
from specviz.spec.run import RunSpec


@pytest.fixture
def reload_gpu(monkeypatch):
    """gpu.py with `spaces` as the test sets it in sys.modules; the real state is restored after."""
    def load(spaces_module):
        monkeypatch.setitem(sys.modules, "spaces", spaces_module)
        return importlib.reload(gpu)

    yield load
    monkeypatch.undo()
    importlib.reload(gpu)


def spec(**fields) -> RunSpec:
    return RunSpec.build(prompts=("a", "b", "c", "d"), **fields)


def test_without_spaces_the_decorator_changes_nothing(reload_gpu):
    # a None entry makes `import spaces` fail, as where it is not installed
    module = reload_gpu(None)
    assert module.spaces is None

    def fn(s):
        return len(s.prompts)

    assert module.gpu(fn) is fn


def test_with_spaces_each_call_asks_for_the_duration_of_its_spec(reload_gpu):
    asked = []

    # what ZeroGPU does: size each call by calling `duration` with the call's arguments
    def GPU(duration):
        def decorate(fn):
            def call(*args, **kwargs):
                asked.append(duration(*args, **kwargs))
                return fn(*args, **kwargs)
            return call
        return decorate

    module = reload_gpu(types.SimpleNamespace(GPU=GPU))

    @module.gpu
    def decode(s, label="x"):
        return f"{label}:{s.method}"

    small, big = spec(max_new_tokens=8), spec(max_new_tokens=200, batch_size=1)
    assert decode(small) == "x:eqspec" and decode(big, label="y") == "y:eqspec"
    assert asked == [module.seconds(small), module.seconds(big)]
    assert asked[0] < asked[1]


def test_the_estimate_grows_with_the_work_and_is_clamped():
    base = spec(method="reference", max_new_tokens=32)
    assert gpu.forward_passes(base) == 4 * 32  # the reference alone
    assert gpu.forward_passes(spec(method="eqspec", max_new_tokens=32, batch_size=4,
                                   k=5)) == 4 * 32 + 16 * 6
    assert gpu.forward_passes(spec(method="eqspec", max_new_tokens=32, batch_size=1,
                                   k=5)) == 4 * 32 + 4 * 16 * 6
    assert gpu.seconds(spec(method="reference", max_new_tokens=1)) == gpu.MIN_SECONDS
    assert gpu.seconds(spec(max_new_tokens=1024, batch_size=1, k=16)) == gpu.MAX_SECONDS
    s = spec(max_new_tokens=256, batch_size=2, k=5)
    assert gpu.forward_passes(s) == 4 * 256 + 2 * 128 * 6
    assert gpu.seconds(s) == 123  # 20 s to start, 2560 passes at 0.04 s
