"""The target's own multi-token-prediction (MTP) layer as the drafter (models/heads.py `MtpHead`,
loaded by transformers' `MtpModel`), on tiny checkpoints that ship one (mtp_checkpoints.py): every
output is the batch-size-1 reference's, every draft is the one transformers' own MTP layer writes
from a fresh pass, transformers' own MTP generation agrees, and a head's bug is named
by its side."""
import json
import shutil

import pytest
import torch
from mtp_checkpoints import FAMILIES, save
from safetensors.torch import load_file, save_file
from transformers.modeling_layers import MtpModel

from specviz.decoding.drafters import MtpDrafter
from specviz.decoding.eqspec import eqspec
from specviz.decoding.exspec import exspec
from specviz.decoding.reference import reference
from specviz.models.pairs import load_pair
from specviz.run import check
from specviz.run.runner import run
from specviz.spec.faults import FAULTS
from specviz.spec.prompts import builtin_set
from specviz.spec.run import ENGINE, TINY_DRAFT, TINY_HYBRID, TINY_TARGET, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics

K, NEW = 4, 24


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return {family: save(tmp_path_factory.mktemp(family), family) for family in FAMILIES}


def _pair(checkpoints, family: str, dtype: str = "float64"):
    return load_pair(checkpoints[family], checkpoints[family], dtype=dtype, device="cpu")


def _spec(path: str, **kw) -> RunSpec:
    return RunSpec.build(**{"target": path, "draft": path, "prompts": tuple(builtin_set("all")[:6]),
                            "drafter": "mtp", "batch_size": 3, "k": K, "max_new_tokens": NEW,
                            "dtype": "float64", "device": "cpu", **kw})


@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("decoder", [eqspec, exspec])
def test_an_mtp_layer_drafts_to_the_reference_exactly(checkpoints, decoder, batch_size):
    pair = _pair(checkpoints, "mellum")
    prompts = pair.encode(builtin_set("all")[:9])
    kw = dict(window=2 * batch_size, max_wait=4) if decoder is exspec else {}
    out = decoder(pair, prompts, batch_size, K, NEW, drafter=MtpDrafter(pair, K), **kw)
    assert [o.ids for o in out.outputs] == [o.ids for o in reference(pair, prompts, NEW).outputs]
    accepted = torch.cat([r.ints["accepted"] for r in out.rounds])
    # rows kept several drafts: the slots the layer drafted are fed again
    assert (accepted >= 2).sum() >= 5


@pytest.mark.parametrize("family,dtype", [("mellum", "float32"), ("bailing-hybrid", "float64"),
                                          ("deepseek-v3", "float64"),
                                          ("deepseek-v3-small", "float64"),
                                          ("mimo", "float64"), ("qwen3.5", "float64"),
                                          ("qwen3.5", "float32")])
@pytest.mark.parametrize("decoder", [eqspec, exspec])
def test_every_family_and_dtype_decodes_as_the_model_alone(checkpoints, family, dtype, decoder):
    pair = _pair(checkpoints, family, dtype)
    prompts = pair.encode(builtin_set("all")[:6])
    kw = dict(window=6, max_wait=4) if decoder is exspec else {}
    out = decoder(pair, prompts, 3, K, 16, drafter=MtpDrafter(pair, K), **kw)
    assert [o.ids for o in out.outputs] == [o.ids for o in reference(pair, prompts, 16).outputs]
    assert sum(int(r.ints["accepted"].sum()) for r in out.rounds) >= 10


def _transformers_drafts(pair, mtp: MtpModel, ids: list[int], k: int) -> list[int]:
    """The MTP layer's greedy drafts after `ids` from transformers' own module, from scratch: the
    target's hidden states from one batch-size-1 pass, then the layer over the whole sequence for
    each draft (no cache), fed its own output after the last token."""
    hidden = pair.target(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1]
    tokens, fed = list(ids), torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], 1)
    drafts = []
    for _ in range(k):
        out = mtp.forward_layer(0, fed, torch.arange(len(tokens))[None], None,
                                input_ids=torch.tensor([tokens]))
        drafts.append(int(mtp._project_to_logits(out[:, -1])[0, : pair.vocab_size].argmax()))
        tokens, fed = tokens + drafts[-1:], torch.cat([fed, out[:, -1:]], 1)
    return drafts


@pytest.mark.parametrize("family", ["bailing-hybrid", "deepseek-v3"])
def test_every_rounds_drafts_are_transformers_own_mtp_layers(checkpoints, family):
    spec = _spec(checkpoints[family], prompts=tuple(builtin_set("all")[:4]), max_new_tokens=12)
    trace = run(spec)
    pair = _pair(checkpoints, family)
    mtp = MtpModel.from_pretrained(pair.target).double()
    prompt_ids, checked = pair.encode(spec.prompts), 0
    for seq in trace.sequences:
        have = 0
        for r in sorted((r for r in trace.rows if r.seq == seq.seq), key=lambda r: r.round):
            if r.draft_tokens:
                ids = prompt_ids[seq.seq] + seq.output_ids[:have]
                assert r.draft_tokens == _transformers_drafts(
                    pair, mtp, ids, len(r.draft_tokens)), (seq.seq, r.round)
                checked += 1
            have += len(r.emitted)
    assert checked >= 8
    assert all(all(r.checks.values()) for r in trace.rows)
    a = trace.acceptance  # the acceptance judge's own replay agrees
    assert a.verdict is None and a.beyond == 0 and a.compared >= checked, a.explanation
    assert metrics.equivalence(trace)["exact"] == 1


