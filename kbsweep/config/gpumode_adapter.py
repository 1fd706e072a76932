"""kbsweep's reference contract over a GPU MODE (KernelBot) problem folder: its ``generate_input``, ``ref_kernel`` and
``check_implementation`` behind ``Model``/``get_init_inputs``/``get_inputs``/``check_outputs`` (docs/gpumode.md).

A GPU MODE ``data`` tuple may carry output buffers (``torch.empty`` tensors the kernel writes into). kbsweep forbids
writing an input or returning one, so a buffer is never an input here: the tensors ``generate_input`` made with
``torch.empty*`` and left unwritten are taken out of the inputs, their shapes and dtypes (``buffers``) are the init
inputs of ``Model`` and of the candidate's ``ModelNew``, and every call gets fresh ones. Their generators write
``device="cuda"``; on another device the tensors are made there. Their seed is drawn from torch's RNG, which the
grader seeds, so kbsweep's seeds (the secret one too) draw other inputs. Loaded by the generated
``kbsweep_adapter.py`` in the referee, and by the tests for GPU MODE's own verdict (:func:`own_verdict`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.overrides import TorchFunctionMode

EMPTY = {torch.empty, torch.empty_like, torch.empty_strided}
SHARED = ("task", "utils")  # the flat module names GPU MODE's files import each other by


def load_modules(folder: Path, names: Sequence[str] = ("reference",)) -> Dict[str, ModuleType]:
    """``folder``'s ``task.py``, ``utils.py`` and ``names``, each under a private name; ``task`` and ``utils``
    are what ``from task import ...`` finds while they load, and sys.modules is put back after."""
    saved = {name: sys.modules.get(name) for name in (*SHARED, *names)}
    loaded: Dict[str, ModuleType] = {}
    try:
        for name in (*SHARED, *names):
            path = folder / f"{name}.py"
            if not path.exists():
                continue
            spec = importlib.util.spec_from_file_location(f"kbsweep_gpumode_{abs(hash(str(folder)))}_{name}", path)
            assert spec is not None and spec.loader is not None  # a .py file's spec always has a source loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            loaded[name] = module
    finally:
        for name, before in saved.items():
            if before is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = before
    return loaded


class OnDevice(TorchFunctionMode):
    """Factories asked for ``cuda`` make their tensors on ``device``; tensors made by ``torch.empty*`` and not
    written in place before the end are recorded as buffers."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.empty: Dict[int, torch.Tensor] = {}  # id -> a tensor made by torch.empty* and not written yet

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if self.device.type != "cuda" and "device" in kwargs and torch.device(kwargs["device"]).type == "cuda":
            kwargs["device"] = self.device
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if func in EMPTY and isinstance(out, torch.Tensor):
            self.empty[id(out)] = out
        elif args and isinstance(args[0], torch.Tensor) and (name.endswith("_") or name == "__setitem__"):
            self.empty.pop(id(args[0]), None)  # written in place: initialized
        return out


def generate(module: ModuleType, params: Dict[str, Any], device: torch.device) -> Tuple[List[Any], List[int], bool]:
    """``generate_input(**params)`` on ``device`` (the meta device: made on the CPU, then moved); returns the data
    as a list, the indices of its buffers, and whether the data is one tensor (no tuple: pmpp's grayscale)."""
    make_on = torch.device("cpu") if device.type == "meta" else device
    real_generator = torch.Generator
    # a stand-in while the generator runs: a class in the stubs, a factory of its instances here
    torch.Generator = lambda device=None: real_generator(device=make_on if make_on.type != "cuda" else device)  # type: ignore[misc,assignment]
    try:
        with OnDevice(make_on) as mode:
            data = module.generate_input(**params)
    finally:
        torch.Generator = real_generator  # type: ignore[misc]  # the class put back (the stubs forbid assigning a type)
    single = not isinstance(data, (tuple, list))
    items = [data] if single else list(data)
    buffers = (
        [] if single else [i for i, v in enumerate(items) if isinstance(v, torch.Tensor) and mode.empty.get(id(v)) is v]
    )
    if device.type == "meta":
        items = [v.to("meta") if isinstance(v, torch.Tensor) else v for v in items]
    return items, buffers, single


def with_buffers(
    inputs: Sequence[Any], buffers: Optional[Sequence[Sequence[Any]]], device: Optional[torch.device] = None
) -> Any:
    """GPU MODE's ``data`` from kbsweep's inputs: a fresh ``torch.empty`` put back at each buffer's index (``buffers``
    None: the data is the one input tensor)."""
    if buffers is None:
        return inputs[0]
    data = list(inputs)
    where = device or next((v.device for v in inputs if isinstance(v, torch.Tensor)), torch.device("cpu"))
    for index, shape, dtype in buffers:
        data.insert(int(index), torch.empty(tuple(shape), dtype=getattr(torch, dtype), device=where))
    return tuple(data)


def as_message(verdict: Any) -> Optional[str]:
    """A ``check_implementation`` result as kbsweep's hook answers: None for a pass, else the reason. Their
    checkers return ``(ok, message)``, a bool, or a string (empty: a pass)."""
    if isinstance(verdict, tuple):
        ok, message = verdict[0], (verdict[1] if len(verdict) > 1 else "")
        return None if ok else (str(message) or "check_implementation failed")
    if isinstance(verdict, bool):
        return None if verdict else "check_implementation failed"
    return str(verdict) or None if verdict is not None else None


