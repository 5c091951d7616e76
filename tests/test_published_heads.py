"""Published EAGLE-3 and EAGLE-1 heads as drafters (models/eagle3.py and eagle1.py, the `eagle3`
and `eagle1` drafters): heads written in the layouts vLLM and SGLang load by
tests/published_heads.py, whose code shares nothing with specviz's loader. Every output is the
batch-size-1 reference's; every round's drafts are the ones the head's files give from scratch;
the aux layers an EAGLE-3 head heard, and whether its config named them, are recorded; what the
engines would refuse, or read wrongly, is refused with the reason."""
import json

import pytest
import torch
from published_heads import drafts_from_scratch, write_eagle1_head, write_eagle3_head
from safetensors.torch import load_file, save_file

from specviz.app.summary import headline
from specviz.app.views import md
from specviz.decoding.drafters import Eagle1Drafter, Eagle3Drafter
from specviz.decoding.eqspec import eqspec
from specviz.decoding.exspec import exspec
from specviz.decoding.reference import reference
from specviz.models.pairs import load_pair
from specviz.run.runner import run
from specviz.run.settings import Settings
from specviz.spec.faults import FAULTS
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics

K, NEW = 4, 24
PROMPTS = tuple(builtin_set("all")[:9])


def _fit(pair) -> list[list[int]]:
    """The sequences a head is fitted on: every other prompt and the target's greedy continuation
    (the others are out of its sample: it drafts worse there)."""
    ids = pair.encode(PROMPTS[::2])
    return [p + o.ids for p, o in zip(ids, reference(pair, ids, NEW).outputs)]


@pytest.fixture(scope="module")
def heads(tiny, tmp_path_factory):
    """Folders of heads over the tiny target: its config naming the aux layers, and naming none."""
    root, fit = tmp_path_factory.mktemp("eagle3"), _fit(tiny)
    return {"named": write_eagle3_head(root / "named", tiny.target, fit, [2, 1, 0]),
            "default": write_eagle3_head(root / "default", tiny.target, fit, None),
            "norm-before-fc": write_eagle3_head(root / "nbfc", tiny.target, fit, [2, 1, 0],
                                                norm_before_fc=True),
            "eagle1": write_eagle1_head(root / "eagle1", tiny.target, fit)}


def _spec(folder, drafter="eagle3", **kw) -> RunSpec:
    fields = dict(target=TINY_TARGET, draft=TINY_DRAFT, prompts=PROMPTS[:6], method="eqspec",
                  drafter=drafter, head=str(folder), batch_size=3, k=K, max_new_tokens=NEW,
                  dtype="float64", device="cpu") | kw
    return RunSpec.build(**fields)


@pytest.mark.parametrize("width", [1, 2])
@pytest.mark.parametrize("decoder", [eqspec, exspec])
@pytest.mark.parametrize(("drafter", "head"), [(Eagle3Drafter, "named"),
                                               (Eagle1Drafter, "eagle1")])
def test_a_published_head_drafts_to_the_reference_exactly(tiny, heads, drafter, head, decoder,
                                                          width):
    prompts = tiny.encode(PROMPTS)
    kw = dict(window=6, max_wait=4) if decoder is exspec else {}
    out = decoder(tiny, prompts, 3, K, NEW, drafter=drafter(tiny, K, width, str(heads[head])),
                  **kw)
    assert [o.ids for o in out.outputs] == [o.ids for o in reference(tiny, prompts, NEW).outputs]
    accepted = torch.cat([r.ints["accepted"] for r in out.rounds])
    # ragged: rows took every draft, some, and none, so every way of re-feeding the head ran
    assert (accepted == K).sum() >= 5 and (accepted == 0).sum() >= 5
    assert ((accepted > 0) & (accepted < K)).sum() >= 5


def test_a_published_head_in_float32_decodes_to_the_float32_reference(heads):
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype="float32", device="cpu")
    prompts = pair.encode(PROMPTS)
    out = eqspec(pair, prompts, 4, K, NEW, drafter=Eagle3Drafter(pair, K, 1, str(heads["named"])))
    assert [o.ids for o in out.outputs] == [o.ids for o in reference(pair, prompts, NEW).outputs]
    assert sum(int(r.ints["accepted"].sum()) for r in out.rounds) > 0


@pytest.mark.parametrize(("drafter", "head", "method"), [
    ("eagle3", "named", "eqspec"), ("eagle3", "named", "exspec"), ("eagle1", "eagle1", "eqspec")])
def test_every_rounds_drafts_are_the_heads_files_own_from_scratch(tiny, heads, drafter, head,
                                                                   method):
    spec = _spec(heads[head], drafter, method=method)
    trace = run(spec)
    prompt_ids, checked = tiny.encode(spec.prompts), 0
    for seq in trace.sequences:
        have = 0
        for r in sorted((r for r in trace.rows if r.seq == seq.seq), key=lambda r: r.round):
            if r.draft_tokens:
                ids = prompt_ids[seq.seq] + seq.output_ids[:have]
                fresh = drafts_from_scratch(heads[head], tiny.target, ids, len(r.draft_tokens))
                assert r.draft_tokens == fresh, (seq.seq, r.round)
                checked += 1
            have += len(r.emitted)
    assert checked >= 20
    assert metrics.equivalence(trace)["exact"] == 1
    a = trace.acceptance  # the acceptance judge's own replay hears the same aux layers
    assert a.verdict is None and a.beyond == 0 and a.compared >= checked, a.explanation
    facts = trace.manifest.head
    if drafter == "eagle1":  # it hears the target's last state: nothing to say beyond the run's
        assert facts is None
        return
    assert (facts.aux_layers, facts.fell_back) == ([0, 1, 2], False)  # in layer order
    assert 0.5 < facts.coverage < 1  # out of its sample, the target writes tokens it cannot draft
    assert "aux layers 0, 1, 2 (named by its config)" in facts.describe()
    assert md(facts.describe()) in headline(trace)