def test_transformers_own_mtp_generation_writes_what_specviz_writes(checkpoints):
    trace = run(_spec(checkpoints["mellum"], method="hf-assisted", batch_size=1,
                      prompts=tuple(builtin_set("all")[:3])))
    assert metrics.equivalence(trace)["exact"] == 1


def test_an_mtp_layers_lossless_bug_is_named_by_its_side(checkpoints):
    """vLLM #14647: the hidden states fed one slot off. (A layer that keeps its own guesses, vLLM
    #14649, drafts the same tokens on this checkpoint: the hidden state's share in its input is too
    small to change one.)"""
    fault = "head-hidden-off-by-one"
    trace = run(_spec(checkpoints["mellum"], faults=(fault,),
                      prompts=tuple(builtin_set("all")[:5])))
    assert metrics.equivalence(trace)["exact"] == 1
    a = trace.acceptance
    assert a.verdict == FAULTS[fault].acceptance and a.beyond > 0, a.explanation


def test_mtp_trees_decode_as_the_model_alone_and_hybrids_refuse_them(checkpoints):
    pair = _pair(checkpoints, "mellum")
    prompts = pair.encode(builtin_set("all")[:6])
    out = eqspec(pair, prompts, 3, K, 16, drafter=MtpDrafter(pair, K, 2))
    assert [o.ids for o in out.outputs] == [o.ids for o in reference(pair, prompts, 16).outputs]
    with pytest.raises(SpecError, match="recurrent state"):
        MtpDrafter(_pair(checkpoints, "bailing-hybrid"), K, 2)


def test_a_model_without_mtp_layers_is_refused_with_the_reason(tiny):
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, prompts=("Hello",), drafter="mtp",
                         device="cpu")
    with pytest.raises(SpecError, match="ships no multi-token-prediction"):
        run(spec)


def test_a_qwen35_model_without_mtp_layers_is_refused_with_the_reason():
    """The tiny hybrid is a Qwen3.5 model that ships no `mtp.` weights."""
    spec = RunSpec.build(target=TINY_HYBRID, draft=TINY_HYBRID, prompts=("Hello",), drafter="mtp",
                         device="cpu")
    with pytest.raises(SpecError, match=r"a Qwen3\.5 model without MTP layers \(no mtp\.\*"):
        run(spec)


def test_a_mimo_model_without_mtp_layers_is_refused_with_the_reason(checkpoints, tmp_path):
    shutil.copytree(checkpoints["mimo"], tmp_path / "mimo")
    weights = tmp_path / "mimo" / "model.safetensors"
    save_file({k: w for k, w in load_file(weights).items() if ".mtp_layers." not in k}, weights,
              metadata={"format": "pt"})
    spec = _spec(str(tmp_path / "mimo"), prompts=("Hello",), max_new_tokens=4)
    with pytest.raises(SpecError, match="a MiMo model without MTP layers"):
        run(spec)


def _engine_file(pair, mtp: MtpModel, prompts: list[list[int]], late: bool) -> bytes:
    """The outputs file of an engine outside specviz that speculates with transformers' own MTP
    layer, k drafts a round, and counts its drafts and accepted ones per request. Its output is
    the target's own greedy text (transformers' `generate`); `late`: it drafts without the token
    the target wrote last (vllm-metal PR #721), a lossless bug."""
    lines = [{"engine": {"name": "mtp-engine", "settings": {"k": K, "drafter": "mtp"}}}]
    for ids in prompts:
        out = pair.target.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                                   attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   pad_token_id=0)[0, len(ids):].tolist()
        drafts = accepted = at = 0
        while at < len(out):
            m = min(K, len(out) - at)
            prefix = ids + out[:at]
            proposed = _transformers_drafts(pair, mtp, prefix[:-1] if late else prefix, m)
            a = next((j for j in range(m) if proposed[j] != out[at + j]), m)
            drafts, accepted, at = drafts + m, accepted + a, at + a + 1
        lines.append({"prompt_ids": ids, "output_ids": out, "drafts": drafts,
                      "accepted": accepted})
    return "\n".join(json.dumps(line) for line in lines).encode()


def test_an_engine_drafting_with_the_models_mtp_layer_is_judged_by_its_counters(checkpoints):
    """An engine that says it drafts with the model's MTP layer (`check --engine-drafter mtp`):
    its counters are set beside specviz's replay of the layer on its outputs; a correct one is
    not short, one that drafts without the target's last token is."""
    pair = _pair(checkpoints, "mellum")
    mtp = MtpModel.from_pretrained(pair.target).double()
    prompts = builtin_set("all")[:3]
    spec = RunSpec.build(target=checkpoints["mellum"], draft=checkpoints["mellum"],
                         prompts=tuple(prompts), method=ENGINE, k=K, max_new_tokens=NEW,
                         dtype="float64", device="cpu", drafter="mtp")
    judged = {late: check.from_files(spec, pair, (_engine_file(pair, mtp, pair.encode(prompts),
                                                               late), "mtp.jsonl"),
                                     drafter="mtp").acceptance
              for late in (False, True)}
    assert judged[False].counters and judged[False].verdict is None, judged[False].explanation
    assert judged[True].verdict == "draft-bug:acceptance", judged[True].explanation
    assert judged[True].accepted < judged[False].accepted
