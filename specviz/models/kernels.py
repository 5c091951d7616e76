"""Linear layers on CPU in float32 through oneDNN with each weight packed once, as vLLM's CPU backend runs them.

At a batch-8 decoding step, GEMMs were 73% of the time. There `F.linear` (MKL's sgemm) takes about twice as
long as oneDNN's GEMM on a weight laid out for it in advance on the MLP's weights, and four times on the output
head; at one row the small GEMMs are slower packed, the head still faster (`python benchmarks/linear_kernels.py`).
Neither kernel gives a row the same bits at every batch size, so this changes which batches round alike, not
whether they can differ; the forensics' float64 yardstick runs plain `F.linear` (its dtype is not float32) and
stays apart from both.

A packed weight is a copy, rebuilt whenever the weight tensor is replaced or written in place; any other
input (another dtype or device, autograd) takes `F.linear`.
"""
from __future__ import annotations

import torch

NAME = "onednn-packed"


def pack_linears(model: torch.nn.Module) -> bool:
    """Send `model`'s plain linear layers through PackedLinear; False where oneDNN is not built in."""
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
        if not (x.dtype == w.dtype == torch.float32 and x.device.type == w.device.type == "cpu"
                and not (torch.is_grad_enabled() and w.requires_grad)):
            return super().forward(x)
        key = (w.data_ptr(), 0 if w.is_inference() else w._version)
        packed = self.__dict__.get("_packed")
        if packed is None or packed[0] != key:
            packed = self.__dict__["_packed"] = (key, torch.ops.mkldnn._reorder_linear_weight(w.detach(), None))
        return torch.ops.mkldnn._linear_pointwise(x, packed[1], self.bias, "none", [], "")

    def __getstate__(self):
        """Copies (deepcopy, pickling) leave the packed weight behind: oneDNN's opaque tensors cannot be copied."""
        state = dict(self.__dict__)
        state.pop("_packed", None)
        return state
