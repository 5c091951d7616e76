"""specviz shrink: a divergent run reduced to a smaller one that forks at the same token, as a share link."""
import pytest

from specviz.app import views
from specviz.cli import main as cli
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import RunSpec
from specviz.trace import share
from specviz.trace.schema import Trace


def _spec(faults) -> RunSpec:
    return RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float32", device="cpu",
                         prompts=tuple(builtin_set("all")[:8]), batch_size=4, k=5, max_new_tokens=32, faults=faults)


@pytest.mark.parametrize("faults", [("bsp-like",), ("dsd-like",)])
def test_shrink_keeps_the_fork_in_a_smaller_run_and_links_to_it(faults, tmp_path, capsys, tiny):
    original = run(_spec(faults))
    path = tmp_path / "trace.json"
    path.write_text(original.to_json())
    seq = next(s for s in original.sequences if s.equivalent is False)
    assert cli.main(["shrink", "--trace", str(path), "--out", str(tmp_path / "small.json")]) == 0
    small = Trace.from_json((tmp_path / "small.json").read_text())
    spec = small.manifest.spec
    # Smaller on every axis it could shrink, never larger.
    assert len(spec.prompts) < len(original.prompts) and spec.max_new_tokens < original.manifest.spec.max_new_tokens
    assert spec.batch_size <= original.manifest.spec.batch_size and spec.k <= original.manifest.spec.k
    # The same prompt forks at the same token, with the same token, still a sync bug.
    here = spec.prompts.index(original.prompts[seq.seq].text)
    kept = small.sequences[here]
    assert kept.first_divergence == seq.first_divergence
    assert kept.output_ids[kept.first_divergence] == seq.output_ids[seq.first_divergence]
    assert kept.forensics.verdict.startswith("sync-bug:")
    # The printed link replays that run and opens on the fork: that sequence, the round that emitted it.
    out = capsys.readouterr().out
    link = share.decode(out.split("share link: ")[1].splitlines()[0].split("?", 1)[1])
    assert link.spec == spec and link.seq == here and link.fingerprint == small.manifest.fingerprint
    replayed = run(link.spec)
    assert replayed.manifest.fingerprint == small.manifest.fingerprint
    focus, note = views.resolve(replayed, link.seq, link.round)
    assert note == "" and focus.round == replayed.sequences[here].forensics.round


def test_shrink_refuses_a_run_that_does_not_diverge(tmp_path, tiny, capsys):
    clean = run(_spec(()))
    path = tmp_path / "clean.json"
    path.write_text(clean.to_json())
    assert cli.main(["shrink", "--trace", str(path)]) == 2
    assert "does not diverge" in capsys.readouterr().err
