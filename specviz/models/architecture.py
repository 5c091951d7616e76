"""What specviz needs to know of a model's architecture: which context each decoder layer attends to, whether its
layouts can hold the model at all, and how its experts run in float64.

Windows are read from the config as transformers reads them to lay out its own caches
(`get_layer_types_and_kwargs`), so a model's windows here are the ones it decodes with under transformers."""
from __future__ import annotations

import weakref

from transformers.cache_utils import get_layer_types_and_kwargs

SUPPORTED = ("full_attention", "sliding_attention")
_windows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _layer_types(model) -> tuple[list[str], list[dict]]:
    return get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))


def unsupported(model) -> str | None:
    """Why specviz's padded, slot-indexed layouts cannot decode `model` as it decodes alone (None: they can)."""
    config = model.config.get_text_config(decoder=True)
    if (config.model_type == "bloom" or getattr(config, "alibi", False)
            or getattr(getattr(config, "attn_config", None), "alibi", False)):
        return ("its attention biases (ALiBi) are computed from slot indices, which padding and stale slots move; "
                "specviz decodes models whose positions come from position ids (RoPE, learned positions)")
    other = sorted(set(_layer_types(model)[0]) - set(SUPPORTED))
    if "dummy" in other:
        return "some of its layers reuse another layer's cache or attend to nothing, which specviz's caches do not lay out"
    if other:
        return f"specviz decodes full and sliding-window attention; this model also has {', '.join(other)} layers"
    return None


def sliding_windows(model) -> dict[str, int]:
    """The window of each sliding-attention layer type of `model` ({} when every layer sees its whole context)."""
    if model not in _windows:
        types, kwargs = _layer_types(model)
        _windows[model] = {t: kw["sliding_window"] for t, kw in zip(types, kwargs) if t == "sliding_attention"}
    return _windows[model]


def declares_layer_types(model) -> bool:
    """The model reads its masks by layer type (a dict), as every transformers model with `layer_types` does."""
    return getattr(model.config.get_text_config(decoder=True), "layer_types", None) is not None


def experts_in_float64(model):
    """`model` (float64) with its mixture-of-experts layers, if any, run as a loop over experts: transformers'
    grouped GEMM has no float64 kernel. A model without experts is unchanged."""
    model.set_experts_implementation("eager")
    return model
