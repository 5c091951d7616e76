"""Operator settings for a served page, read from environment variables.

A public deployment (a Hugging Face Space) must not let a visitor load any
model id or revision, read local files, run a model's own code, or hold the
machine for an hour. These are the knobs, with defaults safe for such a page;
a command-line user is the operator and is not bound by them. No gradio here:
the page reads a Settings, checks every RunSpec against it (`check`), checks
the prompts again once tokenized (`check_prompt_ids`, called by runner.run)
and shows `describe()`.

    SPECVIZ_ALLOWED_MODELS     comma-separated ids, each `org/model` (its default revision only) or
                               `org/model@revision`; * for any  (default: the preset pairs' ids)
    SPECVIZ_PUBLIC             default on where SPACE_ID is set (a Hugging Face Space):
                               refuse local paths
    SPECVIZ_MAX_BATCH_SIZE     default 16
    SPECVIZ_MAX_K              default 8
    SPECVIZ_MAX_NEW_TOKENS     default 256
    SPECVIZ_MAX_PROMPTS        default 64
    SPECVIZ_MAX_RUN_TOKENS     default 4096: prompts x max new tokens
    SPECVIZ_MAX_PROMPT_TOKENS  default 2048: the longest prompt, tokenized (chat template included)
    SPECVIZ_MAX_TOTAL_PROMPT_TOKENS default 16384: all prompts together, tokenized
    SPECVIZ_MAX_DTYPE          default float32: the widest dtype for Hub and local models
    SPECVIZ_DEVICES            default auto,cuda
    SPECVIZ_TRUST_REMOTE_CODE  default off: models that ship their own code are refused
    SPECVIZ_QUEUE_SIZE         default 16 runs waiting; more are turned away
    SPECVIZ_DETERMINISTIC      default off: deterministic GPU kernels (determinism.py)
    SPECVIZ_ENGINE_SERVERS     default none: comma-separated origins (http://host:port) of engine
                               servers the "Check an engine" tab may send prompts to; none on a
                               public server, whatever it says
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from specviz.spec import run as _spec
from specviz.spec.run import BUILT_IN_PAIRS, DEVICES, FITTED_HEAD, PAIR_PRESETS, RunSpec
from specviz.spec.strict import SpecError

ANY = "*"
PRESET_IDS = frozenset(m for pair in PAIR_PRESETS.values() for m in pair)
BUILT_IN = frozenset({*BUILT_IN_PAIRS, *BUILT_IN_PAIRS.values()})  # at most 135M parameters
WIDTH = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}  # bytes a weight takes
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SettingsError(ValueError):
    """A bad environment variable; the message names it."""


@dataclass(frozen=True)
class Settings:
    # `id` or `id@revision` entries; None: any model id
    allowed_models: frozenset[str] | None = PRESET_IDS
    max_batch_size: int = 16
    max_k: int = 8
    max_new_tokens: int = 256
    max_prompts: int = 64
    trust_remote_code: bool = False
    queue_size: int = 16
    deterministic: bool = False
    # A run's work: its batch-size-1 reference alone is one target pass per new token
    # of every prompt.
    max_run_tokens: int = 4096
    # Each batch builds a (batch, longest, longest) attention mask: bound the longest prompt, and
    # the total.
    max_prompt_tokens: int = 2048
    max_total_prompt_tokens: int = 16_384
    # runs one sweep of the page may make (each within the limits above): the casebook's fit
    max_sweep_runs: int = 48
    # float64 doubles a Hub model's memory; the built-in pairs are exempt
    max_dtype: str = "float32"
    # cpu would hold a GPU server's queue at CPU speed
    devices: frozenset[str] = frozenset({"auto", "cuda"})
    public: bool = False  # refuse local paths, whatever the allowlist
    # A server URL makes this machine send requests where a visitor says: none by default, never
    # when public.
    engine_servers: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        d = cls()
        return cls(
            allowed_models=_models(environ.get("SPECVIZ_ALLOWED_MODELS"), d.allowed_models),
            max_batch_size=_int(environ, "SPECVIZ_MAX_BATCH_SIZE", d.max_batch_size,
                                _spec.MAX_BATCH_SIZE),
            max_k=_int(environ, "SPECVIZ_MAX_K", d.max_k, _spec.MAX_K),
            max_new_tokens=_int(environ, "SPECVIZ_MAX_NEW_TOKENS", d.max_new_tokens,
                                _spec.MAX_NEW_TOKENS),
            max_prompts=_int(environ, "SPECVIZ_MAX_PROMPTS", d.max_prompts, _spec.MAX_PROMPTS),
            trust_remote_code=_bool(environ, "SPECVIZ_TRUST_REMOTE_CODE", d.trust_remote_code),
            queue_size=_int(environ, "SPECVIZ_QUEUE_SIZE", d.queue_size, 10_000),
            deterministic=_bool(environ, "SPECVIZ_DETERMINISTIC", d.deterministic),
            max_run_tokens=_int(environ, "SPECVIZ_MAX_RUN_TOKENS", d.max_run_tokens,
                                _spec.MAX_PROMPTS * _spec.MAX_NEW_TOKENS),
            max_prompt_tokens=_int(environ, "SPECVIZ_MAX_PROMPT_TOKENS", d.max_prompt_tokens,
                                   _spec.MAX_PROMPT_TOKENS),
            max_total_prompt_tokens=_int(environ, "SPECVIZ_MAX_TOTAL_PROMPT_TOKENS",
                                         d.max_total_prompt_tokens, _spec.MAX_PROMPT_TOKENS),
            max_sweep_runs=_int(environ, "SPECVIZ_MAX_SWEEP_RUNS", d.max_sweep_runs, 4096),
            max_dtype=_choice(environ, "SPECVIZ_MAX_DTYPE", d.max_dtype, tuple(WIDTH)),
            devices=_choices(environ, "SPECVIZ_DEVICES", d.devices, DEVICES),
            # Spaces do not say whether they are public, and their visibility can change while
            # they run.
            public=_bool(environ, "SPECVIZ_PUBLIC", bool(environ.get("SPACE_ID"))),
            engine_servers=tuple(u.strip()
                                 for u in environ.get("SPECVIZ_ENGINE_SERVERS", "").split(",")
                                 if u.strip()),
        )

    def check(self, spec: RunSpec) -> None:
        """Refuse a run this server does not allow, saying which limit and how to stay within it."""
        for role, model, revision in (("target", spec.target, spec.target_revision),
                                      ("draft", spec.draft, spec.draft_revision)):
            self._check_model(role, model, revision)
        if spec.head:
            self.check_head(spec.head)
        built_in = spec.target in BUILT_IN and spec.draft in BUILT_IN
        if not built_in and WIDTH[spec.dtype] > WIDTH[self.max_dtype]:
            raise SpecError(f"dtype {spec.dtype} is wider than this server's limit of "
                            f"{self.max_dtype} for Hub and local models (SPECVIZ_MAX_DTYPE)")
        if spec.device not in self.devices:
            raise SpecError(f"device {spec.device!r} is not allowed on this server; allowed: "
                            f"{', '.join(sorted(self.devices))} (SPECVIZ_DEVICES)")
        for what, value, limit, var in (
            ("batch size", spec.batch_size, self.max_batch_size, "SPECVIZ_MAX_BATCH_SIZE"),
            ("k", spec.k, self.max_k, "SPECVIZ_MAX_K"),
            ("max new tokens", spec.max_new_tokens, self.max_new_tokens, "SPECVIZ_MAX_NEW_TOKENS"),
            ("the number of prompts", len(spec.prompts), self.max_prompts, "SPECVIZ_MAX_PROMPTS"),
            ("prompts × max new tokens", len(spec.prompts) * spec.max_new_tokens,
             self.max_run_tokens, "SPECVIZ_MAX_RUN_TOKENS"),
        ):
            if value > limit:
                raise SpecError(f"{what} {value} is over this server's limit of {limit} ({var})")

    def check_sweep(self, specs: list[RunSpec]) -> None:
        """Refuse a sweep this server does not run: too many runs, or a run it does not allow
        (which, and why)."""
        if len(specs) > self.max_sweep_runs:
            raise SpecError(f"this sweep makes {len(specs)} runs, over this server's limit of "
                            f"{self.max_sweep_runs} (SPECVIZ_MAX_SWEEP_RUNS)")
        for i, spec in enumerate(specs):
            try:
                self.check(spec)
            except SpecError as e:
                raise SpecError(f"run {i + 1} of the sweep ({spec.method}, batch size "
                                f"{spec.batch_size}, k {spec.k}): {e}") from None

    def check_head(self, head: str) -> None:
        """Refuse a published head's folder this server does not load (a model's files too); the
        fitted head of a built-in target is made here."""
        if head != FITTED_HEAD:
            self._check_model("published head", head, None)

    def _check_model(self, role: str, model: str, revision: str | None) -> None:
        if self.public and is_local_path(model):
            raise SpecError(f"{role} model {model!r} is a local path; this server is public and "
                            "loads Hub ids only (SPECVIZ_PUBLIC)")
        if self.allowed_models is None or _entry(model, revision) in self.allowed_models:
            return
        listed = sorted(self.allowed_models)
        # listed, at other revisions
        known = any(e == model or e.startswith(model + "@") for e in listed)
        rev = "(the default)" if revision is None else repr(revision)
        what = f"revision {rev} of {role} model {model!r}" if known else f"{role} model {model!r}"
        raise SpecError(f"{what} is not allowed on this server; allowed: {', '.join(listed)} "
                        "(SPECVIZ_ALLOWED_MODELS)")

    def check_server(self, url: str) -> None:
        """Refuse an engine server URL this page may not send requests to."""
        if self.public:
            raise SpecError("this server is public: it does not send requests to a server a "
                            "visitor names (SPECVIZ_PUBLIC); upload the engine's outputs file "
                            "instead")
        if _origin(url) not in {_origin(u) for u in self.engine_servers}:
            allowed = ", ".join(self.engine_servers) or "none"
            raise SpecError(f"engine server {url!r} is not allowed on this server; allowed: "
                            f"{allowed} (SPECVIZ_ENGINE_SERVERS); upload the engine's outputs "
                            "file instead")

    def check_prompt_ids(self, prompt_ids: list[list[int]]) -> None:
        """Refuse prompts too long for this server once tokenized: a long prompt, not a long text,
        costs memory."""
        longest = max(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        total = sum(len(ids) for ids in prompt_ids)
        if len(prompt_ids[longest]) > self.max_prompt_tokens:
            raise SpecError(f"prompt {longest} is {len(prompt_ids[longest])} tokens long, over "
                            f"this server's limit of {self.max_prompt_tokens} "
                            "(SPECVIZ_MAX_PROMPT_TOKENS)")
        if total > self.max_total_prompt_tokens:
            raise SpecError(f"the prompts total {total} tokens, over this server's limit of "
                            f"{self.max_total_prompt_tokens} (SPECVIZ_MAX_TOTAL_PROMPT_TOKENS)")

    def describe(self) -> str:
        """The limits in force, as short markdown lines for the page."""
        models = ("any model id" if self.allowed_models is None
                  else ", ".join(f"`{m}`" for m in sorted(self.allowed_models)))
        return "\n".join([
            f"- models: {models}"
            + (" (no local paths: this server is public)" if self.public else ""),
            (f"- batch size ≤ {self.max_batch_size}, k ≤ {self.max_k}, new tokens ≤ "
             f"{self.max_new_tokens}, prompts ≤ {self.max_prompts}, prompts × new tokens ≤ "
             f"{self.max_run_tokens}"),
            (f"- prompt tokens (chat template included): the longest ≤ {self.max_prompt_tokens}, "
             f"all together ≤ {self.max_total_prompt_tokens}"),
            f"- sweeps: up to {self.max_sweep_runs} runs, each within the limits above",
            f"- dtype: up to {self.max_dtype} for Hub and local models, any for the built-in pairs",
            f"- devices: {', '.join(sorted(self.devices))}",
            "- models' own code (trust_remote_code): "
            f"{'allowed' if self.trust_remote_code else 'refused'}",
            f"- queue: {self.queue_size} runs",
            f"- deterministic GPU kernels: {'on' if self.deterministic else 'off'}",
            "- engine servers the check may ask: "
            + (", ".join(f"`{u}`" for u in self.engine_servers)
               if self.engine_servers and not self.public else "none"),
        ])


def is_local_path(model: str) -> bool:
    """Whether transformers would read `model` from this machine's disk: not a built-in id, and not
    a Hub id or the name of something that exists here (a local folder wins over a Hub id of the
    same name)."""
    if model in BUILT_IN:
        return False
    try:
        validate_repo_id(model)
    except HFValidationError:
        return True
    return os.path.exists(model)


def _origin(url: str) -> tuple[str, str]:
    """Scheme and host:port: what a server URL is allowed by (a prefix would let
    http://host.evil.com through)."""
    parts = urlsplit(url.strip())
    return parts.scheme.lower(), parts.netloc.lower()


def _entry(model: str, revision: str | None) -> str:
    return model if revision is None else f"{model}@{revision}"


def _models(text: str | None, default: frozenset[str]) -> frozenset[str] | None:
    if text is None or not text.strip():
        return default
    ids = {m.strip() for m in text.split(",") if m.strip()}
    if ANY in ids:
        return None
    bad = sorted(m for m in ids if m.startswith("@") or m.endswith("@"))
    if bad:
        raise SettingsError(f"SPECVIZ_ALLOWED_MODELS: {bad[0]!r}: expected a model id, or "
                            "id@revision")
    return frozenset(ids)


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


def _choice(environ: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    text = environ.get(name, "").strip()
    if not text:
        return default
    if text not in allowed:
        raise SettingsError(f"{name}={text!r}: expected one of {', '.join(allowed)}")
    return text


def _choices(environ: Mapping[str, str], name: str, default: frozenset[str],
             allowed: tuple[str, ...]) -> frozenset[str]:
    text = environ.get(name, "").strip()
    if not text:
        return default
    values = {v.strip() for v in text.split(",") if v.strip()}
    bad = sorted(values - set(allowed))
    if bad or not values:
        raise SettingsError(f"{name}={text!r}: expected a comma-separated list of "
                            f"{', '.join(allowed)}")
    return frozenset(values)
