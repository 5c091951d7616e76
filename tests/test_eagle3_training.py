"""Training an EAGLE-3 head by the recipe of run/eagle3_training.py, on the tiny pair, a few steps:
its loss falls, and the head it writes keeps the published layout: read back from its files (as
vLLM would read them), it drafts to the batch-size-1 reference exactly, and its drafts are its
own."""
import dataclasses

import pytest

from specviz.models.builtinheads import head_folder, write_head
from specviz.models.eagle3 import default_aux_layers
from specviz.models.pairs import load_pair
from specviz.run.eagle3_training import RECIPE, published, started, train
from specviz.run.head_training import examples
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import EMBEDDED_TARGET, TINY_DRAFT, TINY_TARGET, TRAINED_HEAD, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace import metrics

SMALL = dataclasses.replace(RECIPE, steps=8, tokens_per_step=256, new_tokens=24, sampled=0,
                            learning_rate=1e-3)


def test_a_head_trained_so_learns_and_is_read_back_as_published(tmp_path):
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype="float32", device="cpu")
    aux = sorted(set(default_aux_layers(pair.target.config.num_hidden_layers)))
    data = examples(pair, builtin_set("quick"), SMALL, heard=tuple(aux))
    head, files = started(pair.target, data, aux)
    losses = train(head, data, pair.vocab_size, SMALL)
    assert losses[-1] < losses[0], losses
    write_head(tmp_path, *published(head, files))
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, drafter="eagle3",
                         head=str(tmp_path), prompts=tuple(builtin_set("all")[:6]), k=3,
                         batch_size=3, max_new_tokens=16, dtype="float64")
    trace = run(spec)
    assert metrics.equivalence(trace)["exact"] == 1
    assert trace.acceptance.verdict is None, trace.acceptance.explanation
    assert list(trace.manifest.head.aux_layers) == aux and not trace.manifest.head.fell_back


def test_the_trained_head_is_refused_until_this_machine_has_trained_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    with pytest.raises(SpecError, match="run `specviz train-head --eagle3` once"):
        head_folder(TRAINED_HEAD, None, EMBEDDED_TARGET)
    with pytest.raises(SpecError, match="trains an EAGLE-3 head for specviz:smollm2-135m only"):
        head_folder(TRAINED_HEAD, None, TINY_TARGET)
