"""A stop inside an accepted block. A speculative decoder that checks only the last token of each
block for an end-of-sequence token writes past one the target accepted mid-block (transformers
#47912, koboldcpp #1276). Whatever the target would write after a stop, a correct engine writes
nothing: the run-on is never rounding.

The stop fault in specviz's own engine is one of the field cases (tests/test_casebook.py). The
engine judged from outside is written here, apart from specviz's decoding: a greedy chain
speculative decoder over Hugging Face transformers (no cache, batch size 1), the embedded target as
its own draft so that every draft is accepted and the end of "What is the capital of France?" (token
7) falls inside a block of k = 4."""
import json
from typing import NamedTuple

import pytest
import torch
from transformers import AutoModelForCausalLM

from specviz.cli import main as cli
from specviz.forensics.engineacceptance import judge_engine_acceptance, model_drafts
from specviz.models.checkpoints import embedded_target_dir
from specviz.spec.run import EMBEDDED_TARGET
from specviz.spec.verdicts import verdict
from specviz.trace.schema import Trace

PROMPTS = ("What is the capital of France?", "Hi!")
K, BUDGET = 4, 24


class Written(NamedTuple):
    trace: Trace  # `specviz check --outputs` of the decoder's file
    # per prompt, the drafts each of its rounds accepted (k offered a round)
    rounds: list[list[int]]


@torch.inference_mode()
def speculate(target, draft, prompt: list[int], eos: set[int], whole_block: bool,
              sees_last: bool = True) -> tuple[list[int], list[int]]:
    """Drafts k tokens greedily, keeps them up to the target's first disagreement and the target's
    token there. `whole_block`: a stop anywhere in the kept block ends the output there (correct);
    else only the block's last token is looked at (the bug). `sees_last=False`: the drafter drafts
    without the output's last token (a lossless bug, vllm-metal PR #721). Returns the output, and
    the drafts each round accepted."""
    out: list[int] = []
    rounds: list[int] = []
    while len(out) < BUDGET:
        drafts: list[int] = []
        seen = out if sees_last or not out else out[:-1]
        for _ in range(K):
            drafts.append(int(draft(torch.tensor([prompt + seen + drafts])).logits[0, -1].argmax()))
        logits = target(torch.tensor([prompt + out + drafts])).logits[0,
                                                                      len(prompt) + len(out) - 1:]
        choice = logits.argmax(-1).tolist()
        n = next((i for i in range(K) if drafts[i] != choice[i]), K)
        rounds.append(n)
        block = drafts[:n] + [choice[n]]
        if whole_block:
            block = block[: next((i + 1 for i, t in enumerate(block) if t in eos), len(block))]
        out += block
        if out[-1] in eos:
            break
    return out[:BUDGET], rounds


