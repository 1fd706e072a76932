"""Instruments the grading worker installs before it imports a candidate; they produce the dynamic layer's evidence.

* :class:`Monitor`: a Python audit hook that records what the candidate's own code does (files, processes, sockets,
  native libraries, frames and heap, class patches, imports, threads); snapshots of global torch numeric flags (a
  change is recorded and undone) and hashes of the deck's files. Reaching into frames or the heap, patching a class
  and raising the harness's private audit event are sent to the referee the moment they happen (``notify``): what
  the candidate does once it holds the harness's objects cannot take those back.
* :class:`KernelGate`: counts the candidate's kernel launches (Triton, C++ extension functions, CUDA graph
  replays) and the bytes its code hands to host array libraries; in ghost mode launches do nothing.

Both are sealed: what they install where the candidate can reach it (:mod:`kbsweep.grader.runner.seal`) reports through a
private audit event that the monitor's hook answers, so they are reachable only through the runner, by frames or
the heap, both audited.

An event is the candidate's when, walking out from where it was raised past standard-library frames, a frame of
the candidate's folder comes before one of the toolchain (torch, triton, kbsweep).
"""

from __future__ import annotations

import contextlib
import sys
import sysconfig
import types
import weakref
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from kbsweep.grader.runner import seal
from kbsweep.grader.runner.events import EVENTS, MACHINERY, MAX_EVENTS, file_hashes, numeric_flags, toolchain_dirs

REACH = ("frame_inspection", "class_patch", "grader_tamper")  # sent to the referee as they happen, calls or not


