"""Linear layers on CPU through oneDNN with each weight packed once, as vLLM's CPU backend
runs them.

At a batch-8 decoding step, GEMMs were 73% of the time. There `F.linear` (MKL's sgemm) takes about
twice as long as oneDNN's GEMM on a weight laid out for it in advance on the MLP's weights, and four
times on the output head; at one row the small GEMMs are slower packed, the head still faster
(`python benchmarks/linear_kernels.py`). Neither kernel gives a row the same bits at every batch
size, so this changes which batches round alike, not whether they can differ; the forensics' float64
yardstick runs plain `F.linear` (its dtype is not float32) and stays apart from both.

A CPU without oneDNN's bfloat16 (or float16) GEMM, such as one with AVX2 and no AVX-512, runs
`F.linear` in that dtype through a generic loop at about a tenth of float32's speed. There a
half-precision linear of more than one row widens to float32 and runs packed: each product of two
half-precision numbers is exact in float32, the sum accumulates in float32 as every half-precision
GEMM's does, and the result rounds once to the dtype. It is another correct GEMM in that dtype,
summing in another order (about one output in 10,000 lands one unit in the last place apart). At one
row the GEMMs are bound by reading the weights, and the half-precision ones, half the bytes, stay
on `F.linear`.

A packed weight is a copy, rebuilt whenever the weight tensor is replaced or written in place; any
other input (another dtype or device, autograd through the weight or the input) takes `F.linear`:
oneDNN's kernel has no backward.
"""
from __future__ import annotations

import torch

NAME = "onednn-packed"


def tensor_version(t: torch.Tensor) -> int:
    """How many in-place writes `t` has had (torch's counter; an inference tensor keeps none, and
    none can be written outside inference mode)."""
    return 0 if t.is_inference() else t._version


def _widened() -> frozenset[torch.dtype]:
    """The half-precision dtypes this CPU has no oneDNN GEMM for."""
    native = {torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
              torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported()}
    return frozenset(dtype for dtype, supported in native.items() if not supported)


WIDENED = _widened() if torch.backends.mkldnn.is_available() else frozenset()


def name_for(dtype: torch.dtype) -> str | None:
    """The kernels a CPU model in `dtype` runs its linear layers on here (the trace's pair records
    it); None: `F.linear`'s."""
    if not torch.backends.mkldnn.is_available():
        return None
    if dtype == torch.float32:
        return NAME
    if dtype in WIDENED:
        return f"{NAME}, {str(dtype).removeprefix('torch.')} widened to float32 above one row"
    return None


def pack_linears(model: torch.nn.Module) -> bool:
    """Send `model`'s plain linear layers through PackedLinear; False where oneDNN
    is not built in."""
    if not torch.backends.mkldnn.is_available():
        return False
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = PackedLinear
    return True


def unpack_linears(model: torch.nn.Module) -> None:
    """Back to `F.linear` (the benchmark's "before")."""
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__dict__.pop("_packed", None)
            module.__class__ = torch.nn.Linear


class PackedLinear(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if not (x.dtype == w.dtype and x.device.type == w.device.type == "cpu"
                and not (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
            return super().forward(x)
        if x.dtype == torch.float32:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight(), self.bias, "none",
                                                      [], "")
        if x.dtype in WIDENED and x.numel() > x.shape[-1]:
            return widened_linear(x, self._packed_weight(), self.bias)
        return super().forward(x)

    def _packed_weight(self) -> torch.Tensor:
        """The weight in float32, laid out for oneDNN: made once per weight tensor and version."""
        w = self.weight
        key = (w.data_ptr(), w.dtype, tensor_version(w))
        packed = self.__dict__.get("_packed")
        if packed is None or packed[0] != key:
            packed = self.__dict__["_packed"] = (
                key, torch.ops.mkldnn._reorder_linear_weight(w.detach().float(), None))
        return packed[1]

    def __getstate__(self):
        """Copies (deepcopy, pickling) leave the packed weight behind: oneDNN's opaque tensors
        cannot be copied."""
        state = dict(self.__dict__)
        state.pop("_packed", None)
        return state


def widened_linear(x: torch.Tensor, packed: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """A half-precision linear map summed in float32 on a packed float32 weight, rounded once to
    `x`'s dtype."""
    wide_bias = None if bias is None else bias.float()
    return torch.ops.mkldnn._linear_pointwise(x.float(), packed, wide_bias, "none", [],
                                              "").to(x.dtype)