def as_buffer(out: Any, buffers: Sequence[Sequence[Any]]) -> Any:
    """The reference's output in its output buffer's dtype: a GPU MODE kernel writes the one buffer of its shape, so
    that dtype is the answer's (prefixsum's reference computes in float64, its buffer and submissions are float32)."""
    if isinstance(out, torch.Tensor) and buffers:
        same = [b for b in buffers if list(b[1]) == list(out.shape)]
        if len(same) == 1 and str(out.dtype).replace("torch.", "") != same[0][2]:
            return out.to(getattr(torch, same[0][2]))
    return out


class GpuModeReference:
    """The adapter's four names over one problem folder (``folder`` holds their reference.py, task.py, utils.py)."""

    def __init__(self, folder: Path):
        modules = load_modules(Path(folder))
        self.module = modules["reference"]
        self.buffers: Dict[tuple, Optional[list]] = {}  # shape key -> buffer specs (None: the data is one tensor)
        self.by_inputs: Dict[
            tuple, Optional[list]
        ] = {}  # the inputs' shapes and dtypes -> buffer specs (for check_outputs)
        reference = self

        class Model(torch.nn.Module):
            """GPU MODE's ``ref_kernel`` on ``data`` rebuilt with fresh buffers."""

            def __init__(self, buffers):
                super().__init__()
                self.buffers_spec = None if buffers is None else [list(b) for b in buffers]

            def forward(self, *inputs):
                out = reference.module.ref_kernel(with_buffers(inputs, self.buffers_spec))
                return as_buffer(out, self.buffers_spec)

        self.Model = Model

    def key(self, shape: Dict[str, Any]) -> tuple:
        return tuple(sorted(shape.items()))

    def specs(self, shape: Dict[str, Any]) -> Optional[list]:
        """The buffers of ``shape``: indices, shapes and dtypes (made on the meta device, else on the CPU)."""
        if self.key(shape) not in self.buffers:
            for device in ("meta", "cpu"):
                try:
                    items, indices, single = generate(self.module, {**shape, "seed": 0}, torch.device(device))
                    break
                except Exception:  # noqa: BLE001 - a data-dependent generator (.item(), masks) runs on the CPU
                    if device == "cpu":
                        raise
            self.buffers[self.key(shape)] = (
                None
                if single
                else [[i, list(items[i].shape), str(items[i].dtype).replace("torch.", "")] for i in indices]
            )
        return self.buffers[self.key(shape)]

    def get_init_inputs(self, shape: Dict[str, Any]) -> list:
        return [self.specs(shape)]

    def get_inputs(self, shape: Dict[str, Any], device: Any) -> list:
        # the grader seeds torch before it asks; below 2**16, the range of their tasks' public seeds: a generator may
        # scale values by its seed (sort_py's rows have mean seed + row), and their tolerance is relative
        seed = int(torch.randint(0, 2**16, (1,)).item())
        items, indices, single = generate(self.module, {**shape, "seed": seed}, torch.device(device))
        self.buffers[self.key(shape)] = (
            None if single else [[i, list(items[i].shape), str(items[i].dtype).replace("torch.", "")] for i in indices]
        )
        signature = tuple(
            (tuple(v.shape), v.dtype) for i, v in enumerate(items) if i not in indices and isinstance(v, torch.Tensor)
        )
        self.by_inputs[signature] = self.buffers[self.key(shape)]
        return [v for i, v in enumerate(items) if i not in indices]

    def check_outputs(self, inputs: Sequence[Any], ref_out: Any, out: Any) -> Optional[str]:
        """GPU MODE's own ``check_implementation`` on the call's data (fresh buffers) and the candidate's output."""
        signature = tuple((tuple(v.shape), v.dtype) for v in inputs if isinstance(v, torch.Tensor))
        buffers = self.by_inputs.get(signature, [])  # None: the data is one tensor
        return as_message(self.module.check_implementation(with_buffers(inputs, buffers), out))


def clone_data(data: Any) -> Any:
    """GPU MODE eval's ``_clone_data``: tensors cloned, recursively."""
    if isinstance(data, (tuple, list)):
        return type(data)(clone_data(x) for x in data)
    if isinstance(data, dict):
        return {k: clone_data(v) for k, v in data.items()}
    return data.clone() if isinstance(data, torch.Tensor) else data


def own_verdict(
    folder: Path, kernel: Callable[[Any], Any], tests: Sequence[Dict[str, Any]], device: Any = "cpu"
) -> Dict[str, Any]:
    """GPU MODE's eval's test pass (``_run_single_test``), on ``device``: per test ``data = generate_input(**test)``,
    ``custom_kernel(_clone_data(data))``, ``check_implementation(data, output)``. Returns
    ``{"verdict": "correct"|"incorrect", "tests": [message or None, ...]}``."""
    module = load_modules(Path(folder))["reference"]
    messages = []
    for test in tests:
        items, _, single = generate(module, dict(test), torch.device(device))
        data = items[0] if single else tuple(items)
        try:
            messages.append(as_message(module.check_implementation(data, kernel(clone_data(data)))))
        except Exception as exc:  # noqa: BLE001 - the submission or its check raised: a failed test, as in their eval
            messages.append(f"{type(exc).__name__}: {exc}")
    return {"verdict": "correct" if all(m is None for m in messages) else "incorrect", "tests": messages}
