"""The yardstick kept on disk (forensics/yardstick_cache.py): a later measurement of the same model
on the same sequences reads it back and judges with the very same Rounding; a corrupt, stale or
foreign entry is measured again, never trusted; other weights are another key; the CLI and the page
go through it."""
import copy
import json

import pytest
import torch

from specviz.app import serving
from specviz.cli import main as cli
from specviz.forensics import yardstick, yardstick_cache
from specviz.models.pairs import load_pair
from specviz.run import runner
from specviz.run.settings import Settings
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec

DIRECTORY = yardstick_cache.directory  # read before conftest points each test at its own folder
TINY = ["--pair", "tiny", "--dtype", "float32", "--device", "cpu"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """$SPECVIZ_CACHE in a fresh folder, measurements kept where the package keeps them; the list of
    models yardstick.sample measured."""
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(yardstick_cache, "directory", DIRECTORY)
    calls = []
    measure = yardstick.sample

    def counted(*args, **kwargs):
        calls.append(args[0])
        return measure(*args, **kwargs)
    monkeypatch.setattr(yardstick, "sample", counted)
    return calls


def _fresh_memory(monkeypatch):
    """The runner's in-memory caches emptied for this test alone, as a new process finds them."""
    for name in ("_REFERENCES", "_BATCHED", "_CALIBRATION", "_ROUNDING", "_CHECKED"):
        monkeypatch.setattr(runner, name, runner.PerPair(getattr(runner, name).size))


@pytest.fixture(scope="module")
def pair():
    return load_pair(TINY_TARGET, TINY_DRAFT, dtype="float32", device="cpu")


def _recall(model, pair):
    sequences = pair.encode(builtin_set("quick"))
    return yardstick_cache.recall(model, "target", "the quick prompts", sequences, pair.vocab_size)


def test_a_second_measurement_reads_the_cache_and_gives_the_same_rounding(cache, pair, tmp_path):
    with yardstick_cache.recording() as heard:
        first = _recall(pair.target, pair)
        second = _recall(pair.target, pair)
    assert len(cache) == 1 and [x.cached for x in heard] == [False, True]
    assert len(list((tmp_path / "yardsticks").glob("target-*.json"))) == 1  # under $SPECVIZ_CACHE
    assert torch.equal(first.errors, second.errors) and torch.equal(first.relative, second.relative)
    assert (first.seen, first.sequences, first.largest_logit) == (second.seen, second.sequences,
                                                                  second.largest_logit)
    assert yardstick.rounding(first, pair.dtype, 6) == yardstick.rounding(second, pair.dtype, 6)


def _entry(tmp_path):
    (path,) = (tmp_path / "yardsticks").glob("*.json")
    return path


def _truncated(data):
    data["errors"] = data["errors"][:-1]
    return data


def _foreign(data):
    data["key"]["weights"] = "0" * 64
    return data


def _old(data):
    data["key"]["version"] -= 1
    return data


def _wordy(data):
    data["seen"] = [["a"]]
    return data


@pytest.mark.parametrize("spoil", [lambda text: text[: len(text) // 2], lambda text: "[]",
                                   *(lambda text, edit=edit: json.dumps(edit(json.loads(text)))
                                     for edit in (_truncated, _foreign, _old, _wordy))],
                         ids=["half-written", "not-an-entry", "shapes", "key", "version", "seen"])
def test_a_corrupt_or_foreign_entry_is_measured_again_and_replaced(cache, pair, tmp_path, spoil):
    first = _recall(pair.target, pair)
    path = _entry(tmp_path)
    path.write_text(spoil(path.read_text()))
    again = _recall(pair.target, pair)
    assert len(cache) == 2 and torch.equal(first.errors, again.errors)
    assert _entry(tmp_path) == path and json.loads(path.read_text())["key"]["version"] == (
        yardstick.MEASUREMENT_VERSION)  # replaced whole


def test_another_yardstick_version_is_measured_again(cache, pair, monkeypatch):
    _recall(pair.target, pair)
    monkeypatch.setattr(yardstick, "MEASUREMENT_VERSION", yardstick.MEASUREMENT_VERSION + 1)
    _recall(pair.target, pair)
    assert len(cache) == 2


def test_changed_weights_change_the_key(cache, pair):
    model = copy.deepcopy(pair.target)
    before = yardstick_cache.weights_fingerprint(model)
    _recall(model, pair)
    with torch.no_grad():  # one weight, in place: the same model object, not its checkpoint files
        model.model.layers[0].mlp.down_proj.weight[0, 0] += 1e-6
    assert yardstick_cache.weights_fingerprint(model) != before
    _recall(model, pair)
    assert len(cache) == 2
    same = copy.deepcopy(pair.target)
    assert yardstick_cache.weights_fingerprint(same) == before  # the bytes, not the object
    _recall(same, pair)
    assert len(cache) == 2


def test_a_later_cli_run_says_its_yardstick_came_from_the_cache(cache, tmp_path, capsys,
                                                                monkeypatch):
    argv = ["run", *TINY, "--prompt", "Hi", "--max-new-tokens", "8", "--trace"]
    traces = []
    for i in range(2):
        _fresh_memory(monkeypatch)
        traces.append(tmp_path / f"{i}.json")
        assert cli.main([*argv, str(traces[-1])]) == 0
        out = capsys.readouterr().out.splitlines()
        lines = [x for x in out if x.startswith("judged against")]
        assert len(lines) == 1 and lines[0].endswith(", cached)" if i else "cached for later runs)")
    assert "(measured on " in lines[0]
    assert len(cache) == 2  # the built-in prompts, then the continuations: once each
    first, second = (json.loads(t.read_text())["manifest"]["yardstick"] for t in traces)
    assert first == second


def test_the_page_measures_through_the_same_cache(cache, monkeypatch):
    spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT, dtype="float32", device="cpu",
                         prompts=("Hi",), max_new_tokens=8)
    _fresh_memory(monkeypatch)
    cli.main(["run", *TINY, "--prompt", "Hi", "--max-new-tokens", "8"])
    _fresh_memory(monkeypatch)
    with yardstick_cache.recording() as heard:
        trace = serving.decode_on_gpu(spec, Settings())
    assert heard and all(x.cached for x in heard) and len(cache) == 2
    assert trace.manifest.yardstick.target is not None
