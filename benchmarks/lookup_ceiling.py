"""How many tokens a round prompt lookup can give on the embedded pair, whatever its verify costs:
proposal rules replayed on the exact greedy reference, no timing.

Greedy lookup eqspec writes the batch-size-1 reference (the equivalence grids check it), so its
rounds at batch size 1 can be replayed from the reference alone: at each round the row's history is
its prompt and the reference so far; PromptLookup itself proposes tokens, a rule may cap them; the
leading ones equal to the reference's next are accepted, and the target adds one. Tokens per round
is then exact, and it bounds the speed-up over the reference wherever a verify pass costs what a
one-token pass does (this CPU with the packed kernels, docs/benchmarks.md). The rules:
PromptLookup's own (the longest n-gram in range, its earliest match, up to k tokens), over several n
ranges, and caps on the tokens proposed by the length of the match. Then, as SuffixDecoding does,
matches over the outputs of other requests too: where the row's own history has no match of n
tokens, the most frequent continuation of that n-gram in the outputs written before it in the run
(or, for a server warmed by every other prompt, in all the others' outputs), before any shorter n.

    python benchmarks/lookup_ceiling.py [--prompt-set summarize+code] [--k 5] [--max-new-tokens 48]
                                        [--out benchmarks/results/lookup-ceiling.md]
"""
from collections import Counter
from types import SimpleNamespace

import torch

from specviz.decoding.drafters import PromptLookup
from specviz.decoding.faults import Policy
from specviz.decoding.reference import reference
from specviz.decoding.sampling import GREEDY
from specviz.models.pairs import load_pair
from specviz.spec.prompts import builtin_set
from publish import publish

import options

CAPS = {"k": lambda n, k: k, "1 after a 1-gram": lambda n, k: 1 if n == 1 else k,
        "n + 1": lambda n, k: min(k, n + 1), "2n": lambda n, k: min(k, 2 * n)}
RANGES = ((2, 3), (1, 3), (1, 4), (2, 4), (3, 4))


def proposal(lookups: dict[int, PromptLookup], history: list[int], min_n: int, max_n: int, k: int,
             cap) -> list[int]:
    """What PromptLookup offers on `history`, capped by the length n of the match it took: its
    longest n with a match is the first n, from max_n down, for which the lookup of n alone
    (`lookups[n]`) offers anything."""
    batch = SimpleNamespace(tokens=torch.tensor([history]),
                            valid=torch.ones(1, len(history), dtype=torch.bool))
    for n in range(max_n, min_n - 1, -1):
        offer = lookups[n].propose(Policy(()), batch, k, GREEDY, torch.zeros(1), torch.zeros(1))
        count = int(offer.counts[0])
        if count:
            return offer.tokens[0, : min(count, cap(n, k))].tolist()
    return []


def with_outputs(lookups: dict[int, PromptLookup], history: list[int], outputs: list[list[int]],
                 min_n: int, max_n: int, k: int) -> list[int]:
    """The row's own earliest match of its last n tokens; failing that, the most frequent
    continuation of them in `outputs` (first seen on a tie); from max_n down."""
    for n in range(max_n, min_n - 1, -1):
        own = proposal(lookups, history, n, n, k, CAPS["k"])
        if own:
            return own
        follows = Counter(tuple(out[i + n: i + n + k]) for out in outputs
                          for i in range(len(out) - n)
                          if out[i: i + n] == history[-n:])
        if follows:
            return list(follows.most_common(1)[0][0])
    return []


def tokens_per_round(lookups: dict[int, PromptLookup], prompts: list[list[int]],
                     refs: list[list[int]], min_n: int,
                     max_n: int, k: int, cap, outputs: str | None = None) -> float:
    """Tokens per round of the rule over every prompt; `outputs`: none (the row's own history only),
    "earlier" (the outputs of the prompts before it) or "others" (every other prompt's)."""
    tokens = rounds = 0
    for j, (prompt, ref) in enumerate(zip(prompts, refs)):
        done = 0
        seen = refs[:j] if outputs == "earlier" else refs[:j] + refs[j + 1:]
        while done < len(ref):
            history = prompt + ref[:done]
            offered = (proposal(lookups, history, min_n, max_n, k, cap) if outputs is None
                       else with_outputs(lookups, history, seen, min_n, max_n, k))
            accepted = next((i for i, t in enumerate(offered) if done + i >= len(ref)
                             or t != ref[done + i]), len(offered))
            done += min(accepted + 1, len(ref) - done)
            rounds += 1
        tokens += len(ref)
    return tokens / rounds


def main() -> None:
    ap = options.parser(__doc__, prompt_set="summarize+code", k=5, max_new_tokens=48, threads=2,
                        out=None)
    args = options.parse(ap)
    pair = load_pair(dtype="float32", device="cpu")
    lookups = {n: PromptLookup(pair, n, n) for n in range(1, max(n for _, n in RANGES) + 1)}
    prompts = pair.encode(builtin_set(args.prompt_set))
    refs = [o.ids for o in reference(pair, prompts, args.max_new_tokens).outputs]
    lines = [f"# Prompt lookup's ceiling: {args.prompt_set}, {len(prompts)} prompts, "
             f"{args.max_new_tokens} tokens, k {args.k}, batch size 1\n",
             "| n-grams | " + " | ".join(f"cap {c}" for c in CAPS) + " |",
             "|---|" + "---:|" * len(CAPS)]
    for min_n, max_n in RANGES:
        row = [tokens_per_round(lookups, prompts, refs, min_n, max_n, args.k, cap)
               for cap in CAPS.values()]
        lines.append(f"| {min_n}-{max_n} | " + " | ".join(f"{x:.3f}" for x in row) + " |")
        print(lines[-1], flush=True)
    lines += ["", "| n-grams | own history | and earlier outputs | and every other output |",
              "|---|---:|---:|---:|"]
    for min_n, max_n in RANGES:
        row = [tokens_per_round(lookups, prompts, refs, min_n, max_n, args.k, CAPS["k"], outputs)
               for outputs in (None, "earlier", "others")]
        lines.append(f"| {min_n}-{max_n} | " + " | ".join(f"{x:.3f}" for x in row) + " |")
        print(lines[-1], flush=True)
    lines.append("\nTokens per round: the speed-up over the reference where a verify pass costs a "
                 "one-token pass. Second table: up to k tokens, matched in the row's own prompt "
                 "and output first, then in other requests' outputs (the most frequent "
                 "continuation), as SuffixDecoding proposes.")
    publish("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
