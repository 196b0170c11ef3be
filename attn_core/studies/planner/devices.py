"""Accelerators as a roofline sees them: memory bandwidth, dense bf16 FLOP/s and memory, each from its vendor's data
sheet (named in `source`), plus this machine as the engine measures it. Peak figures, not what a kernel reaches.

    find_device("H100 SXM").bandwidth_bytes_per_s   # 3.35e12
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attn_core.engine.untrusted import quoted

GIB = 1 << 30
# Memory capacity: the data sheet's "GB" read as GiB. HBM and GDDR dies come in powers of two, and what a program sees
# sits near the binary reading (the H200 here shows about 139 GiB of its "141 GB"; 141e9 bytes would be 131 GiB).


@dataclass(frozen=True, kw_only=True)
class Device:
    """One accelerator: its memory `bandwidth_bytes_per_s`, its dense (not 2:4-sparse) `flops_per_s` in `dtype`, its
    `memory_bytes`, and where the figures come from (`source`); `measured`: taken on this machine, not a data sheet."""

    name: str
    bandwidth_bytes_per_s: float
    flops_per_s: float
    memory_bytes: float
    source: str
    dtype: str = "bfloat16"
    measured: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                "flops_per_s": self.flops_per_s, "memory_bytes": self.memory_bytes, "dtype": self.dtype,
                "source": self.source, "measured": self.measured}


_TABLE = (
    Device(name="H100 SXM", bandwidth_bytes_per_s=3.35e12, flops_per_s=989e12, memory_bytes=80 * GIB,
           source="NVIDIA H100 Tensor Core GPU datasheet, SXM column: 3.35 TB/s HBM3, 80 GB, BF16 Tensor Core 1,979 "
                  "TFLOPS with sparsity, so 989 dense (the sheet: 'specifications 1/2 lower without sparsity')"),
    Device(name="H200", bandwidth_bytes_per_s=4.8e12, flops_per_s=989e12, memory_bytes=141 * GIB,
           source="NVIDIA H200 Tensor Core GPU datasheet, SXM column: 4.8 TB/s HBM3e, 141 GB, BF16 Tensor Core 1,979 "
                  "TFLOPS with sparsity, 989 dense (the H100's GH100 chip with more and faster memory)"),
    Device(name="B200", bandwidth_bytes_per_s=8e12, flops_per_s=2.25e15, memory_bytes=180 * GIB,
           source="NVIDIA HGX B200 specifications, per GPU at 1,000 W: 8 TB/s HBM3e, FP16/BF16 Tensor Core 4.5 PFLOPS "
                  "with sparsity, 2.25 dense; 180 GB per GPU as HGX/DGX B200 ship it (192 GB at the 2024 launch)"),
    Device(name="MI300X", bandwidth_bytes_per_s=5.3e12, flops_per_s=1307.4e12, memory_bytes=192 * GIB,
           source="AMD Instinct MI300X data sheet: 5.3 TB/s HBM3, 192 GB, peak BF16 1,307.4 TFLOPS dense (2,614.9 "
                  "with structured sparsity)"),
    Device(name="L40S", bandwidth_bytes_per_s=864e9, flops_per_s=362.05e12, memory_bytes=48 * GIB,
           source="NVIDIA L40S datasheet: 864 GB/s GDDR6, 48 GB, BF16 Tensor Core 362.05 TFLOPS dense (733 with "
                  "sparsity)"),
    Device(name="RTX 4090", bandwidth_bytes_per_s=1008e9, flops_per_s=165.2e12, memory_bytes=24 * GIB,
           source="NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 column: 1,008 GB/s GDDR6X, 24 GB, "
                  "peak BF16 Tensor TFLOPS with FP32 accumulate 165.2 dense (330.4 with sparsity)"),
    Device(name="M4 Max", bandwidth_bytes_per_s=546e9, flops_per_s=17e12, memory_bytes=128 * GIB,
           source="Apple, MacBook Pro (M4 Max, 16-core CPU, 40-core GPU) announcement, October 2024: 546 GB/s, up to "
                  "128 GB unified memory. Apple publishes no FLOP/s: 17 TFLOPS is a third-party estimate (5,120 "
                  "ALUs × 2 × about 1.68 GHz, bf16 at the fp32 rate), not verified"),
)
DEVICES: dict[str, Device] = {d.name.lower(): d for d in _TABLE}


def _key(name: str) -> str:
    return " ".join(str(name).lower().replace("-", " ").replace("_", " ").split())


_LOOKUP = {_key(k): d for k, d in DEVICES.items()} | {_key(k).replace(" ", ""): d for k, d in DEVICES.items()}


def find_device(name: str | Device) -> Device:
    """A device of the table by name, case, spaces and dashes aside ('h100-sxm', 'H100 SXM', 'h100sxm'), 'here' for
    this machine (`this_machine`), or a Device itself; ValueError listing the choices otherwise."""
    if isinstance(name, Device):
        return name
    key = _key(name) if isinstance(name, str) else ""
    if key in ("here", "this machine"):
        return this_machine()
    found = _LOOKUP.get(key) or _LOOKUP.get(key.replace(" ", ""))
    if found is None:
        raise ValueError(f"device {quoted(str(name), 40)} is not in the table; choose one of "
                         f"{', '.join(d.name for d in _TABLE)}, or 'here' for this machine as measured")
    return found


def this_machine(device: str = "cpu", dtype: str | None = None) -> Device:
    """This machine's `device` ('cpu', 'cuda', 'mps') as the engine measures it: the bandwidth of a 256 MiB copy
    (env.memory_bandwidth) and the FLOP/s of square matmuls in `dtype` (env.matmul_gflops; None: bfloat16 on a GPU,
    float32 on a CPU, whose bf16 matmuls are often emulated), both cached per process; its total memory."""
    from attn_core.engine import env  # measuring pulls in the timers; the table needs none of it

    dtype = dtype or ("float32" if device == "cpu" else "bfloat16")
    if device not in env.available_devices():
        raise ValueError(f"device {quoted(device, 20)} is not available here; choose one of "
                         f"{', '.join(env.available_devices())}")
    if dtype not in env.supported_dtypes(device):
        raise ValueError(f"dtype {quoted(dtype, 20)} does not run on {device}; choose one of "
                         f"{', '.join(env.supported_dtypes(device))}")
    bandwidth, gflops = env.memory_bandwidth(device), env.matmul_gflops(device, dtype)
    name = env.device_name(device)
    return Device(name=f"{name} (measured here)", bandwidth_bytes_per_s=bandwidth, flops_per_s=gflops * 1e9,
                  memory_bytes=float(env.total_memory_bytes(device)), dtype=dtype, measured=True,
                  source=f"measured here on {name}: a copy of a 256 MiB buffer at {bandwidth / 1e9:,.1f} GB/s, square "
                         f"{dtype} matmuls at {gflops:,.1f} GFLOP/s (best of a few samples, cached per process)")