def test_a_config_naming_no_aux_layers_falls_back_as_the_engines_do_and_says_so(tiny, heads):
    trace = run(_spec(heads["default"], prompts=PROMPTS[:3]))
    head = trace.manifest.head
    assert (head.aux_layers, head.fell_back) == ([0, 1, 2], True)  # 2, L/2, L-3 for 3 layers
    assert "the engines' default: its config names none" in head.describe()
    assert metrics.equivalence(trace)["exact"] == 1


def test_a_variant_the_engines_load_is_read_and_named(tiny, heads):
    """norm_before_fc: one RMSNorm over the aux states before `fc`, a weight the head ships."""
    trace = run(_spec(heads["norm-before-fc"], prompts=PROMPTS[:3]))
    assert trace.manifest.head.variants == ["norm_before_fc"]
    assert metrics.equivalence(trace)["exact"] == 1
    # without the variant's weight its layout is not the published one
    folder = heads["norm-before-fc"]
    weights = load_file(folder / "model.safetensors")
    assert "input_norm.weight" in weights
    broken = folder.parent / "nbfc-without-norm"
    broken.mkdir()
    (broken / "config.json").write_text((folder / "config.json").read_text())
    save_file({k: v for k, v in weights.items() if k != "input_norm.weight"},
              broken / "model.safetensors")
    with pytest.raises(SpecError, match="does not have the published layout: missing"):
        run(_spec(broken, prompts=PROMPTS[:1]))


def test_a_published_heads_lossless_bug_is_named_by_the_acceptance_judge(heads):
    """vLLM #14647: the head fed the target's state two slots back. (The other head fault,
    #14649, corrupts only the head's cache, which these heads' attention never writes from: see
    test_heads.py, whose head attends.)"""
    fault = "head-hidden-off-by-one"
    trace = run(_spec(heads["named"], faults=(fault,)))
    assert metrics.equivalence(trace)["exact"] == 1
    a = trace.acceptance
    assert a.verdict == FAULTS[fault].acceptance and a.beyond > 0, a.explanation


def test_what_a_head_cannot_be_is_refused_with_the_reason(tiny, heads, tmp_path):
    with pytest.raises(SpecError, match="drafts with an EAGLE-3 head: give its folder"):
        RunSpec.build(prompts=("Hello",), drafter="eagle3")
    with pytest.raises(SpecError, match="no EAGLE-3 head at"):
        run(_spec(tmp_path / "nowhere", prompts=PROMPTS[:1]))
    # a page loads a head's files as it loads a model's: never a local path when public
    public = Settings.from_env({"SPECVIZ_PUBLIC": "1", "SPECVIZ_ALLOWED_MODELS": "*"})
    with pytest.raises(SpecError, match="published head model .* is a local path; this server is "
                                        "public"):
        public.check(_spec(heads["named"]))
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((heads["named"] / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(SpecError, match="pytorch_model.bin are pickles, which specviz never"):
        run(_spec(pickled, prompts=PROMPTS[:1]))
    for name, change, refusal in [
            ("ids", lambda raw, w: w.update(d2t=w["d2t"] + torch.arange(len(w["d2t"]))),
             "outside the target's 49152 ids: is its d2t ids, not offsets"),
            ("far", lambda raw, w: raw.update(eagle_aux_hidden_state_layer_ids=[2, 1, 7]),
             r"hears layers \[1, 2, 7\], but its target has 3"),
            ("deep", lambda raw, w: raw.update(num_hidden_layers=2), "has 2 layers")]:
        folder = tmp_path / name
        folder.mkdir()
        raw = json.loads((heads["named"] / "config.json").read_text())
        weights = load_file(heads["named"] / "model.safetensors")
        change(raw, weights)
        (folder / "config.json").write_text(json.dumps(raw))
        save_file(weights, folder / "model.safetensors")
        with pytest.raises(SpecError, match=refusal):
            run(_spec(folder, prompts=PROMPTS[:1]))


def test_the_page_and_its_share_link_carry_the_head(heads):
    from specviz.app import form
    from specviz.app import runview as ui
    from specviz.trace import share

    spec = form.spec_from_controls(drafter="eagle3", head=f"  {heads['named']} ")
    assert (spec.drafter, spec.head) == ("eagle3", str(heads["named"]))
    opened = ui.open_link(share.encode_link(share.Link(spec)))
    values = {n: opened[n] for n in form.DEFAULTS}
    assert values["head"] == str(heads["named"]) and form.spec_from_controls(**values) == spec
    # another drafter leaves the (hidden) box unread
    assert form.spec_from_controls(drafter="model", head="ignored").head is None
    with pytest.raises(SpecError, match="give its folder"):
        form.spec_from_controls(drafter="eagle3")
