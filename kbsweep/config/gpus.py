"""The GPU a cell grades on (:class:`GpuSpec`, a ``gpu/<name>.yaml``), and GPU discovery through NVML
(nvidia-ml-py; an empty list on machines without a GPU).

NVML numbers GPUs in PCI bus order; a process that pins GPUs by index sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
so that CUDA numbers them the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from kbsweep.errors import KbsweepError


@dataclass
class GpuSpec:
    """One ``gpu/<name>.yaml``: the config group's schema (:data:`kbsweep.config.schema.GROUP_SCHEMAS`; a field without a
    default is a required key) and the record a cell, a grade request and a prompt carry. Loaded and checked by
    :func:`kbsweep.config.schema.load_gpu` or a composed config's validation."""

    name: str
    description: str  # filled into prompts
    roofline: str  # roofline_specs/<roofline>.yaml
    nvml_names: List[str] = field(default_factory=list)  # matched by gpu=auto
    device: str = "cuda"  # cuda | cpu
    shape_set: str = "shapes"  # shapes | smoke_shapes
    hourly_usd: Optional[float] = None  # rental price of one GPU, for plan estimates
    gpus_per_node: int = 1
    baselines: Optional[List[str]] = None  # replaces grade.baselines on this GPU when set

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def list_gpus() -> List[Dict[str, Any]]:
    """Index, name, UUID, memory, clocks and the compute processes of every visible GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no device: the CPU path
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            info: Dict[str, Any] = {
                "index": index,
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
                "memory_total_mib": pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
            }
            for label, clock in (("sm_clock_mhz", pynvml.NVML_CLOCK_SM), ("mem_clock_mhz", pynvml.NVML_CLOCK_MEM)):
                try:
                    info[label] = pynvml.nvmlDeviceGetClockInfo(handle, clock)
                    info[f"max_{label}"] = pynvml.nvmlDeviceGetMaxClockInfo(handle, clock)
                except pynvml.NVMLError:
                    pass
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                info["processes"] = [{"pid": p.pid, "used_mib": (p.usedGpuMemory or 0) // 2**20} for p in procs]
            except pynvml.NVMLError:
                info["processes"] = None
            gpus.append(info)
        return gpus
    finally:
        pynvml.nvmlShutdown()


def visible_gpus(
    found: Optional[List[Dict[str, Any]]] = None, cuda_visible: Optional[str] = None
) -> List[Dict[str, str]]:
    """The GPUs this process may use, each ``{"visible": its CUDA_VISIBLE_DEVICES entry, "uuid": machine-wide id}``.

    ``found`` defaults to NVML's list and ``cuda_visible`` to the environment's CUDA_VISIBLE_DEVICES, whose
    entries (indices or UUID prefixes) narrow that list; unset means every GPU found. An entry NVML does not
    know keeps its own text as its id.
    """
    found = list_gpus() if found is None else found
    cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES") if cuda_visible is None else cuda_visible
    if cuda_visible is None:
        return [{"visible": str(g["index"]), "uuid": g["uuid"]} for g in found]
    pool = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        if not entry:
            continue
        match = [g for g in found if (str(g["index"]) == entry if entry.isdigit() else g["uuid"].startswith(entry))]
        pool.append({"visible": entry, "uuid": match[0]["uuid"] if match else entry})
    return pool


def pool_devices(
    found: Optional[List[Dict[str, Any]]] = None, cuda_visible: Optional[str] = None
) -> List[Dict[str, Any]]:
    """The GPUs a grade in this process may take (:func:`visible_gpus`, same arguments), each with ``name``: NVML's,
    None for an entry NVML does not list."""
    found = list_gpus() if found is None else found
    names = {gpu["uuid"]: gpu["name"] for gpu in found}
    return [{**entry, "name": names.get(entry["uuid"])} for entry in visible_gpus(found, cuda_visible)]


def gpu_mismatch(
    spec: GpuSpec, found: Optional[List[Dict[str, Any]]] = None, cuda_visible: Optional[str] = None
) -> Optional[str]:
    """Why a grade in this process would not run on the card ``spec`` names, else None (a CPU config: always None).

    Every GPU of the pool (:func:`pool_devices`, same arguments) must be one ``spec.nvml_names`` lists, since a grade
    takes whichever is free; none at all is a mismatch too. Asked where the grade runs, never where a sweep is planned.
    """
    if not spec.cuda:
        return None
    pool = pool_devices(found, cuda_visible)
    wanted = f"gpu={spec.name} (gpu/{spec.name}.yaml: nvml_names {', '.join(repr(name) for name in spec.nvml_names) or 'empty'})"
    if not pool:
        return f"{wanted}, but no GPU is visible here; use gpu=cpu (or gpu=auto, which picks cpu where there is no GPU)"
    for device in pool:
        if device["name"] in spec.nvml_names:
            continue
        here = (
            f"GPU {device['visible']} here is {device['name']!r}"
            if device["name"]
            else f"CUDA_VISIBLE_DEVICES names {device['visible']!r}, which NVML does not list here"
        )
        return f"{wanted}, but {here}; use gpu=auto (it picks the gpu YAML listing the card here)"
    return None


def require_card(spec: GpuSpec) -> None:
    """Refuse in one line (:class:`KbsweepError`) to grade as ``spec`` where :func:`gpu_mismatch` finds another card."""
    mismatch = gpu_mismatch(spec)
    if mismatch:
        raise KbsweepError(mismatch)
