"""Memory the referee shares with the candidate's runner: one arena per shape, handed over as a file descriptor.

CPU: a memfd both processes map. CUDA: device memory from the driver's virtual-memory API, exported as a POSIX
file descriptor (it crosses the two sandboxes' PID and IPC namespaces, where legacy CUDA IPC handles do not).
Tensors are views at offsets; what crosses the channel is a slot ``{"offset", "dtype", "shape"}``, never a
pickle. The referee writes inputs and weights into the arena and reads outputs from it; nothing it keeps for
itself (pristine inputs, the reference's weights and outputs) is ever placed there.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any, Dict, List, Optional, Sequence

import torch

ALIGN = 256
DTYPES = {
    str(d).replace("torch.", ""): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
    )
}

Slot = Dict[str, Any]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def seed_rng(seed: int, device: torch.device) -> None:
    """Seed torch's global RNG for the draws of ``device`` (weights, inputs). On a CPU grade the default generator is
    the one they use: ``torch.manual_seed`` would also queue a lazy CUDA, XPU and MTIA seeding per call, each with
    its formatted stack (7.7 s of the referee's py-spy samples over a 100-cell demo sweep)."""
    if device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def padded(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


class _DriverMemory:
    """CUDA VMM through libcuda (ctypes): create + export, or import, then reserve, map and enable access."""

    class Location(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    class Flags(ctypes.Structure):
        _fields_ = [
            ("compression", ctypes.c_ubyte),
            ("rdma", ctypes.c_ubyte),
            ("usage", ctypes.c_ushort),
            ("reserved", ctypes.c_ubyte * 4),
        ]

    class Prop(ctypes.Structure):
        pass

    class Access(ctypes.Structure):
        pass

    Prop._fields_ = [
        ("type", ctypes.c_int),
        ("handle_types", ctypes.c_int),
        ("location", Location),
        ("win32", ctypes.c_void_p),
        ("flags", Flags),
    ]
    Access._fields_ = [("location", Location), ("flags", ctypes.c_int)]
    PINNED, POSIX_FD, DEVICE, READ_WRITE = 1, 1, 1, 3

    def __init__(self, size: int, fd: Optional[int] = None):
        torch.empty(1, device="cuda")  # makes torch's primary context current on this thread
        self.lib = ctypes.CDLL("libcuda.so.1")
        device = torch.cuda.current_device()
        prop = self.Prop(type=self.PINNED, handle_types=self.POSIX_FD, location=self.Location(self.DEVICE, device))
        granularity = ctypes.c_size_t()
        self.call("cuMemGetAllocationGranularity", ctypes.byref(granularity), ctypes.byref(prop), 0)
        self.size = (size + granularity.value - 1) // granularity.value * granularity.value
        self.handle = ctypes.c_ulonglong()
        if fd is None:
            self.call(
                "cuMemCreate",
                ctypes.byref(self.handle),
                ctypes.c_size_t(self.size),
                ctypes.byref(prop),
                ctypes.c_ulonglong(0),
            )
            exported = ctypes.c_int()
            self.call(
                "cuMemExportToShareableHandle",
                ctypes.byref(exported),
                self.handle,
                self.POSIX_FD,
                ctypes.c_ulonglong(0),
            )
            self.fd = exported.value
        else:
            self.call("cuMemImportFromShareableHandle", ctypes.byref(self.handle), ctypes.c_void_p(fd), self.POSIX_FD)
            self.fd = fd
        self.ptr = ctypes.c_ulonglong()
        self.call(
            "cuMemAddressReserve",
            ctypes.byref(self.ptr),
            ctypes.c_size_t(self.size),
            ctypes.c_size_t(0),
            ctypes.c_ulonglong(0),
            ctypes.c_ulonglong(0),
        )
        self.call(
            "cuMemMap", self.ptr, ctypes.c_size_t(self.size), ctypes.c_size_t(0), self.handle, ctypes.c_ulonglong(0)
        )
        access = self.Access(location=self.Location(self.DEVICE, device), flags=self.READ_WRITE)
        self.call("cuMemSetAccess", self.ptr, ctypes.c_size_t(self.size), ctypes.byref(access), ctypes.c_size_t(1))

    def call(self, name: str, *args: Any) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise RuntimeError(f"{name} failed with CUDA driver error {status}")

    def bytes(self, offset: int, size: int) -> torch.Tensor:
        interface = type(
            "DeviceBytes",
            (),
            {
                "__cuda_array_interface__": {
                    "shape": (size,),
                    "typestr": "|u1",
                    "data": (self.ptr.value + offset, False),
                    "version": 3,
                }
            },
        )
        return torch.as_tensor(interface(), device="cuda")

    def close(self) -> None:
        torch.cuda.synchronize()
        self.call("cuMemUnmap", self.ptr, ctypes.c_size_t(self.size))
        self.call("cuMemAddressFree", self.ptr, ctypes.c_size_t(self.size))
        self.call("cuMemRelease", self.handle)
        os.close(self.fd)


class Arena:
    """``nbytes`` of shared memory on ``device``: created by the referee (:meth:`create`, then its :attr:`fd` goes
    to the runner) or attached by the runner (:meth:`attach`)."""

    def __init__(self, size: int, device: torch.device, fd: Optional[int]):
        self.device, self.used = device, 0
        self.views: Dict[tuple, torch.Tensor] = {}
        if device.type == "cuda":
            self.memory: Any = _DriverMemory(size, fd)
            self.fd, self.size = self.memory.fd, self.memory.size
        else:
            self.size = max(size, ALIGN)
            self.fd = os.memfd_create("kbsweep-arena") if fd is None else fd
            if fd is None:
                try:
                    os.ftruncate(self.fd, self.size)
                except OSError as exc:  # EFBIG: a memfd counts against the sandbox's one-file cap; say which file
                    os.close(self.fd)
                    raise OSError(
                        exc.errno,
                        exc.strerror,
                        f"the shared arena (a memfd of {self.size} bytes: inputs, weights and outputs)",
                    ) from None
            self.memory = mmap.mmap(self.fd, self.size)

    @classmethod
    def create(cls, size: int, device: torch.device) -> "Arena":
        return cls(size, device, None)

    @classmethod
    def attach(cls, fd: int, size: int, device: torch.device) -> "Arena":
        return cls(size, device, fd)

    def view(self, slot: Slot) -> torch.Tensor:
        """The tensor a slot names (raises ValueError for a slot outside the arena or of an unknown dtype); the
        same tensor object every time, like a caller that reuses its buffers."""
        key = (slot.get("offset"), slot.get("dtype"), tuple(slot.get("shape", ())))
        if key not in self.views:
            self.views[key] = self.make_view(slot)
        return self.views[key]

    def make_view(self, slot: Slot) -> torch.Tensor:
        name = slot.get("dtype")
        dtype = DTYPES.get(name) if isinstance(name, str) else None
        shape = [int(n) for n in slot.get("shape", ())]
        offset = int(slot.get("offset", -1))
        if dtype is None or any(n < 0 for n in shape):
            raise ValueError(f"bad slot {slot}")
        count = 1
        for n in shape:
            count *= n
        size = count * torch.empty((), dtype=dtype).element_size()
        if offset < 0 or offset % ALIGN or offset + size > self.size:
            raise ValueError(f"slot {slot} outside the arena")
        if not size:
            return torch.empty(shape, dtype=dtype, device=self.device)
        # a storage of its own per slot: writes to one slot never bump another's version counter
        raw = (
            self.memory.bytes(offset, size)
            if self.device.type == "cuda"
            else torch.frombuffer(self.memory, dtype=torch.uint8, count=size, offset=offset)
        )
        return raw.view(dtype).view(shape)

    def alloc(self, dtype: torch.dtype, shape: List[int]) -> Slot:
        slot = {"offset": self.used, "dtype": dtype_name(dtype), "shape": list(shape)}
        size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        if self.used + size > self.size:
            raise MemoryError(f"arena of {self.size} bytes is full")
        self.used += padded(size)
        return slot

    def put(self, tensor: torch.Tensor) -> Slot:
        """A slot holding a copy of ``tensor``."""
        slot = self.alloc(tensor.dtype, list(tensor.shape))
        self.view(slot).copy_(tensor)
        return slot

    def close(self) -> None:
        self.views.clear()
        if self.device.type == "cuda":
            self.memory.close()
            return
        try:
            self.memory.close()
        except BufferError:  # a view still alive somewhere: the mapping goes with it
            pass
        os.close(self.fd)


def encode(value: Any, arena: Arena) -> Dict[str, Any]:
    """A value for the runner: tensors as arena slots (copies), dtypes by name, lists element-wise (the runner's
    ``decode`` reads it back)."""
    if isinstance(value, torch.Tensor):
        return {"slot": arena.put(value)}
    if isinstance(value, (list, tuple)):
        return {"list": [encode(v, arena) for v in value]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    return {"value": value}


def clone(values: Sequence[Any]) -> List[Any]:
    """The referee's own copies of a call's arguments (the reference may write to its inputs)."""
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]
