"""batched-reference kept full as rows finish, beside the same decoder at an earlier commit (static
batches of --batch-size prompts, each shrinking as its rows finish) and vLLM without speculation, in
one run: the 27 built-in prompts (chat template), 48 new tokens, embedded pair in float32, greedy,
each specviz row its best of two.

    python benchmarks/refill.py [--before 6c81cb4] [--batch-size 8] [--threads 2]
    [--out benchmarks/results/refill.md]
"""
import argparse
import importlib.util
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from specviz.decoding.reference import batched_reference, reference
from specviz.engines import vllm
from specviz.engines.server import from_server
from specviz.models.pairs import load_pair
from specviz.spec.prompts import builtin_set
from publish import publish


def decoder_at(commit: str, folder: Path):
    """`batched_reference` as it was at `commit` (its module, imported from a copy)."""
    source = subprocess.run(["git", "show", f"{commit}:specviz/decoding/reference.py"], check=True,
                            capture_output=True, text=True, cwd=Path(__file__).parent).stdout
    path = folder / "reference_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("reference_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.batched_reference


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="6c81cb4",
                    help="the commit whose batched-reference is compared")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(dtype="float32", device="cpu")
    ids = pair.encode(builtin_set("all"))
    ref = [o.ids for o in reference(pair, ids, 48).outputs]
    rows = {}  # name -> [(seconds, output ids)]
    with tempfile.TemporaryDirectory() as folder:
        decoders = {
            f"specviz batched-reference at {args.before} (static batches)":
                decoder_at(args.before, Path(folder)),
            "specviz batched-reference (kept full)": batched_reference}
        batched_reference(pair, ids[:2], 2, 4)  # warm-up
        for _ in range(2):
            for name, decode in decoders.items():
                start = time.perf_counter()
                outputs = decode(pair, ids, args.batch_size, 48).outputs
                rows.setdefault(name,
                                []).append((time.perf_counter() - start, [o.ids for o in outputs]))
                print(name, f"{rows[name][-1][0]:.1f} s", flush=True)
        with vllm.vllm_server("none", Path(folder) / "vllm.log", k=5, max_num_seqs=args.batch_size,
                              threads=args.threads, dtype="float32") as server:
            from_server(server.url, None, ids[:2], 4)  # warm-up
            run = from_server(server.url, None, ids, 48, concurrency=args.batch_size,
                              tokenizer=pair.tokenizer, launch=server.launch)
            rows[f"vLLM {run.version} none, {args.batch_size} in flight"] = [
                (run.seconds, [o.ids for o in run.outputs])]
    lines = ["# batched-reference kept full\n",
             (f"{len(ids)} built-in prompts (chat template), 48 new tokens, embedded pair in "
              f"float32, greedy, batch size {args.batch_size}, {args.threads} threads; specviz "
              "rows: the best of two.\n"),
             "| run | seconds | tokens | tok/s | equal to reference |", "|---|---:|---:|---:|---:|"]
    for name, runs in rows.items():
        seconds, outputs = min(runs, key=lambda r: r[0])
        tokens = sum(map(len, outputs))
        lines.append(f"| {name} | {seconds:.1f} | {tokens} | {tokens / seconds:.1f} | "
                     f"{sum(a == b for a, b in zip(outputs, ref))}/{len(ids)} |")
    publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
