"""A second engine written apart from specviz and from tests/independent_decoder.py: a greedy
speculative decoder at batch size 1 over transformers' own KV cache (DynamicCache), as a small
engine is written. The prompt is prefilled alone; each round verifies the window [last token,
drafts] over the cache, then crops both caches to the tokens kept.

`bug`: oMLX PR #2363, every slot of a verify window at the window's first position, the keys
committed to the cache so (from the first round on: its prefill is apart)."""
import torch
from transformers import DynamicCache


@torch.inference_mode()
def decode_one(target, draft, prompt: list[int], k: int, budget: int, eos: set[int],
               bug: bool = False) -> list[int]:
    """The output ids of one prompt, at most `budget`."""
    tc, dc = DynamicCache(), DynamicCache()
    ids = list(prompt)
    # prefill both models on all but the last prompt token
    for model, cache in ((target, tc), (draft, dc)):
        if len(ids) > 1:
            model(input_ids=torch.tensor([ids[:-1]]), past_key_values=cache, use_cache=True,
                  position_ids=torch.arange(len(ids) - 1)[None])
    out = []
    while len(out) < budget:
        # drafts: the draft model feeds what its cache lacks, then its own guesses
        n = min(k, budget - len(out) - 1)
        drafts = []
        feed = ids[dc.get_seq_length():]
        for _ in range(n):
            start = dc.get_seq_length()
            z = draft(input_ids=torch.tensor([feed]), past_key_values=dc, use_cache=True,
                      position_ids=torch.arange(start, start + len(feed))[None]).logits[0, -1]
            drafts.append(int(z.argmax()))
            feed = drafts[-1:]
        # verify: the last token and the drafts in one window
        start = tc.get_seq_length()
        window = ids[start:] + drafts
        pos = (torch.full((len(window),), start) if bug
               else torch.arange(start, start + len(window)))
        z = target(input_ids=torch.tensor([window]), past_key_values=tc, use_cache=True,
                   position_ids=pos[None]).logits[0]
        choice = z.argmax(-1).tolist()[len(window) - len(drafts) - 1:]
        a = 0
        while a < len(drafts) and drafts[a] == choice[a]:
            a += 1
        new = drafts[:a] + [choice[a]]
        stop = next((i for i, t in enumerate(new) if t in eos), None)
        new = new[: (stop + 1) if stop is not None else len(new)][: budget - len(out)]
        out += new
        ids += new
        # the caches keep what was accepted; the last new token is fed next round
        for cache in (tc, dc):
            extra = cache.get_seq_length() - (len(ids) - 1)
            if extra > 0:
                cache.crop(-extra)
        if stop is not None:
            break
    return out
