"""The referee's view of the host's load while it times a baseline (kbsweep/grader/referee/host_load.py): other
processes' CPU work on its CPUs counted, its own and other CPUs' left out, and the gate that times a baseline only
while that work stays within ``grade.timing.quiet_cpus``, waits for that within a grade's allowance, times again
when the load came during the timing, and gives up as a busy host.
The gate's use on a GPU grade runs in scripts/baseline_load.py (docs/benchmarks.md)."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kbsweep.grader.referee.host_load import SAMPLE_S, TICK_S, HostBusy, OtherWork, QuietHost, host_busy_s

pytestmark = pytest.mark.fast


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass"


def outside_spinner(seconds: float) -> None:
    """A process spinning for ``seconds`` outside this process's tree: started by a child that exits at once, so
    the spinner is re-parented away from this process (another cell's compile, a process a sandbox left behind)."""
    code = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SPIN.format(s=seconds)!r}])"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_another_process_spinning_counts_as_other_work():
    outside_spinner(3.0)
    time.sleep(0.5)  # past its start-up
    with OtherWork() as work:
        time.sleep(1.0)
    assert work.cpus is not None and work.cpus >= 0.5


BURN = "import sys, time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nprint(flush=True)\ntime.sleep({rest})"


def test_the_referees_own_children_are_not_other_work():
    """Processes this one started (torch.compile's and Triton's compile workers) burn 0.3 CPU-s each inside the
    window, one exiting and reaped there, one still alive at its end: the CPUs' busy time holds their work, the
    other work does not (however busy the host)."""
    began, busy = time.monotonic(), host_busy_s()
    with OtherWork() as work:
        brief = subprocess.Popen([sys.executable, "-c", BURN.format(rest=0)], stdout=subprocess.PIPE)
        lasting = subprocess.Popen([sys.executable, "-c", BURN.format(rest=2)], stdout=subprocess.PIPE)
        brief.wait()
        lasting.stdout.readline()  # its burn is over; it sleeps on, alive
    wall, host_s = time.monotonic() - began, host_busy_s() - busy
    lasting.kill()
    lasting.wait()
    assert work.cpus is not None and host_s - work.cpus * wall >= 0.5


