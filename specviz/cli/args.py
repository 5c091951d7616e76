"""The command line's arguments: those every command shares (the pair, the prompts, decoding,
sampling), their types, and a RunSpec made of them. A flag that sets a RunSpec field defaults to
that field's default."""
from __future__ import annotations

import argparse
from pathlib import Path

from specviz.models.pairs import Placement
from specviz.spec.defaults import DEFAULT_PAIR, default_of
from specviz.spec.drafters import DRAFTER_OPTIONS, DRAFTERS, reading
from specviz.spec.faults import FAULT_PRESETS, FAULTS
from specviz.spec.methods import METHODS
from specviz.spec.prompts import DEFAULT_SET, builtin_set, builtin_sets, read_prompts
from specviz.spec.rows import RowSampling, row_fields
from specviz.spec.run import DEVICES, DTYPES, MAX_BATCH_SIZE, PAIR_PRESETS, RunSpec
from specviz.spec.strict import SpecError
from specviz.trace.sweep import NO_FAULTS


def _list_of(kind: type, what: str):
    """An argparse type: comma-separated values of `kind`."""
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, "
                                             f"got {text!r}") from None
    return parse


int_list = _list_of(int, "integers")
float_list = _list_of(float, "numbers")


def add_field(group, name: str, **kwargs) -> None:
    """A flag that sets RunSpec's field `name`, typed and defaulted by that field."""
    default = default_of(name)
    # argparse's type=bool reads "False" as True; a None default has no type to parse with
    assert default is not None and not isinstance(default, bool), name
    group.add_argument("--" + name.replace("_", "-"), type=type(default), default=default,
                       **kwargs)


