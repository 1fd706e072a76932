"""What the runner installs where the candidate's code can reach it: the wrappers it puts on Triton's launchers,
extension functions, CUDA-graph replays, thread starts and tensor exports, and the op recorder it pushes on
torch's dispatch-mode stack.

None of them holds the harness's state. A closure's cells, a function's ``__globals__`` and the mode stack are
read without any audit event, so what they lead to is this module and the callables they wrap, never the
runner's :class:`~kbsweep.grader.runner.runtime.Monitor` or :class:`~kbsweep.grader.runner.runtime.KernelGate`: a wrapper reports
by raising the private audit event :data:`GATE` with a list the monitor's hook fills in place, and the hook
answers only when the event comes from one of these wrappers' own code (:data:`CODES`). The hook itself lives in
the interpreter's list of audit hooks, which no Python code can read.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable

GATE = "kbsweep.gate"

# ops that only copy, cast, rearrange or fill values: glue around a kernel (a pad, a contiguous copy, a cat), not the
# problem's arithmetic, so their bytes are not library work (a problem whose work is data movement itself is
# judged by its ghost replays and the own-kernel check)
MOVEMENT = frozenset(
    {
        "copy_",
        "_to_copy",
        "clone",
        "cat",
        "stack",
        "constant_pad_nd",
        "flip",
        "roll",
        "repeat",
        "fill_",
        "zero_",
        "full",
        "full_like",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "new_zeros",
        "new_ones",
        "new_full",
        "set_",
        "slice_scatter",
        "select_scatter",
        "as_strided_scatter",
        "narrow_copy",
        "expand_copy",
        "permute_copy",
        "transpose_copy",
        "t_copy",
        "view_copy",
        "unsqueeze_copy",
        "squeeze_copy",
        "alias_copy",
        "detach_copy",
        "_unsafe_view",
        "lift_fresh",
        "lift_fresh_copy",
    }
)
ALLOCATORS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"})
IMPORTS = frozenset(
    {"lift_fresh", "lift_fresh_copy"}
)  # a tensor made from host data (numpy, lists) under a dispatch mode


def launcher(original: Callable, kind: str) -> Callable:
    """A launch function (Triton's ``run``, ``CUDAGraph.replay``): counted once it returned (a call that raises
    launched nothing); a stubbable kind does nothing while the gate is in ghost mode (counted as stubbed)."""

    def launch(target, *args, **kwargs):
        if kwargs.get("warmup"):  # Triton's compile-only call
            return original(target, *args, **kwargs)
        box = ["launch", kind, getattr(getattr(target, "fn", target), "__name__", kind), False]
        sys.audit(GATE, box)
        if box[3]:
            return None
        out = original(target, *args, **kwargs)
        sys.audit(GATE, ["launched", *box[1:3], target])  # the target: a replayed graph is known by what it captured
        return out

    return launch


def graph_capture(original: Callable, edge: str) -> Callable:
    """``CUDAGraph.capture_begin`` or ``capture_end``, reported once it returned: what a graph's capture launched is
    what its replays run."""

    def capture(graph, *args, **kwargs):
        out = original(graph, *args, **kwargs)
        sys.audit(GATE, [edge, graph])
        return out

    return capture


def extension_function(function: Callable, name: str) -> Callable:
    """A function of a built extension module, as :func:`launcher` counts a launch (its ATen calls stay in the
    trace)."""

    def call(*args, **kwargs):
        box = ["launch", "extension", name, False]
        sys.audit(GATE, box)
        if box[3]:
            return None
        out = function(*args, **kwargs)
        sys.audit(GATE, ["launched", *box[1:3]])
        return out

    return call


def extension_loader(original: Callable) -> Callable:
    """``torch.utils.cpp_extension.load``/``load_inline``: the built module's public functions wrapped."""

    def load(*args, **kwargs):
        module = original(*args, **kwargs)
        for name in dir(module) if isinstance(module, types.ModuleType) else ():
            function = getattr(module, name)
            if not name.startswith("_") and callable(function):
                setattr(module, name, extension_function(function, name))
        return module

    return load


def thread_start(original: Callable) -> Callable:
    """A thread-start function: the monitor may hand back a wrapped body (it records when the thread ends)."""

    def start(function, *args, **kwargs):
        box = ["thread", function]
        sys.audit(GATE, box)
        return original(box[1], *args, **kwargs)

    return start


