"""Tiny random checkpoints of transformers' hybrid families (layers that attend beside layers that
carry a recurrent state), saved as a user's local model is, with the embedded pair's tokenizer. A
family's target has four layers; its draft is the target's first two, so the two agree about half
the time.

FAMILIES is also the table docs/models.md's "Architectures" section reports (tests/test_hybrids.py
holds it): every family transformers 5.24 ships whose layers carry a recurrent state, decoded or
refused with the reason."""
from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from specviz.models.checkpoints import embedded_tokenizer_dir

LA, FA, SW = "linear_attention", "full_attention", "sliding_attention"
ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128)
GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
           linear_value_head_dim=16, linear_conv_kernel_dim=4)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
           shared_expert_intermediate_size=32)
MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
              mamba_chunk_size=4)
KDA = dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
           moe_intermediate_size=32, mlp_layer_types=["dense", "sparse", "dense", "sparse"],
           num_experts=4, num_experts_per_token=2,
           kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
           linear_head_dim=16, linear_num_heads=4)

# name -> (model_type, config fields, what it is): four layers, the first two a draft
FAMILIES = {
    "qwen3.5": ("qwen3_5_text", dict(**ATTN, **GDN, layer_types=[LA, FA, LA, FA]),
                "Gated DeltaNet"),
    "qwen3.5-moe": ("qwen3_5_moe_text", dict(**ATTN, **GDN, **MOE, layer_types=[LA, FA, LA, FA]),
                    "Gated DeltaNet, mixture of experts"),
    "qwen3-next": ("qwen3_next", dict(**ATTN, **GDN, **MOE, layer_types=[LA, FA, LA, FA]),
                   "Gated DeltaNet, mixture of experts"),
    "olmo-hybrid": ("olmo_hybrid",
                    dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
                         linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=16,
                         linear_value_head_dim=16, layer_types=[LA, FA, LA, FA]), "Gated DeltaNet"),
    "lara-mini": ("lara_mini",
                  dict(**ATTN, **GDN, **MOE, layer_types=[LA, SW, LA, FA], sliding_window=8),
                  "Gated DeltaNet, sliding window, mixture of experts"),
    "kimi-linear": ("kimi_linear", dict(**KDA, layer_types=[LA, FA, LA, FA]),
                    "Kimi delta attention, MLA, experts"),
    "bailing-hybrid": ("bailing_hybrid",
                       dict(**KDA, layer_types=[LA, FA, LA, FA], num_expert_group=1, topk_group=1,
                            num_nextn_predict_layers=0, head_dim=16),
                       "Kimi delta attention, MLA, experts"),
    "nemotron-h": ("nemotron_h",
                   dict(**ATTN, layers_block_type=[LA, FA, "mlp", LA], mamba_num_heads=8,
                        mamba_head_dim=16, ssm_state_size=16, n_groups=2, chunk_size=4,
                        conv_kernel=4),
                   "Mamba-2, MLP-only layers, no RoPE"),
    "falcon-h1": ("falcon_h1", dict(**ATTN, num_hidden_layers=4, mamba_d_ssm=128, **MAMBA2),
                  "Mamba-2 beside attention in every layer"),
    "bamba": ("bamba", dict(**ATTN, num_hidden_layers=4, attn_layer_indices=[1, 3], **MAMBA2),
              "Mamba-2"),
    "granite-4": ("granitemoehybrid",
                  dict(**ATTN, layer_types=[LA, FA, LA, FA], num_local_experts=4,
                       num_experts_per_tok=2, shared_intermediate_size=64, **MAMBA2),
                  "Mamba-2, mixture of experts"),
    "zamba2": ("zamba2", dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
                              layers_block_type=[LA, "hybrid", LA, "hybrid"], n_mamba_heads=8,
                              mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, chunk_size=4,
                              mamba_ngroups=1),
               "Mamba-2, a shared attention block"),
    "jamba": ("jamba", dict(**ATTN, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
                            expert_layer_period=2, expert_layer_offset=1, num_experts=2,
                            num_experts_per_tok=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                            mamba_dt_rank=8),
              "Mamba-1, mixture of experts"),
    "lfm2": ("lfm2", dict(**ATTN, num_hidden_layers=4, full_attn_idxs=[1, 3],
                          block_auto_adjust_ff_dim=False),
             "short convolutions"),
    "lfm2-moe": ("lfm2_moe",
                 dict(**ATTN, moe_intermediate_size=32, layer_types=["conv", FA, "conv", FA],
                      num_dense_layers=1, num_experts=4, num_experts_per_tok=2),
                 "short convolutions, mixture of experts"),
    "lfm3": ("lfm3", dict(**ATTN, layer_types=["conv", FA, "conv", SW], sliding_window=8),
             "short convolutions, sliding window"),
}
# name -> (model_type, config fields, what it is): families specviz refuses at load, each for its
# stated reason
REFUSED = {
    "minimax": ("minimax",
                dict(**ATTN, layer_types=[FA, LA, FA, LA], num_local_experts=2,
                     num_experts_per_tok=1, block_size=4),
                "lightning attention, its state in a cache class of its own"),
    "recurrent-gemma": ("recurrent_gemma",
                        dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                             intermediate_size=128, num_hidden_layers=4, lru_width=64,
                             attention_window_size=16, conv1d_width=4),
                        "RG-LRU, its state on its modules"),
    "mamba2": ("mamba2",
               dict(num_heads=8, head_dim=16, state_size=16, num_hidden_layers=4, n_groups=2,
                    chunk_size=4, conv_kernel=4),
               "Mamba-2 alone, no attention"),
    "qwen4-exp": ("qwen4_exp_text",
                  dict(**ATTN, **GDN, **MOE, indexer_n_heads=2, indexer_kv_heads=1,
                       indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=1,
                       layer_types=[LA, "indexed_attention", LA, "indexed_attention"]),
                  "Gated DeltaNet beside indexed (sparse) attention"),
}


