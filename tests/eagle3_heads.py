"""Tiny EAGLE-3 heads written as published (SpecForge's layout, the one vLLM and SGLang load), by
the recipe measured on this machine, with code that shares nothing with specviz's loader: a
config.json and one safetensors file of `fc`, `midlayer.*`, `norm`, `lm_head`, `d2t` (offsets)
and `t2d`, and no `embed_tokens` (the target's is shared)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_eagle3_head(folder: Path, target, fit: list[list[int]], aux: list[int] | None,
                      seed: int = 0, **config) -> Path:
    """A one-layer head over `target` (a transformers Llama whose last layer is damped) that
    drafts the target's choices on the token sequences `fit` (in sample), among their tokens and
    the lowest ids (its draft vocabulary). `fc` reads its last aux layer alone (the engines
    concatenate the aux states in layer order); its
    attention writes nothing (o_proj 0), and its MLP is fitted, by least squares, to step that
    layer's state from each slot to the next. Its norm and output rows are the target's.
    `aux` None: the config names no aux layers (the engines fall back to 2, L/2, L-3). More
    `config` keys (variants) go into config.json as they are."""
    c = target.config
    H, heads, kv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
    head_dim, inter, eps = H // heads, 1024, c.rms_norm_eps
    layers = sorted(set(aux or [2, c.num_hidden_layers // 2, c.num_hidden_layers - 3]))
    n, reads = len(layers), layers[-1]
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.02):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    fc = torch.zeros(H, n * H)
    fc[:, (n - 1) * H:] = torch.eye(H)  # the last aux layer's state, as it is
    gate, up = rand(inter, H, scale=H ** -0.5), rand(inter, H, scale=H ** -0.5)
    before, after = [], []
    with torch.no_grad():
        for ids in fit:
            out = target(input_ids=torch.tensor([ids]), output_hidden_states=True)
            h = out.hidden_states[reads][0].double()
            before.append(h[:-1])
            after.append(h[1:])
    h0, h1 = torch.cat(before), torch.cat(after)
    u = h0 * torch.rsqrt(h0.pow(2).mean(-1, keepdim=True) + eps)
    features = torch.nn.functional.silu(u @ gate.T) * (u @ up.T)
    down = torch.linalg.lstsq(features, h1 - h0).solution.T  # (H, inter)
    # the lowest ids, the last (so that a map read as ids, not offsets, runs off the end) and those
    # the fit sequences hold
    vocab_ids = sorted(set(range(256)) | {c.vocab_size - 1} | {t for ids in fit for t in ids})
    out_rows = target.lm_head.weight.detach().float()[vocab_ids]
    ids = torch.tensor(vocab_ids)
    weights = {
        "fc.weight": fc,
        "midlayer.input_layernorm.weight": torch.ones(H),
        "midlayer.hidden_norm.weight": torch.ones(H),
        "midlayer.post_attention_layernorm.weight": torch.ones(H),
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * H, scale=0.2),
        "midlayer.self_attn.k_proj.weight": rand(kv * head_dim, 2 * H, scale=0.2),
        "midlayer.self_attn.v_proj.weight": rand(kv * head_dim, 2 * H, scale=0.2),
        "midlayer.self_attn.o_proj.weight": torch.zeros(H, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": gate,
        "midlayer.mlp.up_proj.weight": up,
        "midlayer.mlp.down_proj.weight": down,
        "norm.weight": target.model.norm.weight.detach().float().clone(),
        "lm_head.weight": out_rows.clone(),
        "d2t": ids - torch.arange(len(ids)),  # offsets: target id = i + d2t[i]
        "t2d": torch.zeros(c.vocab_size, dtype=torch.bool).index_fill(0, ids, True),
    }
    if config.get("norm_before_fc"):
        weights["input_norm.weight"] = torch.ones(n * H)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: (v.float() if v.is_floating_point() else v).contiguous()
               for k, v in weights.items()}, folder / "model.safetensors")
    raw = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
           "num_hidden_layers": 1, "hidden_size": H, "intermediate_size": inter,
           "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
           "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size,
           "draft_vocab_size": len(vocab_ids), "target_hidden_size": H,
           "rope_parameters": {"rope_theta": c.rope_parameters["rope_theta"],
                               "rope_type": "default"},
           "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": False,
           "torch_dtype": "float32", **config}
    if aux:
        raw["eagle_aux_hidden_state_layer_ids"] = aux
    (folder / "config.json").write_text(json.dumps(raw, indent=1))
    return folder


def drafts_from_scratch(folder: Path, target, ids: list[int], k: int) -> list[int]:
    """The greedy drafts of the head in `folder` after `ids`, from its files and one fresh pass of
    the target (batch size 1, float64). Its attention writes nothing (o_proj 0: checked), so each
    draft is its MLP's step from the state before: the first from `fc` of the target's aux states
    at the slot before the last token, each later one from the head's own output."""
    from safetensors.torch import load_file

    raw = json.loads((folder / "config.json").read_text())
    w = {k: v.double() if v.is_floating_point() else v
         for k, v in load_file(folder / "model.safetensors").items()}
    assert not w["midlayer.self_attn.o_proj.weight"].any()
    L, eps = target.config.num_hidden_layers, raw["rms_norm_eps"]
    aux = sorted(set(raw.get("eagle_aux_hidden_state_layer_ids") or [2, L // 2, L - 3]))

    def norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    with torch.no_grad():
        states = target(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        s = torch.cat([states[i][0, -2].double() for i in aux]) @ w["fc.weight"].T
        drafts = []
        for _ in range(k):
            u = norm(s, w["midlayer.post_attention_layernorm.weight"])
            gated = torch.nn.functional.silu(u @ w["midlayer.mlp.gate_proj.weight"].T)
            s = s + (gated * (u @ w["midlayer.mlp.up_proj.weight"].T)) @ w[
                "midlayer.mlp.down_proj.weight"].T
            i = int((norm(s, w["norm.weight"]) @ w["lm_head.weight"].T).argmax())
            drafts.append(i + int(w["d2t"][i]))
    return drafts
