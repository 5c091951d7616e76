"""What specviz needs to know of a model's architecture: which context each decoder layer attends
to, which layers carry a recurrent state, whether its layouts can hold the model at all, and how it
computes in float64.

Layer types are read from the config as transformers reads them to lay out its own caches
(`get_layer_types_and_kwargs`), so a model's windows and recurrent layers here are the ones it
decodes with under transformers.

A recurrent layer (Gated DeltaNet, Mamba, a short convolution) keeps a state per row instead of a
slot per token. Its mixer, the module that writes that state, is found by what its code does: it
updates transformers' conv or recurrent cache state. Such a model is decoded when every recurrent
layer's state lives in transformers' cache (a state kept elsewhere, on the module or in a cache
class of the model's own, specviz could not keep per row and position) and some layer attends
(padding, positions and the KV cache are laid out in attention slots)."""
from __future__ import annotations

import functools
import inspect
import weakref

import torch
from torch.overrides import TorchFunctionMode
from transformers.cache_utils import get_layer_types_and_kwargs

ATTENTION = ("full_attention", "sliding_attention")
RECURRENT = ("linear_attention", "conv")  # a recurrent mixer alone
HYBRID = ("hybrid",)  # a recurrent mixer beside attention in one layer (Falcon-H1, Zamba 2)
# a layer that keeps nothing: MLP or experts only (or, refused, one that reuses another's cache)
NO_CACHE = "dummy"
SUPPORTED = (*ATTENTION, *RECURRENT, *HYBRID, NO_CACHE)
# a recurrent mixer's forward
MIXER_PARAMETERS = ["self", "hidden_states", "cache", "attention_mask", "kwargs"]
# model -> its layer types and their kwargs
_types: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _text_config(model):
    return model.config.get_text_config(decoder=True)


def _layer_types(model) -> tuple[list[str], list[dict]]:
    if model not in _types:  # read at every forward pass: once per model
        _types[model] = get_layer_types_and_kwargs(_text_config(model))
    return _types[model]


def unsupported(model) -> str | None:
    """Why specviz's padded, slot-indexed layouts cannot decode `model` as it decodes alone (None:
    they can)."""
    config = _text_config(model)
    if (config.model_type == "bloom" or getattr(config, "alibi", False)
            or getattr(getattr(config, "attn_config", None), "alibi", False)):
        return ("its attention biases (ALiBi) are computed from slot indices, which padding and "
                "stale slots move; specviz decodes models whose positions come from position ids "
                "(RoPE, learned positions)")
    if "reuse" in (getattr(config, "kv_sharing_modes", None) or ()):
        return ("some of its layers reuse another layer's cache, which specviz's caches do not "
                "lay out")
    types = _layer_types(model)[0]
    other = sorted(set(types) - set(SUPPORTED))
    if other:
        return ("specviz decodes full and sliding-window attention and recurrent layers (linear "
                "attention, state spaces, short convolutions); this model also has "
                f"{', '.join(other)} layers")
    if not set(types) & {*ATTENTION, *HYBRID}:
        return ("it has no attention layer: specviz lays a batch out in attention slots (padding, "
                "positions, the KV cache), which a pure state-space model does not use")
    if not ({"cache", "position_ids", "attention_mask"}
            <= set(inspect.signature(model.forward).parameters)):
        return ("its forward pass takes no cache, position ids or attention mask, through which "
                "specviz lays a batch out (its state is its own)")
    recurrent = sum(t in (*RECURRENT, *HYBRID) for t in types)
    mixers = recurrent_mixers(model)
    if recurrent != len(mixers):
        return ("its recurrent layers keep their state outside transformers' cache layers, where "
                "specviz cannot keep it per row and per drafted position")
    if any(list(inspect.signature(type(m).forward).parameters) != MIXER_PARAMETERS for m in mixers):
        return ("its recurrent state is written by a module that takes more than (hidden states, "
                "cache, mask), such as an attention layer, which specviz cannot run one drafted "
                "position at a time")
    return None


def is_recurrent(model) -> bool:
    """Some layer of `model` carries a recurrent state (a hybrid)."""
    return any(t in (*RECURRENT, *HYBRID) for t in _layer_types(model)[0])


def attention_layers(model) -> list[int]:
    """The indices of the layers that attend (and so hold K/V in the cache)."""
    return [i for i, t in enumerate(_layer_types(model)[0]) if t in (*ATTENTION, *HYBRID)]


