"""The embedded pair's linear layers through `F.linear` (MKL's sgemm in float32) and through oneDNN
with packed weights (specviz/models/kernels.py), side by side in one run on this machine; in
float32, or in bfloat16 on a CPU without oneDNN's bfloat16 GEMM (there the packed kernels widen it
to float32).

First each of the target's GEMM shapes alone, at 1 and --batch-size rows; then the reference (batch
size 1), batched-reference and eqspec (--batch-size, k) on the same prompts, each decoded with one
kernel and then the other, and every output compared with the batch-size-1 reference of `F.linear`
(in bfloat16 the two kernels round apart, so some outputs fork: both are correct). Model loading is
excluded; a short warm-up precedes each row. Timings on a shared machine are noisy: quote the ratios
of one run.

    python benchmarks/linear_kernels.py [--prompt-set all] [--max-new-tokens 48] [--batch-size 8]
    [--k 5] [--threads 2]
                                 [--dtype float32] [--out benchmarks/results/linear-kernels.md]
"""
import time

import torch

from specviz.models import kernels
from specviz.models.pairs import load_pair
from specviz.run.runner import decode
from specviz.spec.run import RunSpec

import options


def per_call_us(f, calls: int = 30) -> float:
    f()
    start = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - start) / calls * 1e6


@torch.inference_mode()
def gemm_rows(pair, batch_size: int, dtype: torch.dtype) -> list[str]:
    layer = pair.target.model.layers[0]
    shapes = {"q": layer.self_attn.q_proj, "k, v": layer.self_attn.k_proj,
              "o": layer.self_attn.o_proj, "gate, up": layer.mlp.gate_proj,
              "down": layer.mlp.down_proj, "output head": pair.target.lm_head}
    rows = []
    for name, linear in shapes.items():
        for n in (1, batch_size):
            x = torch.randn(n, linear.in_features, dtype=dtype)
            plain = per_call_us(lambda: torch.nn.functional.linear(x, linear.weight))
            packed = per_call_us(lambda: linear(x))
            rows.append(f"| {name} | {linear.out_features} x {linear.in_features} | {n} | "
                        f"{plain:.0f} | {packed:.0f} | {plain / packed:.2f}x |")
    return rows


def main() -> None:
    ap = options.parser(__doc__, prompt_set="all", max_new_tokens=48, batch_size=8, k=5, threads=2,
                        dtype="float32", out=None)
    args = options.parse(ap)
    pair = load_pair(dtype=args.dtype, device="cpu")
    packed = pair.info.get("linear_kernels")
    if packed is None:
        raise SystemExit(f"here {args.dtype} runs on F.linear (no oneDNN, or its own {args.dtype} "
                         "GEMM): nothing to compare")
    names = (f"F.linear{' (MKL)' if args.dtype == 'float32' else ''}", f"oneDNN ({packed})")
    prompts, ids = options.prompt_set(pair, args)
    setup = (f"{len(ids)} prompts of the {args.prompt_set!r} set, {args.max_new_tokens} new "
             f"tokens, embedded pair in {args.dtype}, greedy, {args.threads} threads, torch "
             f"{torch.__version__}")
    print(setup)
    lines = [f"# Linear kernels: F.linear against oneDNN with packed weights\n\n{setup}.\n",
             "| GEMM | weight | rows | F.linear us | oneDNN us | speed-up |",
             "|---|---|---:|---:|---:|---:|", *gemm_rows(pair, args.batch_size, pair.dtype), "",
             "| method | configuration | kernels | equal to reference | tok/s | speed-up |",
             "|---|---|---|---|---:|---:|"]
    print("\n".join(lines[1:]))

    def spec(method: str, batch_size: int) -> RunSpec:
        return RunSpec.build(prompts=tuple(prompts), method=method, batch_size=batch_size, k=args.k,
                             max_new_tokens=args.max_new_tokens, device="cpu", dtype=args.dtype)

    reference = None
    for method, bs in (("reference", 1), ("batched-reference", args.batch_size),
                       ("eqspec", args.batch_size)):
        rates = []
        for name in names:
            (kernels.unpack_linears if name == names[0] else kernels.pack_linears)(pair.target)
            (kernels.unpack_linears if name == names[0] else kernels.pack_linears)(pair.draft)
            # warm-up
            decode(spec(method, 2).model_copy(update={"max_new_tokens": 4}), pair, ids[:2],
                   record=False)
            result = decode(spec(method, bs), pair, ids, record=False)
            outputs = [o.ids for o in result.outputs]
            reference = reference or outputs
            tokens = sum(len(o) for o in outputs)
            rates.append(tokens / result.seconds)
            equal = sum(a == b for a, b in zip(outputs, reference))
            config = f"bs {bs}" + (f", k {args.k}" if method == "eqspec" else "")
            speed_up = f"{rates[-1] / rates[0]:.2f}x" if len(rates) == 2 else "1.00x"
            options.add_row(lines, f"| {method} | {config} | {name} | {equal}/{len(ids)} | "
                                   f"{rates[-1]:.1f} | {speed_up} |")
    options.write_out(args, lines)


if __name__ == "__main__":
    main()