def add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model pair")
    g.add_argument("--pair", choices=sorted(PAIR_PRESETS), default=DEFAULT_PAIR,
                   help="a preset pair (default: embedded SmolLM2-135M-Instruct and its draft)")
    g.add_argument("--target", help="target model: Hub id or local path (overrides --pair)")
    g.add_argument("--draft", help="draft model: Hub id or local path (overrides --pair)")
    g.add_argument("--target-revision")
    g.add_argument("--draft-revision")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="allow models that ship their own code")
    g.add_argument("--device-map", choices=["auto"],
                   help="spread a target too large for one GPU over the visible GPUs with "
                        "accelerate (then CPU memory)")
    g.add_argument("--max-memory", metavar="LIMITS",
                   help="per-device limits for spreading the target, e.g. "
                        "0=20GiB,1=20GiB,cpu=64GiB (implies --device-map auto)")
    g = p.add_argument_group("prompts")
    g.add_argument("--prompts", type=Path,
                   help="a file: one prompt a line, or Spec-Bench JSONL (turns[0])")
    g.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    g.add_argument("--prompt-set", choices=sorted(builtin_sets()),
                   help=f"a built-in prompt set (default: {DEFAULT_SET})")
    g.add_argument("--limit", type=int, help="use only the first N prompts of the --prompts file")
    g.add_argument("--sort-by-length", action="store_true",
                   help="order all prompts by length (after --limit)")
    g.add_argument("--no-chat-template", action="store_true",
                   help="feed prompts raw, without the chat template")
    g = p.add_argument_group("decoding")
    add_field(g, "max_new_tokens")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="a stop string: an output ends at the token whose text completes it, that "
                        "token kept, as at an end-of-sequence token (repeat it for more; check: "
                        "the engine's own stop strings)")
    g.add_argument("--json-schema", type=json_schema, metavar="JSON|@FILE",
                   help="structured output: every answer follows this JSON schema (its text, or "
                        "@ and a file holding it), its grammar masking the target's logits")
    g.add_argument("--reasoning-end", metavar="TOKEN",
                   help="with --json-schema: the token that ends a reasoning model's thinking "
                        "(its </think>); the grammar starts after it")
    add_field(g, "dtype", choices=DTYPES)
    add_field(g, "device", choices=DEVICES)
    add_field(g, "seed",
              help="sampled runs: every sequence's random stream derives from it")
    g.add_argument("--deterministic", action="store_true",
                   help="deterministic GPU kernels (fixed cuBLAS workspace, no TF32): reruns "
                        "repeat bit for bit; slower")
    g.add_argument("--window", type=int,
                   help="exspec: active sequences in the window (default 2 x batch size)")
    add_field(g, "max_wait", help="exspec: rounds a sequence may be passed over")
    g.add_argument("--drafter", type=drafters, default=[default_of("drafter")], metavar="DRAFTER",
                   help=("what proposes the drafts: "
                         + "; ".join(f"{n}: {d.summary}" for n, d in DRAFTERS.items())
                         + " (verify and bench: several, comma-separated)"))
    # Unset, a drafter's options stay out of the spec (spec_of): RunSpec's defaults, in the help.
    g.add_argument("--ngram-min", type=int,
                   help=f"lookup: the shortest n-gram matched (default {default_of('ngram_min')})")
    g.add_argument("--ngram-max", type=int,
                   help="lookup: the longest n-gram matched, tried first "
                        f"(default {default_of('ngram_max')})")
    g.add_argument("--head", metavar="FOLDER",
                   help="eagle1, eagle3: the published head's folder (its config.json and "
                        "safetensors)")
    g.add_argument("--tree-width", type=int,
                   help="candidates per position, verified as one token tree (eqspec and exspec; "
                        f"default {default_of('tree_width')}: a chain)")
    g.add_argument("--faults", default="",
                   help=("comma-separated faults or presets (in the methods that take faults): "
                         + ", ".join([*FAULTS, *FAULT_PRESETS])))
    g.add_argument("--audit", type=int, nargs="?", const=MAX_BATCH_SIZE,
                   default=default_of("audit"), metavar="ROWS",
                   help="check every row's state against a fresh batch-size-1 recomputation every "
                        "round, or ROWS sampled rows a round: finds corruption before (or without) "
                        "a fork; about one extra batch-size-1 pass of the target and one of the "
                        "draft per audited row and round")
    g.add_argument("--batch-invariant", action="store_true",
                   help="compute every row's logits batch-invariantly (the same bits in any "
                        "batch), and judge forks and audits at zero tolerance; float32 and "
                        "bfloat16, about 1.5 to 4 times slower (docs/batch_invariant.md)")
    add_field(g, "kv_block_size", metavar="TOKENS",
              help="page the engine's caches in blocks of TOKENS from a pool, as serving engines "
                   "do (0: each row contiguous)")
    add_field(g, "kv_blocks", metavar="BLOCKS",
              help="with --kv-block-size: blocks each pool holds at most, a miss evicting the "
                   "prefix cache's idle ones (0: as many as the run needs)")
    g.add_argument("--prefix-caching", action="store_true",
                   help="share prompts' full blocks across requests (copy-on-write): in "
                        "specviz's engine with --kv-block-size; an OpenVINO check turns on "
                        "OpenVINO's own")
    g = p.add_argument_group("sampling (temperature 0: greedy)")
    add_field(g, "temperature")
    add_field(g, "top_k", help="0: off")
    add_field(g, "top_p", help="1: off")
    g.add_argument("--draft-temperature", type=float,
                   help="the draft's own (default: the target's)")
    g.add_argument("--draft-top-k", type=int, help="the draft's own (default: the target's)")
    g.add_argument("--draft-top-p", type=float, help="the draft's own (default: the target's)")
    add_field(g, "repetition_penalty",
              help="transformers' on the target's logits: a token of the prompt or output has its "
                   "logit divided by it where positive, multiplied where negative (1: off)")
    add_field(g, "presence_penalty", help="OpenAI's: subtracted from the target's logit of every "
                                          "token the output holds (0: off)")
    g.add_argument("--logprobs", action="store_true",
                   help="record each token's log-probability under the target, and judge them "
                        "against a fresh float64 recomputation")
    g.add_argument("--row", type=row_sampling, action="append", default=[], metavar="KEY=VALUE,...",
                   help="one request's own settings, in place of --temperature, --top-k and "
                        "--top-p; repeat it for more requests, given to the prompts in turn "
                        "(prompt i gets the (i mod n)-th): keys "
                        f"{', '.join(RowSampling.model_fields)}; an unset temperature is 1, an "
                        "unset seed the run's stream (e.g. --row temperature=0 "
                        "--row top_k=20,seed=7)")


