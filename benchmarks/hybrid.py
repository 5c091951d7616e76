"""What a hybrid's recurrent state costs a verify pass: a Qwen 3.5-style model (Gated DeltaNet
beside attention) against the same model with every layer attending, and the state it keeps at every
drafted position.

One verify pass is what eqspec's round runs after its drafts: k + 1 slots a row over a prefilled
cache, batch size
8. The hybrid runs it three ways: its recurrent layers in one call (their chunked algorithm, keeping
   only the last
state: what an engine that cannot roll back runs), one position at a time keeping each state (what
specviz runs, decoding/kvcache.py: every other layer still takes the k + 1 slots at once), and the
attention-only model. Then a whole eqspec decode of each, side by side. Medians of repeated passes,
interleaved; CPU, one process.

    python benchmarks/hybrid.py [--hidden 512] [--layers 8] [--batch-size 8] [--k 5] [--repeats 9]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hybrids import ATTN, FA, GDN, LA  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from specviz.decoding import kvcache  # noqa: E402
from specviz.decoding.batch import forward, left_pad  # noqa: E402
from specviz.decoding.eqspec import eqspec  # noqa: E402
from specviz.models.checkpoints import embedded_tokenizer_dir  # noqa: E402
from specviz.models.pairs import load_pair  # noqa: E402
from specviz.spec.prompts import builtin_set  # noqa: E402


def _save(path: Path, layers: list[str], hidden: int) -> str:
    tok = AutoTokenizer.from_pretrained(embedded_tokenizer_dir())
    fields = {**ATTN, **GDN, "num_attention_heads": hidden // 64,
              "num_key_value_heads": hidden // 128,
              "head_dim": 64, "intermediate_size": 3 * hidden,
              "linear_num_key_heads": hidden // 128,
              "linear_num_value_heads": hidden // 64, "linear_key_head_dim": 64,
              "linear_value_head_dim": 64}
    config = AutoConfig.for_model("qwen3_5_text", vocab_size=len(tok), hidden_size=hidden,
                                  num_hidden_layers=len(layers), layer_types=layers,
                                  tie_word_embeddings=True, **fields)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _verify_seconds(pair, ids: list[list[int]], k: int, keep: bool) -> float:
    """One verify pass over k + 1 slots a row, after a fresh prefill of the rows."""
    tokens, valid = left_pad([i + [13] * k for i in ids], pair.device)
    S = tokens.shape[1] - k - 1
    cache = kvcache.new(pair.target)
    forward(pair.target, tokens[:, :S], valid[:, :S], 0, cache, pair.vocab_size, keep=1)
    start = time.perf_counter()
    with kvcache.keeping(cache, k + 1 if keep else 0):
        forward(pair.target, tokens, valid, S, cache, pair.vocab_size, keep=k + 1)
    return time.perf_counter() - start


def _state_bytes(pair, k: int, rows: int) -> int:
    """Bytes of recurrent state kept for one round: every recurrent layer's states, per row
    and kept position."""
    cache = kvcache.new(pair.target)
    with torch.inference_mode():
        pair.target(input_ids=torch.ones(1, 4, dtype=torch.long), cache=cache)
    per_row = sum(t[0].numel() * t.element_size() for s in kvcache.layers_states(cache)
                  for t in s.values())
    return per_row * rows * (k + 1)


@torch.inference_mode()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--new", type=int, default=32, help="tokens each eqspec row decodes")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp())
    kinds = {"hybrid": [LA, LA, LA, FA] * (args.layers // 4), "attention-only": [FA] * args.layers}
    pairs = {name: load_pair(t := _save(root / name, layers, args.hidden), t, dtype="float32",
                             device="cpu")
             for name, layers in kinds.items()}
    ids = pairs["hybrid"].encode(builtin_set("all")[: args.batch_size])
    ways = {"attention-only": (pairs["attention-only"], False), "hybrid, chunked (no states kept)":
            (pairs["hybrid"], False),
            "hybrid, a state kept per position (specviz)": (pairs["hybrid"], True)}
    times = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, (pair, keep) in ways.items():
            times[name].append(_verify_seconds(pair, ids, args.k, keep))
    base = statistics.median(times["attention-only"])
    print(f"# One verify pass: {args.layers} layers, hidden {args.hidden}, batch size "
          f"{args.batch_size}, k {args.k}, float32, {torch.get_num_threads()} threads, median of "
          f"{args.repeats}\n")
    print("| pass | ms | vs attention-only |\n|---|---:|---:|")
    for name, ts in times.items():
        print(f"| {name} | {1000 * statistics.median(ts):.1f} | "
              f"{statistics.median(ts) / base:.2f}x |")
    kept = _state_bytes(pairs["hybrid"], args.k, args.batch_size)
    print(f"\nRecurrent state kept a round: {kept / 2**20:.1f} MiB ({args.batch_size} rows x "
          f"{args.k + 1} positions).\n")
    print(f"| eqspec, {args.new} tokens a row | tokens/s |\n|---|---:|")
    for name, pair in pairs.items():
        start = time.perf_counter()
        out = eqspec(pair, ids, args.batch_size, args.k, args.new, record=False)
        print(f"| {name} | "
              f"{sum(len(o.ids) for o in out.outputs) / (time.perf_counter() - start):.1f} |")


if __name__ == "__main__":
    main()
