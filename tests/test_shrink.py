"""specviz shrink: a divergent run reduced to a smaller one that forks at the same token,
as a share link."""
import pytest

from specviz.app import views
from specviz.cli import main as cli
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import RunSpec
from specviz.trace import share
from specviz.trace.schema import Trace


def _spec(faults, **fields) -> RunSpec:
    fields = {"prompts": tuple(builtin_set("all")[:8]), "max_new_tokens": 32, **fields}
    return RunSpec.build(target="specviz:tiny", draft="specviz:tiny-draft", dtype="float32",
                         device="cpu", batch_size=4, k=5, faults=faults, **fields)


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
    assert (len(spec.prompts) < len(original.prompts)
            and spec.max_new_tokens < original.manifest.spec.max_new_tokens)
    assert (spec.batch_size <= original.manifest.spec.batch_size
            and spec.k <= original.manifest.spec.k)
    # The same prompt forks at the same token, with the same token, still a sync bug.
    here = spec.prompts.index(original.prompts[seq.seq].text)
    kept = small.sequences[here]
    assert kept.first_divergence == seq.first_divergence
    assert kept.output_ids[kept.first_divergence] == seq.output_ids[seq.first_divergence]
    assert kept.forensics.verdict.startswith("sync-bug:")
    # The printed link replays that run and opens on the fork: that sequence, the round
    # that emitted it.
    out = capsys.readouterr().out
    link = share.decode_link(out.split("share link: ")[1].splitlines()[0].split("?", 1)[1])
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


def _sampled(faults, audit) -> RunSpec:
    return _spec(faults, temperature=0.8, top_p=0.5, seed=2, audit=audit, max_new_tokens=16,
                 prompts=tuple(builtin_set("all")[:6]))


@pytest.mark.parametrize("faults,audit,kind", [(("bsp-like",), 4, "state"),
                                               (("temperature-draft-only",), 0, "impossible")])
def test_a_sampled_run_shrinks_to_a_smaller_run_that_shows_the_same(faults, audit, kind, tmp_path,
                                                                    capsys, tiny):
    """Sampled, there is no fork: a sync fault's reproducer keeps the corrupt state the audit named
    (same verdict, from the round that drew the same token); a sampling fault's keeps a token the
    target could not draw."""
    from specviz.run.shrink import mark_of

    original = run(_sampled(faults, audit))
    path = tmp_path / "trace.json"
    path.write_text(original.to_json())
    assert cli.main(["shrink", "--trace", str(path), "--out", str(tmp_path / "small.json")]) == 0
    out = capsys.readouterr().out
    seq = int(out.split("; sequence ")[1].split(" ")[0])
    mark = mark_of(original, seq)
    assert mark.kind == kind and "still" in out
    small = Trace.from_json((tmp_path / "small.json").read_text())
    spec = small.manifest.spec
    assert len(spec.prompts) < len(original.prompts) and mark.fork < spec.max_new_tokens <= 16
    here = spec.prompts.index(original.prompts[seq].text)
    # the same evidence at the same token (a state's draw there may differ)
    kept = mark_of(small, here)
    assert (kept.kind, kept.fork, kept.verdict) == (mark.kind, mark.fork, mark.verdict)
    assert kind == "state" or kept.token == mark.token
