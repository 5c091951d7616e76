"""A paged cache as transformers runs it (kvcache.py lays every cache out): each attention layer a
`PagedLayer`, writing a pass's K/V into its model's block pool and reading every row's slots
through the batch's map (paging.py)."""
from __future__ import annotations

from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin

from specviz.decoding.paging import Pages
from specviz.models.recurrent import holds_state


class PagedLayer(CacheLayerMixin):
    """An attention layer's K/V in its model's block pool: a pass writes its tokens' K/V at the
    slots `feeding` mapped, and reads every row's slots through the batch's map."""

    is_sliding = False
    is_croppable = True

    def __init__(self, pages: Pages, index: int):
        super().__init__()
        self.pages, self.index = pages, index

    def lazy_initialization(self, key_states, value_states) -> None:
        self.device, self.dtype, self.is_initialized = key_states.device, key_states.dtype, True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return self.pages.write(self.index, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        """The slots held before the pass under way (transformers asks during a pass)."""
        return self.pages.before

    def get_max_length(self) -> int:
        return -1


class PagedCache(DynamicCache):
    """A batch's cache whose attention layers are `PagedLayer`s over `pages`."""

    pages: Pages


def paged(cache: DynamicCache, pages: Pages) -> PagedCache:
    """`cache` (fresh) with its attention layers in `pages`' pool; its recurrent layers stay."""
    cache.__class__, cache.pages = PagedCache, pages
    cache.layers = [lay if holds_state(lay) else PagedLayer(pages, i)
                    for i, lay in enumerate(cache.layers)]
    return cache
