"""A served page that decodes with several pairs in turn must not keep them all: once a pair leaves
the loader's cache, nothing computed from it (references, batched references, traces) keeps
it alive."""
import functools
import gc
import weakref

from specviz.models import pairs
from specviz.models.pairs import pair_for
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec


def _spec(dtype: str, device: str) -> RunSpec:
    return RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype=dtype, device=device,
                         prompts=tuple(builtin_set("spec-bench")[:4]), batch_size=4, k=5,
                         max_new_tokens=24)


def test_after_three_pairs_in_turn_the_first_is_freed(monkeypatch):
    # The loader keeps SPECVIZ_MAX_PAIRS pairs (2 by default; the suite keeps more): a fresh loader
    # of the default size.
    monkeypatch.setattr(pairs, "_cached_pair",
                        functools.lru_cache(maxsize=2)(pairs._cached_pair.__wrapped__))
    first = _spec("bfloat16", "cpu")
    trace = run(first)
    # bfloat16 forks on a near-tie here, so the batched reference was decoded and cached too
    assert any(s.forensics and s.forensics.batching_noise is not None for s in trace.sequences)
    freed = weakref.ref(pair_for(first))  # the loader's cached pair: the one run used
    for later in (_spec("float32", "cpu"), _spec("float64", "auto")):
        run(later)
    gc.collect()
    assert freed() is None
