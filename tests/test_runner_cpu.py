"""The referee's outside view of the runner's CPU (kbsweep.grader.referee.runner_cpu), on real processes read
through a descriptor of the host's /proc: work on the calling thread is the calling thread's; work on another
thread, a thread that exits, or a child process is the others', whatever the worker's process does to hide it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kbsweep.grader.referee.runner_cpu import RunnerCPU, finding

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs Linux /proc with schedstat")

# A child that imports and idles (the pin's busiest process), then on each line of stdin does ~0.2 s of CPU work
# where the word says (main: the calling thread; thread: a thread that keeps living; exiting: a thread that ends;
# child: a process it starts), and prints "done" when the work is over.
CHILD = r"""
import subprocess, sys, threading, time
def spin(s=0.2):
    end = time.thread_time() + s
    while time.thread_time() < end:
        pass
live, go = threading.Event(), threading.Event()
def keeper():
    while True:
        go.wait(); go.clear(); spin(); live.set()
threading.Thread(target=keeper, daemon=True).start()
spin(0.3)  # the harness's import: the busiest process of the tree
print("ready", flush=True)
for word in sys.stdin:
    word = word.strip()
    if word == "main":
        spin()
    elif word == "thread":
        go.set(); live.wait(); live.clear()
    elif word == "exiting":
        t = threading.Thread(target=spin); t.start(); t.join()
    elif word == "child":
        subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass"])
    print("done", flush=True)
"""


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    yield proc, RunnerCPU(proc_fd, proc.pid)
    os.close(proc_fd)
    proc.kill()
    proc.wait()


def window(proc, watch: RunnerCPU, word: str):
    before, t0 = watch.read(), time.perf_counter()
    proc.stdin.write(word + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"
    wall_ms = (time.perf_counter() - t0) * 1e3
    return watch.others_ms(before, watch.read()), wall_ms


def test_the_pin_is_the_busiest_process_main_thread(child):
    proc, watch = child
    watch.pin()
    assert watch.calling == (proc.pid, proc.pid)


@pytest.mark.parametrize("word", ["thread", "exiting", "child"])
def test_work_off_the_calling_thread_is_the_others_and_a_finding(child, word):
    proc, watch = child
    watch.pin()
    cpu, wall_ms = window(proc, watch, word)
    assert cpu["others_ms"] > 120, cpu  # ~200 ms of work, read to a tick or better
    assert cpu["calling_ms"] < 60, cpu
    assert finding("a batch", {}, cpu, wall_ms, "host")["kind"] == "host_thread_cpu"
    assert finding("a batch", {}, cpu, wall_ms, "back_to_back")["kind"] == "host_thread_cpu"


def test_work_on_the_calling_thread_is_no_finding(child):
    proc, watch = child
    watch.pin()
    cpu, wall_ms = window(proc, watch, "main")
    assert cpu["calling_ms"] > 150, cpu
    assert cpu["others_ms"] < 5, cpu
    assert finding("a batch", {}, cpu, wall_ms, "host") is None


def test_without_a_pin_all_work_is_the_others(child):
    proc, watch = child  # a pin that never happened must not turn the calling thread's work into no one's
    cpu, _ = window(proc, watch, "main")
    assert cpu["others_ms"] > 150, cpu
