"""Instruments the grading worker installs before it imports a candidate; they produce the dynamic layer's evidence.

* :class:`Monitor`: a Python audit hook and thread-start wrappers that record what the candidate's own code does
  (files, processes, sockets, native libraries, frames and heap, class patches, imports, threads); snapshots of
  global torch numeric flags (a change is recorded and undone) and hashes of the deck's files.
* :class:`KernelGate`: counts the candidate's kernel launches (Triton, C++ extension functions, CUDA graph
  replays); in ghost mode it turns launches into no-ops.
* :class:`OpRecorder`: a TorchDispatchMode listing the aten ops (and their FLOPs) the candidate runs outside its
  own kernels; in ghost mode it fills every fresh allocation with 0xFF bytes (NaN, -1) so that a stubbed kernel
  leaves visible garbage.

An event is the candidate's when, walking out from where it was raised past standard-library frames, a frame of
the candidate's folder comes before one of the toolchain (torch, triton, kbsweep).
"""
from __future__ import annotations

import contextlib
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from kbsweep.audit.events import EVENTS, MACHINERY, MAX_EVENTS, file_hashes, numeric_flags, toolchain_dirs

class Monitor:
    """Records the candidate's own runtime events into ``evidence`` (live, so a failed grade keeps them)."""

    def __init__(self, candidate_dir: Path, watched_files: List[Path], evidence: Dict[str, Any]):
        self.candidate_dir = str(Path(candidate_dir).resolve()) + "/"
        self.toolchain = toolchain_dirs()
        self.stage = "import"
        self.active = False
        self.busy = False
        self.events: List[Dict[str, Any]] = evidence.setdefault("runtime_events", [])
        self.threads: List[Dict[str, Any]] = evidence.setdefault("threads", [])
        self.flag_changes: Dict[str, List[str]] = evidence.setdefault("global_flags", {})
        self.evidence = evidence
        self.seen: set = set()
        self.flags = numeric_flags()
        self.flag_values = [get() for _, get, _ in self.flags]
        self.watched_files = watched_files
        self.hashes = file_hashes(watched_files)
        self.patched = self.wrap_thread_starts()
        sys.addaudithook(self.hook)

    # -- attribution ------------------------------------------------------------------
    def culprit(self, machinery: bool = False) -> Optional[str]:
        """``file:line`` of the candidate frame responsible for the current event, or None. ``machinery``: only
        the candidate's own direct call counts; library machinery raising it for its own work (``exec`` in
        ``dataclasses``, ``id`` in ``importlib``, ``sys._getframe`` in ``namedtuple``) is never the candidate's,
        though the candidate's frame is further out (the static layer reads what the candidate imports)."""
        frame = sys._getframe(2)
        if machinery:  # the candidate's own call, or library machinery working for it (stdlib, generated code)
            path = frame.f_code.co_filename if frame is not None else ""
            return f"{Path(path).name}:{frame.f_lineno}" if path.startswith(self.candidate_dir) else None
        while frame is not None:
            path = frame.f_code.co_filename
            if path.startswith(self.candidate_dir):
                return f"{Path(path).name}:{frame.f_lineno}"
            if path.startswith(self.toolchain):
                return None
            frame = frame.f_back
        return None

    def hook(self, event: str, args: tuple) -> None:
        kind = EVENTS.get(event)
        if kind is None or not self.active or self.busy:
            return
        self.busy = True
        try:
            detail = self.describe(event, args)
            where = self.culprit(kind in MACHINERY) if detail is not None else None
            if where is not None:
                self.record(kind if not (event == "open" and self.writes(args)) else "file_write", event, detail, where)
        finally:
            self.busy = False

    def describe(self, event: str, args: tuple) -> Optional[str]:
        """A short description of the event, or None for events that are routine (imports' own code objects)."""
        if event in ("exec", "compile"):
            code = args[0]
            filename = getattr(code, "co_filename", args[1] if len(args) > 1 else "")
            return None if str(filename).startswith(self.candidate_dir) else f"{event} of {str(filename)[:80]}"
        if event in ("object.__setattr__", "object.__delattr__"):
            target = args[0]
            module = getattr(target, "__module__", "") or ""
            if getattr(sys.modules.get(module), "__file__", "") and sys.modules[module].__file__.startswith(self.candidate_dir):
                return None  # the candidate's own classes
            return f"{module}.{getattr(target, '__qualname__', type(target).__name__)}.{args[1]}"
        if event == "object.__getattr__":
            return f"{type(args[0]).__name__}.{args[1]}"
        if event == "open" and not self.writes(args) and str(args[0]).startswith(self.candidate_dir):
            return None  # its own files (imports of helper modules)
        if event in ("sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents"):
            return event
        if event == "import":
            return str(args[0])
        if event == "builtins.id":
            return "id()"
        return " ".join(str(a)[:120] for a in args[:2])

    @staticmethod
    def writes(args: tuple) -> bool:
        mode = args[1] if len(args) > 1 else "r"
        return isinstance(mode, str) and any(c in mode for c in "wax+")

    def record(self, kind: str, event: str, detail: str, where: str) -> None:
        key = (kind, detail, where)
        if key in self.seen or len(self.events) >= MAX_EVENTS:
            return
        self.seen.add(key)
        self.events.append({"kind": kind, "event": event, "detail": detail, "where": where, "stage": self.stage})

    # -- threads ----------------------------------------------------------------------
    def wrap_thread_starts(self) -> List[Tuple[Any, str]]:
        import _thread
        import threading

        patched = []
        for module in (_thread, threading):
            for name in ("start_new_thread", "_start_new_thread", "start_joinable_thread", "_start_joinable_thread"):
                if hasattr(module, name):
                    setattr(module, name, self.thread_start(getattr(module, name)))
                    patched.append((module, name))
        return patched

    def thread_start(self, original: Callable) -> Callable:
        def start(function, *args, **kwargs):
            where = self.culprit() if self.active else None
            if where is None:
                return original(function, *args, **kwargs)
            record = {"where": where, "stage": self.stage, "running": True, "outlived_call": False}
            self.threads.append(record)

            def body(*a, **k):
                try:
                    return function(*a, **k)
                finally:
                    record["running"] = False

            return original(body, *args, **kwargs)

        return start

    # -- scopes -----------------------------------------------------------------------
    @contextlib.contextmanager
    def watch(self, stage: str) -> Iterator[None]:
        """Attribute events to the candidate while it runs (cheap: the timed path goes through here)."""
        self.stage, self.active = stage, True
        try:
            yield
        finally:
            self.active = False
            for record in self.threads:
                if record["running"] and record["stage"] == stage:
                    record["outlived_call"] = True

    def check_flags(self) -> None:
        """Record and undo any change of the global numeric flags (so the reference keeps its numerics)."""
        for (name, get, set_), before in zip(self.flags, self.flag_values):
            now = get()
            if now != before:
                self.flag_changes.setdefault(name, [str(before), str(now)])
                set_(before)

    def close(self) -> None:
        self.check_flags()
        after = file_hashes(self.watched_files)
        self.evidence["files_modified"] = sorted(p for p, h in self.hashes.items() if after.get(p) != h)