@pytest.fixture(scope="module")
def model():
    """The embedded target, the decoders' target and draft."""
    return AutoModelForCausalLM.from_pretrained(embedded_target_dir(), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def written(model, embedded, tmp_path_factory) -> dict[str, Written]:
    """Each decoder's outputs, as a file with its drafts counted per request as llama.cpp counts
    them, checked by `specviz check --outputs`."""
    prompts = embedded.encode(list(PROMPTS))
    eos = set(embedded.eos_ids)
    checked = {}
    for name, whole, sees_last in (("whole-block", True, True), ("last-token-only", False, True),
                                   ("drafts-without-last-token", True, False)):
        path = tmp_path_factory.mktemp(name) / "outputs.jsonl"
        lines = [{"engine": {"name": name, "settings": {"k": K, "drafter": "model"}}}]
        rounds = []
        for p in prompts:
            ids, accepts = speculate(model, model, p, eos, whole, sees_last)
            lines.append({"prompt_ids": p, "output_ids": ids, "drafts": K * len(accepts),
                          "accepted": sum(accepts)})
            rounds.append(accepts)
        path.write_text("\n".join(json.dumps(line) for line in lines))
        out = path.with_suffix(".trace.json")
        assert cli.main(["check", "--dtype", "float32", "--device", "cpu", "--max-new-tokens",
                         str(BUDGET), "--target", EMBEDDED_TARGET, "--draft", EMBEDDED_TARGET,
                         "--k", str(K), "--outputs", str(path), "--trace", str(out)]) == 0
        checked[name] = Written(Trace.from_json(out.read_text()), rounds)
    return checked


def test_an_engine_that_runs_past_a_stop_accepted_mid_block_is_a_stop_bug_never_numerics(
        written, embedded, capsys):
    trace = written["last-token-only"].trace
    eos = set(embedded.eos_ids)
    ran_on = [s for s in trace.sequences if any(t in eos for t in s.output_ids[:-1])]
    assert ran_on, "the capital of France ends inside a block: the decoder must run past it"
    for s in ran_on:
        assert (s.reference_ids[-1] in eos
                and s.output_ids[: len(s.reference_ids)] == s.reference_ids)
        assert s.forensics.verdict == "decision-bug:stop", s.forensics.explanation
        assert (s.forensics.fork == len(s.reference_ids)
                and f"token {s.forensics.fork - 1}" in s.forensics.explanation)
    assert "numerics" not in {s.forensics.verdict for s in trace.sequences if s.forensics}


def test_the_same_decoder_stopping_anywhere_in_the_block_gets_no_bug(written):
    trace = written["whole-block"].trace
    assert not [s.forensics.verdict for s in trace.sequences if s.forensics
                and verdict(s.forensics.verdict).bug]
    # its counters: every draft of the target drafting for itself accepted, as the replay's
    a = trace.acceptance
    assert (a.counters and a.verdict is None and a.accepted == a.compared
            and a.accepted_fresh == a.offered_fresh), \
        a.explanation


def test_a_drafter_that_misses_the_last_token_is_caught_by_the_engines_own_counters(written):
    """A lossless bug: the output is the reference's, and only the engine's counters show
    the drafts wasted."""
    trace = written["drafts-without-last-token"].trace
    assert all(s.equivalent for s in trace.sequences)
    a = trace.acceptance
    assert a.counters and a.verdict == "draft-bug:acceptance", a.explanation
    assert a.accepted < a.accepted_fresh and "not seen from outside" in a.explanation


@pytest.mark.parametrize("name, expected", [("whole-block", None),
                                            ("drafts-without-last-token", "draft-bug:acceptance")])
def test_a_servers_totals_over_the_run_judge_its_drafts_where_it_counts_none_per_request(
        written, model, embedded, name, expected):
    """vLLM counts drafts only in /metrics, over the run: the same decoders' counts, summed as a
    server would and per draft position, judged against the same replay as their counts
    per request."""
    trace, rounds = written[name]
    accepts = [n for per_prompt in rounds for n in per_prompt]
    served = trace.model_copy(deep=True)
    served.manifest.engine.settings["spec_decode"] = {
        "drafts": len(accepts), "draft_tokens": K * len(accepts), "accepted_tokens": sum(accepts),
        **{f"accepted_tokens_per_pos_{i}": sum(n > i for n in accepts) for i in range(K)}}
    for s in served.sequences:
        s.engine.drafts = s.engine.accepted = None
    a = judge_engine_acceptance(served, model_drafts(served, model, embedded.vocab_size),
                                "the draft model's", K)
    assert a.counters and a.verdict == expected and "/metrics" in a.explanation, a.explanation
    per_request = trace.acceptance
    assert (a.compared, a.accepted, a.accepted_fresh, a.offered_fresh) == (
        per_request.compared, per_request.accepted, per_request.accepted_fresh,
        per_request.offered_fresh)
    assert len(a.per_position) == len(a.per_position_fresh) == K
    # the correct drafter: the engine's acceptance at each position is the replay's
    if expected is None:
        assert a.per_position == a.per_position_fresh, a.explanation
    else:  # the first draft, proposed without the target's last token, is the one wasted
        assert a.per_position[0] < a.per_position_fresh[0], a.explanation
