"""Every default a run setting has is RunSpec's: the command line's flags and the page's controls
read them from RunSpec's fields, and the few defaults of their own (verify's and bench's sweeps) are
what they were. No handler of the page takes more than eight positional parameters: the page is
keyed by names."""
import ast
import contextlib
import io
from pathlib import Path

import pytest

from specviz.cli.args import spec_of
from specviz.cli.main import parser
from specviz.spec.defaults import DEFAULT_PAIR, default_of
from specviz.spec.prompts import DEFAULT_SET, builtin_sets
from specviz.spec.run import RunSpec

QUICK = RunSpec.build(prompts=tuple(builtin_sets()[DEFAULT_SET]))
# Flags that set a RunSpec field of the same name, in the commands that take them.
SHARED = ("max_new_tokens", "dtype", "device", "seed", "max_wait", "audit", "temperature", "top_k",
          "top_p", "repetition_penalty", "presence_penalty", "draft_temperature", "draft_top_k",
          "draft_top_p", "window", "target_revision", "draft_revision")


def _parsed(*argv: str) -> dict:
    return vars(parser().parse_args(list(argv)))


@pytest.mark.parametrize("command", ["run", "verify", "check", "bench"])
def test_every_flag_that_sets_a_run_field_defaults_to_runspecs_default(command):
    args = _parsed(command)
    for field in SHARED:
        default = default_of(field)
        assert args[field] == default and type(args[field]) is type(default), field
    assert args["pair"] == DEFAULT_PAIR == "embedded" and args["drafter"] == [default_of("drafter")]
    # Left out of the spec unless given: RunSpec's defaults.
    assert (args["ngram_min"], args["ngram_max"], args["tree_width"]) == (None, None, None)


def test_a_run_with_no_flags_is_runspecs_default_run_on_the_quick_prompts():
    args = parser().parse_args(["run"])
    assert (args.method, args.batch_size, args.k) == (
        default_of("method"), default_of("batch_size"), default_of("k"))
    spec = spec_of(args, method=args.method, batch_size=args.batch_size, k=args.k)
    assert spec == QUICK and spec.key() == QUICK.key()
    assert _parsed("check")["k"] == _parsed("bench")["k"] == default_of("k") == 5


def test_the_commands_own_defaults_are_what_they_were():
    verify, bench, check = _parsed("verify"), _parsed("bench"), _parsed("check")
    assert verify["methods"] == ["batched-reference", "eqspec"] and verify["batch_sizes"] == [1, 4]
    assert verify["k"] == [5] and verify["temperatures"] is None and verify["fault_sets"] is None
    assert bench["batch_sizes"] == [1, 2, 4, 8] and bench["max_waits"] is None
    assert bench["name"] == "bench"
    assert (check["concurrency"], check["timeout"]) == (8, 300.0)
    assert _parsed("shrink")["url"] == "http://localhost:7860/"


def test_the_help_names_the_same_defaults():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser().parse_args(["run", "--help"])
    shown = " ".join(out.getvalue().split())
    for said in ("(default: quick)", "(default 1)", "tried first (default 3)", "default 1: a chain",
                 "(default 2 x batch size)",
                 "(default: embedded SmolLM2-135M-Instruct and its draft)"):
        assert said in shown, said


def test_the_page_starts_at_runspecs_defaults():
    from specviz.app.form import DEFAULTS, ENGINE_DEFAULTS, INPUTS, controls_of, spec_from_controls

    assert spec_from_controls() == QUICK  # every control at its default: RunSpec's default run
    assert {**controls_of(QUICK), "target": "", "draft": ""} == DEFAULTS
    # what the page offered before its defaults were read from RunSpec, unchanged
    assert DEFAULTS == {
        "pair": "embedded", "target": "", "draft": "", "prompt_set": "quick", "typed": "",
        "method": "eqspec", "faults": [], "batch_size": 4, "k": 5, "max_new_tokens": 48,
        "dtype": "float32", "seed": 0, "window": 0, "max_wait": 4, "audit": False,
        "temperature": 0.0, "top_k": 0, "top_p": 1.0, "draft_temperature": None,
        "draft_top_k": None, "draft_top_p": None, "drafter": "model", "ngram_min": 1,
        "ngram_max": 3, "rows": "", "repetition_penalty": 1.0, "presence_penalty": 0.0,
        "logprobs": False, "stop": "", "chat_template": True, "tree_width": 1,
        "json_schema": "", "reasoning_end": "", "batch_invariant": False, "head": "",
        "kv_block_size": 0, "prefix_caching": False, "kv_blocks": 0}
    assert INPUTS["prompt_file"] is None
    assert (DEFAULTS["pair"], DEFAULTS["prompt_set"]) == (DEFAULT_PAIR, DEFAULT_SET)
    for field in ("dtype", "max_new_tokens", "temperature", "top_p", "seed"):
        assert ENGINE_DEFAULTS[field] == default_of(field), field
    with pytest.raises(TypeError, match="no such control: batch"):
        spec_from_controls(batch=2)  # a misspelt control is refused, not left at its default


MAX_POSITIONAL = 8


def test_no_function_of_the_page_takes_more_than_eight_positional_parameters():
    """Keyword-only parameters may be more: a control is passed by its name."""
    app = Path(__file__).resolve().parents[1] / "specviz" / "app"
    found = []
    for path in sorted(app.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                positional = len(node.args.posonlyargs) + len(node.args.args)
                if positional > MAX_POSITIONAL:
                    name = getattr(node, "name", "lambda")
                    found.append(f"{path.name}:{node.lineno} {name} ({positional})")
    assert found == [], found
