"""The EAGLE-3 heads specviz makes for its built-in targets, written in the published layout (the
folder vLLM and SGLang load), named as a head's folder:

- `FITTED_HEAD`, fitted in seconds by least squares, not trained, so that a published head's faults
  can be replayed on any machine without a download;
- `TRAINED_HEAD`, the embedded target's, trained on this machine by EAGLE-3's recipe, small
  (run/eagle3_training.py, `specviz train-head --eagle3`), from the fit below on its own text.

The fit. The head hears three of the target's layers, named in its config. `fc` passes the last of
them as it is; its attention writes nothing (o_proj 0); its MLP is fitted to step that state from
each slot of a text to the next, and its output rows (after the target's final norm) to give the
target's logits from the state so reached. So it drafts the target's own text where it was fitted,
and poorly elsewhere. Its draft vocabulary is the ids of that text, the byte tokens and the
end-of-sequence tokens, mapped by d2t offsets. The fitted head hears layers 1, L/2 and L-1 (not the
engines' default 2, L/2, L-3, so that falling back to those shows) and is fitted on the target's
greedy continuations of the page's default prompts and the field casebook's: a head to show what
feeding it wrongly costs, not one to speed a run up. Each is made once per target and cached beside
the embedded pair's converted weights."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from specviz.models.checkpoints import atomic_save, cache_dir, embedded_tokenizer_dir
from specviz.spec.casebook import PROMPTS
from specviz.spec.prompts import DEFAULT_SET, builtin_set
from specviz.spec.run import EMBEDDED_TARGET, FITTED_HEAD, TINY_TARGET, TRAINED_HEAD
from specviz.spec.strict import SpecError

FITTED_FOR = (EMBEDDED_TARGET, TINY_TARGET)  # Llama targets with the embedded tokenizer
WIDTH = 2048  # the MLP's: wider than the fit's states, so the fit is exact in sample
NEW_TOKENS = 48  # of each continuation it is fitted on
SEED = 0  # of the gate and up projections, and of the attention it does not use
VERSION = 1  # of the recipe: a new one makes a new folder


# where the embedded target's trained head is cached; a new recipe (run/eagle3_training.py) makes a
# new folder
TRAINED_VERSION = 1


def head_folder(source: str, target, name: str) -> str:
    """The folder a head's `source` names for target `name`: itself, or a built-in head's."""
    if source == FITTED_HEAD:
        return str(fitted_head(target, name))
    if source == TRAINED_HEAD:
        folder = trained_folder(name)
        if not (folder / "config.json").is_file():
            raise SpecError(f"{name}'s EAGLE-3 head is not trained on this machine yet: run "
                            "`specviz train-head --eagle3` once (about 15 minutes on 2 CPU "
                            f"cores; it caches the head at {folder})")
        return str(folder)
    return source


def trained_folder(name: str) -> Path:
    """Where target `name`'s trained EAGLE-3 head is cached."""
    if name != EMBEDDED_TARGET:
        raise SpecError(f"specviz trains an EAGLE-3 head for {EMBEDDED_TARGET} only, not {name}: "
                        "give a published head's folder")
    return cache_dir() / f"{name.split(':')[-1]}-trained-eagle3-v{TRAINED_VERSION}"


