"""The yardstick's measurements kept on disk, so that a later run, check or page on the same pair
starts from them: measuring the embedded pair's rounding against float64 takes minutes on a CPU,
reading it back milliseconds.

Each entry is one call of yardstick.sample, as JSON under $SPECVIZ_CACHE/yardsticks (cache_dir),
keyed by everything the samples depend on: the model's weights (a fingerprint of their bytes), class
and config, its dtype and device, the sequences measured and those measured before (whose prefixes
it skips), where it stops, the role, torch's and transformers' versions, torch's thread count on
a CPU (its reductions may split by it), and the yardstick's code (MEASUREMENT_VERSION and its
constants).
An entry that does not read back whole, or whose key differs, is measured again and replaced, never
trusted; entries are written to a temporary file and renamed over, so none is ever half read.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import os
import tempfile
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from specviz.forensics import yardstick
from specviz.forensics.recompute import copyable
from specviz.forensics.yardstick import Samples
from specviz.models.checkpoints import cache_dir
from specviz.models.kernels import tensor_version

MAX_ENTRIES = 512  # the least recently used beyond these go: a page meets new prompts forever
# model -> (its tensors' identities and in-place versions, their fingerprint)
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_HEARD: contextvars.ContextVar[list | None] = contextvars.ContextVar("lookups", default=None)


def directory() -> Path:
    """Where measurements are kept."""
    return cache_dir() / "yardsticks"


@dataclass(frozen=True)
class Lookup:
    """One measurement asked for: of which model, on what, when it was made, whether from disk."""

    role: str  # "target" or "draft"
    what: str  # the sequences measured, in words
    measured_at: str  # UTC, to the minute
    cached: bool  # read back from disk (else measured now)
    kept: bool  # on disk now, for a later run


def weights_fingerprint(model) -> str:
    """A digest of the bytes of every parameter and buffer of `model`, with its class and config.

    The samples are computed from the model in memory, which need not match any checkpoint file:
    the draft is derived from the target in memory (models/draft.py), a pair loads in several
    dtypes, and a test may round or perturb weights in place. Names, sizes and mtimes of files would
    miss all three; the bytes cannot (about 0.5 s for the embedded target in float32, against
    minutes of measuring). The digest is remembered per model while each of its tensors is the same
    object over the same memory at the same in-place version (torch bumps it on an in-place write,
    though not through `.data`): a run hashes once. Within a process the runner's in-memory caches
    take a pair's weights as fixed anyway; a new process hashes the bytes afresh.
    """
    tensors = [*model.named_parameters(), *model.named_buffers()]
    state = tuple((id(t), t.data_ptr(), tensor_version(t)) for _, t in tensors)
    known = _FINGERPRINTS.get(model)
    if known is not None and known[0] == state:
        return known[1]
    config = model.config.to_json_string()
    attention = getattr(model.config, "_attn_implementation", None)
    digest = hashlib.sha256(f"{type(model).__qualname__}\n{attention}\n{config}\n".encode())
    for name, t in tensors:
        digest.update(f"{name} {tuple(t.shape)} {t.dtype}\n".encode())
        digest.update(t.detach().reshape(-1).view(torch.uint8).cpu().numpy().data)
    _FINGERPRINTS[model] = (state, digest.hexdigest())
    return digest.hexdigest()


def recall(model, role: str, what: str, sequences: list[list[int]], vocab: int,
           seen: tuple = (), enough: int | None = None) -> Samples | None:
    """yardstick.sample of `model` (the pair's `role`) on `sequences` (`what`, in words): read back
    where this very measurement was kept, else measured and kept."""
    if not copyable(model):  # no float64 copy: nothing measured (sample says so), nothing kept
        return yardstick.sample(model, sequences, vocab, seen, enough)
    key = _key(model, role, sequences, vocab, seen, enough)
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    path = directory() / f"{role}-{name}.json"
    found = _read_entry(path, key)
    if found is not None:
        samples, measured_at = found
        _note(Lookup(role, what, measured_at, cached=True, kept=True))
        return samples
    samples = yardstick.sample(model, sequences, vocab, seen, enough)
    measured_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    kept = samples is not None and _write_entry(path, key, samples, measured_at)
    _note(Lookup(role, what, measured_at, cached=False, kept=kept))
    return samples


def _digest(sequences) -> str:
    return hashlib.sha256(json.dumps([list(ids) for ids in sequences]).encode()).hexdigest()


def _key(model, role: str, sequences, vocab: int, seen: tuple, enough: int | None) -> dict:
    device = model.get_input_embeddings().weight.device
    card = f" {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    return {"version": yardstick.MEASUREMENT_VERSION,
            "constants": [yardstick.MAX_POSITIONS, yardstick.RECURRENT_POSITIONS],
            "role": role, "weights": weights_fingerprint(model), "dtype": str(model.dtype),
            "device": f"{device}{card}", "torch": torch.__version__,
            "transformers": transformers.__version__,
            # a CPU's reductions may split by its threads; a GPU's do not
            "threads": torch.get_num_threads() if device.type == "cpu" else None,
            "sequences": _digest(sequences), "seen": _digest(seen), "enough": enough,
            "vocab": vocab}


def _floats(values) -> list[float]:
    if not isinstance(values, list) or not all(type(v) in (int, float) for v in values):
        raise ValueError("not a list of numbers")
    return values


def _samples_of(data: dict) -> Samples:
    """The samples an entry keeps; ValueError where it does not read back whole."""
    errors, relative = _floats(data["errors"]), _floats(data["relative"])
    largest, algorithms = _floats([data["largest_logit"], data["algorithms"]])
    seen = data["seen"]
    if not isinstance(seen, list) or not all(
            isinstance(ids, list) and all(type(i) is int for i in ids) for ids in seen):
        raise ValueError("not lists of token ids")
    counts = (data["sequences"], data["decoded"])
    if (len(errors) != len(relative) or not all(type(c) is int and c >= 0 for c in counts)
            or not isinstance(data["measured_at"], str)):
        raise ValueError("a kept measurement that does not add up")
    as_tensor = functools.partial(torch.tensor, dtype=torch.float64)
    return Samples(as_tensor(errors), as_tensor(relative), counts[0], float(largest),
                   tuple(map(tuple, seen)), counts[1], float(algorithms))


def _read_entry(path: Path, key: dict) -> tuple[Samples, str] | None:
    """The samples kept at `path` under `key`, and when measured (None: none, or not whole)."""
    try:
        data = json.loads(path.read_text())
        if data["key"] != key:
            return None
        samples = _samples_of(data)
        os.utime(path)  # recently used: pruned last
    except (OSError, ValueError, KeyError, TypeError):  # missing, unreadable, or corrupt
        return None
    return samples, data["measured_at"]


def _write_entry(path: Path, key: dict, samples: Samples, measured_at: str) -> bool:
    """Keep `samples` at `path`, whole or not at all; False where the cache cannot be written."""
    data = {"key": key, "measured_at": measured_at, "errors": samples.errors.tolist(),
            "relative": samples.relative.tolist(), "sequences": samples.sequences,
            "largest_logit": samples.largest_logit, "seen": [list(ids) for ids in samples.seen],
            "decoded": samples.decoded, "algorithms": samples.algorithms}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    except OSError:  # a read-only cache: the measurement stands, unkept
        return False
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(data, f)
        os.chmod(temporary, 0o644)  # as the cache's converted weights: mkstemp makes it private
        os.replace(temporary, path)
    except OSError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    _prune(path.parent)
    return True


def _prune(folder: Path) -> None:
    """Delete the least recently used entries beyond MAX_ENTRIES (another process may race us)."""
    entries = []
    for path in folder.glob("*.json"):
        with contextlib.suppress(OSError):
            entries.append((path.stat().st_mtime, path))
    for _, path in sorted(entries)[:-MAX_ENTRIES]:
        with contextlib.suppress(OSError):
            path.unlink()


@contextlib.contextmanager
def recording() -> Iterator[list[Lookup]]:
    """Within the block, in this thread, every measurement asked for is noted in the list yielded
    (one remembered in memory from earlier in the process is not asked for again)."""
    heard: list[Lookup] = []
    token = _HEARD.set(heard)
    try:
        yield heard
    finally:
        _HEARD.reset(token)


def _note(lookup: Lookup) -> None:
    heard = _HEARD.get()
    if heard is not None:
        heard.append(lookup)


def provenance(role: str = "target") -> str:
    """Where the `role`'s yardstick came from, in words, as noted by `recording` so far:
    " (measured on 2027-01-05 14:03 UTC, cached)"; empty where nothing was noted."""
    heard = list(dict.fromkeys(x for x in _HEARD.get() or () if x.role == role))
    if not heard:
        return ""
    if all(x.cached for x in heard):
        return f" (measured on {min(x.measured_at for x in heard)}, cached)"  # its first part
    if not any(x.cached for x in heard):
        return " (measured now, cached for later runs)" if all(x.kept for x in heard) else ""
    parts = (f"{x.what} measured on {x.measured_at}, cached" if x.cached
             else f"{x.what} measured now" for x in heard)
    return f" ({'; '.join(parts)})"
