"""RunSpec: the validated, hashable, canonical description of one run.

Everything that decides a run's token ids lives here, so that a spec can be
hashed (cache key, trace fingerprint) and round-tripped through a share link.
"""
from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from specviz.spec.drafters import DEFAULT_DRAFTER, DRAFTER_OPTIONS, DRAFTERS, reading
from specviz.spec.faults import expand, needing
from specviz.spec.grammar import compile_schema
from specviz.spec.methods import METHODS
from specviz.spec.rows import MAX_TEMPERATURE, RowSampling
from specviz.spec.strict import Strict

# the method of an engine check's trace: outputs from outside, judged against the reference
ENGINE = "engine"
DTYPES = ("float32", "bfloat16", "float16", "float64")
DEVICES = ("auto", "cpu", "cuda")

MAX_BATCH_SIZE = 64
MAX_K = 16
MAX_NEW_TOKENS = 1024
MAX_PROMPTS = 4096
MAX_PROMPT_CHARS = 400_000  # all prompts together; the token bound is checked at encoding
MAX_PROMPT_TOKENS = 131_072  # all prompts together, after tokenization

EMBEDDED_TARGET = "specviz:smollm2-135m"
EMBEDDED_DRAFT = "specviz:smollm2-135m-draft"
TINY_TARGET = "specviz:tiny"
TINY_DRAFT = "specviz:tiny-draft"
# a random Qwen 3.5-style hybrid: attention beside Gated DeltaNet layers
TINY_HYBRID = "specviz:tiny-hybrid"
TINY_HYBRID_DRAFT = "specviz:tiny-hybrid-draft"
# the tiny pair with a sliding window of TINY_WINDOW_SIZE on every layer
TINY_WINDOW = "specviz:tiny-window"
TINY_WINDOW_DRAFT = "specviz:tiny-window-draft"
# longer than the casebook's chat prompts (35 to 40 tokens), reached within 32 new tokens
TINY_WINDOW_SIZE = 48
# name -> (target, draft). The Hub pairs are for machines with a GPU and Hub access.
PAIR_PRESETS = {
    "embedded": (EMBEDDED_TARGET, EMBEDDED_DRAFT),
    "tiny": (TINY_TARGET, TINY_DRAFT),
    "tiny-hybrid": (TINY_HYBRID, TINY_HYBRID_DRAFT),
    "tiny-window": (TINY_WINDOW, TINY_WINDOW_DRAFT),
    "qwen3": ("Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B"),
    "vicuna": ("lmsys/vicuna-7b-v1.3", "double7/vicuna-68m"),
    "smollm2": ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
}
BUILT_IN_PAIRS = {target: draft for target, draft in PAIR_PRESETS.values()
                  if target.startswith("specviz:")}
SAMPLING_FIELDS = ("top_k", "top_p", "draft_temperature", "draft_top_k", "draft_top_p")
MAX_NGRAM = 16
MAX_TREE_WIDTH = 8
MAX_HEAD_PATH = 512  # characters of a head's folder
MAX_KV_BLOCK_SIZE = 256  # tokens a paged cache's block holds at most
MAX_KV_BLOCKS = 1 << 20
# the EAGLE-3 heads specviz makes for a built-in target (models/builtinheads.py), named as a folder:
# fitted in seconds, and trained on this machine (specviz train-head --eagle3)
FITTED_HEAD = "specviz:fitted-eagle3"
TRAINED_HEAD = "specviz:trained-eagle3"
MAX_REPETITION_PENALTY = 10.0
MAX_PRESENCE_PENALTY = 2.0  # OpenAI's bound
PENALTY_FIELDS = ("repetition_penalty", "presence_penalty")
# Left out of the canonical form at their defaults, so that the keys of runs made before them stay
# what they were.
OMITTED_AT_DEFAULT = (*SAMPLING_FIELDS, "drafter", *DRAFTER_OPTIONS, *PENALTY_FIELDS, "logprobs",
                      "rows", "stop", "batch_invariant", "kv_block_size", "prefix_caching",
                      "kv_blocks")
