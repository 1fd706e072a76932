"""GPU discovery through NVML (nvidia-ml-py); an empty list on machines without a GPU."""
from __future__ import annotations

from typing import Any, Dict, List


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