def row_sampling(text: str) -> dict:
    """A --row: one request's settings (spec.run.row_fields)."""
    try:
        return row_fields(text)
    except SpecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _names_of(known: dict, what: str):
    """An argparse type: comma-separated names, each one of `known`."""
    def names(text: str) -> list[str]:
        got = [x.strip() for x in text.split(",") if x.strip()]
        unknown = [n for n in got if n not in known]
        if unknown or not got:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown) or repr(text)}; "
                                             "choose from "
                                             + ", ".join(known))
        return got
    return names


drafters = _names_of(DRAFTERS, "drafter")


methods = _names_of(METHODS, "method")


def prompts_from_args(args) -> list[str]:
    """Typed prompts, then the built-in set, then the file's first --limit prompts."""
    prompts = list(args.prompt)
    if args.prompt_set or not (prompts or args.prompts):
        prompts += builtin_set(args.prompt_set or DEFAULT_SET)
    if args.prompts:
        prompts += read_prompts(args.prompts)[: args.limit]
    return sorted(prompts, key=len) if args.sort_by_length else prompts


def json_schema(value: str) -> str:
    """--json-schema's value: the schema's text, or the text of the file after an @."""
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise argparse.ArgumentTypeError(f"cannot read the JSON schema's file: {e}") from e


def spec_of(args, **overrides) -> RunSpec:
    target, draft = PAIR_PRESETS[args.pair]
    fields = dict(
        target=args.target or target, draft=args.draft or draft,
        target_revision=args.target_revision, draft_revision=args.draft_revision,
        prompts=tuple(prompts_from_args(args)), chat_template=not args.no_chat_template,
        max_new_tokens=args.max_new_tokens, dtype=args.dtype, device=args.device, seed=args.seed,
        faults=tuple(f.strip() for f in args.faults.split(",") if f.strip()),
        window=args.window, max_wait=args.max_wait, audit=args.audit,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        draft_temperature=args.draft_temperature,
        draft_top_k=args.draft_top_k, draft_top_p=args.draft_top_p, drafter=args.drafter[0],
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        logprobs=args.logprobs, rows=tuple(args.row), stop=tuple(args.stop),
        json_schema=args.json_schema, reasoning_end=args.reasoning_end,
        batch_invariant=args.batch_invariant, kv_block_size=args.kv_block_size,
        prefix_caching=args.prefix_caching, kv_blocks=args.kv_blocks,
    )
    fields.update(overrides)
    options = {f: getattr(args, f) for f in DRAFTER_OPTIONS if getattr(args, f) is not None}
    for f in options:
        if not set(reading(f)) & {*args.drafter, fields["drafter"]}:
            raise SpecError(f"--{f.replace('_', '-')} sets the {' or '.join(reading(f))} drafter; "
                            f"add --drafter {reading(f)[0]}")
    # the runs of other drafters in a sweep leave them out
    fields.update({f: v for f, v in options.items() if f in DRAFTERS[fields["drafter"]].options})
    return RunSpec.build(**fields)


def placement_of(args) -> Placement:
    return Placement(spread=bool(args.device_map or args.max_memory), max_memory=args.max_memory)


_faults = _names_of({NO_FAULTS: "", **FAULTS, **FAULT_PRESETS}, "fault")


def fault_set(text: str) -> tuple[str, ...]:
    """A --fault-sets item: comma-joined fault or preset names, or `none`."""
    names = _faults(text)
    if NO_FAULTS in names and len(names) > 1:
        raise argparse.ArgumentTypeError(f"{NO_FAULTS!r} is the set of no faults: give it alone")
    return () if names == [NO_FAULTS] else tuple(names)
