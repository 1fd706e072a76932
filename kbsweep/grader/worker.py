"""The grading process: imports the candidate in a fresh interpreter, checks it, times it.

Run by :func:`kbsweep.grader.grade` as ``python -m kbsweep.grader.worker <fd>``; the request comes on stdin
and the one result message goes to the pipe ``fd`` (the candidate's stdout/stderr are logs only).
The secret seed is read before the candidate is imported. Scoring happens in the parent, not here.
The audit's runtime instruments (:mod:`kbsweep.audit.runtime`) are installed before the candidate is imported;
after correctness (and timing), audit probes trace one call and replay it with the candidate's kernels stubbed.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from kbsweep.grader.failures import GradeFailure, classify, one_line
from kbsweep.grader.referee import load_module

STAGES = ("load_reference", "baselines", "import_candidate", "correctness", "timing", "audit")
HARNESS_STAGES = STAGES[:2]  # before the candidate is imported: a failure there is the harness's, never the candidate's


class Worker:
    """Correctness over shapes × seeds × stress cases, then timing of candidate and baselines."""

    def __init__(self, request: Dict[str, Any]):
        import torch

        self.torch = torch
        self.req = request
        self.spec = request["spec"]
        self.device = torch.device(request["device"])
        self.secret_seed = request.pop("secret_seed")
        self.findings: List[Dict[str, Any]] = []
        self.evidence: Dict[str, Any] = {}
        self.monitor = None
        self.stage = "load_reference"

    # -- building models and inputs -------------------------------------------------
    def seeded(self, seed: int) -> None:
        self.torch.manual_seed(seed)

    def build(self, cls: Any, shape: Dict[str, Any], seed: int):
        self.seeded(seed)
        model = cls(*self.ref.get_init_inputs(dict(shape)))
        return model.to(self.device).eval()

    def inputs(self, shape: Dict[str, Any], seed: int, scale: float = 1.0) -> List[Any]:
        self.seeded(seed + 7919)
        values = list(self.ref.get_inputs(dict(shape), self.device))
        if scale != 1.0:
            values = [v * scale if self.is_float(v) else v for v in values]
        return values

    def is_float(self, value: Any) -> bool:
        return isinstance(value, self.torch.Tensor) and value.dtype in (
            self.torch.float32, self.torch.float16, self.torch.bfloat16, self.torch.float64
        )

    def clone(self, values: Sequence[Any]) -> List[Any]:
        return [v.clone() if isinstance(v, self.torch.Tensor) else v for v in values]

    def poison(self, fill: int) -> None:
        from kbsweep.grader.runner import poison_free_memory

        poison_free_memory(self.device, fill)

    # -- the stages -----------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        from kbsweep.grader import checks

        self.checks = checks
        t0 = time.perf_counter()
        self.ref = load_module("kbsweep_reference", Path(self.req["reference"]))
        timed = self.req["mode"] in ("bench", "full")
        if timed and self.req.get("baselines"):
            self.stage = "baselines"  # before the candidate exists: it cannot touch what its speedups divide by
            deadline = time.perf_counter() + self.req.get("baseline_budget_s", math.inf)  # one budget for all shapes
            with self.torch.no_grad():
                baselines = [self.time_baselines(shape, deadline) for shape in self.req["shapes"]]
        workdir = Path(self.req["solution"]).parent
        self.install_instruments(workdir)
        self.stage = "import_candidate"
        sys.path.insert(0, str(workdir))
        try:
            with self.monitor.watch(self.stage):
                self.cand = load_module("solution", Path(self.req["solution"]))
            self.monitor.check_flags()
            if not hasattr(self.cand, "ModelNew"):
                raise GradeFailure("compile_error", "solution.py defines no ModelNew")
        except GradeFailure:
            raise
        except BaseException as exc:  # noqa: BLE001 - any import failure is the candidate's
            outcome = "grade_oom" if classify(exc) == "grade_oom" else "compile_error"
            raise GradeFailure(outcome, f"import failed: {one_line(exc)}") from None
        self.stage = "correctness"
        with self.torch.no_grad():
            correctness = self.correctness()
            self.guard.check(self.findings)
            timings = []
            if timed and not self.findings_block():
                self.stage = "timing"
                timings = [self.time_shape(shape) for shape in self.req["shapes"]]
                for entry, base in zip(timings, baselines if self.req.get("baselines") else []):
                    entry["baselines"] = base
                self.monitor.check_flags()
                self.guard.check(self.findings)
            self.stage = "audit"
            self.audit_probes()
            self.guard.check(self.findings)
        return {
            "correctness": correctness,
            "timings": timings,
            "evidence": self.evidence,
            "findings": self.findings,
            "worker_s": time.perf_counter() - t0,
        }

    def install_instruments(self, workdir: Path) -> None:
        """Runtime monitor and kernel gate (before the candidate exists), then the guard over them and the grader."""
        from kbsweep.audit import runtime
        from kbsweep.grader import timing

        if self.device.type == "cuda":  # a persisting-L2 carve-out an earlier process left on the GPU is not this candidate's
            self.evidence["persisting_l2_inherited"] = runtime.persisting_l2_limit()
            timing.reset_persisting_l2()
        deck = Path(self.req["reference"]).parent  # in-process writes anywhere are runtime events; the deck is also hashed
        self.monitor = runtime.Monitor(workdir, sorted(p for p in deck.iterdir() if p.is_file()), self.evidence)
        self.gate = runtime.KernelGate()
        self.guard = TamperGuard(self.ref, self.monitor.patched + self.gate.patched)

    def findings_block(self) -> bool:
        return any(f["kind"] == "grader_tamper" for f in self.findings)

    def run_candidate(self, model: Any, inputs: Sequence[Any]) -> Any:
        try:
            with self.monitor.watch(self.stage):
                return model(*inputs)
        except self.checks.CheckFailure:
            raise
        except Exception as exc:
            raise GradeFailure(classify(exc), f"{self.stage}: {one_line(exc)}") from None
        finally:
            if self.stage != "timing":  # in timing, checked once after the loop (no host work in the interval)
                self.monitor.check_flags()

    def check_case(self, ref_model, cand_model, inputs, tolerance: Optional[Dict] = None, fill: int = 0xFF):
        checks = self.checks
        pristine = self.clone(inputs)
        ref_out = ref_model(*self.clone(inputs))
        self.poison(fill)
        out = self.run_candidate(cand_model, inputs)
        checks.check_structure(ref_out, out, inputs)
        for i, (a, b) in enumerate(zip(inputs, pristine)):
            if isinstance(a, self.torch.Tensor) and not checks.same_values(a, b):
                raise checks.CheckFailure(f"the candidate modified input {i}")
        worst = checks.compare(ref_out, out, self.spec["tolerance"], tolerance)
        hook = getattr(self.ref, "check_outputs", None)
        if hook is not None:
            message = hook(pristine, ref_out, out)
            if message:
                raise checks.CheckFailure(message)
        return out, worst

    def correctness(self) -> Dict[str, Any]:
        seeds = [42 + 1000 * i for i in range(self.spec.get("seeds", 3))] + [self.secret_seed]
        stress = [{"name": "nominal", "input_scale": 1.0, "weight_scale": 1.0, "tolerance": None}]
        stress += self.spec.get("stress", [])
        cases, worst = 0, {"max_abs": 0.0, "max_rel": 0.0}
        try:
            for s_index, shape in enumerate(self.req["shapes"]):
                for k, seed in enumerate(seeds):
                    ref_model = self.build(self.ref.Model, shape, seed)
                    cand_model = self.build(self.cand.ModelNew, shape, seed)
                    try:
                        cand_model.load_state_dict(ref_model.state_dict(), strict=True)
                    except Exception as exc:
                        raise self.checks.CheckFailure(f"load_state_dict(strict=True) failed: {one_line(exc)}")
                    for case in stress if k == 0 else stress[:1]:
                        self.scale_weights(ref_model, cand_model, case.get("weight_scale", 1.0))
                        inputs = self.inputs(shape, seed, case.get("input_scale", 1.0))
                        _, err = self.check_case(ref_model, cand_model, inputs, case.get("tolerance"))
                        self.scale_weights(ref_model, cand_model, 1.0 / case.get("weight_scale", 1.0))
                        worst = {key: max(worst[key], err[key]) for key in worst}
                        cases += 1
                    if s_index == 0 and k == 0:
                        self.poison_determinism(ref_model, cand_model, shape, seed)
                        self.pointer_cache_probe(ref_model, cand_model, shape, seed)
        except self.checks.CheckFailure as exc:
            raise GradeFailure("incorrect", f"shape {shape}, seed {'secret' if seed == self.secret_seed else seed}: {exc}")
        return {"passed": True, "cases": cases, "seeds": len(seeds), "worst": worst}

    def scale_weights(self, ref_model, cand_model, factor: float) -> None:
        if factor == 1.0:
            return
        for tensor in list(ref_model.parameters()) + list(ref_model.buffers()):
            if self.is_float(tensor):
                tensor.data.mul_(factor)
        cand_model.load_state_dict(ref_model.state_dict(), strict=True)

    def poison_determinism(self, ref_model, cand_model, shape, seed) -> None:
        """Run twice under different poison fills: output that depends on stale memory shows up here."""
        first, _ = self.check_case(ref_model, cand_model, self.inputs(shape, seed), fill=0xFF)
        second, _ = self.check_case(ref_model, cand_model, self.inputs(shape, seed), fill=0xC7)
        same = self.checks.same_values(first, second)
        self.evidence["poison_deterministic"] = same
        if not same:
            self.findings.append({"kind": "nondeterministic_under_poison", "shape": shape})

    def pointer_cache_probe(self, ref_model, cand_model, shape, seed) -> None:
        """Warm up on fixed tensors, overwrite them in place (same pointer and version): output must follow."""
        inputs = self.inputs(shape, seed)
        for _ in range(11):
            self.run_candidate(cand_model, inputs)
        fresh = self.inputs(shape, seed + 1)
        versions = [getattr(t, "_version", None) for t in inputs]
        for old, new in zip(inputs, fresh):
            if isinstance(old, self.torch.Tensor):
                old.data.copy_(new)
        assert versions == [getattr(t, "_version", None) for t in inputs]
        ref_out = ref_model(*self.clone(fresh))
        out = self.run_candidate(cand_model, inputs)
        try:
            self.checks.compare(ref_out, out, self.spec["tolerance"])
        except self.checks.CheckFailure as exc:
            raise self.checks.CheckFailure(f"stale output after inputs changed in place (a pointer-keyed cache?): {exc}")
        self.evidence["pointer_cache_probe"] = "passed"

    # -- audit probes -----------------------------------------------------------------
    def audit_probes(self) -> None:
        """On the first shape and the timer's first input set: one traced call (aten ops and FLOPs outside the
        candidate's kernels; its output must be right although no correctness frame is on the stack), then ghost
        replays with the kernels stubbed and fresh allocations poisoned, on the same and on a fresh instance."""
        from kbsweep.audit import runtime
        from kbsweep.problems import evaluate

        shape = self.req["shapes"][0]
        ref_model = self.build(self.ref.Model, shape, 42)
        models = [self.build(self.cand.ModelNew, shape, 42) for _ in range(2)]
        for model in models:
            model.load_state_dict(ref_model.state_dict(), strict=True)
        inputs = self.inputs(shape, 2026)
        expected = ref_model(*self.clone(inputs))
        self.run_candidate(models[0], inputs)  # warm-up, as the timer's
        before = self.gate.counts.copy()
        recorder = runtime.op_recorder(self.gate)
        with self.gate.probing(recorder, ghost=False):
            out = self.run_candidate(models[0], inputs)
        try:
            self.checks.check_structure(expected, out, inputs)
            self.checks.compare(expected, out, self.spec["tolerance"])
        except self.checks.CheckFailure as exc:
            raise GradeFailure("incorrect", f"audit probe (a call outside the correctness stage), shape {shape}: {exc}")
        probe: Dict[str, Any] = {
            "shape": shape,
            "launches": dict(self.gate.counts - before),
            "kernels": sorted(self.gate.names),
            "aten_ops": dict(recorder.ops),
            "own_ops": dict(recorder.own_ops),
            "torch_flops": recorder.flops,
            "problem_flops": evaluate(self.spec.get("flops"), shape, "probe"),
        }
        if self.device.type == "cuda":
            probe["persisting_l2_limit"] = runtime.persisting_l2_limit()
        self.evidence["probe"] = probe
        if self.req.get("world_size", 1) > 1:
            return  # no ghost replays across ranks: a rank that fails without its kernels would strand the others in a collective
        real = self.clone(self.checks.as_tuple(out))
        for tensor in self.checks.as_tuple(out):
            tensor.untyped_storage().fill_(0xFF)  # a same-instance replay must not find the last output in place
        probe["ghost"] = {
            "same_instance": self.ghost_call(models[0], inputs, real, out),
            "fresh_instance": self.ghost_call(models[1], inputs, real, None),
        }

    def ghost_call(self, model, inputs, real: List[Any], previous: Any) -> Dict[str, Any]:
        """One call with the candidate's kernel launches stubbed out: did the output change?"""
        from kbsweep.audit import runtime

        before = self.gate.counts.copy()
        record: Dict[str, Any] = {"error": None, "aliases_previous": False}
        try:
            with self.gate.probing(runtime.op_recorder(self.gate, poison=True), ghost=True):
                out = self.run_candidate(model, inputs)
            outs = self.checks.as_tuple(out)
            record["changed"] = len(outs) != len(real) or not self.checks.same_values(tuple(real), outs)
            if previous is not None:
                old = self.checks.storages(self.checks.as_tuple(previous))
                record["aliases_previous"] = any(span in old for span in self.checks.storages(outs))
        except Exception as exc:  # noqa: BLE001 - a crash without the kernels means the kernels mattered
            record.update(changed=True, error=one_line(exc))
        counts = self.gate.counts - before
        record.update(stubbed=counts["triton"] + counts["extension"], graph_replays=counts["graph_replay"])
        return record

    # -- timing ---------------------------------------------------------------------
    def input_sets(self, shape: Dict[str, Any]) -> List[List[Any]]:
        first = self.inputs(shape, 2026)
        nbytes = sum(t.numel() * t.element_size() for t in first if isinstance(t, self.torch.Tensor))
        wanted = math.ceil(3 * self.req["l2_bytes"] / max(nbytes, 1)) if self.device.type == "cuda" else 1
        count = max(1, min(wanted, 32, int(self.req.get("max_input_bytes", 8 << 30) // max(nbytes, 1))))
        return [first] + [self.inputs(shape, 2026 + i) for i in range(1, count)]

    def timer(self, fn: Callable, input_sets, recheck=None) -> Dict[str, Any]:
        from kbsweep.grader import timing

        cfg = timing.TimingConfig(**self.req.get("timing", {}))
        if self.device.type == "cuda":
            hide_launch = self.spec.get("regime") != "latency"  # latency problems pay their launches
            return timing.time_cuda(fn, input_sets, cfg, self.req["l2_bytes"], recheck, hide_launch)
        return timing.time_cpu(fn, input_sets, cfg, recheck)

    def time_shape(self, shape: Dict[str, Any]) -> Dict[str, Any]:
        from kbsweep.grader import timing

        ref_model = self.build(self.ref.Model, shape, 42)
        cand_model = self.build(self.cand.ModelNew, shape, 42)
        cand_model.load_state_dict(ref_model.state_dict(), strict=True)
        sets = self.input_sets(shape)
        expected = {id(s): ref_model(*self.clone(s)) for s in sets}

        def recheck(inputs, out):
            try:
                self.checks.compare(expected[id(inputs)], out, self.spec["tolerance"])
            except self.checks.CheckFailure as exc:
                raise GradeFailure("incorrect", f"timed call {shape}: {exc}")

        entry: Dict[str, Any] = {"shape": shape, "input_sets": len(sets)}
        entry["candidate"] = self.timer(lambda *a: self.run_candidate(cand_model, a), sets, recheck)
        if self.device.type == "cuda":
            if self.spec.get("regime") == "latency" or entry["candidate"]["median_ms"] < 0.05:
                entry["candidate"]["graph_ms"] = timing.time_cuda_graph(cand_model, sets[0])
            entry["profile"] = self.profile(cand_model, sets[0])
        entry["baselines"] = {}
        return entry

    def time_baselines(self, shape: Dict[str, Any], deadline: float) -> Dict[str, Any]:
        from kbsweep.grader.referee import time_baselines

        return time_baselines(self.req, self.build(self.ref.Model, shape, 42), self.input_sets(shape), deadline, self.timer)

    def profile(self, model, inputs, calls: int = 3) -> Dict[str, Any]:
        """Kernel names and launches per call on the GPU (CUDA-graph replays count their kernels)."""
        from torch.profiler import ProfilerActivity, profile

        torch = self.torch
        from kbsweep.grader import timing

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                self.run_candidate(model, inputs)
            torch.cuda.synchronize()
        return timing.kernel_profile(list(prof.profiler.kineto_results.events()), [(0, 2**63)], calls)  # every launch counts


class TamperGuard:
    """Snapshots the callables the grader trusts; a candidate that patches them is caught.

    ``instruments`` are (owner, name) attributes the audit's runtime instruments patched in.
    """

    def __init__(self, reference: Any, instruments: Sequence[tuple] = ()):
        import time as time_mod

        import torch

        self.watched = {
            "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
            "torch.cuda.Event.record": (torch.cuda.Event, "record"),
            "torch.cuda.synchronize": (torch.cuda, "synchronize"),
            "time.perf_counter": (time_mod, "perf_counter"),
            "torch.allclose": (torch, "allclose"),
            "torch.equal": (torch, "equal"),
            "torch.Tensor.__eq__": (torch.Tensor, "__eq__"),
            "reference.Model.forward": (reference.Model, "forward"),
        }
        from kbsweep.audit import runtime
        from kbsweep.grader import checks, timing

        for module in (checks, timing, runtime):
            for name in dir(module):
                if callable(getattr(module, name)) and not name.startswith("__"):
                    self.watched[f"{module.__name__}.{name}"] = (module, name)
        for owner, name in instruments:
            self.watched[f"{getattr(owner, '__qualname__', owner.__name__)}.{name}"] = (owner, name)
        self.original = {key: getattr(obj, attr) for key, (obj, attr) in self.watched.items()}

    def check(self, findings: List[Dict[str, Any]]) -> None:
        for key, (obj, attr) in self.watched.items():
            if getattr(obj, attr, None) is not self.original[key]:
                findings.append({"kind": "grader_tamper", "detail": f"{key} was replaced"})
                setattr(obj, attr, self.original[key])


def main() -> None:
    fd = int(sys.argv[1])
    channel = os.fdopen(fd, "w")
    os.set_inheritable(fd, False)
    request = json.loads(sys.stdin.read())
    nonce = request.pop("nonce")
    worker = None
    try:
        worker = Worker(request)
        message = {"ok": True, "result": worker.run()}
    except GradeFailure as exc:
        message = {"ok": False, "outcome": exc.outcome, "message": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - report everything, classify by stage
        stage = worker.stage if worker else "load_reference"
        outcome = "harness_error" if stage in HARNESS_STAGES else classify(exc)
        message = {"ok": False, "outcome": outcome, "message": f"{stage}: {one_line(exc)}"}
        traceback.print_exc()
    if worker is not None and worker.monitor is not None:
        worker.monitor.close()  # flags undone, files re-hashed: evidence for passes and failures alike
    if worker is not None and not message["ok"]:
        message.update(stage=worker.stage, findings=worker.findings, evidence=worker.evidence)
    message["nonce"] = nonce
    channel.write(json.dumps(message, default=str) + "\n")
    channel.flush()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: candidate atexit hooks cannot rewrite the result


if __name__ == "__main__":
    main()
