"""The drafter protocol: every drafter is declared once (spec/drafters.py) and built once
(decoding/drafters.py), no layer branches on a drafter's name, and a drafter that asks to hear the
verify pass gets the target's own hidden states, as a fresh batch-size-1 pass computes them."""
import re
from dataclasses import replace
from pathlib import Path

import mtp_checkpoints
import pytest
import torch
from published_heads import write_eagle1_head, write_eagle3_head

import specviz
from specviz.decoding.batch import left_pad
from specviz.decoding.drafters import BUILT, PromptLookup
from specviz.decoding.eqspec import eqspec
from specviz.decoding.exspec import exspec
from specviz.decoding.faults import Policy
from specviz.decoding.paging import Memory
from specviz.decoding.reference import reference
from specviz.decoding.round import lay_out
from specviz.models.pairs import load_pair
from specviz.spec.drafters import DRAFTERS
from specviz.spec.prompts import builtin_set
from specviz.spec.run import RunSpec

SOURCE = Path(specviz.__file__).parent


def test_every_declared_drafter_is_built_and_keeps_the_state_it_declares(tiny, tmp_path):
    assert BUILT.keys() == DRAFTERS.keys()
    tokens, valid = left_pad([[5, 6, 7], [8, 9]], torch.device("cpu"))
    with_mtp = load_pair(*[mtp_checkpoints.save(tmp_path, "mellum")] * 2, dtype="float64",
                         device="cpu")
    # published heads, fitted on a few of the tiny target's tokens
    fit = [list(range(5, 30))]
    heads = {"eagle1": write_eagle1_head(tmp_path / "eagle1", tiny.target, fit),
             "eagle3": write_eagle3_head(tmp_path / "eagle3", tiny.target, fit, None)}
    for name, cls in BUILT.items():
        assert cls.kind is DRAFTERS[name]
        spec = RunSpec.build(prompts=("a",), drafter=name, **(
            {"head": str(heads[name])} if "head" in DRAFTERS[name].options else {}))
        pair = with_mtp if name == "mtp" else tiny  # the tiny pair ships no MTP layer
        b = lay_out(pair, Policy(()), cls.of(spec, pair), Memory(), [0, 1], tokens, valid)
        assert (b.draft.cache is not None) == DRAFTERS[name].cache
        assert b.draft.length(tokens.shape[1]) == (tokens.shape[1] - 2 if DRAFTERS[name].cache
                                                   else 0)


def test_no_layer_branches_on_a_drafters_name():
    """What a drafter is, every layer asks its declaration: its name is compared nowhere but where
    it is declared."""
    names = "|".join(map(re.escape, DRAFTERS))
    compared = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({names})["']|["']({names})["']\s*(==|!="""
                          r"""|\bin\b|\bnot in\b)""")
    found = [f"{path.relative_to(SOURCE)}:{n}: {line.strip()}"
             for path in SOURCE.rglob("*.py") if path.name != "drafters.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if compared.search(line)]
    assert not found, found


class HearingLookup(PromptLookup):
    """Prompt lookup that asks to hear the target's last hidden states, and keeps what it heard."""

    kind = replace(DRAFTERS["lookup"], hears=("hidden",))
    heard = (-1,)

    def __init__(self, pair):
        super().__init__(pair, 1, 3)
        self.kept = []

    def observe(self, b, verified, accepted) -> None:
        self.kept.append((verified.tokens.clone(), verified.valid.clone(),
                           verified.hidden.clone()))


def _fresh_hidden(pair, ids: list[int]) -> torch.Tensor:
    """The target's last hidden state at each of `ids`, in a fresh batch-size-1 pass."""
    out = pair.target(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0]


@pytest.mark.parametrize("decoder", [eqspec, exspec])
def test_a_drafter_that_hears_the_verify_gets_the_targets_own_hidden_states(tiny, decoder):
    prompts = [tiny.tokenizer(p).input_ids for p in builtin_set("all")[:5]]
    drafter = HearingLookup(tiny)
    kw = dict(window=4, max_wait=2) if decoder is exspec else {}
    out = decoder(tiny, prompts, 3, 4, 12, drafter=drafter, **kw)
    assert [o.ids for o in out.outputs] == [o.ids for o in reference(tiny, prompts, 12).outputs]
    assert len(drafter.kept) == len(out.rounds)
    checked = 0
    for tokens, valid, hidden in drafter.kept[::3]:
        # the slots the pass fed: the prompt at first, then the last token and drafts
        fed = valid[:, -hidden.shape[1]:]
        for row in range(tokens.shape[0]):
            fresh = _fresh_hidden(tiny, tokens[row][valid[row]].tolist())[-int(fed[row].sum()):]
            torch.testing.assert_close(hidden[row][fed[row]], fresh, rtol=0, atol=1e-9)
            checked += 1
    assert checked >= 5
