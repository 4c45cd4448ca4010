"""Int8 linear layers for the CPU query encoder, each token row quantised on its own.

torch's dynamic quantisation (`torch.ao.quantization.quantize_dynamic`) takes one activation scale
per call, over the whole batch, on 7 bits: a query's vector then depends on the queries batched with
it, and recall drops. Here every row gets its own scale on all 8 bits and weights one scale per
output channel, so a query's vector depends on the query alone and recall stays fp32's.
The integer products run in `torch._int_mm`, exact in int32.

int8 is faster than fp32 only where `torch._int_mm` runs oneDNN's kernels: torch hands it to oneDNN
where cpuinfo finds AVX-512 VNNI (and oneDNN is on), and elsewhere (AVX2 CPUs: Zen 2 and 3, Haswell
to Skylake client, Alder Lake) runs a reference loop, with which the int8 encoder answered 20-40x
fewer queries/s than fp32 (`benchmarks/RESULTS.md`, "Retriever").
`int8_slow_here` tells which.
"""

from __future__ import annotations

from pathlib import Path

import torch


class Int8Linear(torch.nn.Module):
    """`torch.nn.Linear` with int8 weights (per output channel) and int8 inputs (per row)."""

    def __init__(self, linear: torch.nn.Linear, weight_max: int = 127):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / weight_max
        bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(weight.shape[0])
        self.register_buffer("weight", torch.round(weight / scale[:, None]).to(torch.int8).t().contiguous())
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127)
        product = torch._int_mm(torch.round(rows / scale).to(torch.int8), self.weight).float().mul_(scale)
        return torch.addcmul(self.bias, product, self.weight_scale).reshape(*x.shape[:-1], -1).to(x.dtype)


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every linear layer of `model` (in place) by an `Int8Linear`; returns `model`.

    Weights keep 7 bits on CPUs without VNNI, where int8 products are summed in saturating int16
    pairs (oneDNN's advice); with VNNI nothing saturates and they get all 8.
    """
    weight_max = 127 if any("vnni" in flag for flag in cpu_flags()) else 63
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, Int8Linear(child, weight_max))
    return model


def int8_matmul() -> str:
    """What multiplies int8 matrices in this process: "onednn" (VNNI kernels) or "reference" (torch's
    loop). The inputs of torch's own choice in `_int_mm_out_cpu`: cpuinfo's AVX-512 VNNI and whether
    oneDNN is available and enabled (`torch.backends.mkldnn`)."""
    has_vnni = getattr(torch.cpu, "_is_vnni_supported", None)  # cpuinfo's avx512vnni, as torch asks it
    vnni = has_vnni() if has_vnni is not None else "avx512_vnni" in cpu_flags()
    onednn = torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
    return "onednn" if vnni and onednn else "reference"


def int8_slow_here() -> str | None:
    """Why the int8 query encoder is slower than fp32 in this process, or None where it is faster."""
    if int8_matmul() == "onednn":
        return None
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return "torch's oneDNN is off, so int8 products run torch's reference loop"
    return "this CPU lacks AVX-512 VNNI, so torch multiplies int8 matrices with its reference loop"


def cpu_flags() -> list[str]:
    """This CPU's flags from /proc/cpuinfo (none where it cannot be read)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []
    return next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
