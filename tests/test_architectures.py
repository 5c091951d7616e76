"""Architectures beyond the Llama the built-in pairs are, saved as a user's local checkpoint is.

Sliding-window attention (Mistral's on every layer; Qwen2's and Gemma's beside full layers): every
method writes what the model itself writes once a row is longer than its window, and forensics still
names a planted fault. Before, the engine's own mask ignored the window and transformers' sliding
cache layers dropped slots the layout still indexed: prefills past the window were wrong, decoding
past it and teacher forcing raised.

Mixtures of experts (Qwen3-MoE): decoded and judged in float64, where transformers' grouped GEMM has
no kernel.

Attention that padded, slot-indexed layouts cannot hold (chunked; ALiBi, computed from slot indices)
is refused at load with the reason, never decoded wrong."""
import pytest
import torch
from test_reference import plain_argmax
from transformers import (
    AutoConfig,
    AutoTokenizer,
    MistralConfig,
    MistralForCausalLM,
    MptConfig,
    MptForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from specviz.decoding import kvcache
from specviz.decoding.batch import attention_masks, left_pad
from specviz.decoding.reference import reference
from specviz.forensics import enginenoise
from specviz.forensics.recompute import float64_target, fresh_logits
from specviz.models.architecture import sliding_windows
from specviz.models.checkpoints import embedded_tokenizer_dir
from specviz.models.pairs import load_pair
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics

WINDOW = 8
NEW = 16
FAMILIES = {  # (config, model, the target's own settings): its draft is its first two layers
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": WINDOW}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"use_sliding_window": True, "sliding_window": WINDOW,
                                              # layer 0 full, layers 1 and 2 sliding
                                              "max_window_layers": 1}),
    "qwen3-moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM, {"num_experts": 4, "num_experts_per_tok": 2,
                                                        "moe_intermediate_size": 32,
                                                        "head_dim": 16}),
}
SLIDING = ("mistral", "qwen2")


def _save(path, family: str, layers: int, state: dict | None = None) -> str:
    config_cls, model_cls, own = FAMILIES[family]
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    config = config_cls(vocab_size=len(tok), hidden_size=64, intermediate_size=192,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=4096, initializer_range=0.2,
                        tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **own)
    torch.manual_seed(0)
    model = model_cls(config)
    # the target: its last layer damped, so that its first two agree with it about half the time
    if state is None:
        last = model.model.layers[-1]
        with torch.no_grad():
            for name, weight in last.named_parameters():
                # an expert's is a 3D tensor
                if name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")):
                    weight.mul_(0.15)
    else:
        model.load_state_dict(state, strict=False)  # the target's weights, less its last layer
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _family(family: str, root) -> tuple[str, str, object]:
    """(target dir, draft dir, the pair in float64) of one family."""
    target = _save(root / "target", family, 3)
    state = load_pair(target, target, dtype="float64", device="cpu").target.state_dict()
    draft = _save(root / "draft", family, 2, state)
    return target, draft, load_pair(target, draft, dtype="float64", device="cpu")


