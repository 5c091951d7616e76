"""vLLM's `mtp` mode on a tiny DeepSeek-V3 (multi-head latent attention, experts, one MTP layer),
judged by specviz against vLLM's own run without speculation (docs/engines.md, "vLLM with the
model's MTP layer"). Both runs use the CPU_MLA backend, set for the target and the MTP layer apart
(vLLM's default on an AMX CPU computes no float32 latent attention), at float32, in eager mode.

The checkpoint is the suite's (tests/mtp_checkpoints.py, "deepseek-v3-vllm"): 2 decoder layers (the
first dense, the second 4 routed experts top-2 and a shared one), latent attention at the only sizes
CPU_MLA computes (kv_lora_rank 512, rope 64), its own output head (vLLM's DeepSeek-V3 ties none),
and one MTP layer stored after the decoder's (model.layers.2) that drafts its target's text about
half the time. It prints each output's verdict and fork, the outputs against the control, and the
acceptance against the MTP layer's own replay: first as vLLM's eager mode runs by default (its CPU
rotary-embedding kernel, which misreads latent attention's strided views), then with vLLM's PyTorch
rope (`vllm_server(native_rope=True)`).

    .venv/bin/python benchmarks/vllm_mtp.py [--new-tokens 24] [--k 3]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

# this checkout's engine, whichever one is installed, and the suite's checkpoints
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from mtp_checkpoints import save  # noqa: E402

from specviz.engines.vllm import vllm_server  # noqa: E402
from specviz.models.pairs import load_pair  # noqa: E402
from specviz.run import check  # noqa: E402
from specviz.spec.prompts import builtin_set  # noqa: E402
from specviz.spec.run import ENGINE, RunSpec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--k", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vllm-mtp-"))
    model = Path(save(root / "model", "deepseek-v3-vllm"))
    pair = load_pair(str(model), str(model), dtype="float32", device="cpu")
    spec = RunSpec.build(target=str(model), draft=str(model), prompts=tuple(builtin_set("quick")),
                         method=ENGINE, k=args.k, max_new_tokens=args.new_tokens, dtype="float32")
    for native_rope in (False, True):
        _judge(spec, pair, model, root / ("native-rope" if native_rope else "rope-kernel"),
               args.k, native_rope)


def _judge(spec: RunSpec, pair, model: Path, folder: Path, k: int, native_rope: bool) -> None:
    """vLLM's mtp mode against its control, with vLLM's CPU rope kernel (its eager default) or its
    PyTorch rope (`native_rope`)."""
    folder.mkdir()
    start = time.perf_counter()
    # one core each: both servers at once, the control beside the speculating one
    with (vllm_server("none", folder / "control.log", eager=True, model=model,
                      attention="CPU_MLA", threads=1, native_rope=native_rope) as control,
          vllm_server("mtp", folder / "mtp.log", k=k, eager=True, model=model,
                      attention="CPU_MLA", threads=1, native_rope=native_rope) as server):
        trace = check.from_servers(spec, pair, (server.url, server.served_model),
                                   (control.url, control.served_model), 8, 300.0, drafter="mtp")
    rope = "PyTorch rope" if native_rope else "its CPU rope kernel"
    print(f"vLLM mtp against its control, {rope}, on {model} "
          f"({time.perf_counter() - start:.0f} s)")
    for s in trace.sequences:
        same = s.output_ids == s.control.ids if s.control else None
        print(f"  output {s.seq}: fork at {s.first_divergence}, same as its control: {same}, "
              f"verdict {s.forensics and s.forensics.verdict}")
        if s.forensics:
            print(f"    {s.forensics.explanation}")
    if trace.acceptance:
        print(f"acceptance: {trace.acceptance.explanation}")
    (folder / "trace.json").write_text(trace.to_json())
    print(f"trace: {folder / 'trace.json'}")


if __name__ == "__main__":
    main()
