"""Operator settings for a served page, read from environment variables.

A public deployment (a Hugging Face Space) must not let a visitor load any
model id, run a model's own code, or hold the GPU for an hour. These are the
knobs, with defaults safe for such a page; a command-line user is the operator
and is not bound by them. No gradio here: the page reads a Settings, checks
every RunSpec against it and shows `describe()`.

    SPECVIZ_ALLOWED_MODELS    comma-separated model ids, or * for any  (default: the preset pairs' ids)
    SPECVIZ_MAX_BATCH_SIZE    default 16
    SPECVIZ_MAX_K             default 8
    SPECVIZ_MAX_NEW_TOKENS    default 256
    SPECVIZ_MAX_PROMPTS       default 64
    SPECVIZ_TRUST_REMOTE_CODE default off: models that ship their own code are refused
    SPECVIZ_QUEUE_SIZE        default 16 runs waiting; more are turned away
    SPECVIZ_DETERMINISTIC     default off: deterministic GPU kernels (determinism.py)
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import spec as _spec
from .models import PRESETS
from .spec import RunSpec, SpecError

ANY = "*"
PRESET_IDS = frozenset(m for pair in PRESETS.values() for m in pair)
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SettingsError(ValueError):
    """A bad environment variable; the message names it."""


@dataclass(frozen=True)
class Settings:
    allowed_models: frozenset[str] | None = PRESET_IDS  # None: any model id
    max_batch_size: int = 16
    max_k: int = 8
    max_new_tokens: int = 256
    max_prompts: int = 64
    trust_remote_code: bool = False
    queue_size: int = 16
    deterministic: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        d = cls()
        return cls(
            allowed_models=_models(environ.get("SPECVIZ_ALLOWED_MODELS"), d.allowed_models),
            max_batch_size=_int(environ, "SPECVIZ_MAX_BATCH_SIZE", d.max_batch_size, _spec.MAX_BATCH_SIZE),
            max_k=_int(environ, "SPECVIZ_MAX_K", d.max_k, _spec.MAX_K),
            max_new_tokens=_int(environ, "SPECVIZ_MAX_NEW_TOKENS", d.max_new_tokens, _spec.MAX_NEW_TOKENS),
            max_prompts=_int(environ, "SPECVIZ_MAX_PROMPTS", d.max_prompts, _spec.MAX_PROMPTS),
            trust_remote_code=_bool(environ, "SPECVIZ_TRUST_REMOTE_CODE", d.trust_remote_code),
            queue_size=_int(environ, "SPECVIZ_QUEUE_SIZE", d.queue_size, 10_000),
            deterministic=_bool(environ, "SPECVIZ_DETERMINISTIC", d.deterministic),
        )

    def check(self, spec: RunSpec) -> None:
        """Refuse a run this server does not allow, saying which limit and how to stay within it."""
        for role, model in (("target", spec.target), ("draft", spec.draft)):
            if self.allowed_models is not None and model not in self.allowed_models:
                raise SpecError(f"{role} model {model!r} is not allowed on this server; allowed: "
                                f"{', '.join(sorted(self.allowed_models))} (SPECVIZ_ALLOWED_MODELS)")
        for what, value, limit, var in (
            ("batch size", spec.batch_size, self.max_batch_size, "SPECVIZ_MAX_BATCH_SIZE"),
            ("k", spec.k, self.max_k, "SPECVIZ_MAX_K"),
            ("max new tokens", spec.max_new_tokens, self.max_new_tokens, "SPECVIZ_MAX_NEW_TOKENS"),
            ("the number of prompts", len(spec.prompts), self.max_prompts, "SPECVIZ_MAX_PROMPTS"),
        ):
            if value > limit:
                raise SpecError(f"{what} {value} is over this server's limit of {limit} ({var})")

    def describe(self) -> str:
        """The limits in force, as short markdown lines for the page."""
        models = ("any model id" if self.allowed_models is None
                  else ", ".join(f"`{m}`" for m in sorted(self.allowed_models)))
        return "\n".join([
            f"- models: {models}",
            (f"- batch size ≤ {self.max_batch_size}, k ≤ {self.max_k}, new tokens ≤ {self.max_new_tokens}, "
             f"prompts ≤ {self.max_prompts}"),
            f"- models' own code (trust_remote_code): {'allowed' if self.trust_remote_code else 'refused'}",
            f"- queue: {self.queue_size} runs",
            f"- deterministic GPU kernels: {'on' if self.deterministic else 'off'}",
        ])


def _models(text: str | None, default: frozenset[str]) -> frozenset[str] | None:
    if text is None or not text.strip():
        return default
    ids = {m.strip() for m in text.split(",") if m.strip()}
    return None if ANY in ids else frozenset(ids)


def _int(environ: Mapping[str, str], name: str, default: int, most: int) -> int:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise SettingsError(f"{name}={text!r}: expected a whole number") from None
    if not 1 <= value <= most:
        raise SettingsError(f"{name}={value}: must be between 1 and {most}")
    return value


def _bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    text = environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in TRUE + FALSE:
        return text in TRUE
    raise SettingsError(f"{name}={text!r}: expected 1/0, true/false, yes/no or on/off")
