"""The bytes torch ops that compute read inside each call range, as the runner's profiler session saw them.

The session sees every op the dispatcher runs, those run with torch dispatch disabled or a dispatch key excluded
included, with the shapes and dtypes of its inputs (``with_flops`` records them); the op recorder on torch's
dispatch-mode stack does not see those. So a call's library bytes are the larger of the recorder's and these.
An op counts when it computes: not a view, an allocation, a copy, cast, pad, concatenation or fill (the recorder's
glue, :data:`kbsweep.grader.runner.seal.MOVEMENT`), nor a composite op whose work is the ops it runs (a softmax
runs ``_softmax``, a ``to`` runs ``_to_copy``), nor an op inside another that counts. An op of another namespace
than aten's (a ``torch.library`` op of the candidate's) counts by what runs inside it. A candidate's op in the
aten namespace is looked up like any aten op: a new name, or a new overload of a glue op whose body computes,
counts by its inputs or by its body's ops.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Dict, List

from kbsweep.grader.runner.seal import ALLOCATORS, IMPORTS, MOVEMENT
from kbsweep.grader.shared.profiling import CALL_RANGE, Spans, group_of

SCALARS = frozenset(
    {
        "item",
        "_local_scalar_dense",
        "is_nonzero",
        "detach",
        "detach_",
        "resize_",
        "scalar_tensor",
        "record_stream",
        "_has_compatible_shallow_copy_type",
        "result_type",
    }
)
GLUE = MOVEMENT | ALLOCATORS | IMPORTS | SCALARS
SIZES = {
    "double": 8,
    "long int": 8,
    "c10::complex<double>": 16,
    "c10::complex<float>": 8,
    "float": 4,
    "int": 4,
    "unsigned int": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "short int": 2,
    "unsigned short": 2,
    "c10::complex<c10::Half>": 4,
    "unsigned long": 8,
    "unsigned long int": 8,
}


class Counted:
    """Whether an aten op's name counts as compute (cached: a grade's session holds tens of thousands of ops)."""

    def __init__(self) -> None:
        self.known: Dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        if name not in self.known:
            self.known[name] = self.decide(name)
        return self.known[name]

    @staticmethod
    def decide(name: str) -> bool:
        namespace, _, op = name.partition("::")
        if namespace != "aten" or op in GLUE:
            return False
        import torch

        try:
            packet = getattr(torch.ops.aten, op)
            overloads = [getattr(packet, overload) for overload in packet.overloads()]
        except (AttributeError, RuntimeError):  # no such packet: counted by its inputs
            return True
        for overload in overloads:
            try:
                if overload.is_view or torch._C._dispatch_has_kernel_for_dispatch_key(
                    overload.name(), "CompositeImplicitAutograd"
                ):
                    return False
            except RuntimeError:
                continue
        return True


def element_size(dtype: str) -> int:
    """Bytes of one element of a profiled input's dtype, 0 for what is no tensor (a scalar, a list, none)."""
    if dtype in SIZES:
        return SIZES[dtype]
    if dtype in ("bool", "signed char", "unsigned char") or "Float8" in dtype or "Float4" in dtype:
        return 1
    return 0


def input_bytes(event: Any) -> int:
    total = 0
    for shape, dtype in zip(event.shapes(), event.dtypes()):
        size = element_size(str(dtype))
        if size and isinstance(shape, list):
            count = 1
            for extent in shape:
                count *= int(extent)
            total += count * size
    return total


def read_once(prof: Any) -> Any:
    """A finished session whose events are read from Kineto once (a list built in C++: half a second for 80 000
    events) for every pass over them, as ``prof.profiler.kineto_results.events()``."""
    events = prof.profiler.kineto_results.events()
    return SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: events)))


def range_bytes(prof: Any, groups: Dict[str, str]) -> Dict[str, List[int]]:
    """Per group, each outermost call range's bytes read by ops that compute, in the ranges' order (that of
    :func:`kbsweep.grader.shared.profiling.session_evidence`'s ``range_flops``). A range named like an op (a
    ``record_function`` of the candidate's) is no op: it neither counts nor hides the ops inside it."""
    import torch

    cpu = torch.autograd.DeviceType.CPU
    counted = Counted()
    ranges, ops = [], []
    for (
        e
    ) in prof.profiler.kineto_results.events():  # each field a call into C++: the name first, the rest when it matters
        name = e.name()
        if name.startswith(CALL_RANGE):
            group = group_of(name[len(CALL_RANGE) :], groups)
            if group is not None and e.device_type() == cpu:  # not the copy of the range on the GPU's timeline
                ranges.append((e.start_ns(), e.end_ns(), group))
        elif name.startswith("aten::") and counted(name) and not e.is_user_annotation():
            ops.append((e.start_ns(), e.end_ns(), e))
    outer: List[tuple] = []
    for span in sorted(ranges):
        if not outer or span[0] > outer[-1][1]:  # a range inside (or across) another bounds nothing
            outer.append(span)
    at = Spans((start, end) for start, end, _ in outer)
    per_range, reach = [0] * len(outer), [0] * len(outer)
    for start, end, e in sorted(ops, key=lambda op: op[0]):
        index = at.index(start)
        if index < 0 or start < reach[index]:  # outside the calls, or inside an op that counted (its work already)
            continue
        per_range[index] += input_bytes(e)
        reach[index] = end
    out: Dict[str, List[int]] = {}
    for (_, _, group), moved in zip(outer, per_range):
        out.setdefault(group, []).append(moved)
    return out
