"""Bugs planted in the target's attention kernel, in the verify path only: a pass of several queries
over a non-empty cache. Ids, positions, masks and caches stay right; only the computation is wrong,
so the yardstick (fresh passes, no cache) never runs them, and neither does the batch-size-1
reference (one query a pass).

BUGS move logits far beyond rounding. SUBTLE ones stay within it: a softmax scale one part in a
million off, and a kernel that sums the keys in another order (correct, but its bits depend on
the pass's shape, which batch-invariant mode forbids)."""
import contextlib

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface

from specviz.models import invariant


def _scale(query, key, value, mask, scaling):
    return key, value, mask, scaling * 1.25  # a softmax scale taken from the wrong head size


def _stale_tile(query, key, value, mask, scaling):
    q = query.shape[2]  # the pass's own keys read one slot late: its newest tile was not refreshed
    key, value = key.clone(), value.clone()
    key[:, :, -q:], value[:, :, -q:] = key[:, :, -q - 1:-1].clone(), value[:, :, -q - 1:-1].clone()
    return key, value, mask, scaling


def _stale_row(query, key, value, mask, scaling):
    # each row reads the previous row's new keys and values: a tile indexed off by one row
    q = query.shape[2]
    key, value = key.clone(), value.clone()
    key[:, :, -q:], value[:, :, -q:] = key.roll(1, 0)[:, :, -q:], value.roll(1, 0)[:, :, -q:]
    return key, value, mask, scaling


def _reduction(query, key, value, mask, scaling):
    # a split-K reduction loses the partial sum of the cache's last tile (its softmax share stays)
    q = query.shape[2]
    value = value.clone()
    value[:, :, -q - 8:-q] = 0
    return key, value, mask, scaling


def _scale_ulp(query, key, value, mask, scaling):
    return key, value, mask, scaling * (1 + 2 ** -20)  # a scale rounded once too often


def _reordered(query, key, value, mask, scaling):
    # the keys summed last to first: another order, as a split-K kernel picks one by query count
    return key.flip(2), value.flip(2), mask.flip(-1), scaling


BUGS = {"scale": _scale, "stale-tile": _stale_tile, "stale-row": _stale_row,
        "reduction": _reduction}
SUBTLE = {"scale-ulp": _scale_ulp, "reordered": _reordered}


@contextlib.contextmanager
def planted(monkeypatch, name):
    """Every attention call of several queries over a cache, sdpa's or the batch-invariant mode's,
    goes through bug `name`."""
    bug = {**BUGS, **SUBTLE}[name]

    def bugged(kernel):
        def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
            if query.shape[2] > 1 and key.shape[2] > query.shape[2] \
                    and isinstance(attention_mask, torch.Tensor):
                key, value, attention_mask, scaling = bug(query, key, value, attention_mask,
                                                          scaling)
            return kernel(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        return attention

    with monkeypatch.context() as m:
        m.setitem(AttentionInterface._global_mapping, "sdpa", bugged(sdpa_attention_forward))
        m.setitem(AttentionInterface._global_mapping, invariant.NAME, bugged(invariant.attention))
        yield