MAX_STOPS, MAX_STOP_CHARS = 4, 32  # stop strings a run may set, and the length of each
# what a request's own settings (RowSampling) replace
TARGET_FIELDS = ("temperature", "top_k", "top_p")


class RunSpec(Strict):
    """A run: which pair, which prompts, which method, and the knobs that matter."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str = EMBEDDED_TARGET
    draft: str = EMBEDDED_DRAFT
    target_revision: str | None = None
    draft_revision: str | None = None
    prompts: tuple[str, ...] = Field(min_length=1, max_length=MAX_PROMPTS, fail_fast=True)
    chat_template: bool = True
    method: Literal[(*METHODS, ENGINE)] = "eqspec"
    # what proposes the drafts (speculative methods)
    drafter: Literal[tuple(DRAFTERS)] = DEFAULT_DRAFTER
    ngram_min: int = Field(1, ge=1, le=MAX_NGRAM)  # prompt lookup: the shortest n-gram matched
    ngram_max: int = Field(3, ge=1, le=MAX_NGRAM)  # and the longest (tried first)
    # a published head (eagle1, eagle3 drafters): the folder of its config.json and safetensors
    head: str | None = Field(None, min_length=1, max_length=MAX_HEAD_PATH)
    # candidates per position (decoding/trees.py); 1: a chain
    tree_width: int = Field(1, ge=1, le=MAX_TREE_WIDTH)
    # fault or preset names (decoding/faults.py), for speculative methods
    faults: tuple[str, ...] = Field((), fail_fast=True)
    batch_size: int = Field(4, ge=1, le=MAX_BATCH_SIZE)
    k: int = Field(5, ge=1, le=MAX_K)
    max_new_tokens: int = Field(48, ge=1, le=MAX_NEW_TOKENS)
    dtype: Literal[DTYPES] = "float32"
    device: Literal[DEVICES] = "auto"
    seed: int = Field(0, ge=0, le=2**31 - 1)
    # exspec: active sequences (None: 2 x batch)
    window: int | None = Field(None, ge=1, le=4 * MAX_BATCH_SIZE)
    max_wait: int = Field(4, ge=0, le=1024)  # exspec: rounds a sequence may be passed over
    # rows per round checked against a fresh recomputation; 0: off
    audit: int = Field(0, ge=0, le=MAX_BATCH_SIZE)
    # Sampling: the target's temperature (0: greedy), top-k (0: off) and top-p (1: off); the draft's
    # own, where set.
    temperature: float = Field(0.0, ge=0, le=MAX_TEMPERATURE)
    top_k: int = Field(0, ge=0, le=2**20)
    top_p: float = Field(1.0, gt=0, le=1)
    draft_temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE)
    draft_top_k: int | None = Field(None, ge=0, le=2**20)
    draft_top_p: float | None = Field(None, gt=0, le=1)
    # Penalties on the target's logits (decoding/penalties.py), discouraging repeats only:
    # transformers' repetition penalty (1: off) and OpenAI's presence penalty (0: off).
    repetition_penalty: float = Field(1.0, ge=1, le=MAX_REPETITION_PENALTY)
    presence_penalty: float = Field(0.0, ge=0, le=MAX_PRESENCE_PENALTY)
    # record each emitted token's log-probability under the target, and judge them
    logprobs: bool = False
    # Each request's own settings, replacing the three above: prompt i gets rows[i % len(rows)].
    # Empty: every request samples with the run's.
    rows: tuple[RowSampling, ...] = Field((), max_length=MAX_PROMPTS, fail_fast=True)
    # Stop strings: an output ends at the token whose text completes one (decoding/stops.py), as at
    # its EOS.
    stop: tuple[str, ...] = Field((), max_length=MAX_STOPS)
    # Structured output (decoding/grammar.py): a JSON schema every answer follows, free up to a
    json_schema: str | None = None  # reasoning end (one token, a reasoning model's </think>)
    reasoning_end: str | None = Field(None, min_length=1, max_length=MAX_STOP_CHARS)
    # A row's logits the same bits in any batch (models/invariant.py): forks are judged at zero
    # tolerance.
    batch_invariant: bool = False
    # How the engine lays out its caches (decoding/paging.py): 0 keeps each row's K/V contiguous;
    # a block size pages them in a pool, and prefix caching shares prompts' full blocks.
    kv_block_size: int = Field(0, ge=0, le=MAX_KV_BLOCK_SIZE)
    prefix_caching: bool = False
    # blocks each paged pool holds at most, evicting the prefix cache's idle ones (0: as many as
    # the run needs)
    kv_blocks: int = Field(0, ge=0, le=MAX_KV_BLOCKS)

    @field_validator("target", "draft")
    @classmethod
    def _model_id(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("model id must not be empty")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for s in v:
            if not s or len(s) > MAX_STOP_CHARS:
                raise ValueError(f"a stop string must have 1 to {MAX_STOP_CHARS} characters")
        return v

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for i, p in enumerate(v):
            if not p.strip():
                raise ValueError(f"prompt {i} is empty")
        total = sum(len(p) for p in v)
        if total > MAX_PROMPT_CHARS:
            raise ValueError(f"prompts total {total} characters; the limit is {MAX_PROMPT_CHARS}")
        return v

    @field_validator("faults")
    @classmethod
    def _faults(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        expand(v)  # raises on unknown names
        return tuple(dict.fromkeys(v))

    @model_validator(mode="after")
    def _method_allows(self) -> RunSpec:
        if self.method == ENGINE:
            return self
        m = METHODS[self.method]
        if self.faults and not m.faults:
            takes = ", ".join(n for n, x in METHODS.items() if x.faults)
            raise ValueError(f"faults apply to {takes}, not {self.method}")
        if m.max_batch_size is not None and self.batch_size > m.max_batch_size:
            raise ValueError(f"{self.method} runs at batch size {m.max_batch_size} at most")
        if self.drafter not in m.drafters and self.drafter != DEFAULT_DRAFTER:
            raise ValueError(f"{self.method} drafts nothing: the {self.drafter} drafter needs a "
                             "speculative method")
        if not self.greedy and not m.samples:
            raise ValueError(f"{self.method} runs greedy only here; sample with "
                             + " or ".join(n for n, x in METHODS.items() if x.samples
                                           and x.speculative))
        return self

    def changed(self, fields) -> list[str]:
        """Those of `fields` set away from their defaults."""
        return [f for f in fields if getattr(self, f) != type(self).model_fields[f].default]

    @model_validator(mode="after")
    def _drafter(self) -> RunSpec:
        kind = DRAFTERS[self.drafter]
        stray = [f for f in self.changed(DRAFTER_OPTIONS) if f not in kind.options]
        if stray:
            takes = reading(stray[0])
            raise ValueError(f"{', '.join(stray)} set the {' or '.join(takes)} drafter; "
                             f"choose drafter {takes[0]}")
        if not kind.draft_model and (found := needing("draft-model", self.faults)):
            raise ValueError(f"{', '.join(found)} break a draft model's passes: "
                             f"{kind.noun} runs none")
        if "hidden" not in kind.hears and (found := needing("hidden", self.faults)):
            raise ValueError(f"{', '.join(found)} break a draft head's inputs: {kind.noun} hears "
                             "no hidden state; choose drafter "
                             + " or ".join(n for n, d in DRAFTERS.items() if "hidden" in d.hears))
        if "head" not in kind.options and (found := needing("published-head", self.faults)):
            raise ValueError(f"{', '.join(found)} misfeed a published head: choose drafter "
                             + " or ".join(n for n, d in DRAFTERS.items() if "head" in d.options))
        if "head" in kind.options and not self.head:
            raise ValueError(f"the {self.drafter} drafter drafts with {kind.noun}: give its "
                             "folder (head)")
        if self.tree_width > 1:
            self._trees()
        elif found := needing("tree", self.faults):
            raise ValueError(f"{', '.join(found)} break a token tree's verify: "
                             "set tree_width above 1")
        if "ngram_min" not in kind.options:
            return self
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) must not exceed ngram_max "
                             f"({self.ngram_max})")
        if self.method == "hf-assisted" and self.ngram_min != 1:
            raise ValueError("transformers' prompt lookup always matches down to 1 token: "
                             "hf-assisted needs ngram_min 1")
        return self

    def _trees(self) -> None:
        if self.method != ENGINE and not METHODS[self.method].trees:
            raise ValueError(f"{self.method} verifies chains only; trees run in "
                             + " or ".join(n for n, m in METHODS.items() if m.trees))
        if found := needing("sampled", self.faults):
            raise ValueError(f"{', '.join(found)} break a chain's sampled decisions; a token "
                             "tree's are SpecInfer's: set tree_width 1")
        if self.repetition_penalty != 1 or self.presence_penalty != 0:
            raise ValueError("a penalty's history along a token tree's branches is not built: "
                             "penalise with tree_width 1")

    @model_validator(mode="after")
    def _rows(self) -> RunSpec:
        if not self.rows:
            if found := needing("rows", self.faults):
                raise ValueError(f"{', '.join(found)} need per-request sampling settings (rows)")
            return self
        if self.method == ENGINE:
            raise ValueError("an engine check sends every request the run's settings: per-request "
                             "rows are for specviz's own methods")
        if self.changed(TARGET_FIELDS):
            raise ValueError("per-request settings (rows) replace the run's temperature, top-k and "
                             "top-p: leave those at their defaults")
        return self

    @model_validator(mode="after")
    def _sampling(self) -> RunSpec:
        # (the audit compares each row's state with a fresh pass, at any temperature)
        if not self.greedy:
            if found := needing("greedy", self.faults):
                raise ValueError(f"{', '.join(sorted(found))} breaks greedy acceptance: it needs "
                                 "temperature 0")
            return self
        if self.changed(SAMPLING_FIELDS):
            raise ValueError("top-k, top-p and the draft's sampling settings need a temperature "
                             "above 0")
        if needing("sampled", self.faults):
            raise ValueError("sampling faults need a temperature above 0"
                             + (" in some request" if self.rows else ""))
        return self

    @model_validator(mode="after")
    def _grammar(self) -> RunSpec:
        if self.json_schema is None and self.reasoning_end is not None:
            raise ValueError("a reasoning end says where a grammar starts: set a JSON schema too")
        for need, value, what in (("grammar", self.json_schema, "a JSON schema"),
                                  ("reasoning", self.reasoning_end, "a reasoning end")):
            if value is None and (found := needing(need, self.faults)):
                raise ValueError(f"{', '.join(found)} needs {what}")
        if self.json_schema is None:
            return self
        compile_schema(self.json_schema)
        if not self.greedy:
            raise ValueError("a grammar runs at temperature 0: the distribution judge scores the "
                             "target unmasked")
        if self.method == ENGINE or not METHODS[self.method].grammar:
            raise ValueError(f"{self.method} takes no grammar; "
                             + ", ".join(n for n, m in METHODS.items() if m.grammar) + " do")
        return self

    @model_validator(mode="after")
    def _invariant(self) -> RunSpec:
        if self.batch_invariant and self.dtype == "float64":
            raise ValueError("batch-invariant mode is for float32, bfloat16 and float16: float64 "
                             "is the truth rounding is measured from")
        return self

    @model_validator(mode="after")
    def _paged(self) -> RunSpec:
        if self.prefix_caching and not self.kv_block_size and self.method != ENGINE:
            raise ValueError("prefix caching shares a paged cache's blocks: set a kv block size")
        if self.kv_blocks and not self.kv_block_size:
            raise ValueError("kv blocks bound a paged cache's pool: set a kv block size")
        paged = [n for n, m in METHODS.items() if m.paged]
        if self.kv_block_size and self.method not in paged:
            raise ValueError(f"{self.method} keeps its cache contiguous; "
                             f"{' and '.join(paged)} page it")
        for need, value, what in (("paged", self.kv_block_size, "a KV block size (a paged cache)"),
                                  ("prefix-cached", self.prefix_caching, "prefix caching on")):
            if not value and (found := needing(need, self.faults)):
                raise ValueError(f"{', '.join(found)} needs {what}")
        return self

    @model_validator(mode="after")
    def _penalties(self) -> RunSpec:
        penalised = [f.removesuffix("_penalty") for f in self.changed(PENALTY_FIELDS)]
        if self.method == ENGINE:
            if penalised or self.logprobs:
                raise ValueError("an engine check sends no penalties and records the engine's own "
                                 "log-probabilities")
            return self
        m = METHODS[self.method]
        if refused := [p for p in penalised if p not in m.penalties]:
            raise ValueError(f"{self.method} takes no {' or '.join(refused)} penalty; "
                             + ", ".join(n for n, x in METHODS.items()
                                         if set(refused) <= set(x.penalties)) + " do")
        if self.logprobs and not m.logprobs:
            raise ValueError(f"{self.method} records no log-probabilities")
        if self.stop and not m.stop_strings:
            raise ValueError(f"{self.method} takes no stop strings")
        if not penalised and (found := needing("penalty", self.faults)):
            raise ValueError(f"{', '.join(found)} needs a repetition or presence penalty to break")
        if not self.logprobs and (found := needing("logprobs", self.faults)):
            raise ValueError(f"{', '.join(found)} breaks only the log-probabilities: set logprobs")
        return self

    @property
    def greedy(self) -> bool:
        """Temperature 0, for the run or every request: the target's argmax at every token
        (decoding/sampling.py builds the samplers)."""
        return all(r.greedy for r in self.rows) if self.rows else self.temperature == 0

    def draft_sampling(self, row: RowSampling | None = None) -> tuple[float, int, float]:
        """The draft's temperature, top-k and top-p: its own where set, else the target's (`row`'s,
        where given)."""
        target = row.target() if row else (self.temperature, self.top_k, self.top_p)
        return tuple(t if d is None else d for t, d in zip(
            target, (self.draft_temperature, self.draft_top_k, self.draft_top_p)))

    @model_validator(mode="after")
    def _window(self) -> RunSpec:
        if self.window is not None and self.window <= self.batch_size:
            raise ValueError(f"window ({self.window}) must be larger than the batch size "
                             f"({self.batch_size})")
        return self

    @model_validator(mode="after")
    def _pair(self) -> RunSpec:
        # A built-in target drafts with its own draft, or with itself (a self-test: every draft
        # is accepted).
        for target, draft in BUILT_IN_PAIRS.items():
            if (self.target == target) != (self.draft in (draft, target)):
                raise ValueError("the built-in drafts only pair with their own targets (or a "
                                 "built-in target with itself)")
        return self

    def on_prompts(self, prompts, **update) -> RunSpec:
        """This run (unvalidated, with `update`) on some of its own prompts, in their order: each
        keeps its own request's settings."""
        rows = (tuple(self.rows[self.prompts.index(p) % len(self.rows)] for p in prompts)
                if self.rows else ())
        return self.model_copy(update={"prompts": tuple(prompts), "rows": rows, **update})

    def canonical_json(self) -> str:
        """Stable text form: sorted keys, no whitespace; the basis of hashing and links."""
        fields = self.model_dump(mode="json")
        for f in OMITTED_AT_DEFAULT:
            default = type(self).model_fields[f].default
            # a tuple dumps as a list
            if fields[f] == (list(default) if isinstance(default, tuple) else default):
                del fields[f]
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    def key(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]
