"""Big targets: a target spread by accelerate (device_map="auto", max_memory).

Without GPUs the spread that can be made here is CPU memory plus disk: accelerate
then hooks the target's layers exactly as it does across GPUs (weights brought to
the execution device, the cache kwarg left alone), which is what the engine must
survive. Tensors crossing between two GPUs are not exercised here."""
import pytest
import torch
from transformers import AutoTokenizer

from specviz.decoding.eqspec import eqspec
from specviz.decoding.reference import reference
from specviz.models.checkpoints import embedded_tokenizer_dir
from specviz.models.draft import layer_subset
from specviz.models.pairs import Placement, load_pair, parse_max_memory, tiny_target
from specviz.spec.run import TINY_DRAFT, TINY_TARGET
from specviz.spec.strict import SpecError

# The tiny target's embedding (25.2 MB in float64) and its first layer fit; the rest goes to disk.
CPU_AND_DISK = "cpu=26MB"


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """The tiny pair saved as a local target and draft: the kind of pair that can be spread."""
    root = tmp_path_factory.mktemp("tiny")
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    target = tiny_target(torch.float64)
    for name, model in (("target", target), ("draft", layer_subset(target, [0, 1]))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return str(root / "target"), str(root / "draft")


def test_max_memory_parses_to_accelerates_form():
    assert (parse_max_memory("0=20GiB, 1=20GiB,cpu=64GiB")
            == {0: "20GiB", 1: "20GiB", "cpu": "64GiB"})
    with pytest.raises(SpecError, match="expected DEVICE=SIZE, DEVICE a GPU index or cpu"):
        parse_max_memory("gpu0=20GiB")
    with pytest.raises(SpecError, match="'lots' is not a size like 20GiB"):
        parse_max_memory("0=lots")
    with pytest.raises(SpecError, match="max memory is empty"):
        parse_max_memory(" , ")


def test_built_in_pairs_and_an_explicit_cpu_device_refuse_to_spread(tiny_dirs):
    with pytest.raises(SpecError, match="needs a Hub or local target and device auto or cuda"):
        load_pair(TINY_TARGET, TINY_DRAFT, dtype="float64", device="auto",
                  placement=Placement(spread=True))
    with pytest.raises(SpecError, match="needs a Hub or local target"):
        load_pair(*tiny_dirs, dtype="float64", device="cpu", placement=Placement(spread=True))


def test_a_target_spread_by_accelerate_decodes_exactly_as_on_one_device(tiny, tiny_dirs,
                                                                        mixed_prompts):
    spread = load_pair(*tiny_dirs, dtype="float64", device="auto",
                       placement=Placement(True, CPU_AND_DISK))
    assert (spread.target.hf_device_map["model.embed_tokens"] == "cpu"
            and "disk" in spread.target.hf_device_map.values())
    assert spread.info["target_devices"] == "cpu,disk"
    assert spread.device == torch.device("cpu")  # the draft sits where the target takes its inputs
    assert next(spread.draft.parameters()).device == spread.device

    prompts = mixed_prompts[:5]
    ref = reference(tiny, prompts, 12)
    assert [o.ids for o in reference(spread, prompts, 12).outputs] == [o.ids for o in ref.outputs]
    plain, hooked = (eqspec(p, prompts, 3, 3, 12) for p in (tiny, spread))
    assert ([o.ids for o in hooked.outputs] == [o.ids for o in plain.outputs]
            == [o.ids for o in ref.outputs])
    assert any(r.realigned for r in hooked.rounds)  # the caches were gathered, layer by layer
