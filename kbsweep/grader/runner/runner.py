"""The candidate's process: an isolated interpreter that imports the candidate and runs what the referee asks.

Nothing this process reports is trusted (docs/grading.md, threat model): the candidate controls all of it, this
module included. It exists so that honest candidates are easy to run and dishonest ones leave evidence; the
referee (:mod:`kbsweep.grader.referee.referee`) decides correctness from the outputs it reads back from shared memory
and corroborates every reported time with its own clock.

Started by :func:`kbsweep.grader.processes.supervise` as ``python -I -c <bootstrap> <channel fd>``, or once per rank under
torchrun by :func:`kbsweep.grader.distributed.supervise_ranks` as ``... ranks <rendezvous folder>`` (it joins the
ranks' process group, then dials its referee rank): isolated mode (no
PYTHON* variables, no user site, no script folder on ``sys.path``); kbsweep's root is appended *after* the
standard paths, every harness module is imported before any candidate path exists, and the candidate's folder is
reachable only through :class:`CandidateFinder` (last on ``sys.meta_path``: a helper named like a standard or
installed module never shadows it).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import torch
import torch.profiler

from kbsweep.grader.runner import op_bytes, runtime, seal
from kbsweep.grader.runner.finder import PACKAGE, CandidateFinder
from kbsweep.grader.shared import profiling, timing
from kbsweep.grader.shared.arena import Arena, seed_rng
from kbsweep.grader.shared.channel import Channel, ChannelError
from kbsweep.grader.shared.failures import GradeFailure, classify, one_line
from kbsweep.outcomes import Outcome


def decode(value: Any, arena: Arena) -> Any:
    """A value the referee encoded (:func:`kbsweep.grader.shared.arena.encode`)."""
    if "slot" in value:
        return arena.view(value["slot"])
    if "list" in value:
        return [decode(v, arena) for v in value["list"]]
    if "dtype" in value:
        return getattr(torch, value["dtype"])
    return value["value"]


class Runner:
    """Serves the referee's commands until ``exit``; an exception from candidate code answers with its outcome."""

    def __init__(self, channel: Channel, request: Dict[str, Any], barrier: Optional[Callable[[], None]] = None):
        self.channel, self.request = channel, request
        self.barrier = barrier  # ranks: the harness's own barrier across the runner ranks
        self.device = torch.device(request["device"])
        self.folder = Path(request["workdir"])
        self.models: Dict[int, Any] = {}
        self.attached: Optional[Arena] = None  # the referee's arena (``arena``), until ``release``
        self.cand: Any = None
        self.monitor: Optional[runtime.Monitor] = None  # installed by ``instrument``, before the candidate's import
        self.evidence: Dict[str, Any] = {}
        self.stage = self.tag = ""  # the current command's id: the referee never names its stage here
        self.flush = timing.L2Flush(request["l2_bytes"]) if self.device.type == "cuda" else None
        if self.device.type == "cuda":  # a fresh context may start with a persisting-L2 carve-out: not the candidate's
            self.evidence["persisting_l2_inherited"] = timing.persisting_l2_limit()
            timing.reset_persisting_l2()
        self.ops = {"calls": 0}
        self.calls: Dict[str, List[List[int]]] = {}  # per command id, each call's work (Runner.work)
        self.replay: Optional[timing.Replay] = None  # the last batch's captured calls
        self.paused: Any = None  # the profiler's kernel records, paused from a replay's arm to the next command
        # the armed batch: (warm steps, timed steps, mode, spin_us, its replay), None after a failed capture
        self.armed: Optional[Tuple[List[tuple], List[tuple], str, float, Optional[timing.Replay]]] = None

    @property
    def arena(self) -> Arena:
        if self.attached is None:
            raise RuntimeError("no arena: the referee attaches one before any command that passes tensors")
        return self.attached

    def watched(self) -> ContextManager[None]:
        """The monitor's watch over a call into the candidate's code."""
        if self.monitor is None:
            raise RuntimeError("no monitor: the referee instruments the runner before it imports the candidate")
        return self.monitor.watch(self.stage)

    def armed_batch(self) -> Tuple[List[tuple], List[tuple], str, float, Optional[timing.Replay]]:
        if self.armed is None:
            raise RuntimeError("no batch armed: its capture failed")
        return self.armed

    def serve(self) -> None:
        while True:
            message, fds = self.channel.receive()
            op = message.get("op")
            if op == "exit":
                return
            self.stage = self.tag = str(message.get("tag", ""))
            if self.paused is not None and op not in ("warm", "batch"):  # a replay's batch is over
                self.paused, paused = None, self.paused
                paused.__exit__(None, None, None)
            try:
                reply = {"ok": True, **(getattr(self, f"op_{op}")(message, fds) or {})}
            except GradeFailure as exc:
                reply = {"ok": False, "outcome": exc.outcome, "message": str(exc)}
            except Exception as exc:  # noqa: BLE001 - the candidate's code raised: classified, never fatal here
                reply = {"ok": False, "outcome": classify(exc), "message": f"{self.stage}: {one_line(exc)}"}
            if self.monitor is not None:
                self.monitor.check_flags()
            self.channel.send(reply)

    # -- setup ----------------------------------------------------------------------
    def op_arena(self, message, fds) -> None:
        self.attached = Arena.attach(fds[0], int(message["size"]), self.device)

    def op_release(self, message, fds) -> None:
        """Drop the models built so far and the arena they came from, returning their GPU memory to the driver (a
        grade that kept every shape's and seed's models and arenas ran an 80 GB GPU out of memory)."""
        self.models.clear()
        self.replay = None
        if self.attached is not None:
            self.attached.close()
            self.attached = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def op_instrument(self, message, fds) -> None:
        """The harness's instruments, over every command from here on, all alike: the kernel gate, the monitor, the
        op recorder and the profiler session. Installed before the import, so the trusted round trips and empty
        batches the referee measures next carry what every later command carries."""
        self.gate = runtime.KernelGate()
        self.monitor = runtime.Monitor(
            self.folder, [], self.evidence, self.gate, lambda event: self.channel.send({"event": event})
        )
        self.recorder = seal.op_recorder(self.gate.launches, frozenset(torch._C._dispatch_get_all_op_names()))
        self.session = profiling.profiler_session(self.device)
        self.session.start()

    def op_import(self, message, fds) -> None:
        sys.meta_path.append(CandidateFinder(self.folder))
        unlist_harness()
        try:
            with self.watched():
                self.cand = importlib.import_module(f"{PACKAGE}.solution")
        except BaseException as exc:  # noqa: BLE001 - any import failure is the candidate's
            outcome = Outcome.GRADE_OOM if classify(exc) == Outcome.GRADE_OOM else Outcome.COMPILE_ERROR
            raise GradeFailure(outcome, f"import failed: {one_line(exc)}") from None
        if not hasattr(self.cand, "ModelNew"):
            raise GradeFailure(Outcome.COMPILE_ERROR, "solution.py defines no ModelNew")

    def op_build(self, message, fds) -> None:
        seed_rng(int(message["seed"]), self.device)
        with torch.no_grad(), self.watched():
            model = (
                self.cand.ModelNew(*decode(message["init"], self.arena))
                .to(self.device)
                .train(bool(message.get("train")))
            )
            if message.get("state") is not None:  # None: the weights are the seed's (KernelBench problems)
                state = {name: self.arena.view(slot) for name, slot in message["state"].items()}
                try:
                    model.load_state_dict(state, strict=True)
                except Exception as exc:
                    raise GradeFailure(
                        Outcome.INCORRECT, f"load_state_dict(strict=True) failed: {one_line(exc)}"
                    ) from None
        self.models[int(message["model"])] = model

    # -- calls ----------------------------------------------------------------------
    def invoke(self, model: Any, inputs: List[Any]) -> Any:
        """One call of the candidate, its torch ops recorded (every call alike: no probe looks different). What it
        returned is made plain inside the call's range (:func:`plain`) and let go there, so none of its code runs
        once the range has closed (a list whose ``__iter__`` computes, a ``__del__``: the call's work either way)."""
        with (
            self.watched(),
            torch.profiler.record_function(profiling.CALL_RANGE + self.tag),
            self.recorded(),
        ):
            return plain(model(*inputs))

    @contextlib.contextmanager
    def recorded(self):
        """The call's work recorded under its command's id, as the difference of :meth:`work` across it."""
        before = self.work()
        try:
            with self.recorder:
                yield
        finally:
            self.calls.setdefault(self.tag, []).append([after - at for after, at in zip(self.work(), before)])
            self.ops["calls"] += 1

    def work(self) -> List[int]:
        """Bytes that torch ops which compute moved, their FLOPs, the candidate's own launches, CUDA-graph replays,
        and bytes that crossed between torch and host arrays, so far."""
        recorder, gate = self.recorder, self.gate
        return [
            recorder.bytes,
            recorder.flops,
            gate.own_launches(),
            gate.counts["graph_replay"],
            recorder.host_bytes + gate.exported,
        ]

    def deliver(self, out: Any, slots: List[Dict[str, Any]], inputs: List[Any], kernelbench: bool = False) -> None:
        """Copy the outputs into the referee's slots, refusing what does not fit exactly. ``kernelbench``: what
        KernelBench's eval accepts instead: one tensor (it reads ``output.shape``), aliasing an input or not."""
        if kernelbench and not isinstance(out, torch.Tensor):
            raise GradeFailure(Outcome.INCORRECT, f"the output is {type(out).__name__}, not a tensor")
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(outs) != len(slots):
            raise GradeFailure(Outcome.INCORRECT, f"expected {len(slots)} outputs, got {len(outs)}")
        spans = [
            (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            for t in inputs
            if isinstance(t, torch.Tensor)
        ]
        for i, (o, slot) in enumerate(zip(outs, slots)):
            target = self.arena.view(slot)
            if type(o) is not torch.Tensor:
                raise GradeFailure(Outcome.INCORRECT, f"output {i} is {type(o).__name__}, not exactly torch.Tensor")
            if o.dtype != target.dtype or o.shape != target.shape or o.device.type != target.device.type:
                raise GradeFailure(
                    Outcome.INCORRECT,
                    f"output {i}: got {o.dtype} {tuple(o.shape)} on {o.device}, expected {target.dtype} {tuple(target.shape)} on {target.device}",
                )
            start, size = o.untyped_storage().data_ptr(), o.untyped_storage().nbytes()
            if not kernelbench and o.numel() and any(start < s + n and s < start + size for s, n in spans):
                raise GradeFailure(Outcome.INCORRECT, f"output {i} aliases an input's memory")
            target.copy_(o)

    def op_call(self, message, fds) -> None:
        """One call, prepared as a timed call is: no fill of its memory or allocations (a fill only some calls got
        would tell them apart; the referee's poison is in its output slots, and its ghost replays run on inputs
        no call has seen)."""
        model = self.models[int(message["model"])]
        inputs = decode(message["inputs"], self.arena)
        with torch.no_grad():
            out = self.invoke(model, inputs)
            self.deliver(out, message["outputs"], inputs, kernelbench=bool(message.get("kernelbench")))
        self.sync()

    def op_ghost(self, message, fds) -> Dict[str, Any]:
        """A call as :meth:`op_call` makes it, with the candidate's kernel launches stubbed."""
        before = self.gate.counts.copy()
        error = None
        self.gate.ghost = True
        try:
            self.op_call(message, fds)
        except Exception as exc:  # noqa: BLE001 - a crash without the kernels means the kernels mattered
            error = one_line(exc)
        finally:
            self.gate.ghost = False
        self.sync()
        counts = self.gate.counts - before
        return {
            "error": error,
            "stubbed": counts["triton"] + counts["extension"],
            "graph_replays": counts["graph_replay"],
        }

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # -- timing ---------------------------------------------------------------------
    def op_ping(self, message, fds) -> None:
        """An empty command: the referee times the channel's round trip with it before the candidate is imported."""

    def op_arm(self, message, fds) -> Optional[Dict[str, Any]]:
        """A timed batch's plan (its inputs arrive with the go): the calls' views and slots made ready outside the
        referee's clock. The first ``warm`` calls run on ``op_warm``, the rest on ``op_batch``: by events, or with
        ``replay`` as one CUDA graph replay (captured now, or the last capture of the same plan reused), the
        profiler's kernel records paused from here to the next command (no candidate code runs in a replay)."""
        calls, warm = message["calls"], int(message.get("warm") or 0)
        model = self.models[int(message["model"])] if calls else None
        kernelbench = bool(message.get("kernelbench"))  # outputs as KernelBench takes them (may alias an input)
        align = timing.call_barrier(self.barrier, message["mode"])

        def step(call: Dict[str, Any]) -> tuple:
            inputs, slots = decode(call["inputs"], self.arena), call["outputs"]
            return (
                align,
                lambda: self.invoke(model, inputs),
                lambda out: self.deliver(out, slots, inputs, kernelbench=kernelbench),
            )

        timed = calls[warm:]
        replay = None
        if message.get("replay"):
            if self.flush is None:  # CPU: no graph to capture (the referee asks for replays on GPUs only)
                self.armed = None
                return {"replay_error": f"{self.stage}: capture failed: no GPU"}
            key = (message["model"], repr([(c["inputs"], c["outputs"]) for c in timed]))
            if self.replay is None or self.replay.key != key:
                self.replay = None  # the last capture's memory pool goes before the next is taken
                tag, self.tag = self.tag, self.tag + profiling.CAPTURE_TAG
                try:
                    with torch.no_grad():
                        self.replay = timing.Replay([step(c) for c in timed], self.flush, key)
                except Exception as exc:  # noqa: BLE001 - a call a graph cannot hold is timed by events alone
                    self.armed = None
                    return {"replay_error": f"{self.stage}: capture failed: {one_line(exc)}"}
                finally:
                    self.tag = tag
            replay = self.replay
            self.paused = profiling.kernels_unrecorded(self.session)
            self.paused.__enter__()
        self.armed = (
            [step(c) for c in calls[:warm]],
            [] if replay else [step(c) for c in timed],
            message["mode"],
            float(message.get("spin_us") or 0),
            replay,
        )
        return None

    def op_warm(self, message, fds) -> None:
        """The armed batch's warm calls, to their end: the chip at the clock it sustains when the go comes."""
        warm, _, mode, _, _ = self.armed_batch()
        with torch.no_grad():
            timing.run_batch(warm, mode)

    def op_batch(self, message, fds) -> Dict[str, Any]:
        """The armed batch's timed calls (:func:`kbsweep.grader.shared.timing.run_batch`), each output copied to its slot
        outside its timed interval, or their replay; the referee's clock runs around this command."""
        _, steps, mode, spin_us, replay = self.armed_batch()
        with torch.no_grad():
            return timing.run_batch(steps, mode, spin_us, self.flush, replay)

    def op_evidence(self, message, fds) -> Dict[str, Any]:
        """Everything recorded: runtime events, the recorder's ops, and from the profiler session the ops of
        every call (those run with torch dispatch disabled too) and, per tag, the kernels of its calls."""
        if self.monitor is None:
            raise RuntimeError("no monitor: the referee instruments the runner before it asks for evidence")
        self.monitor.close()
        session = getattr(self, "session", None)
        profiled = {}
        if session is not None:
            session.stop()
            groups, events = message.get("groups") or {}, op_bytes.read_once(session)
            profiled = {
                "profiled": {
                    **profiling.session_evidence(events, groups, message.get("calls") or {}),
                    "range_bytes": op_bytes.range_bytes(events, groups),
                }
            }
        ops = {**self.ops, "aten_ops": dict(self.recorder.ops), "own_ops": dict(self.recorder.own_ops)}
        extra = {"persisting_l2_limit": timing.persisting_l2_limit()} if self.device.type == "cuda" else {}
        return {
            "evidence": self.evidence,
            "ops": ops,
            "launches": dict(self.gate.counts),
            "kernels": sorted(self.gate.names),
            "calls": self.calls,
            **extra,
            **profiled,
        }


def unlist_harness() -> None:
    """kbsweep's modules out of ``sys.modules`` before the candidate is imported: an ``import kbsweep...`` then loads
    a fresh copy (an import the monitor records), never the modules whose functions this process runs."""
    for name in [name for name in sys.modules if name == "kbsweep" or name.startswith("kbsweep.")]:
        del sys.modules[name]


def plain(out: Any) -> Any:
    """A call's result as the harness takes it: a tuple or list (a subclass's items read by its own ``__iter__``,
    here, inside the call) becomes a plain tuple; anything else is left for :meth:`Runner.deliver` to judge."""
    return tuple(out) if isinstance(out, (tuple, list)) else out


def join_ranks() -> tuple:
    """Under torchrun: this rank's process group (the candidate's ``torch.distributed``) and a gloo group of the
    harness's own for aligning timed calls, then the line to its referee rank. Returns (channel, barrier)."""
    import torch.distributed as dist

    from kbsweep.grader.shared.channel import connect_rank
    from kbsweep.grader.shared.ranks import init_distributed

    rank, _, _ = init_distributed()
    control = dist.new_group(backend="gloo")
    token = os.environ.pop("KBSWEEP_RANK_TOKEN", "")
    return connect_rank(Path(sys.argv[-1]), rank, token), lambda: dist.barrier(group=control)


def warm() -> None:
    """Run once by the runner's zygote before it forks, for CPU grades only (``CUDA_VISIBLE_DEVICES`` empty: on
    the H200 a zygote that had imported these forked runners that died at their start, exit 70; a zygote of GPU
    grades imports no more than the runner needs): ``torch._inductor`` (the profiler session's start imports it, ~3 CPU-s),
    ``torch.utils.cpp_extension`` (whose loaders the kernel gate patches in every grade), Triton's gluon (its
    argument specialisation imports it at a grade's first interpreted launch), the list of builtins Triton's
    interpreter searched ``triton.language`` for at every launch (:mod:`kbsweep.grader.runner.interpreter_cache`), and
    the host profiler's first start, which sets up Kineto (2-3 s on CPU)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        import torch._inductor  # noqa: F401
        import torch.utils.cpp_extension  # noqa: F401

        from kbsweep.grader.runner import interpreter_cache

        with contextlib.suppress(ImportError):  # a host without Triton grades torch-only solutions
            import triton.experimental.gluon  # noqa: F401
        interpreter_cache.install()

        session = profiling.profiler_session("cpu")
        session.start()
        session.stop()


def main() -> None:
    channel, barrier = join_ranks() if sys.argv[-2:-1] == ["ranks"] else (Channel.from_fd(int(sys.argv[-1])), None)
    os.set_inheritable(channel.sock.fileno(), False)
    message, _ = channel.receive()
    runner = Runner(channel, message["request"], barrier)
    channel.send({"ok": True, "pid": os.getpid()})
    try:
        runner.serve()
    except ChannelError:
        pass
    sys.stdout.flush()
    os._exit(0)
