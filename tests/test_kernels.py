"""The CPU float32 linear layers through oneDNN with packed weights (specviz/models/kernels.py)."""
import copy

import pytest
import torch

from specviz.decoding.eqspec import eqspec
from specviz.decoding.reference import batched_reference, reference
from specviz.models import kernels
from specviz.models.pairs import load_pair, tiny_target
from specviz.spec.run import TINY_DRAFT, TINY_TARGET


def packed_linear(out_features: int = 48, in_features: int = 32,
                  bias: bool = True) -> torch.nn.Linear:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(in_features, out_features, bias=bias))
    assert kernels.pack_linears(model)
    return model[0]


def test_a_packed_linear_computes_the_linear_map():
    linear = packed_linear()
    assert type(linear) is kernels.PackedLinear
    x = torch.randn(2, 5, 32)
    with torch.inference_mode():
        assert torch.allclose(linear(x), torch.nn.functional.linear(x, linear.weight, linear.bias),
                              atol=1e-5)


def test_a_weight_written_in_place_or_replaced_is_packed_again():
    """A stale packed copy would run yesterday's weights: the draft's noise, a test's planted bug, a
    resized head."""
    linear = packed_linear(bias=False)
    x = torch.randn(3, 32)
    with torch.inference_mode():
        before = linear(x)
    with torch.no_grad():
        linear.weight.mul_(2)
    with torch.inference_mode():
        assert torch.allclose(linear(x), 2 * before, atol=1e-5)
    linear.weight = torch.nn.Parameter(torch.zeros(48, 32))
    with torch.inference_mode():
        assert torch.equal(linear(x), torch.zeros(3, 48))


def test_other_dtypes_and_autograd_take_f_linear_exactly():
    linear = packed_linear()
    x = torch.randn(4, 32)
    grad = linear(x.requires_grad_())  # autograd: F.linear, so gradients flow
    grad.sum().backward()
    assert linear.weight.grad is not None
    # a copy leaves the packed weight behind (oneDNN's cannot be copied)
    wide = copy.deepcopy(linear).double()
    with torch.inference_mode():
        linear(x)
        assert "_packed" in linear.__dict__
        x64 = x.detach().double()
        assert torch.equal(wide(x64), torch.nn.functional.linear(x64, wide.weight, wide.bias))
    assert "_packed" not in wide.__dict__


def test_a_float32_pair_on_cpu_runs_packed_and_says_so_and_other_pairs_do_not():
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype="float32", device="cpu")
    assert pair.info["linear_kernels"] == kernels.NAME
    assert (type(pair.target.lm_head) is kernels.PackedLinear
            and type(pair.draft.lm_head) is kernels.PackedLinear)
    wide = load_pair(TINY_TARGET, TINY_DRAFT, dtype="float64", device="cpu")
    assert "linear_kernels" not in wide.info and type(wide.target.lm_head) is torch.nn.Linear


def test_batched_methods_on_packed_kernels_equal_their_batch_size_1_reference(mixed_prompts):
    """On the tiny pair in float32, prompts of very different lengths; the same weights through
    F.linear agree to rounding."""
    pair, prompts = load_pair(TINY_TARGET, TINY_DRAFT, dtype="float32", device="cpu"), mixed_prompts
    ref = [o.ids for o in reference(pair, prompts, 16).outputs]
    assert [o.ids for o in batched_reference(pair, prompts, 3, 16).outputs] == ref
    assert [o.ids for o in eqspec(pair, prompts, 3, 4, 16).outputs] == ref
    plain = tiny_target(torch.float32)  # the same weights through F.linear
    with torch.inference_mode():
        x = torch.tensor([prompts[0]])
        assert torch.allclose(plain(x).logits, pair.target(x).logits, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_linear_widened_to_float32_is_a_correct_gemm_in_its_dtype(monkeypatch,
                                                                                   dtype):
    """Where oneDNN has no GEMM for the dtype (forced here, so that every CPU runs it): more than
    one row sums in float32 on the packed weight and rounds once: off the float64 truth by at most
    the dtype's rounding of the result plus float32's textbook bound on a sum of n products, as
    `F.linear` in that dtype is; one row stays on `F.linear`, bit for bit."""
    monkeypatch.setattr(kernels, "WIDENED", frozenset({dtype}))
    linear = packed_linear(out_features=300, in_features=200).to(dtype)
    x = torch.randn(2, 7, 200).to(dtype)
    with torch.inference_mode():
        wide = linear(x)
        assert "_packed" in linear.__dict__ and wide.dtype == dtype
        plain = torch.nn.functional.linear(x, linear.weight, linear.bias)
        truth = torch.nn.functional.linear(x.double(), linear.weight.double(), linear.bias.double())
        scale = torch.nn.functional.linear(x.double().abs(), linear.weight.double().abs(),
                                           linear.bias.double().abs())
        bound = torch.finfo(dtype).eps * truth.abs() + 200 * torch.finfo(torch.float32).eps * scale
        for y in (wide, plain):
            assert ((y.double() - truth).abs() <= bound).all()
        assert (wide != plain).float().mean() < 0.01  # the same map, summed in another order
        one = x[:1, :1]
        assert torch.equal(linear(one), torch.nn.functional.linear(one, linear.weight, linear.bias))


def test_a_half_precision_pair_says_which_kernels_its_linears_run_on():
    """bfloat16 is widened only on a CPU without oneDNN's bfloat16 GEMM (AVX2 without AVX-512); the
    trace's pair says so wherever it is."""
    pair = load_pair(TINY_TARGET, TINY_DRAFT, dtype="bfloat16", device="cpu")
    if torch.bfloat16 in kernels.WIDENED:
        assert (pair.info["linear_kernels"]
                == "onednn-packed, bfloat16 widened to float32 above one row")
        assert type(pair.target.lm_head) is kernels.PackedLinear
    else:
        assert "linear_kernels" not in pair.info and type(pair.target.lm_head) is torch.nn.Linear
