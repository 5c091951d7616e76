"""Tiny random checkpoints that ship multi-token-prediction (MTP) layers, saved as a user's local
model is, with the embedded pair's tokenizer, in the two layouts transformers' `MtpModel` loads:

- "layers": the MTP layer stored after the decoder's own, `model.layers.{N}.` with `enorm`, `hnorm`,
  `eh_proj` and `shared_head.norm` (DeepSeek-V3, GLM-4.5, Ling's hybrids);
- "mtp": under `mtp.`, with `fc`, `pre_fc_norm_embedding`, `pre_fc_norm_hidden` and `norm`
  (Qwen3-Next's and Qwen3.5's layout, which Mellum shares: transformers reads Mellum's, specviz
  Qwen3.5's, models/mtplayouts.py);

and MiMo's, which transformers does not read (specviz does, models/mtplayouts.py): "mimo", under
`model.mtp_layers.{i}.`, with `token_layernorm`, `hidden_layernorm`, `input_proj` (the hidden
state first) and `final_layernorm`. `mimo_of` writes the embedded target as a MiMo model.

The MTP layer is a copy of one of the target's attention layers, its final norm, and a projection
that passes the token's embedding and a small share of the hidden state, so that it drafts from
both, as the EAGLE-style head of models/heads.py is built. The target's other layers are damped, so
that its MTP layer is right about half the time (measured: 57, 57 and 41 of 96 next tokens on six
built-in prompts, Mellum, Ling's hybrid and DeepSeek-V3).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from hybrids import FAMILIES as HYBRIDS
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from specviz.models.checkpoints import embedded_tokenizer_dir
from specviz.models.mtplayouts import ARCHITECTURE as MIMO

ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128)
MLA = dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=128, kv_lora_rank=16,
           q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)
VLLM_MLA = dict(MLA, kv_lora_rank=512, q_lora_rank=64, qk_rope_head_dim=64, qk_nope_head_dim=64,
                v_head_dim=64)
_, BAILING, _ = HYBRIDS["bailing-hybrid"]
_, QWEN35, _ = HYBRIDS["qwen3.5"]  # linear attention, full attention, linear, full
# name -> (model_type, config fields, layout, the target layers the MTP layer copies (its attention
# and norms, its MLP), what it is)
FAMILIES = {
    "mellum": ("mellum", dict(**ATTN, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
                              moe_intermediate_size=32, sliding_window=24,
                              layer_types=["sliding_attention", "full_attention",
                                           "full_attention"]), "mtp", (0, 0),
               "mixture of experts, sliding-window layers (the MTP layer's too), Qwen3.5's layout"),
    # transformers 5.24 finds DeepSeek-V3's MTP layer at index 61 only: the target has DeepSeek-V3's
    # depth, its last layer's MLP a mixture of experts, as the MTP layer's is
    "deepseek-v3": ("deepseek_v3", dict(**MLA, num_hidden_layers=61, first_k_dense_replace=60,
                                        moe_intermediate_size=32, n_routed_experts=4,
                                        num_experts_per_tok=2, n_group=1,
                                        topk_group=1), "layers", (0, 60),
                    "multi-head latent attention, experts"),
    # the same layout at 2 layers, its MTP layer at model.layers.2: where vLLM reads it (and
    # specviz), which transformers alone does not
    "deepseek-v3-small": ("deepseek_v3", dict(**MLA, num_hidden_layers=2, first_k_dense_replace=1,
                                              moe_intermediate_size=32, n_routed_experts=4,
                                              num_experts_per_tok=2, n_group=1,
                                              topk_group=1), "layers", (0, 1),
                          "DeepSeek-V3's layout in a smaller model"),
    # the same at the only latent-attention sizes vLLM's CPU_MLA computes, with its own output
    # head (vLLM's DeepSeek-V3 ties none) and the routing fields vLLM reads (transformers computes
    # them always)
    "deepseek-v3-vllm": ("deepseek_v3", dict(**VLLM_MLA, num_hidden_layers=2,
                                             first_k_dense_replace=1, moe_intermediate_size=32,
                                             n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                                             topk_group=1, topk_method="noaux_tc",
                                             scoring_func="sigmoid", tie_word_embeddings=False),
                         "layers", (0, 1), "DeepSeek-V3's layout, as vLLM's CPU build serves it"),
    # Qwen3.5: a hybrid whose MTP layer (full attention, under `mtp.`) transformers does not read
    "qwen3.5": ("qwen3_5_text", dict(QWEN35, num_hidden_layers=4, mtp_num_hidden_layers=1), "mtp",
                (1, 1), "Qwen3.5's own: Gated DeltaNet, its MTP layer full attention"),
    # MiMo: a Qwen2 model (attention with biases) whose MTP layer transformers does not read
    "mimo": ("qwen2", dict(ATTN, num_hidden_layers=2), "mimo", (0, 0),
             "MiMo's layout (model.mtp_layers), read as vLLM reads it"),
    "bailing-hybrid": ("bailing_hybrid",
                       dict(BAILING, num_hidden_layers=4, num_nextn_predict_layers=1,
                            mtp_layer_types=["full_attention"], mtp_mlp_layer_types=["sparse"]),
                       "layers", (1, 1),
                       "a hybrid: Kimi delta attention, MLA, experts"),
}
SHARE = 0.01  # of the hidden state in the MTP layer's input
DAMPED = 0.003  # the output projections of the attention and MLPs it does not copy, scaled by


def save(path, family: str) -> str:
    """`family`'s target with one MTP layer, saved in `path`."""
    model_type, fields, layout, copied, _ = FAMILIES[family]
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), hidden_size=64,
                                  initializer_range=0.2, bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                  **{"num_nextn_predict_layers": 1, "tie_word_embeddings": True,
                                     **fields})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, experts_implementation="eager")
    with torch.no_grad():
        for name, weight in model.named_parameters():
            parts = name.split(".")
            if "layers" not in parts:
                continue
            layer, mlp = int(parts[parts.index("layers") + 1]), "mlp" in parts
            if layer != copied[mlp] and name.endswith(("o_proj.weight", "dense.weight",
                                                       "down_proj.weight", "down_proj",
                                                       "out_proj.weight")):
                weight.mul_(DAMPED)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    # the checkpoint's own names and layouts, to copy from
    stored = load_file(f"{path}/model.safetensors")
    # (a norm whose weights start at zero scales by 1 + weight: Qwen3.5's)
    centred = not bool(model.get_decoder().norm.weight.any())
    save_file({**stored, **_mtp_layer(stored, layout, copied, config.num_hidden_layers,
                                      config.hidden_size, float(centred))},
              f"{path}/model.safetensors", metadata={"format": "pt"})
    if layout == "mimo":
        _named_mimo(path)
    return str(path)


