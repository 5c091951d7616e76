"""Tiny draft heads written as published, by the recipe measured on this machine, with code that
shares nothing with specviz's loader: a config.json and one safetensors file.

- EAGLE-3 (SpecForge's layout, which vLLM and SGLang load): `fc`, `midlayer.*`, `norm`,
  `lm_head`, `d2t` (offsets) and `t2d`.
- EAGLE-1 (the layout of vLLM's `eagle` method): `fc` and `layers.0.*` without an input norm; no
  final norm, no output head.

Neither ships `embed_tokens` (the target's is shared). Each head's attention writes nothing
(o_proj 0) and its MLP is fitted by least squares to step one target state from each slot to the
next, on the target's own text: so it drafts the target's choices there, and its drafts have a
closed form (drafts_from_scratch)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

INTER = 1024  # the head's MLP width: more than the fit's states, so the fit is exact in sample


def _default_aux(layers: int) -> list[int]:
    return sorted({2, layers // 2, layers - 3})


def _fitted_layer(target, fit: list[list[int]], state: int, prefix: str, gen) -> dict:
    """A decoder layer's weights, named under `prefix`, whose MLP steps the target's
    `hidden_states[state]` from each slot of the sequences `fit` to the next (attention zeroed)."""
    c = target.config
    H, heads, kv = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
    d, eps, width = H // heads, c.rms_norm_eps, 2 * H if prefix == "midlayer" else H

    def rand(*shape, scale):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    gate, up = rand(INTER, H, scale=H ** -0.5), rand(INTER, H, scale=H ** -0.5)
    before, after = [], []
    with torch.no_grad():
        for ids in fit:
            h = target(input_ids=torch.tensor([ids]),
                       output_hidden_states=True).hidden_states[state][0].double()
            before.append(h[:-1])
            after.append(h[1:])
    h0, h1 = torch.cat(before), torch.cat(after)
    u = h0 * torch.rsqrt(h0.pow(2).mean(-1, keepdim=True) + eps)
    features = torch.nn.functional.silu(u @ gate.T) * (u @ up.T)
    down = torch.linalg.lstsq(features, h1 - h0).solution.T  # (H, INTER)
    return {f"{prefix}.{k}": v for k, v in {
        "post_attention_layernorm.weight": torch.ones(H),
        "self_attn.q_proj.weight": rand(heads * d, width, scale=0.2),
        "self_attn.k_proj.weight": rand(kv * d, width, scale=0.2),
        "self_attn.v_proj.weight": rand(kv * d, width, scale=0.2),
        "self_attn.o_proj.weight": torch.zeros(H, heads * d),
        "mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up, "mlp.down_proj.weight": down,
    }.items()}


def _write(folder: Path, target, architecture: str, weights: dict, **config) -> Path:
    c = target.config
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: (v.float() if v.is_floating_point() else v).contiguous()
               for k, v in weights.items()}, folder / "model.safetensors")
    raw = {"architectures": [architecture], "model_type": "llama", "num_hidden_layers": 1,
           "hidden_size": c.hidden_size, "intermediate_size": INTER,
           "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads,
           "head_dim": c.hidden_size // c.num_attention_heads, "hidden_act": "silu",
           "rms_norm_eps": c.rms_norm_eps, "vocab_size": c.vocab_size,
           "rope_parameters": {"rope_theta": c.rope_parameters["rope_theta"],
                               "rope_type": "default"},
           "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": False,
           "torch_dtype": "float32", **config}
    (folder / "config.json").write_text(json.dumps(raw, indent=1))
    return folder


def write_eagle3_head(folder: Path, target, fit: list[list[int]], aux: list[int] | None,
                      seed: int = 0, **config) -> Path:
    """An EAGLE-3 head over `target` (a transformers Llama whose last layer is damped), drafting
    among the tokens of `fit`, the lowest ids and the last (its draft vocabulary). `fc` reads its
    last aux layer alone (the engines concatenate the aux states in layer order), whose state its
    MLP steps. Its norm and output rows are the target's. `aux` None: the config names no aux
    layers (the engines fall back to 2, L/2, L-3). More `config` keys (variants) go into
    config.json as they are."""
    c = target.config
    H, layers = c.hidden_size, sorted(set(aux or _default_aux(c.num_hidden_layers)))
    n = len(layers)
    fc = torch.zeros(H, n * H)
    fc[:, (n - 1) * H:] = torch.eye(H)  # the last aux layer's state, as it is
    # the last id: a map read as ids, not offsets, runs off the end
    vocab_ids = sorted(set(range(256)) | {c.vocab_size - 1} | {t for ids in fit for t in ids})
    ids = torch.tensor(vocab_ids)
    weights = {
        "fc.weight": fc,
        **_fitted_layer(target, fit, layers[-1], "midlayer", torch.Generator().manual_seed(seed)),
        "midlayer.input_layernorm.weight": torch.ones(H),
        "midlayer.hidden_norm.weight": torch.ones(H),
        "norm.weight": target.model.norm.weight.detach().float().clone(),
        "lm_head.weight": target.lm_head.weight.detach().float()[vocab_ids].clone(),
        "d2t": ids - torch.arange(len(ids)),  # offsets: target id = i + d2t[i]
        "t2d": torch.zeros(c.vocab_size, dtype=torch.bool).index_fill(0, ids, True),
    }
    if config.get("norm_before_fc"):
        weights["input_norm.weight"] = torch.ones(n * H)
    return _write(folder, target, "LlamaForCausalLMEagle3", weights,
                  draft_vocab_size=len(vocab_ids), target_hidden_size=H,
                  **({"eagle_aux_hidden_state_layer_ids": aux} if aux else {}), **config)


def write_eagle1_head(folder: Path, target, fit: list[list[int]], seed: int = 0) -> Path:
    """An EAGLE-1 head over `target`: `fc` passes the target's last hidden state (after its
    final norm), whose state its MLP steps; the target's output head reads its output."""
    H = target.config.hidden_size
    fc = torch.zeros(H, 2 * H)
    fc[:, H:] = torch.eye(H)  # [embedding, hidden state]: the hidden state, as it is
    weights = {"fc.weight": fc, **_fitted_layer(target, fit, -1, "layers.0",
                                                torch.Generator().manual_seed(seed))}
    return _write(folder, target, "LlamaForCausalLM", weights)


