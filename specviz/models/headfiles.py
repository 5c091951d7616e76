"""A published draft head's files (EAGLE-1's, EAGLE-3's: the layouts vLLM and SGLang load): its
folder found on this machine or fetched from the Hub (its config and safetensors only), read, and
loaded into the head. Pickled weights are never loaded."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from safetensors.torch import load_file

from specviz.spec.strict import SpecError


def head_files(source: str, kind: str) -> tuple[Path, dict, dict[str, torch.Tensor]]:
    """(its folder, its config, its weights without a leading `model.`) of the `kind` head (in
    words: "EAGLE-3") at `source`, or a SpecError that says what is wrong."""
    folder = _folder(source, kind)
    if not (folder / "config.json").is_file():
        raise SpecError(f"no {kind} head at {folder}: give the folder of its config.json and "
                        "safetensors (download a Hub head with `hf download ID --local-dir DIR`)")
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"the {kind} head's config.json at {folder} is unreadable: {e}") from None
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        raise SpecError(f"the {kind} head at {folder} ships no safetensors"
                        + (f" ({', '.join(pickled)} are pickles, which specviz never loads: "
                           "convert them to safetensors first)" if pickled else ""))
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(f))
    return folder, raw, {k.removeprefix("model."): w for k, w in weights.items()}


def _folder(source: str, kind: str) -> Path:
    """`source` on this machine, else a Hub id's download."""
    path = Path(source).expanduser()
    if path.exists():
        return path
    try:
        validate_repo_id(source)
    except HFValidationError:
        return path  # not a Hub id: head_files says nothing is there
    try:
        return Path(snapshot_download(source, allow_patterns=["config.json", "*.safetensors"]))
    except Exception as e:  # offline, unknown, gated: the Hub's own words
        raise SpecError(f"no {kind} head at {source!r} on this machine, and the Hub did not "
                        f"give it: {e}") from None


def load_weights(head: torch.nn.Module, weights: dict[str, torch.Tensor], which: str,
                 computed: tuple[str, ...] = ()) -> None:
    """`weights`, named as `head` names them, into it; a SpecError naming `which` ("the EAGLE-3
    head at DIR") where they do not fit, or some are missing or left over. `computed`: its
    buffers made, not shipped (rotary ones always)."""
    try:
        missing, unexpected = head.load_state_dict(weights, strict=False)
    except RuntimeError as e:
        raise SpecError(f"{which} does not fit its config: {e}") from None
    missing = [m for m in missing if "rotary" not in m and m not in computed]
    if missing or unexpected:
        raise SpecError(f"{which} does not have the published layout: missing {missing[:4]}, "
                        f"unexpected {unexpected[:4]}")
