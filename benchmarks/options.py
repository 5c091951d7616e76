"""The options the benchmarks share: each asks for the ones it takes, at the values it measures at,
so that an option is spelled, typed and explained once."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specviz.spec.prompts import builtin_set

_SHARED = {
    "prompt_set": {"help": "a built-in prompt set"},
    "max_new_tokens": {"type": int},
    "batch_size": {"type": int},
    "k": {"type": int, "help": "draft length"},
    "threads": {"type": int, "help": "CPU threads, for torch (and vLLM's workers where it runs)"},
    "dtype": {"choices": ("float32", "bfloat16")},
    "out": {"type": Path, "help": "also write the results here (Markdown)"},
}


def parser(doc: str, **defaults) -> argparse.ArgumentParser:
    """A parser titled by the benchmark's docstring, with the shared options named in `defaults`
    (keys of _SHARED), each at its given default."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    for name, default in defaults.items():
        ap.add_argument("--" + name.replace("_", "-"), default=default, **_SHARED[name])
    return ap


def parse(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """The arguments, with torch's threads set to --threads."""
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args


def prompt_set(pair, args: argparse.Namespace) -> tuple[list[str], list[list[int]]]:
    """The prompts of --prompt-set, and their token ids in `pair`'s chat template."""
    prompts = builtin_set(args.prompt_set)
    return prompts, pair.encode(prompts)


def add_row(lines: list[str], row: str) -> None:
    """A table row, kept for --out and printed as soon as it is measured."""
    lines.append(row)
    print(row, flush=True)


def write_out(args: argparse.Namespace, lines: list[str]) -> None:
    """The results as Markdown to --out, where given."""
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