def drafts_from_scratch(folder: Path, target, ids: list[int], k: int) -> list[int]:
    """The greedy drafts of the head in `folder` (either layout) after `ids`, from its files and
    one fresh pass of the target (batch size 1, float64). Its attention writes nothing (o_proj 0:
    checked), so each draft is its MLP's step from the state before: the first from `fc` of the
    target's states at the slot before the last token, each later one from its own output."""
    raw = json.loads((folder / "config.json").read_text())
    w = {k: v.double() if v.is_floating_point() else v
         for k, v in load_file(folder / "model.safetensors").items()}
    eagle3 = raw["architectures"] == ["LlamaForCausalLMEagle3"]
    layer = "midlayer" if eagle3 else "layers.0"
    assert not w[f"{layer}.self_attn.o_proj.weight"].any()
    L, eps = target.config.num_hidden_layers, raw["rms_norm_eps"]

    def norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    with torch.no_grad():
        states = target(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        if eagle3:
            aux = sorted(set(raw.get("eagle_aux_hidden_state_layer_ids") or _default_aux(L)))
            s = torch.cat([states[i][0, -2].double() for i in aux]) @ w["fc.weight"].T
        else:  # the embedding's share of fc is zero here: checked
            assert not w["fc.weight"][:, : target.config.hidden_size].any()
            s = states[-1][0, -2].double() @ w["fc.weight"][:, target.config.hidden_size:].T
        drafts = []
        for _ in range(k):
            u = norm(s, w[f"{layer}.post_attention_layernorm.weight"])
            gated = torch.nn.functional.silu(u @ w[f"{layer}.mlp.gate_proj.weight"].T)
            s = s + (gated * (u @ w[f"{layer}.mlp.up_proj.weight"].T)) @ w[
                f"{layer}.mlp.down_proj.weight"].T
            if eagle3:
                i = int((norm(s, w["norm.weight"]) @ w["lm_head.weight"].T).argmax())
                drafts.append(i + int(w["d2t"][i]))
            else:
                drafts.append(int((s @ target.lm_head.weight.double().T).argmax()))
    return drafts
