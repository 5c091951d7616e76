"""The padded batch layout shared by every batched decoder.

A batch is a grid of slots: `tokens` (B, S) and `valid` (B, S). A row's real
tokens are its valid slots; everything else (left padding, and stale slots
where a faulty engine leaves them) is masked. Padding is tracked by the mask,
never by token value: SmolLM2's pad token is also its EOS token.
"""
from __future__ import annotations

import torch

from specviz.decoding import kvcache
from specviz.models.architecture import (RECURRENT, declares_layer_types, is_recurrent,
                                         sliding_windows)
from specviz.models.head import heard_states


def left_pad(seqs: list[list[int]], device: torch.device,
             min_width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, valid) with every row right-aligned at the same last slot."""
    width = max(min_width, max(len(s) for s in seqs))
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s:
            tokens[i, width - len(s):] = torch.tensor(s)
            valid[i, width - len(s):] = True
    return tokens.to(device), valid.to(device)


def right_pad(seqs: list[list[int]], device: torch.device,
              min_width: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The `right-padding` fault's layout: the pad block sits after each prompt's
    body, before its last token (which must end the row: it is fed next)."""
    tokens, valid = left_pad(seqs, device, min_width)
    width = tokens.shape[1]
    for i, s in enumerate(seqs):
        pad = width - len(s)
        if pad and len(s) > 1:
            tokens[i, : len(s) - 1] = tokens[i, pad: width - 1].clone()
            valid[i, : len(s) - 1], valid[i, len(s) - 1: width - 1] = True, False
    return tokens, valid


def positions(valid: torch.Tensor) -> torch.Tensor:
    """I2: a slot's position is the number of real tokens before it (0 at the first)."""
    return (valid.long().cumsum(dim=1) - 1).clamp(min=0)


def attention_bias(valid: torch.Tensor, q_start: int, dtype: torch.dtype, window: int | None = None,
                   among: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Additive 4D mask (B, 1, q, kv) for the queries at slots q_start.. over keys 0..S-1.

    A query sees the valid slots at or before it, and always itself: a pad query then attends to
    something finite instead of producing NaNs that would leak into the cache. A sliding-window
    layer sees only the keys less than `window` positions back (transformers' rule), counted in
    positions, not slots: padding and stale slots take no room in a row's window. `among`: a token
    tree's (decoding/trees.py) slots each slot may see (B, S, S), in place of `valid`, and the
    positions of every slot (B, S), which its windows count.
    """
    _, S = valid.shape
    q = torch.arange(q_start, S, device=valid.device)[:, None]
    kv = torch.arange(S, device=valid.device)[None, :]
    shown = valid[:, None, :] if among is None else among[0][:, q_start:]
    allowed = (shown & (kv <= q)[None]) | (kv == q)[None]
    if window is not None:
        pos = positions(valid) if among is None else among[1]
        allowed &= (pos[:, q_start:, None] - pos[:, None, :] < window) | (kv == q)[None]
    bias = torch.zeros(allowed.shape, dtype=dtype, device=valid.device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias[:, None]


def attention_masks(model, valid: torch.Tensor, q_start: int,
                    among: tuple[torch.Tensor, torch.Tensor] | None = None, windowed: bool = True):
    """The mask `model` takes for this layout: one bias, or where some layers see a sliding window
    or carry a recurrent state, a mask per layer type (a model that declares `layer_types` reads
    them by type; one that does not has a single window on every layer). A recurrent layer takes the
    plain padding mask of the slots fed, as transformers gives it, and zeroes its pads before they
    reach its state. `among`: a token tree's (attention_bias). `windowed`: False runs a
    sliding-window layer as full attention (a fault's)."""
    windows = {t: w if windowed else None for t, w in sliding_windows(model).items()}
    recurrent = is_recurrent(model)
    if not windows and not recurrent:
        return attention_bias(valid, q_start, model.dtype, among=among)
    if not declares_layer_types(model) and not recurrent:
        (window,) = set(windows.values())
        return attention_bias(valid, q_start, model.dtype, window, among)
    masks = {"full_attention": attention_bias(valid, q_start, model.dtype, among=among),
             **{t: attention_bias(valid, q_start, model.dtype, w, among)
                for t, w in windows.items()}}
    if recurrent:
        masks.update(dict.fromkeys(RECURRENT, valid[:, q_start:].long()))
    return masks


def forward(model, tokens: torch.Tensor, valid: torch.Tensor, q_start: int, cache, vocab: int,
            pos: torch.Tensor | None = None, seen: torch.Tensor | None = None, keep: int = 0,
            hidden: tuple[int, ...] = (), among: tuple[torch.Tensor, torch.Tensor] | None = None,
            windowed: bool = True):
    """Run `model` on slots q_start.. of the layout (earlier slots are in `cache`).

    Returns logits (float32, or float64 for a float64 model) sliced to the shared vocabulary: (B, q,
    vocab), or (B, keep, vocab) for the last `keep` slots only; with `hidden` (indices into
    transformers' `hidden_states`), (logits, those hidden states at every slot fed, concatenated,
    (B, q, n·H)). `pos` and `seen` override the positions and
    the slots the mask lets through, both derived from `valid` by default (a fault policy may swap
    them; a correct engine never does). `among`: a token tree's mask (attention_bias).
    `windowed`: attention_masks'.
    """
    if pos is None:
        pos = positions(valid)[:, q_start:]
    kvcache.feeding(cache, tokens, valid, q_start)
    out = model(
        input_ids=tokens[:, q_start:],
        attention_mask=attention_masks(model, valid if seen is None else seen, q_start, among,
                                       windowed),
        position_ids=pos,
        cache=cache,
        use_cache=True,
        logits_to_keep=keep,
        **({"output_hidden_states": True} if hidden else {}),
    )
    # A target spread over GPUs returns logits from its last GPU: bring them back
    # to the engine's device.
    logits = out.logits[..., :vocab].to(tokens.device)
    logits = logits if logits.dtype == torch.float64 else logits.float()
    if not hidden:
        return logits
    return logits, heard_states(out.hidden_states, hidden).to(tokens.device)