class Monitor:
    """Records the candidate's own runtime events into ``evidence`` (live, so a failed grade keeps them), answers the
    sealed wrappers for ``gate``, and sends reach events through ``notify`` at once."""

    def __init__(
        self,
        candidate_dir: Path,
        watched_files: List[Path],
        evidence: Dict[str, Any],
        gate: Optional["KernelGate"] = None,
        notify: Optional[Callable[[Dict[str, Any]], None]] = None,
    ):
        self.candidate_dir = str(Path(candidate_dir).resolve()) + "/"
        self.toolchain = toolchain_dirs()
        self.libraries = tuple(
            {sysconfig.get_paths()[key].rstrip("/") + "/" for key in ("stdlib", "platstdlib", "purelib", "platlib")}
        )
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
        self.gate, self.notify, self.sent = gate, notify, 0
        # what the hook calls, bound now: a class's functions lead to this module's globals without an audit event
        # (``object.__subclasses__()``), and rebinding a name there must not reach the hook
        self.getframe, self.kinds, self.codes, self.private = (
            sys._getframe,
            types.MappingProxyType(dict(EVENTS)),
            seal.CODES,
            seal.GATE,
        )
        self.machinery, self.reach = frozenset(MACHINERY), frozenset(REACH)
        self.patched = self.wrap_thread_starts()
        sys.addaudithook(self.hook)

    # -- attribution ------------------------------------------------------------------
    def culprit(self, frame: Any, machinery: bool = False) -> Optional[str]:
        """``file:line`` of the candidate frame responsible for an event raised in ``frame``, or None. ``machinery``:
        only the candidate's own direct call counts; library machinery raising it for its own work (``exec`` in
        ``dataclasses``, ``id`` in ``importlib``, ``sys._getframe`` in ``namedtuple``) is never the candidate's,
        though the candidate's frame is further out (the static layer reads what the candidate imports)."""
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
        if self.busy:
            return
        kind = "gate" if event == self.private else self.kinds.get(event)
        if kind is None or not (self.active or kind == "gate" or kind in self.reach):
            return
        self.busy = True
        try:
            frame = self.getframe(1)  # where it was raised
            if kind == "gate":
                self.answer(frame, args[0] if args else None)
                return
            detail = self.describe(event, args)
            if detail is None:
                return
            where = self.culprit(frame, kind in self.machinery)
            if where is not None:
                self.record(kind if not (event == "open" and self.writes(args)) else "file_write", event, detail, where)
        finally:
            self.busy = False

    def answer(self, frame: Any, box: Any) -> None:
        """A sealed wrapper's report (:mod:`kbsweep.grader.runner.seal`), answered in ``box``; the event raised by any other
        code is a tamper attempt."""
        if frame.f_code not in self.codes:
            where = self.culprit(frame) or f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
            self.record(
                "grader_tamper", seal.GATE, f"{seal.GATE} raised outside the harness's wrappers: {str(box)[:80]}", where
            )
        elif box[0] in ("launch", "launched") and self.gate is not None:
            stub = (
                box[0] == "launch" and self.gate.ghost and box[1] != "graph_replay"
            )  # an honest graph replays its kernels
            if stub or box[0] == "launched":
                self.gate.counts[box[1]] += 1
                self.gate.names.add(box[2])
            if box[0] == "launched" and box[1] == "graph_replay":
                self.gate.replayed(box[3])
            if stub:
                box[3] = True
        elif box[0] in ("capture_begin", "capture_end") and self.gate is not None:
            self.gate.captured(box[1], box[0] == "capture_end")
        elif box[0] == "thread":
            starter = self.culprit(frame.f_back) if self.active else None
            box[1] = box[1] if starter is None else self.thread_body(box[1], starter)
        elif box[0] == "export" and self.gate is not None and self.culprit(frame.f_back):
            self.gate.exported += int(box[1])

    def describe(self, event: str, args: tuple) -> Optional[str]:
        """A short description of the event, or None for events that are routine (imports' own code objects)."""
        if event in ("exec", "compile"):
            code = args[0]
            filename = getattr(code, "co_filename", args[1] if len(args) > 1 else "")
            return None if str(filename).startswith(self.candidate_dir) else f"{event} of {str(filename)[:80]}"
        if event in ("object.__setattr__", "object.__delattr__"):
            target = args[0]
            module = getattr(target, "__module__", "") or ""
            module_file = getattr(sys.modules.get(module), "__file__", None)
            if isinstance(module_file, str) and module_file.startswith(self.candidate_dir):
                return None  # the candidate's own classes
            return f"{module}.{getattr(target, '__qualname__', type(target).__name__)}.{args[1]}"
        if event == "object.__getattr__":
            return f"{type(args[0]).__name__}.{args[1]}"
        if event == "open" and not self.writes(args) and str(args[0]).startswith(self.candidate_dir):
            return None  # its own files (imports of helper modules)
        if (
            event in ("open", "os.listdir", "os.scandir")
            and not (event == "open" and self.writes(args))
            and str(args[0]).startswith(self.libraries)
        ):
            return None  # the interpreter's own libraries, read as an import of a module not loaded yet reads them
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
        if key in self.seen:
            return
        self.seen.add(key)
        entry = {"kind": kind, "event": event, "detail": detail, "where": where, "stage": self.stage}
        if (
            kind in self.reach and self.notify is not None and self.sent < MAX_EVENTS
        ):  # a cap of its own: other events never crowd it out
            self.sent += 1
            try:
                self.notify(entry)
            except Exception:  # noqa: BLE001 - a broken channel ends the grade elsewhere; an audited call must not fail here
                pass
        if len(self.events) < MAX_EVENTS:
            self.events.append(entry)

    # -- threads ----------------------------------------------------------------------
    def wrap_thread_starts(self) -> List[Tuple[Any, str]]:
        import _thread
        import threading

        patched = []
        for module in (_thread, threading):
            for name in ("start_new_thread", "_start_new_thread", "start_joinable_thread", "_start_joinable_thread"):
                if hasattr(module, name):
                    setattr(module, name, seal.thread_start(getattr(module, name)))
                    patched.append((module, name))
        return patched

    def thread_body(self, function: Callable, where: str) -> Callable:
        """``function`` as a thread's body whose end is recorded (the closure holds its own record only)."""
        record = {"where": where, "stage": self.stage, "running": True, "outlived_call": False}
        self.threads.append(record)

        def body(*a, **k):
            try:
                return function(*a, **k)
            finally:
                record["running"] = False

        return body

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
    """Counts kernel launches by kind and the bytes the candidate's code exported to host arrays (the monitor's hook
    answers the wrappers installed here); with ``ghost`` set, launches do nothing.

    A CUDA graph's replay runs what its capture launched, so a replay counts the candidate's own kernels its capture
    launched (``replayed_own``), and a graph whose capture launched none of them (library ops, a capture the gate
    did not see) counts none: graphs and persistent kernels are the candidate's own work when their kernels are."""

    def __init__(self, install: bool = True):
        self.ghost = False
        self.counts: Counter = Counter()
        self.names: set = set()
        self.exported = 0
        self.replayed_own = 0
        self.capturing: "weakref.WeakKeyDictionary[Any, int]" = (
            weakref.WeakKeyDictionary()
        )  # graph -> own launches at its capture_begin
        self.graphs: "weakref.WeakKeyDictionary[Any, int]" = (
            weakref.WeakKeyDictionary()
        )  # graph -> own kernels its capture launched
        self.launches = types.MappingProxyType(self.counts)  # what the op recorder reads: never the gate itself
        self.patched: List[Tuple[Any, str]] = []
        if install:
            self.install()

    def install(self) -> None:
        import torch
        import torch.utils.cpp_extension as cpp

        try:
            from triton.runtime.interpreter import InterpretedFunction
            from triton.runtime.jit import JITFunction

            for cls in (JITFunction, InterpretedFunction):
                self.patch(cls, "run", seal.launcher(cls.run, "triton"))
        except ImportError:
            pass
        for name in ("load", "load_inline"):
            self.patch(cpp, name, seal.extension_loader(getattr(cpp, name)))
        self.patch(torch.cuda.CUDAGraph, "replay", seal.launcher(torch.cuda.CUDAGraph.replay, "graph_replay"))
        for edge in ("capture_begin", "capture_end"):
            self.patch(torch.cuda.CUDAGraph, edge, seal.graph_capture(getattr(torch.cuda.CUDAGraph, edge), edge))
        for name in ("numpy", "__array__", "__dlpack__"):  # the ways out of torch into numpy, scipy, DLPack consumers
            self.patch(torch.Tensor, name, seal.exporter(getattr(torch.Tensor, name)))

    def patch(self, owner: Any, name: str, value: Callable) -> None:
        setattr(owner, name, value)
        self.patched.append((owner, name))

    def own_launches(self) -> int:
        """The candidate's own kernels launched so far: Triton and extension functions, and those that graph replays ran."""
        return self.counts["triton"] + self.counts["extension"] + self.replayed_own

    def captured(self, graph: Any, ended: bool) -> None:
        launched = self.counts["triton"] + self.counts["extension"]
        try:
            if not ended:
                self.capturing[graph] = launched
            elif graph in self.capturing:
                self.graphs[graph] = launched - self.capturing.pop(graph)
        except TypeError:  # an object no weak reference can name: its capture is not attributed
            pass

    def replayed(self, graph: Any) -> None:
        try:
            self.replayed_own += self.graphs.get(graph, 0)
        except TypeError:
            pass