class KernelGate:
    """Counts kernel launches by kind; with ``ghost`` set, launches do nothing."""

    def __init__(self):
        self.ghost = False
        self.counts: Counter = Counter()
        self.names: set = set()
        self.recorder: Any = None  # the OpRecorder of a probe call, paused while a kernel runs
        self.patched: List[Tuple[Any, str]] = []
        self.install()

    def install(self) -> None:
        import torch
        import torch.utils.cpp_extension as cpp

        try:
            from triton.runtime.interpreter import InterpretedFunction
            from triton.runtime.jit import JITFunction

            for cls in (JITFunction, InterpretedFunction):
                self.patch(cls, "run", self.launcher(cls.run, "triton"))
        except ImportError:
            pass
        for name in ("load", "load_inline"):
            self.patch(cpp, name, self.extension_loader(getattr(cpp, name)))
        self.patch(torch.cuda.CUDAGraph, "replay", self.counter(torch.cuda.CUDAGraph.replay, "graph_replay"))

    def patch(self, owner: Any, name: str, value: Callable) -> None:
        setattr(owner, name, value)
        self.patched.append((owner, name))

    def launcher(self, original: Callable, kind: str) -> Callable:
        gate = self

        def run(kernel, *args, **kwargs):
            if kwargs.get("warmup"):
                return original(kernel, *args, **kwargs)
            gate.counts[kind] += 1
            gate.names.add(getattr(getattr(kernel, "fn", kernel), "__name__", kind))
            if gate.ghost:
                return None
            with gate.paused(), profiler_range(KERNEL_RANGE):
                return original(kernel, *args, **kwargs)

        return run

    def counter(self, original: Callable, kind: str) -> Callable:
        def call(*args, **kwargs):
            self.counts[kind] += 1
            return original(*args, **kwargs)

        return call

    def extension_loader(self, original: Callable) -> Callable:
        """Wrap the functions of a built extension module: counted, stubbed in ghost mode."""

        def load(*args, **kwargs):
            module = original(*args, **kwargs)
            for name in dir(module) if isinstance(module, types.ModuleType) else ():
                function = getattr(module, name)
                if not name.startswith("_") and callable(function):
                    setattr(module, name, self.extension_call(function, name))
            return module

        return load

    def extension_call(self, function: Callable, name: str) -> Callable:
        def call(*args, **kwargs):
            self.counts["extension"] += 1
            self.names.add(name)
            return None if self.ghost else function(*args, **kwargs)  # its ATen calls stay in the trace

        return call

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        recorder = self.recorder
        if recorder is not None:
            recorder.paused += 1
        try:
            yield
        finally:
            if recorder is not None:
                recorder.paused -= 1

    @contextlib.contextmanager
    def probing(self, recorder: Any, ghost: bool) -> Iterator[None]:
        """One probe call: ops go to ``recorder`` (outside kernels); with ``ghost``, kernels do nothing."""
        self.recorder, self.ghost = recorder, ghost
        try:
            with recorder:
                yield
        finally:
            self.recorder, self.ghost = None, False