def _named_mimo(path) -> None:
    """The config in `path` names MiMo's class, which vLLM reads (saving named the class
    transformers loaded)."""
    raw = json.loads(Path(path, "config.json").read_text())
    Path(path, "config.json").write_text(json.dumps({**raw, "architectures": [MIMO]}))


def _mtp_layer(stored: dict, layout: str, copied: tuple[int, int], layers: int, H: int,
               centred: float = 0.0) -> dict:
    block = {}
    for name, w in stored.items():
        for layer, part in zip(copied, ("attention", "mlp")):
            prefix = f"model.layers.{layer}."
            if name.startswith(prefix) and (name[len(prefix):].startswith("mlp.")
                                            == (part == "mlp")):
                block[name[len(prefix):]] = w
    # the norms give the embedding its own scale back (the layer's residual stream is an embedding,
    # as in the target)
    embedding = next(w for name, w in stored.items() if "embed" in name)
    scale = torch.full((H,), float(embedding.pow(2).mean(-1).sqrt().mean()) - centred)
    mix = torch.cat([torch.eye(H), SHARE * torch.eye(H)], 1)
    if layout == "mimo":  # the hidden state first (vLLM's mimo_mtp.py)
        at = "model.mtp_layers.0."
        return {**{at + n: w.clone() for n, w in block.items()},
                at + "token_layernorm.weight": scale, at + "hidden_layernorm.weight": scale.clone(),
                at + "input_proj.weight": torch.cat([SHARE * torch.eye(H), torch.eye(H)], 1),
                at + "final_layernorm.weight": stored["model.norm.weight"].clone()}
    if layout == "layers":
        at = f"model.layers.{layers}."
        return {**{at + n: w.clone() for n, w in block.items()}, at + "enorm.weight": scale,
                at + "hnorm.weight": scale.clone(), at + "eh_proj.weight": mix,
                at + "shared_head.norm.weight": stored["model.norm.weight"].clone()}
    return {**{"mtp.layers.0." + n: w.clone() for n, w in block.items()}, "mtp.fc.weight": mix,
            "mtp.pre_fc_norm_embedding.weight": scale,
            "mtp.pre_fc_norm_hidden.weight": scale.clone(),
            "mtp.norm.weight": stored["model.norm.weight"].clone()}


def mimo_of(path, target: Path) -> str:
    """The Llama checkpoint in folder `target` (the embedded SmolLM2) as a MiMo model, saved in
    `path`: the Qwen2 model that computes what it computes (zero attention biases, its norms' eps,
    its rope, its output head stored untied, as vLLM's MiMo layer reads one), and an MTP layer
    that copies its first layer."""
    raw = json.loads((target / "config.json").read_text())
    stored = load_file(target / "model.safetensors")
    H, layers = raw["hidden_size"], raw["num_hidden_layers"]
    kv = raw["num_key_value_heads"] * raw["head_dim"]
    biases = {f"model.layers.{i}.self_attn.{p}_proj.bias": torch.zeros(n)
              for i in range(layers) for p, n in (("q", H), ("k", kv), ("v", kv))}
    weights = {**stored, **biases,
               "lm_head.weight": stored["model.embed_tokens.weight"].clone()}
    weights.update(_mtp_layer(weights, "mimo", (0, 0), layers, H))
    Path(path).mkdir(parents=True)
    save_file(weights, f"{path}/model.safetensors", metadata={"format": "pt"})
    keep = ("bos_token_id", "eos_token_id", "pad_token_id", "hidden_size", "intermediate_size",
            "max_position_embeddings", "num_attention_heads", "num_hidden_layers",
            "num_key_value_heads", "rms_norm_eps", "rope_parameters", "vocab_size", "hidden_act")
    config = AutoConfig.for_model("qwen2", **{k: raw[k] for k in keep},
                                  tie_word_embeddings=False, num_nextn_predict_layers=1)
    config.save_pretrained(path)
    _named_mimo(path)
    AutoTokenizer.from_pretrained(target).save_pretrained(path)
    return str(path)
