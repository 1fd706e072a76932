"""Sizing a KernelBench file for a CPU smoke grade: its module-level integer constants (tuple elements included)
halved until the reference's parameters, one input set and its output fit ``SMOKE_BYTES`` and one forward
``SMOKE_FLOPS``, measured on the meta device; :class:`SizedReference` loads the file at the sizes a shape overrides.
Deck files are sized in a child interpreter (``python -m kbsweep.config.kernelbench_sizing FILE...``), their fits cached
by content under the KernelBench cache (:func:`cache_root`). :mod:`kbsweep.config.kernelbench` builds problem folders from them.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Optional, Tuple

# A CPU smoke grade's budget. A passing grade makes some 60 forwards (candidate, reference, eager timing; tests pin
# them); at 64 MiB / 1 GFLOP a memory-bound level-1 forward took up to 1 s on this loaded 2-core host (42_Max_Pooling_2D:
# 131 s for its two grades), at a quarter of that a quarter. GPUs grade the file's full sizes.
SMOKE_BYTES = 16 << 20  # parameters + one input set + output
SMOKE_FLOPS = 2.5e8  # one forward
MIN_SIZE = 8  # constants below 16 (kernel sizes, strides, dims, small groups) are never halved
BATCH_NAMES = ("batch_size", "batch", "bs")  # what KernelBench's files call the batch a held-out shape scales
FIT_TIMEOUT_S = 600

ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
}


def integer(node: ast.AST) -> Optional[int]:
    """The value of an integer literal or of arithmetic on literals (``2048 * 2``), else None."""
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is int else None
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        left, right = integer(node.left), integer(node.right)
        return None if left is None or right is None else ARITHMETIC[type(node.op)](left, right)
    return None


def size_constants(source: str, least: int = 2 * MIN_SIZE) -> Dict[str, int]:
    """Module-level ``name = <integer>`` assignments (``a = b = 128`` gives both names) and the integer elements of
    ``name = (<integer>, ...)`` (as ``name[i]``) of at least ``least``."""
    found: Dict[str, int] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign):
            continue
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elements = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
        for index, element in enumerate(elements):
            value = integer(element)
            if value is not None and value >= least:
                found.update({f"{n}[{index}]" if isinstance(node.value, ast.Tuple) else n: value for n in names})
    return found


def with_sizes(source: str, sizes: Dict[str, int]) -> str:
    """``source`` with the module-level constants in ``sizes`` (names, or ``name[i]`` for a tuple's element)
    assigned those values instead; what is derived from them at import time (``bias_shape = (out_channels, 1, 1)``)
    follows."""
    if not sizes:
        return source
    tree = ast.parse(source)
    body: List[ast.stmt] = []
    for node in tree.body:
        names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if isinstance(node, ast.Assign) and any(n == k.split("[")[0] for n in names for k in sizes):
            for name in names:  # one assignment per name: `height = width = 128` may scale one of the two
                body.append(
                    ast.copy_location(
                        ast.Assign([ast.Name(name, ast.Store())], sized_value(node.value, name, sizes)), node
                    )
                )
        else:
            body.append(node)
    tree.body = body
    return ast.unparse(ast.fix_missing_locations(tree))


def sized_value(value: ast.expr, name: str, sizes: Dict[str, int]) -> ast.expr:
    """``value`` of the assignment to ``name`` with what ``sizes`` overrides of it."""
    if isinstance(value, ast.Tuple):
        return ast.Tuple(
            [ast.Constant(sizes[f"{name}[{i}]"]) if f"{name}[{i}]" in sizes else e for i, e in enumerate(value.elts)],
            ast.Load(),
        )
    return ast.Constant(sizes[name]) if name in sizes else value


def load_sized(path: Path, sizes: Dict[str, int]) -> ModuleType:
    module = ModuleType(f"kernelbench_{path.stem}")
    module.__file__ = str(path)
    exec(compile(with_sizes(path.read_text(), sizes), str(path), "exec"), module.__dict__)  # noqa: S102 - deck code
    return module


class SizedReference:
    """The KernelBench file's ``Model``/``get_init_inputs``/``get_inputs`` at the sizes a shape overrides."""

    def __init__(self, path: Path):
        self.path = path
        self.modules: Dict[Tuple, ModuleType] = {}
        self.current = self.module({})

    def module(self, shape: Dict[str, Any]) -> ModuleType:
        key = tuple(sorted(shape.items()))
        if key not in self.modules:
            self.modules[key] = load_sized(self.path, dict(shape))
        self.current = self.modules[key]
        return self.current

    def Model(self, *init_inputs: Any):  # noqa: N802 - the contract's name
        """The model of the sizes last asked for (builders call get_init_inputs(shape) just before)."""
        return self.current.Model(*init_inputs)

    def get_init_inputs(self, shape: Dict[str, Any]) -> List[Any]:
        return list(self.module(shape).get_init_inputs())

    def get_inputs(self, shape: Dict[str, Any], device: Any) -> List[Any]:
        import torch

        values = self.module(shape).get_inputs()
        return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def footprint(module: ModuleType) -> Tuple[int, float, bool]:
    """Bytes of the reference's parameters, one input set and its output, and the FLOPs of one forward (matmuls,
    convolutions, attention: what torch's flop counter knows), on the meta device (no memory used, nothing
    computed); and whether the forward ran there (False: an op without a meta kernel, or sizes the model rejects)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    def size(values):
        return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))

    with torch.device("meta"):
        inputs = list(module.get_inputs())
        model = module.Model(*module.get_init_inputs())
    total = size(inputs) + size(list(model.parameters()) + list(model.buffers()))
    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), counter:
            out = model(*inputs)
        return total + size(out if isinstance(out, (tuple, list)) else [out]), float(counter.get_total_flops()), True
    except Exception:  # noqa: BLE001 - the meta device cannot say; the sizes are judged without the output
        return total, float(counter.get_total_flops()), False


def fit(path: Path, budget: int = SMOKE_BYTES, flop_budget: float = SMOKE_FLOPS) -> Dict[str, Any]:
    """Overrides that fit ``budget`` bytes and ``flop_budget`` FLOPs a forward: the largest constant halved, one
    step at a time; when the forward no longer runs on meta after a step (while it did at full size), the step is
    tried again with every constant of the same value halved together, tuples' elements included (sizes tied by
    broadcasting: ``batch_size = 32768`` beside ``input_shape = (32768,)``), and else undone and that constant left
    alone. A tuple's element is never halved on its own."""
    source = path.read_text()
    constants = size_constants(source)
    full, full_flops, runs = footprint(load_sized(path, {}))
    sizes, left, used, flops = dict(constants), set(constants), full, full_flops

    def measure(trial: Dict[str, int]) -> Tuple[int, float, bool]:
        try:
            return footprint(load_sized(path, {k: v for k, v in trial.items() if v != constants[k]}))
        except Exception:  # noqa: BLE001 - the file rejects the size (an assert, a shape mismatch)
            return used, flops, False

    while (used > budget or flops > flop_budget) and (names := [n for n in left if "[" not in n]):
        name = max(names, key=lambda n: sizes[n])  # a tuple's element moves only with a name it is tied to
        if sizes[name] // 2 < MIN_SIZE:
            left.discard(name)
            continue
        tied = [n for n in left if sizes[n] == sizes[name]]
        groups = [[name], tied] if len(tied) > 1 else [[name]]
        for group in groups:
            trial = {**sizes, **{n: sizes[n] // 2 for n in group}}
            bytes_, flops_, ok = measure(trial)
            if ok or not runs:
                sizes, used, flops = trial, bytes_, flops_
                break
        else:
            left.discard(name)
    overrides = {k: v for k, v in sizes.items() if v != constants[k]}
    return {
        "sizes": overrides,
        "full_bytes": full,
        "bytes": used,
        "full_flops": full_flops,
        "flops": flops,
        "fits": used <= budget and flops <= flop_budget,
        "held_out": held_out(path, overrides, runs),
    }


def held_out_batch(value: int) -> Optional[int]:
    """The batch a held-out shape grades in place of ``value``: three quarters of it less one (16 -> 11, 128 -> 95:
    a size no kernel was tuned for, often odd), None below 3 (no smaller batch is left)."""
    return value * 3 // 4 - 1 if value >= 3 else None


def held_out(path: Path, smoke: Dict[str, int], runs: bool) -> Dict[str, Any]:
    """A KernelBench file's held-out shapes: its batch (the first of BATCH_NAMES it assigns at module level) at
    :func:`held_out_batch` of its value, over the sizes as written (the GPU's) and over the smoke sizes ``smoke``
    (the CPU's); each must build and run on the meta device, else the constants of the batch's value (a tuple's
    elements included: ``input_shape = (batch_size,)``) move with it. ``{"shapes", "smoke_shapes"}``, or
    ``{"none": why}``."""
    constants = size_constants(path.read_text(), least=1)
    name = next((n for n in BATCH_NAMES if n in constants), None)
    if name is None:
        return {"none": f"no module-level batch size ({', '.join(BATCH_NAMES)}) to scale"}
    if not runs:
        return {"none": "its forward does not run on the meta device, where another batch would be checked"}
    found = []
    for base in ({}, smoke):
        value = base.get(name, constants[name])
        batch = held_out_batch(value)
        if batch is None:
            return {"none": f"{name} = {value} leaves no smaller batch to hold out"}
        tied = {n: batch for n, v in {**constants, **base}.items() if v == value}
        for trial in ({**base, name: batch}, {**base, **tied}):
            try:
                if footprint(load_sized(path, trial))[2]:
                    found.append(trial)
                    break
            except Exception:  # noqa: BLE001 - the file rejects the size
                continue
        else:
            return {"none": f"the reference does not run at {name} = {batch}"}
    return {"shapes": [found[0]], "smoke_shapes": [found[1]]}


def cache_root() -> Path:
    return Path(tempfile.gettempdir()) / "kbsweep-kernelbench"


def fit_key(original: Path) -> str:
    """A fit's identity: the file's content, the sizing rule (the source of the functions that size) and the
    budget; edits elsewhere in this module keep the fits."""
    import inspect

    rule = "".join(
        inspect.getsource(f)
        for f in (
            integer,
            size_constants,
            with_sizes,
            sized_value,
            load_sized,
            footprint,
            fit,
            held_out_batch,
            held_out,
        )
    ) + repr(BATCH_NAMES)
    digest = hashlib.sha256(
        original.read_bytes() + b"\0" + rule.encode() + f"\0{SMOKE_BYTES}\0{SMOKE_FLOPS}\0{MIN_SIZE}".encode()
    )
    return digest.hexdigest()[:24]


def fits(files: List[Path]) -> Dict[Path, Dict[str, Any]]:
    """:func:`fit` of each file, from the cache where its content was sized before; the rest in one child
    interpreter for all of them (the files are deck code, and this process need not import torch). A file that
    kills or hangs the child gets an ``error`` fit and a fresh child takes the files after it."""
    cached = cache_root() / "fits"
    found: Dict[Path, Dict[str, Any]] = {}
    todo = []
    for path in files:
        try:
            found[path] = json.loads((cached / f"{fit_key(path)}.json").read_text())
        except (OSError, ValueError):  # not sized yet (or a torn write): size it
            todo.append(path)
    while todo:
        reported = fit_in_child(todo)
        for path, fitted in reported.items():
            found[path] = fitted
            if "error" not in fitted:  # a failure is sized again next time (a package installed, a loaded machine)
                cached.mkdir(parents=True, exist_ok=True)
                partial = cached / f".{fit_key(path)}.{os.getpid()}"
                partial.write_text(json.dumps(fitted))
                partial.replace(cached / f"{fit_key(path)}.json")
        todo = [p for p in todo if p not in reported]
    return found


def fit_in_child(files: List[Path]) -> Dict[Path, Dict[str, Any]]:
    """One child sizes ``files`` in order, one JSON line each; when it dies or a file takes over FIT_TIMEOUT_S,
    the files it reported and the culprit's error come back (the caller starts another child for the rest)."""
    import selectors

    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kbsweep.config.kernelbench_sizing", *map(str, files)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert proc.stdout is not None  # a PIPE
        reported: Dict[Path, Dict[str, Any]] = {}
        hung = False
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while len(reported) < len(files):
                hung = not selector.select(timeout=FIT_TIMEOUT_S)
                line = "" if hung else proc.stdout.readline()
                if not line:  # the child hangs on this file, or died on it (EOF)
                    break
                message = json.loads(line)
                reported[Path(message["file"])] = message["fit"]
        if len(reported) < len(files):
            culprit = files[len(reported)]
            try:
                proc.wait(timeout=0 if hung else FIT_TIMEOUT_S)  # a dead child's exit code names its death
            except subprocess.TimeoutExpired:
                proc.kill()
            proc.wait()
            err.seek(0)
            tail = (err.read().decode(errors="replace").strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            reported[culprit] = {"error": f"sizing took over {FIT_TIMEOUT_S} s" if hung else tail[:300]}
        proc.wait()
        proc.stdout.close()
    return reported


def main(files: List[str]) -> None:
    """The sizing child: one ``{"file", "fit"}`` line per file, flushed as each is done."""
    for name in files:
        try:
            fitted = fit(Path(name))
        except Exception as exc:  # noqa: BLE001 - the file does not load or build: recorded, the rest go on
            fitted = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
        print(json.dumps({"file": name, "fit": fitted}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
