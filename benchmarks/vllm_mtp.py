"""vLLM's `mtp` mode on a tiny DeepSeek-V3 (multi-head latent attention, experts, one MTP layer),
judged by specviz against vLLM's own run without speculation (docs/engines.md, "vLLM with the
model's MTP layer"). Both runs use the CPU_MLA backend, set for the target and the MTP layer apart
(vLLM's default on an AMX CPU computes no float32 latent attention), at float32, in eager mode.

The checkpoint is random, built here: 2 decoder layers (the first dense, the second 4 routed experts
top-2 and a shared one), latent attention at the only sizes CPU_MLA computes (kv_lora_rank 512, rope
64), its own output head (vLLM's DeepSeek-V3 does not tie it), and one MTP layer stored after the
decoder's (model.layers.2), a copy of its last layer with the embedding and hidden-state norms and
projection. It prints each output's verdict and fork, the outputs against the control, and the
acceptance against the MTP layer's own replay.

    .venv/bin/python benchmarks/vllm_mtp.py [--new-tokens 24] [--k 3]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

# this checkout's engine, whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specviz.engines.vllm import vllm_server  # noqa: E402
from specviz.models.checkpoints import embedded_tokenizer_dir  # noqa: E402
from specviz.models.pairs import load_pair  # noqa: E402
from specviz.run import check  # noqa: E402
from specviz.spec.prompts import builtin_set  # noqa: E402
from specviz.spec.run import ENGINE, RunSpec  # noqa: E402

MLA = dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=128, kv_lora_rank=512,
           q_lora_rank=64, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64)
MOE = dict(first_k_dense_replace=1, moe_intermediate_size=32, n_routed_experts=4,
           num_experts_per_tok=2, n_group=1, topk_group=1, topk_method="noaux_tc",
           scoring_func="sigmoid")


def build(folder: Path) -> Path:
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    config = AutoConfig.for_model("deepseek_v3", vocab_size=len(tok), hidden_size=64,
                                  num_hidden_layers=2, num_nextn_predict_layers=1,
                                  tie_word_embeddings=False, initializer_range=0.2,
                                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.pad_token_id, **MLA, **MOE)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    weights = load_file(folder / "model.safetensors")
    H = config.hidden_size
    mtp = {k.replace("model.layers.1.", "model.layers.2."): w.clone()
           for k, w in weights.items() if k.startswith("model.layers.1.")}
    mtp.update({"model.layers.2.enorm.weight": torch.ones(H),
                "model.layers.2.hnorm.weight": torch.ones(H),
                "model.layers.2.eh_proj.weight": torch.cat([torch.eye(H), torch.eye(H)], 1),
                "model.layers.2.shared_head.norm.weight": torch.ones(H)})
    save_file({**weights, **mtp}, folder / "model.safetensors", metadata={"format": "pt"})
    raw = json.loads((folder / "config.json").read_text())
    raw.update(topk_method="noaux_tc", scoring_func="sigmoid")  # vLLM reads them; transformers
    (folder / "config.json").write_text(json.dumps(raw, indent=1))  # computes them always
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--k", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vllm-mtp-"))
    model = build(root / "model")
    pair = load_pair(str(model), str(model), dtype="float32", device="cpu")
    spec = RunSpec.build(target=str(model), draft=str(model), prompts=tuple(builtin_set("quick")),
                         method=ENGINE, k=args.k, max_new_tokens=args.new_tokens, dtype="float32")
    start = time.perf_counter()
    # one core each: both servers at once, the control beside the speculating one
    with (vllm_server("none", root / "control.log", eager=True, model=model, attention="CPU_MLA",
                      threads=1) as control,
          vllm_server("mtp", root / "mtp.log", k=args.k, eager=True, model=model,
                      attention="CPU_MLA", threads=1) as server):
        trace = check.from_servers(spec, pair, (server.url, server.served_model),
                                   (control.url, control.served_model), 8, 300.0, drafter="mtp")
    print(f"vLLM mtp against its control on {model} ({time.perf_counter() - start:.0f} s)")
    for s in trace.sequences:
        same = s.output_ids == s.control.ids if s.control else None
        print(f"  output {s.seq}: fork at {s.first_divergence}, same as its control: {same}, "
              f"verdict {s.forensics and s.forensics.verdict}")
        if s.forensics:
            print(f"    {s.forensics.explanation}")
    if trace.acceptance:
        print(f"acceptance: {trace.acceptance.explanation}")
    (root / "trace.json").write_text(trace.to_json())
    print(f"trace: {root / 'trace.json'}")


if __name__ == "__main__":
    main()
