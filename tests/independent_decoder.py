"""An independent batch speculative decoder over HF transformers: the "other engine" the tests have
specviz judge from its token ids alone. It imports nothing of specviz (torch, transformers and the
standard library only), so that a bug they shared could not hide itself.

It keeps no KV cache: every pass feeds each row's whole sequence again, left-padded, with its own
attention mask and position ids. What a cached engine's cache would remember (the position a token
was fed at, K/V a rollback threw away) is kept per sequence and replayed on every pass, so a planted
bug lasts as it does in a cached engine.

`bug` plants a bug from the field by hand (or several at once: a tuple), named after specviz's fault
of the same mechanism (BUGS; SAMPLING_BUGS, of its sampler; LOSSLESS_BUGS, which keep the output;
OUTSIDE_BUGS, of no fault);
None is the correct engine, whose greedy outputs are those of the target decoding alone. It can
report its rounds as an engine would (each round's drafts and how many it accepted).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

BUGS = ("draft-bonus", "bonus-from-another-row", "verify-positions-not-advanced",
        "stop-at-last-token", "min-crop", "rollback-by-draft-list")
# bugs of its sampler (temperature > 0)
SAMPLING_BUGS = ("residual-from-draft", "temperature-draft-only")
# bugs that keep every greedy output right: a round keeps one draft fewer than the target chose
# (sampled: one fewer than its draws kept)
LOSSLESS_BUGS = ("accept-count-one-short",)
# an accept rule of no fault of the catalogue: a round keeps its drafts up to the last one the
# target chose, past a mismatch (the refused drafts before it kept too)
OUTSIDE_BUGS = ("keep-to-last-match",)
# the bugs that erase committed K/V (the tokens are kept)
ERASING = ("min-crop", "rollback-by-draft-list")


@dataclass
class _Seq:
    prompt: list[int]
    out: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)  # per token: the position the target was fed it at
    # tokens whose K/V the target no longer holds (zeroed)
    lost: set[int] = field(default_factory=set)
    draft_lost: set[int] = field(default_factory=set)  # the same in the draft model's cache
    # per round: the drafts offered to it and how many it accepted
    rounds: list[dict] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.out


def _logits(model, rows: list[list[int]], positions: list[list[int]], vocab: int, keep: int,
            zeroed: list[set[int]] | None = None) -> torch.Tensor:
    """(B, keep, vocab): the logits at each row's last `keep` tokens, every row fed whole. `zeroed`:
    per row, the tokens whose keys and values are zero at every layer (what a cache holds after its
    entries were erased)."""
    dev = next(model.parameters()).device
    B, width = len(rows), max(map(len, rows))
    ids = torch.zeros(B, width, dtype=torch.long)
    pos = torch.zeros(B, width, dtype=torch.long)
    real = torch.zeros(B, width, dtype=torch.bool)
    lost = torch.zeros(B, width, dtype=torch.bool)
    for r, (row, p) in enumerate(zip(rows, positions)):
        pad = width - len(row)
        ids[r, pad:], pos[r, pad:], real[r, pad:] = torch.tensor(row), torch.tensor(p), True
        lost[r, [pad + i for i in (zeroed[r] if zeroed else ())]] = True
    # causal over real tokens; every slot sees itself, so that a pad's row is never all -inf (NaN)
    slot = torch.arange(width)
    sees = ((real[:, None, :] & (slot[None, :] <= slot[:, None]))
            | torch.eye(width, dtype=torch.bool))
    bias = torch.zeros(B, 1, width, width, dtype=model.dtype).masked_fill(
        ~sees[:, None], torch.finfo(model.dtype).min)
    hooks = []
    # zero K and V as they leave their projections (RoPE and norms keep a zero vector zero)
    if lost.any():
        mask = lost[..., None].to(dev)
        projections = [m for n, m in model.named_modules() if n.endswith(("k_proj", "v_proj"))]
        if not projections:
            raise ValueError("zeroing K/V needs separate k_proj and v_proj modules")
        hooks = [m.register_forward_hook(lambda mod, args, out: out.masked_fill(mask, 0))
                 for m in projections]
    try:
        out = model(input_ids=ids.to(dev), attention_mask=bias.to(dev), position_ids=pos.to(dev),
                    use_cache=False, logits_to_keep=keep)
    finally:
        for h in hooks:
            h.remove()
    z = out.logits[..., :vocab]
    return z if z.dtype == torch.float64 else z.float()


def _lookup(hist: list[int], lo: int, hi: int, width: int) -> tuple[list[int], int]:
    """Prompt lookup: the tokens after the earliest earlier occurrence of the row's last n tokens,
    the longest n in [lo, hi] that has one. Returns `width` tokens (filler past the match's: the
    row's last token) and how many are real."""
    L = len(hist)
    for n in range(min(hi, L - 1), lo - 1, -1):
        for s in range(L - n):  # an occurrence followed by at least one token
            if hist[s:s + n] == hist[L - n:]:
                found = hist[s + n:s + n + width]
                return found + [hist[-1]] * (width - len(found)), len(found)
    return [hist[-1]] * width, 0


@torch.inference_mode()
def decode(target, draft, prompts: list[list[int]], *, k: int, max_new_tokens: int, batch_size: int,
           drafter: str = "model", ngram: tuple[int, int] | int = (1, 3), temperature: float = 0.0,
           seed: int = 0, eos_ids=(), bug: str | tuple[str, ...] | None = None,
           rounds: list | None = None) -> list[list[int]]:
    """Each prompt's output ids. Prompts run in consecutive static batches of `batch_size`; a
    finished row leaves its batch at once. `drafter`: "model" (the draft model) or "ngram" (prompt
    lookup over n in `ngram`, (min, max)). `rounds`, a list: each prompt's rounds are appended to
    it, as {"drafts": [...], "accepted": n}."""
    bugs = frozenset((bug,) if isinstance(bug, str) else bug or ())
    if (bugs - set(BUGS + SAMPLING_BUGS + LOSSLESS_BUGS + OUTSIDE_BUGS)
            or len(bugs & set(ERASING)) > 1):
        raise ValueError(f"unknown bugs, or two that erase the cache: {sorted(bugs)}")
    lo, hi = (ngram, ngram) if isinstance(ngram, int) else ngram
    vocab = min(m.get_output_embeddings().weight.shape[0] for m in (target, draft) if m is not None)
    eos, gen = set(eos_ids), torch.Generator().manual_seed(seed)
    outputs = []
    for start in range(0, len(prompts), batch_size):
        seqs = [_Seq(list(p), pos=list(range(len(p)))) for p in prompts[start:start + batch_size]]
        live = list(seqs)
        while live:
            live = _round(target, draft, live, k, max_new_tokens, drafter, lo, hi, temperature,
                          gen, eos, bugs, vocab)
        outputs += [s.out for s in seqs]
        if rounds is not None:
            rounds += [s.rounds for s in seqs]
    return outputs


def _round(target, draft, live: list[_Seq], k: int, budget: int, drafter: str, lo: int,
           hi: int, temperature: float, gen: torch.Generator, eos: set[int], bugs: frozenset[str],
           vocab: int) -> list[_Seq]:
    """One round of drafting, verifying and accepting for every live row; returns the rows
    that go on."""
    have = [len(s.out) for s in live]
    # near the budget, no more drafts than the shortest row can emit
    kr = max(1, min(k, budget - 1 - min(have)))
    # a draft that supplies the bonus proposes one more
    width = kr + 1 if "draft-bonus" in bugs else kr
    q = None
    if drafter == "model":
        drafts, q = _draft_chain(draft, live, width, vocab, temperature, gen, eos,
                                 stop_early="draft-bonus" not in bugs,
                                 zeroed=bool(bugs & set(ERASING)))
        counts = [len(drafts[0])] * len(live)
    else:
        drafts, counts = map(list, zip(*(_lookup(s.ids, lo, hi, width) for s in live)))
        counts = [min(c, kr) for c in counts]
    kk = min(kr, max(counts))  # the verify window: the most drafts any row was offered
    room = [min(max(0, min(kk, budget - 1 - h)), c) for h, c in zip(have, counts)]

    # verify: each row's sequence and its drafts in one pass
    # every window slot at the window's first position (the first round's too: an engine that
    # prefills the prompt apart verifies every window so)
    shifted = "verify-positions-not-advanced" in bugs
    z = _logits(target, [s.ids + d[:kk] for s, d in zip(live, drafts)],
                [s.pos + ([s.pos[-1]] * kk if shifted else list(range(len(s.ids), len(s.ids) + kk)))
                 for s in live],
                vocab, kk + 1, [s.lost for s in live] if bugs & set(ERASING) else None)

    # accept: drafts up to the first disagreement (or rejection), then the target's own token there
    accepted, own = [], []
    for r in range(len(live)):
        a = 0
        if temperature == 0:
            while a < room[r] and drafts[r][a] == int(z[r, a].argmax()):
                a += 1
            if "accept-count-one-short" in bugs:
                a = max(a - 1, 0)  # the bug: the last draft the target chose is refused
            if "keep-to-last-match" in bugs:  # the bug: up to the last draft the target chose
                a = max([i + 1 for i in range(room[r]) if drafts[r][i] == int(z[r, i].argmax())],
                        default=0)
            own.append(int(z[r, a].argmax()))
        else:
            # the bug: the draft's alone
            verify_at = 1.0 if "temperature-draft-only" in bugs else temperature
            p = (z[r] / verify_at).softmax(-1).double().cpu()
            qr = (q[r] if q is not None
                  else torch.nn.functional.one_hot(torch.tensor(drafts[r]), vocab).double())
            while a < room[r]:  # accept a draft d with probability min(1, p(d) / q(d))
                d = drafts[r][a]
                if (not float(torch.rand((), generator=gen, dtype=torch.float64)) * qr[a, d]
                        < p[a, d]):
                    break
                a += 1
            if "accept-count-one-short" in bugs:
                a = max(a - 1, 0)  # the bug: the last draft kept is refused
            if a == room[r]:  # the bonus
                dist = p[a]
            else:  # the residual; the bug draws from the draft's q instead
                dist = qr[a] if "residual-from-draft" in bugs else (p[a] - qr[a]).clamp(min=0)
            own.append(int(torch.multinomial(dist / dist.sum(), 1, generator=gen)))
        accepted.append(a)

    going = []
    for r, s in enumerate(live):
        a = accepted[r]
        if "draft-bonus" in bugs:
            pick = drafts[r][a]  # the draft's own next token
        elif "bonus-from-another-row" in bugs:
            pick = own[r - 1]  # the row before's choice (row 0: the last row's)
        else:
            pick = own[r]
        new = drafts[r][:a] + [pick]
        s.rounds.append({"drafts": drafts[r][:room[r]], "accepted": a})
        # only the block's last token ends the row
        stops = [a] if "stop-at-last-token" in bugs else range(a + 1)
        stop = next((i for i in stops if new[i] in eos), None)
        n_keep = min(a + 1, budget - have[r]) if stop is None else min(stop + 1, budget - have[r])
        finished = (stop is not None and stop < n_keep) or have[r] + n_keep >= budget
        base, opener = len(s.ids), s.pos[-1]
        s.out += new[:n_keep]
        # an accepted draft was fed at the window's first position; the last token is fed next
        # round, at its own
        s.pos += [opener if shifted and i < a else base + i for i in range(n_keep)]
        if finished:
            continue
        # the cache holds every token before the picked one; the bug erases its last entries
        if bugs & set(ERASING):
            held = base + a
            # min-crop: every row's cache cut to the batch's fewest accepted drafts (finished rows
            # count too); rollback-by-draft-list: rolled back by the widest draft list, a row
            # offered fewer loses the difference
            cut = (base + min(accepted) if "min-crop" in bugs
                   else max(0, held - max(0, kk - room[r])))
            s.lost |= set(range(cut, held))
            s.draft_lost |= set(range(cut, held - 1))  # the draft re-feeds its last two
        going.append(s)
    return going


def _draft_chain(draft, live: list[_Seq], n: int, vocab: int, temperature: float,
                 gen: torch.Generator, eos: set[int], stop_early: bool,
                 zeroed: bool) -> tuple[list[list[int]], torch.Tensor | None]:
    """Up to n drafts a row from the draft model, one pass each, and (sampled) the distributions
    they came from (B, n, V). Drafting stops once every row has drafted an end of sequence: nothing
    after it could be emitted."""
    chains: list[list[int]] = [[] for _ in live]
    dists = []
    for j in range(n):
        rows = [s.ids + c for s, c in zip(live, chains)]
        z = _logits(draft, rows, [list(range(len(x))) for x in rows], vocab, 1,
                    [s.draft_lost for s in live] if zeroed else None)[:, -1]
        if temperature == 0:
            nxt = z.argmax(-1).tolist()
        else:
            dists.append((z / temperature).softmax(-1).double().cpu())
            nxt = torch.multinomial(dists[-1], 1, generator=gen)[:, 0].tolist()
        for c, t in zip(chains, nxt):
            c.append(t)
        if stop_early and j < n - 1 and all(eos & set(c) for c in chains):
            break
    return chains, torch.stack(dists, 1) if dists else None


def write_outputs(path, prompts: list[list[int]], outputs: list[list[int]], settings: dict,
                  rounds: list[list[dict]] | None = None) -> None:
    """The outputs as specviz reads an engine's (engines/jsonl.py): a header, then one line
    a prompt (with its rounds, where given)."""
    with open(path, "w") as f:
        f.write(json.dumps({"engine": {"name": "independent-decoder", "settings": settings}})
                + "\n")
        for n, (p, o) in enumerate(zip(prompts, outputs)):
            line = {"prompt_ids": list(p), "output_ids": list(o)}
            if rounds is not None:
                line["rounds"] = rounds[n]
            f.write(json.dumps(line) + "\n")
