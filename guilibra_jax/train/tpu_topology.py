"""TPU slices without a TPU: the devices of a named topology (``v5p:4x4x4``), the chips'
published figures, and a roofline estimate of a compiled program's time.

``jax.experimental.topologies.get_topology_desc`` with the ``libtpu`` package installed
(``pip install -e .[tpu]``) gives the devices of any TPU slice on a CPU-only machine;
programs lowered with shardings over them compile with the real TPU compiler, whose
``memory_analysis()`` and ``cost_analysis()`` are per device. Nothing runs.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from typing import NamedTuple

from guilibra_jax.errors import UserError


class Chip(NamedTuple):
    kind: str             # jax's device_kind
    peak_bf16_flops: float  # per chip, FLOP/s
    hbm_gib: float        # per chip
    hbm_bytes_per_s: float  # per chip


# Published per-chip figures (Cloud TPU system architecture pages):
CHIPS = {
    # https://cloud.google.com/tpu/docs/v4: 275 TFLOPs bf16, 32 GiB HBM2, 1200 GBps
    "v4": Chip("TPU v4", 275e12, 32.0, 1200e9),
    # https://cloud.google.com/tpu/docs/v5e: 197 TFLOPs bf16, 16 GB HBM2, 819 GBps
    "v5e": Chip("TPU v5 lite", 197e12, 16.0, 819e9),
    # https://cloud.google.com/tpu/docs/v5p: 459 TFLOPs bf16, 95 GB HBM2e, 2765 GBps
    "v5p": Chip("TPU v5", 459e12, 95.0, 2765e9),
    # https://cloud.google.com/tpu/docs/v6e: 918 TFLOPs bf16, 32 GB HBM, 1640 GBps
    "v6e": Chip("TPU v6 lite", 918e12, 32.0, 1640e9),
}
_NAME = re.compile(r"^(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$")


def parse_topology(name: str) -> tuple[str, tuple[int, ...]]:
    """``"v5p:4x4x4"`` -> ("v5p", (4, 4, 4)); UserError naming what is allowed."""
    m = _NAME.match(name or "")
    if not m:
        raise UserError(f"--topology={name!r} is not a TPU topology: expected GENERATION:AxB[xC] with GENERATION "
                        f"one of {sorted(CHIPS)}, e.g. v5e:2x2, v5p:4x4x4, v6e:4x4")
    return m.group(1), tuple(int(d) for d in m.group(2).split("x"))


def libtpu_available() -> bool:
    return importlib.util.find_spec("libtpu") is not None


class Topology(NamedTuple):
    name: str
    generation: str
    chips: int
    devices: list          # jax TPU devices (compile targets; nothing can run on them)
    hosts: int             # processes of a run on the slice (one per TPU VM)
    chip: Chip

    @property
    def devices_per_chip(self) -> int:
        return max(1, len(self.devices) // self.chips)

    @property
    def device_memory_gib(self) -> float:
        return self.chip.hbm_gib / self.devices_per_chip

    @property
    def device_peak_flops(self) -> float:
        return self.chip.peak_bf16_flops / self.devices_per_chip

    @property
    def device_hbm_bytes_per_s(self) -> float:
        return self.chip.hbm_bytes_per_s / self.devices_per_chip


def topology(name: str) -> Topology:
    """The devices of TPU slice ``name``; UserError for an unknown name or without libtpu."""
    generation, dims = parse_topology(name)
    if not libtpu_available():
        raise UserError(f"--topology={name} needs the TPU compiler (the libtpu package), which is not installed: "
                        f"pip install -e .[tpu]")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")   # quiets libtpu's start-up probe
    # compiling only: several planners (or a planner beside a test) may load libtpu at once;
    # without this the second one fails on libtpu's lockfile
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies
    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=name)
    except Exception as e:  # noqa: BLE001  (libtpu's own message says which shapes exist)
        raise UserError(f"--topology={name}: libtpu does not know this slice: {str(e).splitlines()[0]}") from None
    devices = list(desc.devices)
    hosts = len({d.process_index for d in devices})
    return Topology(name, generation, math.prod(dims), devices, hosts, CHIPS[generation])


def model_flops_per_token(params: int, layers: int, hidden: int, tokens: int, train: bool = True) -> float:
    """6N (2N forward) per token plus causal attention's score and value matmuls
    (2 x 2 x layers x hidden x T/2 forward per token, x3 with the backward)."""
    dense = (6 if train else 2) * params
    attention = (3 if train else 1) * 2 * 2 * layers * hidden * tokens / 2
    return dense + attention


def roofline(flops: float, bytes_accessed: float, topo: Topology) -> dict:
    """Lower bound on a per-device program's time: max(compute, HBM traffic) at peak."""
    compute = flops / topo.device_peak_flops
    memory = bytes_accessed / topo.device_hbm_bytes_per_s
    return {"compute_s": compute, "memory_s": memory, "time_s": max(compute, memory),
            "bound": "compute" if compute >= memory else "memory"}
