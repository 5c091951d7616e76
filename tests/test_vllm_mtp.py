"""vLLM's `mtp` mode, drafting with the MTP layer a checkpoint ships, judged from outside by `check
--engine-drafter mtp`: against transformers' reading of the same files, and its acceptance against
specviz's replay of the MTP layer on the engine's committed tokens. Two layouts
(tests/mtp_checkpoints.py): a tiny DeepSeek-V3 at the latent-attention sizes vLLM's CPU_MLA
computes, and the embedded target as a MiMo model, with an MTP layer copied from its first layer
(which transformers does not read: specviz reads it as vLLM does, models/mtplayouts.py).

vLLM's eager mode runs its CPU rotary-embedding kernel, which misreads latent attention's strided
query and key views (docs/engines.md): served so, the engine computes another function than the
model, with or without speculation, and specviz must not put that down to rounding. Served with
vLLM's PyTorch rope, it is the reference. One server at a time (each holds about 3 GiB)."""
import pytest
from conftest import ENGINE_THREADS
from mtp_checkpoints import mimo_of, save

from specviz.engines.vllm import vllm_python, vllm_server
from specviz.models.checkpoints import embedded_target_dir
from specviz.models.pairs import load_pair
from specviz.run import check
from specviz.spec.prompts import builtin_set
from specviz.spec.run import ENGINE, RunSpec

K, NEW = 3, 24


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The mtp mode's check: the DeepSeek-V3 with vLLM's PyTorch rope ("native") and with its CPU
    kernel ("kernel"), and the embedded target as a MiMo model ("mimo")."""
    vllm_python()  # without `make vllm`, this says so
    root = tmp_path_factory.mktemp("vllm-mtp")
    models = {"deepseek-v3": save(root / "deepseek-v3", "deepseek-v3-vllm"),
              "mimo": mimo_of(root / "mimo", embedded_target_dir())}
    served = {"native": ("deepseek-v3", dict(attention="CPU_MLA", native_rope=True)),
              "kernel": ("deepseek-v3", dict(attention="CPU_MLA")), "mimo": ("mimo", {})}
    traces = {}
    for name, (model, settings) in served.items():
        pair = load_pair(models[model], models[model], dtype="float32", device="cpu")
        spec = RunSpec.build(target=models[model], draft=models[model], method=ENGINE, k=K,
                             prompts=tuple(builtin_set("quick")), max_new_tokens=NEW,
                             dtype="float32", device="cpu")
        with vllm_server("mtp", root / f"{name}.log", k=K, eager=True, model=root / model,
                         threads=ENGINE_THREADS, **settings) as server:
            traces[name] = check.from_servers(spec, pair, (server.url, server.served_model), None,
                                              8, 300.0, drafter="mtp")
    return traces


def test_vllm_drafting_with_the_models_mtp_layer_is_the_reference(runs):
    """With its PyTorch rope: every output is transformers' float32 reference, and its acceptance
    is not short of the MTP layer's own replayed by specviz. At the first draft position, where
    the layer drafts from the target's own state, by as much as the replay's (a loader not ours
    reads the layer where specviz does); the later positions, which about 30 drafts each reach
    here, are left to the judge's test."""
    trace = runs["native"]
    assert all(s.equivalent for s in trace.sequences), [s.first_divergence
                                                        for s in trace.sequences]
    assert trace.manifest.engine.settings["drafter"] == "mtp"
    a = trace.acceptance
    assert a.counters and a.verdict is None, a.explanation
    assert a.accepted > 0.2 * a.compared, a.explanation  # the layer drafts its target's text
    assert len(a.per_position) == K
    assert abs(a.per_position[0] - a.per_position_fresh[0]) <= 0.1, a.explanation


def test_vllms_rope_kernel_on_latent_attention_is_never_put_down_to_rounding(runs):
    """With its CPU rope kernel the engine departs from the model far beyond transformers'
    rounding, and nothing bounds its own: each fork is `unexplained`, saying what evidence is
    missing, never `numerics` (nor a speculation bug: nothing shows speculation caused it)."""
    forks = [s.forensics for s in runs["kernel"].sequences if s.forensics]
    assert forks, "the kernel's rope should move the engine's tokens"
    for f in forks:
        assert f.verdict == "unexplained", f.explanation
        assert "Missing evidence" in f.explanation or "missing" in f.explanation, f.explanation


def test_vllm_drafting_with_a_mimo_models_mtp_layer_is_the_embedded_targets_reference(runs):
    """The embedded target as a MiMo model (the Qwen2 model that computes SmolLM2's function), in
    vLLM's mtp mode: every output is the reference, and its acceptance, of a layer copied from the
    target's first (vLLM and specviz each read it their own way), is not short of specviz's
    replay."""
    trace = runs["mimo"]
    assert all(s.equivalent for s in trace.sequences), [s.first_divergence
                                                        for s in trace.sequences]
    a = trace.acceptance
    assert a.counters and a.compared > 0 and a.verdict is None, a.explanation