def fitted_head(target, name: str) -> Path:
    """The folder of built-in target `name`'s fitted EAGLE-3 head, made once (from the target in
    float32, whatever the run's dtype)."""
    if name not in FITTED_FOR:
        raise SpecError(f"specviz fits an EAGLE-3 head for its built-in targets "
                        f"({', '.join(FITTED_FOR)}) only, not {name}: give a published head's "
                        "folder")
    folder = cache_dir() / f"{name.split(':')[-1]}-fitted-eagle3-v{VERSION}"
    if not (folder / "config.json").is_file():
        model = target if target.dtype == torch.float32 else copy.deepcopy(target).float()
        texts = _continuations(model)
        L = model.config.get_text_config().num_hidden_layers
        atomic_save(folder, lambda tmp: write_head(tmp, *fitted(model, texts, sorted(
            {1, L // 2, L - 1}), f"fitted by models/builtinheads.py, version {VERSION}: not "
                                 "trained")))
    return folder


def _continuations(target) -> list[list[int]]:
    """The target's greedy continuations of the page's default prompts and the casebook's, each
    with its prompt."""
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    out = []
    for prompt in dict.fromkeys((*builtin_set(DEFAULT_SET), *PROMPTS)):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                      add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"].to(target.device)
        with torch.no_grad():
            done = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=NEW_TOKENS, pad_token_id=tok.eos_token_id)
        out.append(done[0].tolist())
    return out


def fitted(target, texts: list[list[int]], aux: list[int],
           made: str) -> tuple[dict[str, torch.Tensor], dict]:
    """(weights, config) of a head over `target` (float32) hearing layers `aux`, fitted on the
    token ids `texts` (module docstring); `made`: how, said in its config."""
    c = target.config.get_text_config()
    H, V, eps = c.hidden_size, c.vocab_size, c.rms_norm_eps
    heads, kv = c.num_attention_heads, c.num_key_value_heads
    d = getattr(c, "head_dim", None) or H // heads
    gen = torch.Generator().manual_seed(SEED)

    def rand(*shape, scale: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    gate, up = rand(WIDTH, H, scale=H ** -0.5), rand(WIDTH, H, scale=H ** -0.5)
    eos = c.eos_token_id if isinstance(c.eos_token_id, list) else [c.eos_token_id]
    vocab = torch.tensor(sorted(set(range(256)) | {t for ids in texts for t in ids} | set(eos)))
    before, after, logits = [], [], []
    with torch.no_grad():
        for ids in texts:
            out = target(input_ids=torch.tensor([ids], device=target.device),
                         output_hidden_states=True)
            h = out.hidden_states[aux[-1]][0].double().cpu()
            before.append(h[:-1])
            after.append(h[1:])
            logits.append(out.logits[0, 1:, vocab.to(target.device)].double().cpu())
    h0, h1 = torch.cat(before), torch.cat(after)
    down = torch.linalg.lstsq(torch.nn.functional.silu(_rms(h0, eps) @ gate.T)
                              * (_rms(h0, eps) @ up.T), h1 - h0).solution
    norm = target.model.norm.weight.detach().double().cpu()
    lm_head = torch.linalg.lstsq(_rms(h1, eps) * norm, torch.cat(logits)).solution
    fc = torch.zeros(H, len(aux) * H, dtype=torch.float64)
    fc[:, -H:] = torch.eye(H)
    weights = {
        "fc.weight": fc, "norm.weight": norm, "lm_head.weight": lm_head.T,
        "d2t": vocab - torch.arange(len(vocab)),
        "t2d": torch.zeros(V, dtype=torch.bool).index_fill(0, vocab, True),
        **{f"midlayer.{k}": v for k, v in {
            "input_layernorm.weight": torch.ones(H), "hidden_norm.weight": torch.ones(H),
            "post_attention_layernorm.weight": torch.ones(H),
            "self_attn.q_proj.weight": rand(heads * d, 2 * H, scale=0.02),
            "self_attn.k_proj.weight": rand(kv * d, 2 * H, scale=0.02),
            "self_attn.v_proj.weight": rand(kv * d, 2 * H, scale=0.02),
            "self_attn.o_proj.weight": torch.zeros(H, heads * d),
            "mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up, "mlp.down_proj.weight": down.T,
        }.items()}}
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "num_hidden_layers": 1, "hidden_size": H, "intermediate_size": WIDTH,
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d,
              "hidden_act": "silu", "rms_norm_eps": eps, "vocab_size": V,
              "draft_vocab_size": len(vocab), "target_hidden_size": H,
              "rope_parameters": c.rope_parameters,
              "max_position_embeddings": c.max_position_embeddings,
              "tie_word_embeddings": False, "torch_dtype": "float32",
              "eagle_aux_hidden_state_layer_ids": list(aux), "specviz": made}
    return weights, config


def write_head(folder: Path, weights: dict[str, torch.Tensor], config: dict) -> None:
    """A head's files as published: model.safetensors (float32) and config.json."""
    save_file({k: (v.detach().float().cpu() if v.is_floating_point() else v.cpu()).contiguous()
               for k, v in weights.items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