def exporter(original: Callable) -> Callable:
    """A way out of torch into a host array library (``Tensor.numpy``, ``__array__``, ``__dlpack__``): the bytes
    handed out are reported, and counted when the candidate's own code asked for them."""

    def export(tensor, *args, **kwargs):
        sys.audit(GATE, ["export", tensor.numel() * tensor.element_size()])
        return original(tensor, *args, **kwargs)

    return export


# the code of the wrappers above (the functions they return): the only raisers of GATE the monitor answers
CODES = frozenset(
    c
    for f in (launcher, graph_capture, extension_function, thread_start, exporter)
    for c in f.__code__.co_consts
    if isinstance(c, types.CodeType)
)


def op_recorder(launches: Any, native: frozenset = frozenset()):
    """An op recorder (built lazily: the dispatch-mode base class lives in torch). ``launches``: a read-only view of
    the gate's launch counts (a custom op that launched the candidate's kernels is its own, not library work).
    ``native``: the aten ops the dispatcher held before the candidate was imported; an aten op registered later (a
    fragment of the aten namespace: torch registers none after its import) is the candidate's, never torch's own:
    recorded under ``aten.fragment::name.overload``, its bytes library work whatever it launched or is named like
    (its body runs below this mode; the profiler's bytes see the ops it runs). Torch's inductor registers prims ops
    lazily, so a prims op is judged by its name as before, and its body by the profiler's bytes."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class OpRecorder(TorchDispatchMode):
        """Counts ``namespace::op`` calls, their FLOPs, the bytes ops that compute read and write, and the bytes
        brought in from host data."""

        def __init__(self):
            super().__init__()
            self.ops: dict = {}
            self.own_ops: dict = {}
            self.flops = self.bytes = self.host_bytes = 0
            self.foreign: dict = {}  # op -> whether it is an aten op the dispatcher did not hold at the import

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            launched = sum(launches.values())
            name = func._overloadpacket.__name__
            foreign = self.foreign.get(func)
            if foreign is None:
                foreign = self.foreign[func] = bool(native) and func.namespace == "aten" and func.name() not in native
            custom = foreign or func.namespace not in ("aten", "prims")
            body = custom_body(func, args) if custom and not foreign else None
            if body is not None:  # a torch.library op's Python body, run with this mode on: its own ops are recorded
                with self:
                    out = body(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
            own = custom and not foreign and sum(launches.values()) > launched
            counter = self.own_ops if own else self.ops
            key = f"{func.namespace}.fragment::{name}.{func._overloadname}" if foreign else f"{func.namespace}::{name}"
            counter[key] = counter.get(key, 0) + 1
            moved = sum(t.numel() * t.element_size() for t in tensors((args, kwargs, out)))
            if not foreign and (name in IMPORTS or (name in ("_to_copy", "copy_") and to_host(args, out))):
                self.host_bytes += moved
            elif foreign or (
                body is None and not own and not func.is_view and name not in ALLOCATORS and name not in MOVEMENT
            ):
                self.bytes += moved  # a body's bytes are its ops'; an opaque op of the candidate's own that launched its kernels is its work
            formula = flop_registry.get(func._overloadpacket)
            if formula is not None:
                try:
                    self.flops += int(formula(*args, **kwargs, out_val=out))
                except Exception:  # noqa: BLE001 - an unusual overload: no FLOP count, never a failed grade
                    pass
            return out

    return OpRecorder()


def custom_body(func: Any, args: Any) -> Any:
    """The Python function a ``torch.library.custom_op`` (or ``triton_op``) runs for these arguments' device, or None
    for any other op (one in C++, a raw ``Library.impl``: opaque, its bytes library work unless it launched the
    candidate's kernels; the profiler's bytes see the torch ops it runs)."""
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(f"{func.namespace}::{func._overloadpacket.__name__}")
    if opdef is None:
        return None
    devices = {t.device.type for t in tensors(args)}
    kernels = opdef._backend_fns
    return kernels.get(devices.pop()) or kernels.get(None) if len(devices) == 1 else kernels.get(None)


def to_host(args: Any, out: Any) -> bool:
    """A copy from a device tensor into host memory."""
    sources = [t for t in tensors(args) if t.device.type != "cpu"]
    return bool(sources) and all(t.device.type == "cpu" for t in tensors(out))


def tensors(tree: Any) -> list:
    """The distinct tensors in a nest of lists, tuples and dicts."""
    import torch
    from torch.utils._pytree import tree_leaves

    seen, out = set(), []
    for leaf in tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and id(leaf) not in seen:
            seen.add(id(leaf))
            out.append(leaf)
    return out