def burn(cpu_s: float) -> None:
    """Spin until this thread has had ``cpu_s`` of CPU (however busy the host)."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_the_referees_own_threads_are_not_other_work():
    """A thread of this process burns 0.5 CPU-s inside the window: the CPUs' busy time holds it, the other work
    does not (whatever else the host runs meanwhile)."""
    began, busy = time.monotonic(), host_busy_s()
    with OtherWork() as work:
        thread = threading.Thread(target=burn, args=(0.5,))
        thread.start()
        thread.join()
    wall, host_s = time.monotonic() - began, host_busy_s() - busy
    assert work.cpus is not None and host_s - work.cpus * wall >= 0.4


class FakeHost:
    """A 16-CPU /proc/stat whose CPUs 0-7 get busy by ``load`` CPUs per second of a clock that moves only when
    slept on or worked on (CPU 8 as much again: not the referee's); ``loads`` is popped once per :data:`SAMPLE_S`
    slept. The gates it makes run on CPUs 0-7."""

    CPUS = range(8)

    def __init__(self, folder: Path, loads: list, timing_load: list):
        self.path, self.loads, self.timing_load = folder / "stat", list(loads), list(timing_load)
        self.now, self.busy_ticks, self.timings = 0.0, 0, 0
        self.write()

    def write(self) -> None:
        share = self.busy_ticks // len(self.CPUS)
        lines = [f"cpu  {2 * self.busy_ticks} 0 0 1000 0 0 0 0 0 0"]
        lines += [f"cpu{i} {share + (self.busy_ticks % 8 if i == 0 else 0)} 0 0 100 0 0 0 0 0 0" for i in self.CPUS]
        lines += [f"cpu8 0 {self.busy_ticks} 0 100 0 0 0 0 0 0"] + [
            f"cpu{i} 0 0 0 100 0 0 0 0 0 0" for i in range(9, 16)
        ]
        self.path.write_text("\n".join(lines + ["intr 0", "ctxt 0"]) + "\n")

    def advance(self, seconds: float, load: float) -> None:
        self.now += seconds
        self.busy_ticks += round(seconds * load / TICK_S)
        self.write()

    def sleep(self, seconds: float) -> None:
        self.advance(seconds, self.loads.pop(0) if self.loads else 0.0)

    def timer(self) -> dict:
        """A baseline's timing: 2 s of the clock under the next ``timing_load``."""
        self.timings += 1
        self.advance(2.0, self.timing_load.pop(0) if self.timing_load else 0.0)
        return {"median_ms": 4.4}

    def gate(self, limit_cpus, wait_s: float = 10.0, agree=bool) -> QuietHost:
        """A gate on CPUs 0-7."""
        return QuietHost(
            limit_cpus, wait_s, agree, stat=self.path, sleep=self.sleep, clock=lambda: self.now, on=set(self.CPUS)
        )


def test_a_busy_host_is_waited_for_then_the_baseline_timed(tmp_path):
    host = FakeHost(tmp_path, loads=[6.0, 6.0, 6.0, 0.2], timing_load=[0.3])
    timed, others = host.gate(2.0).time("baseline eager", host.timer)
    assert timed == {"median_ms": 4.4} and host.timings == 1
    assert others == pytest.approx(0.3, abs=0.05)
    assert host.now == pytest.approx(4 * SAMPLE_S + 2.0)  # three busy looks, one quiet, then the timing


def test_load_that_came_during_the_timing_times_it_again(tmp_path):
    host = FakeHost(tmp_path, loads=[0.0, 0.0], timing_load=[5.0, 0.1])
    timed, others = host.gate(2.0).time("baseline eager", host.timer)
    assert host.timings == 2 and others == pytest.approx(0.1, abs=0.05)


def test_a_host_busy_through_both_timings_fails(tmp_path):
    host = FakeHost(tmp_path, loads=[0.0, 0.0], timing_load=[5.0, 5.0])
    with pytest.raises(
        HostBusy,
        match=r"busy while baseline eager was timed, twice: other processes used 5\.0 of the referee.s 8 CPUs \(at most 2: grade\.timing\.quiet_cpus\)",
    ):
        host.gate(2.0).time("baseline eager", host.timer)


def test_the_wait_is_a_grades_allowance_not_each_baselines(tmp_path):
    host = FakeHost(tmp_path, loads=[3.0] * 3 + [0.0] + [3.0] * 100, timing_load=[0.0])
    gate = host.gate(2.0, wait_s=5.0)
    gate.time("baseline eager", host.timer)  # 3 s of the 5 waited
    with pytest.raises(HostBusy, match="stayed busy while baseline compile waited"):
        gate.time("baseline compile", host.timer)
    assert host.timings == 1 and host.now < 4 * SAMPLE_S + 2.0 + 2.0 + 2 * SAMPLE_S


def test_only_the_referees_cpus_count(tmp_path):
    """The fake host's CPU 8 (not the gate's) is as busy as its CPUs 0-7 together: none of it is read."""
    host = FakeHost(tmp_path, loads=[1.5], timing_load=[1.5])
    timed, others = host.gate(2.0).time("baseline eager", host.timer)
    assert host.timings == 1 and others == pytest.approx(1.5, abs=0.05)


def test_without_a_limit_nothing_waits_and_the_load_is_recorded(tmp_path):
    host = FakeHost(tmp_path, loads=[9.0] * 10, timing_load=[7.0])
    timed, others = host.gate(None).time("baseline eager", host.timer)
    assert host.timings == 1 and host.now == pytest.approx(2.0) and others == pytest.approx(7.0, abs=0.05)


def test_without_a_limit_a_short_timing_neither_waits_nor_records_a_load(tmp_path):
    """CPU grades have no gate: padding a 10 ms baseline to a look's window would cost a second per baseline and shape."""
    host = FakeHost(tmp_path, loads=[9.0] * 10, timing_load=[])
    timed, others = host.gate(None).time("baseline eager", lambda: {"median_ms": 0.01})
    assert host.now == pytest.approx(0.0) and others is None and timed == {"median_ms": 0.01}


def test_one_busy_rank_makes_every_rank_wait_and_time_again(tmp_path):
    """``agree`` stands for the ranks' all-reduce: another rank found its host busy on the first look and timing."""
    verdicts = iter([True, False, True, False, False])
    host = FakeHost(tmp_path, loads=[0.0] * 5, timing_load=[0.0, 0.0])
    seen = []
    gate = host.gate(2.0, agree=lambda busy: seen.append(busy) or next(verdicts))
    gate.time("baseline eager", host.timer)
    assert host.timings == 2 and seen == [False] * 5  # looked, looked, timed, looked, timed: this rank quiet each time


def test_a_timing_shorter_than_a_look_is_read_over_a_looks_window(tmp_path):
    """/proc/stat counts 10 ms ticks: a 2 ms timing's load is read over SAMPLE_S, or one tick would read as 5 CPUs."""
    host = FakeHost(tmp_path, loads=[0.0, 0.5], timing_load=[])
    timed, others = host.gate(2.0).time("baseline eager", lambda: {"median_ms": 0.01})
    assert host.now == pytest.approx(2 * SAMPLE_S) and others == pytest.approx(0.5, abs=0.05)


def test_an_unreadable_proc_stat_is_no_load_and_no_wait(tmp_path):
    gate = QuietHost(1.0, 10.0, stat=tmp_path / "missing", sleep=lambda s: None)
    timed, others = gate.time("baseline eager", lambda: {"median_ms": 1.0})
    assert timed == {"median_ms": 1.0} and others is None


def test_a_busy_host_ends_the_grade_as_a_node_failure_not_a_baseline_error(tmp_path):
    """The referee's side: the gate's verdict is the grade's (infra, retried), never recorded as one baseline's error
    that the grade would then score without; a quiet timing carries the load it saw."""
    from types import SimpleNamespace

    from kbsweep.grader.referee.baseline_stage import time_baselines
    from kbsweep.grader.referee.timing_stage import TimingStage
    from kbsweep.grader.shared.failures import GradeFailure
    from kbsweep.outcomes import Outcome

    stage = object.__new__(TimingStage)
    stage.time_with_timers = lambda fn, sets: {"median_ms": fn()}
    request = SimpleNamespace(spec={}, baselines=["eager"], reference=str(tmp_path / "reference.py"), compile_mode=None)
    busy = FakeHost(tmp_path, loads=[4.0] * 20, timing_load=[])
    stage.__dict__["quiet_host"] = busy.gate(2.0, wait_s=3.0)
    with pytest.raises(GradeFailure, match="stayed busy while baseline eager waited") as failure:
        time_baselines(request, lambda: 4.4, [[]], lambda: False, stage.time_quietly)
    assert failure.value.outcome == Outcome.NODE_FAILURE and Outcome.NODE_FAILURE.is_infra
    quiet = FakeHost(tmp_path, loads=[0.0, 0.4], timing_load=[])
    stage.__dict__["quiet_host"] = quiet.gate(2.0)
    timed = time_baselines(request, lambda: 4.4, [[]], lambda: False, stage.time_quietly)["eager"]
    assert timed["median_ms"] == 4.4 and timed["host_others_cpus"] == pytest.approx(0.4, abs=0.05)


@pytest.mark.parametrize(
    "device, budget_s, limit, wait_s",
    [("cuda", 2400.0, 1.0, 600.0), ("cuda", 96.0, 1.0, 48.0), ("cpu", 2400.0, None, 600.0)],
)
def test_the_referees_gate_from_its_config(device, budget_s, limit, wait_s):
    """grade.timing's quiet_cpus on GPUs only; the wait within half the baseline budget (the grade's limit is 2.5× it:
    a busy host must end the grade as a node failure before the grade times out, which would count as the model's)."""
    from types import SimpleNamespace

    import torch

    from kbsweep.grader.referee.timing_stage import TimingStage
    from kbsweep.grader.shared.timing import TimingConfig

    stage = object.__new__(TimingStage)
    stage.cfg, stage.device, stage.any_rank = TimingConfig(), torch.device(device), bool
    stage.req = SimpleNamespace(baseline_budget_s=budget_s)
    assert (stage.quiet_host.limit, stage.quiet_host.wait_left) == (limit, wait_s)