@pytest.fixture(scope="module", params=SLIDING)
def sliding(request, tmp_path_factory):
    return _family(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return _family("qwen3-moe", tmp_path_factory.mktemp("qwen3-moe"))


def _prompts(pair) -> list[str]:
    prompts = builtin_set("all")[:6]
    # every row reaches far past its window
    assert min(len(p) for p in pair.encode(prompts)) > 3 * WINDOW
    return prompts


def test_the_mask_hides_what_left_the_window_counted_in_positions_and_the_cache_keeps_every_slot(
        sliding):
    _, _, pair = sliding
    assert set(sliding_windows(pair.target).values()) == {WINDOW}
    tokens, valid = left_pad([list(range(3, 23)), list(range(3, 13))], pair.device)
    valid[0, 12] = False  # a stale slot inside row 0: it takes no place in the window
    masks = attention_masks(pair.target, valid, 0)
    windowed = masks["sliding_attention"] if isinstance(masks, dict) else masks
    seen = windowed[:, 0] > torch.finfo(windowed.dtype).min / 2
    # 8 positions back, 12 skipped
    assert seen[0, 19].nonzero().flatten().tolist() == [11, 13, 14, 15, 16, 17, 18, 19]
    assert seen[1, 19].nonzero().flatten().tolist() == list(range(12, 20))
    # padding before the row is never seen
    assert seen[1, 14].nonzero().flatten().tolist() == [10, 11, 12, 13, 14]
    if isinstance(masks, dict):  # full layers still see the whole row
        full = masks["full_attention"][:, 0] > torch.finfo(windowed.dtype).min / 2
        assert full[1, 19].nonzero().flatten().tolist() == list(range(10, 20))
    cache = kvcache.new(pair.target)
    with torch.inference_mode():
        pair.target(input_ids=tokens, attention_mask=masks, cache=cache)
    assert kvcache.length(cache) == tokens.shape[1]


def test_the_reference_is_the_model_alone_past_its_window(sliding):
    _, _, pair = sliding
    prompts = pair.encode(_prompts(pair))[:2]
    assert [o.ids for o in reference(pair, prompts, NEW).outputs] == [
        plain_argmax(pair.target, ids, NEW, pair.vocab_size) for ids in prompts]


def test_teacher_forcing_reads_what_a_fresh_pass_reads_past_the_window(sliding):
    """The judge's own cache is cropped back to a shared prefix between prompts: with a sliding
    layer that kept only its window, the crop would cut the wrong slots."""
    _, _, pair = sliding
    forcing = enginenoise.TeacherForcing(pair.target, pair.vocab_size)
    output = list(range(100, 100 + 3 * WINDOW))
    for prompt in pair.encode(["Name three primes.", "Why is the sky blue?"]):
        fresh = fresh_logits(pair.target, prompt + output[:-1], len(output), pair.vocab_size)
        assert torch.allclose(forcing(prompt, output), fresh, rtol=0, atol=1e-9)


@pytest.mark.parametrize("method,drafter", [("batched-reference", "model"), ("eqspec", "model"),
                                            ("exspec", "model"), ("eqspec", "lookup")])
def test_every_method_writes_the_reference_past_the_window(sliding, method, drafter):
    target, draft, pair = sliding
    spec = RunSpec.build(target=target, draft=draft, dtype="float64", device="cpu",
                         prompts=tuple(_prompts(pair)), method=method, drafter=drafter,
                         batch_size=3, k=4, max_new_tokens=NEW)
    trace = run(spec)
    assert metrics.equivalence(trace)["exact"] == 1
    if method != "batched-reference" and drafter == "model":
        accepted = [r.accepted for r in trace.rows]
        # ragged acceptance: rows fall out of step, as in real runs
        assert 0 < sum(accepted) < 4 * len(accepted)


@pytest.mark.parametrize("fault,state", [("positions-from-slots", "positions"),
                                         ("no-kv-shift", "kv"), ("draft-bonus", "bonus")])
def test_a_planted_fault_is_named_on_a_sliding_window_pair(sliding, fault, state):
    target, draft, pair = sliding
    spec = RunSpec.build(target=target, draft=draft, dtype="float64", device="cpu",
                         prompts=tuple(_prompts(pair)), batch_size=3, k=4, max_new_tokens=NEW,
                         faults=(fault,))
    trace = run(spec)
    verdicts = [s.forensics.verdict for s in trace.sequences if s.forensics]
    assert verdicts and all(v == f"sync-bug:{state}" for v in verdicts), verdicts


def test_a_mixture_of_experts_decodes_as_the_model_alone_and_is_judged_in_float64(moe):
    target, draft, pair = moe
    prompts = _prompts(pair)
    ids = pair.encode(prompts)[:2]
    assert [o.ids for o in reference(pair, ids, NEW).outputs] == [
        plain_argmax(pair.target, i, NEW, pair.vocab_size) for i in ids]
    for faults, verdicts in (((), set()), (("positions-from-slots",), {"sync-bug:positions"})):
        spec = RunSpec.build(target=target, draft=draft, dtype="float64", device="cpu",
                             prompts=tuple(prompts), batch_size=3, k=4, max_new_tokens=NEW,
                             faults=faults)
        trace = run(spec)
        assert (metrics.equivalence(trace)["exact"] == 1) == (not faults)
        assert {s.forensics.verdict for s in trace.sequences if s.forensics} == verdicts


def test_a_float32_mixture_of_experts_gets_its_float64_truth(moe):
    target, draft, _ = moe
    pair = load_pair(target, draft, dtype="float32", device="cpu")
    ids = pair.encode(["Name three primes."])[0]
    truth = fresh_logits(float64_target(pair), ids, 1, pair.vocab_size)[0]
    assert float((truth - fresh_logits(pair.target, ids, 1, pair.vocab_size)[0]).abs().max()) < 1e-3


def test_attention_that_is_neither_full_nor_a_window_is_refused_at_load(tmp_path):
    path = _save(tmp_path / "chunked", "mistral", 2)
    config = AutoConfig.from_pretrained(path)
    config.sliding_window, config.attention_chunk_size = None, WINDOW  # Llama 4's chunked attention
    config.save_pretrained(path)
    with pytest.raises(SpecError, match=r"target .*chunked_attention"):
        load_pair(path, path, dtype="float64", device="cpu")


def test_alibi_attention_is_refused_at_load(tmp_path):
    """MPT's ALiBi biases count slots: one stale slot moved a float64 logit by 0.015 (the layouts'
    positions are not the model's)."""
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    torch.manual_seed(0)
    MptForCausalLM(MptConfig(vocab_size=len(tok), d_model=64, n_heads=4,
                             n_layers=2)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(SpecError, match="ALiBi"):
        load_pair(str(tmp_path), str(tmp_path), dtype="float64", device="cpu")