def _config(model_type: str, fields: dict, layers: int, tok, initializer_range: float):
    fields = {k: v[:layers] if isinstance(v, list) and k.endswith(("types", "type")) else v
              for k, v in fields.items()}
    if "attn_layer_indices" in fields:
        fields["attn_layer_indices"] = [i for i in fields["attn_layer_indices"] if i < layers]
    if "full_attn_idxs" in fields:
        fields["full_attn_idxs"] = [i for i in fields["full_attn_idxs"] if i < layers]
    fields["num_hidden_layers"] = layers
    return AutoConfig.for_model(model_type, vocab_size=len(tok), hidden_size=64,
                                initializer_range=initializer_range,
                                tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                **fields)


def save(path, family: str, layers: int = 4, state: dict | None = None, loops: bool = False) -> str:
    """One family's checkpoint in `path`: a random target of four layers whose last two are damped
    (so that its first two, its draft, agree with it about half the time), or the target's `state`
    cut to `layers`. `loops`: its weights left small instead, so that it falls into the loops small
    models fall into, where prompt lookup finds drafts (and, when a loop breaks, none)."""
    model_type, fields, _ = {**FAMILIES, **REFUSED}[family]
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    torch.manual_seed(0)
    config = _config(model_type, fields, layers, tok, initializer_range=0.06 if loops else 0.2)
    model = AutoModelForCausalLM.from_config(config, experts_implementation="eager")
    if state is not None:
        model.load_state_dict(state, strict=False)
    elif not loops:
        with torch.no_grad():
            for name, weight in model.named_parameters():
                parts = name.split(".")
                if "layers" in parts and int(parts[parts.index("layers") + 1]) >= 2 \
                        and name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight",
                                           "down_proj")):
                    weight.mul_(0.15)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def save_pair(root, family: str, loops: bool = False) -> tuple[str, str]:
    """(target dir, draft dir) of one family under `root`: the draft is the target's first
    two layers."""
    target = save(root / "target", family, loops=loops)
    state = AutoModelForCausalLM.from_pretrained(target).state_dict()
    return target, save(root / "draft", family, 2, state)
