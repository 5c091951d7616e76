"""A model's multi-token path over a cache, checked at load: a verify pass feeds several tokens
to a model whose cache already holds a prefix, and must compute what as many single steps would.
transformers once sent such a call through the single-token path whenever the cache held a state
(PR #46741: Mamba 2 mixers of Zamba 2, Nemotron-H, Bamba, Falcon-H1 and Granite MoE Hybrid processed
only the first token and corrupted their state), and every engine's verify rests on that path.

On fixed tokens: a prefix in one pass, then VERIFY tokens in one pass over its cache, against the
same prefix followed by VERIFY single-token passes, in the model's own dtype. A correct model parts
from its own single steps by rounding alone (float32: under 1e-5 of its logits' range here;
bfloat16: under 2%); a path that drops tokens by as much as the logits themselves move. Measured on
transformers 5.24: Jamba's Mamba mixer restarts its scan from a zero state on a multi-token call
over a cache (the full-sequence form ignores the cached recurrent state).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from specviz.models.architecture import is_recurrent
from specviz.spec.strict import SpecError

PREFIX, VERIFY = 8, 4
# The largest |difference| a correct model shows, as a share of its logits' range at those
# positions. Not rounding alone: Nemotron-H's and Zamba 2's decode step skips their chunked scan's
# time-step clamp, and parts from it by up to 3.3e-2 logits in float64 (docs/models.md).
SHARE = {torch.float64: 1e-2, torch.float32: 1e-2}
LOW_PRECISION_SHARE = 0.1  # bfloat16, float16


@torch.inference_mode()
def verify_path_gap(model, vocab: int) -> tuple[float, float]:
    """The largest |logit difference| between one pass over VERIFY tokens with a cached prefix and
    VERIFY single steps, and the logits' range there."""
    device = model.get_input_embeddings().weight.device
    ids = torch.tensor([[(37 * i + 11) % vocab for i in range(PREFIX + VERIFY)]], device=device)

    def run(chunks: list[tuple[int, int]]) -> torch.Tensor:
        cache, rows = DynamicCache(config=model.config), []
        for lo, hi in chunks:
            out = model(input_ids=ids[:, lo:hi], cache=cache, use_cache=True,
                        position_ids=torch.arange(lo, hi, device=device)[None])
            rows.append(out.logits[0, :, :vocab].double())
        return torch.cat(rows)[PREFIX - 1:]

    together = run([(0, PREFIX), (PREFIX, PREFIX + VERIFY)])
    stepped = run([(0, PREFIX), *((j, j + 1) for j in range(PREFIX, PREFIX + VERIFY))])
    spread = float((stepped.amax(-1) - stepped.amin(-1)).mean())
    return float((together - stepped).abs().max()), spread


def verify_path_finding(model, vocab: int, role: str) -> str | None:
    """What the self-test found where the model's multi-token path over a cache is not its single
    steps' (None where it is)."""
    try:
        gap, spread = verify_path_gap(model, vocab)
    except (TypeError, ValueError) as e:  # a forward that takes no transformers 5 cache
        raise SpecError(f"the {role} cannot be run over a cache as transformers 5 models are "
                        f"({e}): specviz's verify passes need it") from None
    share = SHARE.get(next(model.parameters()).dtype, LOW_PRECISION_SHARE)
    if gap <= share * spread:
        return None
    return (f"the {role}'s forward over {VERIFY} tokens with a cached prefix departs from "
            f"{VERIFY} single steps by {gap:.3g} logits (their range: {spread:.3g}): its "
            "multi-token path over a cache is broken (transformers fixed one such bug in PR "
            "#46741)")


def check_verify_path(model, vocab: int, role: str) -> str | None:
    """The self-test at load. A model whose layers all attend verifies through that path in
    specviz's engine too: refused. A hybrid's recurrent layers are stepped one token at a time by
    specviz's engine (decoding/kvcache.py keeps a state per position), so its own runs stand: the
    finding is returned, for the manifest, since transformers' assisted generation and engines
    that use the path are wrong on it."""
    found = verify_path_finding(model, vocab, role)
    if found and not is_recurrent(model):
        raise SpecError(f"{found}, so every verify pass would be wrong: upgrade transformers, or "
                        "report the model")
    return found and (f"{found}; specviz steps its recurrent layers one token at a time, so its "
                      "own runs stand, but hf-assisted and engines that use the path do not")