ALLOCATORS = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted")


def op_recorder(gate: KernelGate, poison: bool = False):
    """An :class:`OpRecorder` (built lazily: the dispatch-mode base class lives in torch)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class OpRecorder(TorchDispatchMode):
        """Counts ``namespace::op`` calls and their FLOPs while not paused; ``poison`` fills new allocations.
        Custom (non-aten) ops that launch the candidate's kernels are counted apart, in ``own_ops``."""

        def __init__(self):
            super().__init__()
            self.ops: Counter = Counter()
            self.own_ops: Counter = Counter()
            self.flops = 0
            self.bytes = 0  # read and written by ops that compute (views and allocations move nothing)
            self.paused = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            launched = sum(gate.counts.values())
            out = func(*args, **kwargs)
            if self.paused:
                return out
            packet = func._overloadpacket
            custom = func.namespace not in ("aten", "prims")
            counter = self.own_ops if custom and sum(gate.counts.values()) > launched else self.ops
            counter[f"{func.namespace}::{packet.__name__}"] += 1
            if not func.is_view and packet.__name__ not in ALLOCATORS:
                self.bytes += sum(t.numel() * t.element_size() for t in tensors((args, kwargs, out)))
            formula = flop_registry.get(packet)
            if formula is not None:
                with contextlib.suppress(Exception):  # an unusual overload: no FLOP count, never a failed grade
                    self.flops += int(formula(*args, **kwargs, out_val=out))
            if poison and packet.__name__ in ALLOCATORS and out.numel():
                out.untyped_storage().fill_(0xFF)
            return out

    return OpRecorder()


KERNEL_RANGE = "kbsweep::kernel"  # excluded from the candidate's torch ops by the runner's profiler session


def profiler_range(name: str):
    import torch.profiler

    return torch.profiler.record_function(name)  # what the runner's profiler session excludes from the candidate's torch ops


def tensors(tree: Any) -> List[Any]:
    """The distinct tensors in a nest of lists, tuples and dicts."""
    from torch.utils._pytree import tree_leaves

    import torch

    seen, out = set(), []
    for leaf in tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and id(leaf) not in seen:
            seen.add(id(leaf))
            out.append(leaf)
    return out


def loaded_library(stem: str) -> Optional[str]:
    """Path of a shared library already mapped into this process (the one torch itself uses)."""
    with open("/proc/self/maps") as fh:
        for line in fh:
            path = line.split()[-1]
            if f"/{stem}" in path and ".so" in path:
                return path
    return None


def persisting_l2_limit() -> Optional[int]:
    """cudaDeviceGetLimit(cudaLimitPersistingL2CacheSize) through the process's libcudart, or None."""
    import ctypes

    path = loaded_library("libcudart")
    if path is None:
        return None
    value = ctypes.c_size_t(0)
    status = ctypes.CDLL(path).cudaDeviceGetLimit(ctypes.byref(value), 0x06)
    return int(value.value) if status == 0 else None
