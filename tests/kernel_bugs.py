"""Bugs planted in the target's attention kernel, in the verify path only: a pass of several queries
over a non-empty cache. Ids, positions, masks and caches stay right; only the computation is wrong,
so the yardstick (fresh passes, no cache) never runs them, and neither does the batch-size-1
reference (one query a pass)."""
import contextlib

from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface


def _scale(query, key, value, scaling):
    return key, value, scaling * 1.25  # a softmax scale taken from the wrong head size


def _stale_tile(query, key, value, scaling):
    q = query.shape[2]  # the pass's own keys read one slot late: its newest tile was not refreshed
    key, value = key.clone(), value.clone()
    key[:, :, -q:], value[:, :, -q:] = key[:, :, -q - 1:-1].clone(), value[:, :, -q - 1:-1].clone()
    return key, value, scaling


def _stale_row(query, key, value, scaling):
    # each row reads the previous row's new keys and values: a tile indexed off by one row
    q = query.shape[2]
    key, value = key.clone(), value.clone()
    key[:, :, -q:], value[:, :, -q:] = key.roll(1, 0)[:, :, -q:], value.roll(1, 0)[:, :, -q:]
    return key, value, scaling


def _reduction(query, key, value, scaling):
    # a split-K reduction loses the partial sum of the cache's last tile (its softmax share stays)
    q = query.shape[2]
    value = value.clone()
    value[:, :, -q - 8:-q] = 0
    return key, value, scaling


BUGS = {"scale": _scale, "stale-tile": _stale_tile, "stale-row": _stale_row,
        "reduction": _reduction}


@contextlib.contextmanager
def planted(monkeypatch, name):
    """Every sdpa attention call of several queries over a cache goes through bug `name`."""
    bug = BUGS[name]

    def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        if query.shape[2] > 1 and key.shape[2] > query.shape[2]:
            key, value, scaling = bug(query, key, value, scaling)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      **kwargs)

    with monkeypatch.context() as m:
        m.setitem(AttentionInterface._global_mapping, "sdpa", attention)
        yield