@functools.cache
def _writes_state(cls: type) -> bool:
    """Whether `cls` (or a class it derives from) writes transformers' conv or recurrent
    cache state."""
    for c in cls.__mro__:
        try:
            source = inspect.getsource(c)
        # built in, or made at run time (specviz's own stepwise subclass)
        except (OSError, TypeError):
            continue
        if "update_conv_state" in source or "update_recurrent_state" in source:
            return True
    return False


def recurrent_mixers(model) -> list[torch.nn.Module]:
    """The modules of `model` that write a layer's recurrent state, in order."""
    return [m for m in model.modules() if _writes_state(type(m))]


def attention_layers_only(model) -> list[int]:
    """The layers that only attend (no recurrent state): those an EAGLE-style head
    copies (heads.py)."""
    return [i for i, t in enumerate(_layer_types(model)[0]) if t in ATTENTION]


def sliding_windows(model) -> dict[str, int]:
    """The window of each sliding-attention layer type of `model` ({} when every layer sees its
    whole context)."""
    types, kwargs = _layer_types(model)
    return {t: kw["sliding_window"] for t, kw in zip(types, kwargs) if t == "sliding_attention"}


def narrowest_window(model) -> int | None:
    """The narrowest sliding window of `model`'s layers (None: every layer sees
    its whole context)."""
    return min(sliding_windows(model).values(), default=None)


def declares_layer_types(model) -> bool:
    """The model reads its masks by layer type (a dict), as every transformers model with
    `layer_types` does."""
    return getattr(_text_config(model), "layer_types", None) is not None


# ---------------------------------------------------------------- float64, throughout


_NARROW = (torch.float32, torch.float16, torch.bfloat16)
_CAST_METHODS = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16)
_CAST_TO = (torch.Tensor.to, torch.Tensor.type, torch.Tensor.type_as)


def _wide(arg):
    """`arg` of a cast, with a narrower float dtype (or a tensor of one, whose dtype `to` and
    `type_as` read) made float64."""
    if arg in _NARROW:
        return torch.float64
    if isinstance(arg, torch.Tensor) and arg.dtype in _NARROW:
        return arg.new_empty((), dtype=torch.float64)
    return arg


class Float64Throughout(TorchFunctionMode):
    """Inside, every float is float64: a cast to a narrower float dtype (`.float()`,
    `.to(torch.float32)`, a `dtype` argument) casts to float64 instead. transformers computes parts
    of a float64 model in float32 on purpose (RMS norms; Gated DeltaNet's and Mamba's scans; Gemma
    2's softmax): there its chunked (prefill) and recurrent (decode) algorithms, two correct
    computations, part by 3e-8 to 5e-8 in a float64 Qwen 3.5 and by 1e-16 throughout float64. A
    truth is float64 only so. Tensors made without a dtype are float64 too (the default dtype,
    while inside)."""

    def __enter__(self):
        self._default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.set_default_dtype(self._default)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("dtype") in _NARROW:
            kwargs = {**kwargs, "dtype": torch.float64}
        if func in _CAST_METHODS:
            return args[0].to(torch.float64)
        if func in _CAST_TO:
            args = (args[0], *map(_wide, args[1:]))
        return func(*args, **kwargs)


_ENTERED: list[Float64Throughout | None] = []


def _enter(module, args) -> None:
    dtype = next(module.parameters()).dtype
    # a narrower copy of it computes as it is
    mode = Float64Throughout() if dtype == torch.float64 else None
    if mode is not None:
        mode.__enter__()
    _ENTERED.append(mode)


def _leave(module, args, output) -> None:
    mode = _ENTERED.pop()
    if mode is not None:
        mode.__exit__(None, None, None)


def in_float64(model):
    """`model` (float64) computing in float64 throughout: every parameter float64, its
    mixture-of-experts layers, if any, run as a loop over experts (transformers' grouped GEMM has no
    float64 kernel), and no part of its forward pass narrows to float32 (Float64Throughout). Copies
    of it (deepcopy) keep both; a copy cast to a narrower dtype computes as that dtype does."""
    model.set_experts_implementation("eager")
    model.double()  # parameters a checkpoint keeps in float32 (`_keep_in_fp32_modules`) too
    return throughout_float64(model)


def throughout_float64(module):
    """`module` (any torch module, float64) with no part of its forward pass narrowed to float32."""
    if not getattr(module, "_specviz_float64", False):
        module.register_forward_pre_hook(_enter)
        module.register_forward_hook(_leave, always_call=True)
        module._specviz_float64 = True
    return module
