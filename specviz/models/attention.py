"""Which context each decoder layer of a model attends to: all of it, or a sliding window of the last W positions.

Read from the config as transformers reads it to lay out its own caches (`get_layer_types_and_kwargs`), so a
model's windows here are the ones it decodes with under transformers."""
from __future__ import annotations

import weakref

from transformers.cache_utils import get_layer_types_and_kwargs

SUPPORTED = ("full_attention", "sliding_attention")
_windows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def sliding_windows(model) -> dict[str, int]:
    """The window of each sliding-attention layer type of `model` ({} when every layer sees its whole context).
    Raises ValueError for attention that is neither (chunked, linear, ...)."""
    if model not in _windows:
        types, kwargs = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
        other = sorted(set(types) - set(SUPPORTED))
        if other:
            raise ValueError(f"specviz decodes full and sliding-window attention; this model also has {other} layers")
        _windows[model] = {t: kw["sliding_window"] for t, kw in zip(types, kwargs) if t == "sliding_attention"}
    return _windows[model]


def declares_layer_types(model) -> bool:
    """The model reads its masks by layer type (a dict), as every transformers model with `layer_types` does."""
    return getattr(model.config.get_text_config(decoder=True), "layer_types", None) is not None
