import torch

from specviz.decoding import kvcache
from specviz.decoding.batch import forward, left_pad


def _prefill(pair, prompts, width=None):
    tokens, valid = left_pad(prompts, pair.device, min_width=width or 1)
    cache = kvcache.new(pair.target)
    logits = forward(pair.target, tokens, valid, 0, cache, pair.vocab_size)
    return tokens, valid, cache, logits


def _assert_row_matches_alone(pair, cache, row, pad, ids):
    """I3: row `row`'s entries at slots pad.. equal a batch-size-1 prefill of `ids`."""
    _, _, alone, _ = _prefill(pair, [ids])
    for layer in range(len(cache.layers)):
        k, v = kvcache.row_kv(cache, layer, row)
        k1, v1 = kvcache.row_kv(alone, layer, 0)
        n = len(ids)
        torch.testing.assert_close(k[:, pad:pad + n], k1[:, :n], rtol=0, atol=1e-10)
        torch.testing.assert_close(v[:, pad:pad + n], v1[:, :n], rtol=0, atol=1e-10)


@torch.inference_mode()
def test_left_padded_prefill_matches_each_row_alone(tiny, mixed_prompts):
    prompts = [mixed_prompts[0][:5], mixed_prompts[1][:9]]
    _, _, cache, _ = _prefill(tiny, prompts)
    assert kvcache.length(cache) == 9
    _assert_row_matches_alone(tiny, cache, 0, 4, prompts[0])
    _assert_row_matches_alone(tiny, cache, 1, 0, prompts[1])


@torch.inference_mode()
def test_per_row_shift_by_gather_keeps_each_row_in_step(tiny, mixed_prompts):
    a, b = mixed_prompts[0][:5], mixed_prompts[1][:9]
    _, _, cache, _ = _prefill(tiny, [a, b])
    # A wider layout: both rows move right by 3 slots.
    width = 12
    shift = torch.tensor([3, 3])
    src = (torch.arange(width)[None] - shift[:, None]).clamp(0, 8)
    kvcache.gather(cache, torch.tensor([0, 1]), src)
    assert kvcache.length(cache) == width
    _assert_row_matches_alone(tiny, cache, 0, 4 + 3, a)
    _assert_row_matches_alone(tiny, cache, 1, 3, b)
    # Rows can move by different amounts and swap places in one gather.
    src = torch.stack([(torch.arange(10) + 2).clamp(max=11), (torch.arange(10) + 5).clamp(max=11)])
    kvcache.gather(cache, torch.tensor([1, 0]), src)
    _assert_row_matches_alone(tiny, cache, 0, 1, b)
    _assert_row_matches_alone(tiny, cache, 1, 2, a)


@torch.inference_mode()
def test_decoding_after_a_shift_equals_decoding_alone(tiny, mixed_prompts):
    a, b = mixed_prompts[0][:5], mixed_prompts[1][:9]
    _, _, cache, _ = _prefill(tiny, [a, b])
    # Append one token to both rows, shifting row 0 by +2 in a wider layout.
    nxt = torch.tensor([[11], [12]])
    new_tokens = torch.zeros(2, 12, dtype=torch.long)
    new_valid = torch.zeros(2, 12, dtype=torch.bool)
    new_tokens[0, 6:11], new_valid[0, 6:11] = torch.tensor(a), True
    new_tokens[1, 2:11], new_valid[1, 2:11] = torch.tensor(b), True
    new_tokens[:, 11:], new_valid[:, 11] = nxt, True
    src = torch.stack([(torch.arange(11) - 2).clamp(min=0), (torch.arange(11) - 2).clamp(min=0)])
    kvcache.gather(cache, torch.tensor([0, 1]), src)
    logits = forward(tiny.target, new_tokens, new_valid, 11, cache, tiny.vocab_size)
    for row, ids in enumerate([a + [11], b + [12]]):
        alone = tiny.target(torch.tensor([ids])).logits[0, -1, : tiny.vocab_size]
        torch.testing.assert_close(logits[row, -1], alone, rtol=0, atol=1e-9)


@torch.inference_mode()
def test_crop_and_select_rows(tiny, mixed_prompts):
    prompts = [mixed_prompts[0][:6], mixed_prompts[1][:6], mixed_prompts[3][:6]]
    _, _, cache, _ = _prefill(tiny, prompts)
    kvcache.crop(cache, 4)
    assert kvcache.length(cache) == 4
    _assert_row_matches_alone(tiny, cache, 1, 0, prompts[1][:4])
    kvcache.select_rows(cache, torch.tensor([2, 0]))
    assert cache.layers[0].keys.shape[0] == 2
    _assert_row_matches_alone(tiny, cache, 0, 0, prompts[2][:4])
    _assert_row_matches_alone(tiny, cache, 1, 0, prompts[0][:4])


@torch.inference_mode()
def test_split_and_merge_round_trip(tiny, mixed_prompts):
    a, b = mixed_prompts[0][:5], mixed_prompts[1][:9]
    _, _, cache, _ = _prefill(tiny, [a, b])
    rows = kvcache.split(cache, [(0, 9), (0, 9)])
    assert [kvcache.length(c) for c in rows] == [9, 9]
    unpadded = kvcache.split(cache, [(4, 9), (0, 9)])
    assert kvcache.length(unpadded[0]) == 5
    _assert_row_matches_alone(tiny, unpadded[0], 0, 0, a)
    merged = kvcache.merge(rows)
    for layer in range(len(cache.layers)):
        torch.testing.assert_close(merged.layers[layer].keys, cache.layers[layer].keys, rtol=0,
                                   atol=0)
    # Caches of different lengths merge left-padded: each row stays right-aligned.
    _, _, alone, _ = _prefill(tiny, [a])
    mixed = kvcache.merge([alone, rows[1]])
    assert kvcache.length(mixed) == 9
    _assert_row_matches_alone(tiny, mixed, 0, 4, a)
    _assert_row_matches_alone(tiny, mixed, 1, 0, b)
