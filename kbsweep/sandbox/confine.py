"""The sandbox: an agent's shell commands and the grading process run confined (docs/sandbox.md).

Under bubblewrap a command gets its own pid, network, ipc and uts namespaces and a fresh root holding only the
system folders and Python (read-only), the paths it is given (read-only or writable), a size-limited tmpfs /tmp
and /dev/shm, and with a GPU its device nodes and /sys. It never sees other runs, ``outputs/``, the tracking
store or the orchestrator's processes, and it starts from an explicit minimal environment. It runs without
privileges (as root, kbsweep hands it an unused uid: the kernel's process limit does not bind root), under
rlimits for processes, CPU seconds, file size and (without a GPU) address space. Its supervisor
(:class:`~kbsweep.sandbox.watch.Watch`) stops it past its wall time, its memory (proportional set sizes of the whole
tree: shared pages counted once) or its disk quota (the writable folders and the files its output goes to). Network
is off; ``network_allow`` hosts are reached through a filtering proxy (:class:`kbsweep.sandbox.net.AllowProxy`).

``mode: unsafe`` runs the same commands with the same environment and limits but no namespaces; it is never
chosen silently: where bubblewrap cannot run, :func:`require` refuses.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from kbsweep.errors import KbsweepError
from kbsweep.paths import REPO_ROOT
from kbsweep.sandbox.init import INIT, command_fd
from kbsweep.sandbox.init import NAME as INIT_NAME
from kbsweep.sandbox.net import BASH, FORWARDER, PROXY_PORT, PROXY_SOCKET, WITH_FORWARDER, AllowProxy
from kbsweep.sandbox.secret_env import secret_names
from kbsweep.sandbox.watch import Watch, head_tail, memory_cap_mib

MODES = ("bwrap", "unsafe")
WORKSPACE = "/workspace"  # where run_shell sees its workspace
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
PASS_ENV = (
    "PATH",
    "LD_LIBRARY_PATH",
    "LANG",
    "LC_ALL",
    "TZ",
    "CUDA_HOME",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "TRITON_INTERPRET",
)
ROOT_UID_BASE = 200_000  # as root, a sandbox runs as ROOT_UID_BASE + pid % ROOT_UID_SPAN (its own process count)
ROOT_UID_SPAN = 100_000


class SandboxUnavailable(KbsweepError):
    """bubblewrap cannot confine commands on this host, and ``sandbox.mode`` is not ``unsafe``."""


@dataclass(frozen=True)
class SandboxPolicy:
    """Limits of one sandboxed command. ``memory_mib`` and ``wall_s`` are run_shell's (grading has its own)."""

    mode: str = "bwrap"  # bwrap | unsafe
    network_allow: Tuple[str, ...] = ()  # "host" or "host:port", reached through the proxy
    cpu_s: int = 3600  # CPU seconds per process (all its threads)
    memory_mib: int = 16384  # memory of all the command's processes (never more than the host's)
    max_procs: int = 4096  # processes and threads at once (torch starts a thread per core)
    disk_mib: int = 4096  # the writable folders' growth, /tmp, /dev/shm, and any one file
    wall_s: float = 600.0

    @classmethod
    def of(cls, track: Mapping[str, Any]) -> "SandboxPolicy":
        """The policy of a resolved track config: its ``sandbox`` section plus the track's own ``network_allow``."""
        conf = dict(track.get("sandbox") or {})
        hosts = [*conf.pop("network_allow", ()), *(track.get("network_allow") or ())]
        return cls(**conf, network_allow=tuple(dict.fromkeys(hosts)))


@dataclass
class ShellResult:
    returncode: int
    output: str  # stdout and stderr interleaved, head and tail when long
    notes: List[str] = field(default_factory=list)  # what the sandbox stopped or refused


def is_root() -> bool:
    return os.geteuid() == 0


def sandbox_uid() -> int:
    return ROOT_UID_BASE + os.getpid() % ROOT_UID_SPAN


def python_dirs() -> List[Path]:
    """Python's installation, the virtual environment and site-packages (read-only in every sandbox)."""
    import site

    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages()}
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return [Path(d) for d in sorted(dirs) if Path(d).exists()]


def limits(policy: SandboxPolicy, gpu: bool, memory_mib: Optional[float]) -> List[str]:
    """A bash prefix setting the rlimits (soft and hard) before it execs the command."""
    caps = f"ulimit -u {policy.max_procs} -t {policy.cpu_s} -f {policy.disk_mib * 1024}"
    if memory_mib and not gpu:  # CUDA reserves far more address space than it uses: with a GPU, Watch alone
        caps += f" -v {int(memory_mib * 1024)}"
    return [BASH, "-c", f'{caps} && exec "$@"', "kbsweep-sandbox"]


def ancestors(dests: Sequence[str]) -> List[str]:
    """Folders above the mount points that no mount provides, top-down (created 0755: as root, bubblewrap copies
    the host's modes, and a 0700 /root would hide a Python installed under it)."""
    out: List[str] = []
    for dest in dests:
        for parent in reversed(Path(dest).parents[:-1]):
            p = str(parent)
            if p not in out and p not in dests and not any(p.startswith(d.rstrip("/") + "/") for d in dests):
                out.append(p)
    return out


def inside(path: Path, folders: Sequence[Path]) -> bool:
    """``path`` is one of ``folders`` or below one."""
    return any(path == folder or folder in path.parents for folder in folders)


def bwrap_argv(
    policy: SandboxPolicy,
    *,
    cwd: str,
    command_fd: int,
    writable: Sequence[Tuple[Path, str]] = (),
    readonly: Iterable[Path] = (),
    gpu: bool = False,
    extra: Sequence[str] = (),
) -> List[str]:
    """The bubblewrap command line: ``writable`` is (host path, sandbox path) pairs; ``readonly`` paths keep theirs.
    It ends in the sandbox's pid 1 (:mod:`kbsweep.sandbox.init`), which reads the command from ``command_fd``."""
    size = str(policy.disk_mib * 2**20)
    system = [
        Path(d) for d in (*SYSTEM_DIRS, "/sys" if gpu else "/sys/devices/system/cpu")
    ]  # torch reads the CPU topology
    # a read-only path inside a system folder (and no writable bind) is there already, and bound again it needs a
    # mount point that a symlink on its way (/usr/local/cuda -> /etc/alternatives/cuda) keeps bubblewrap from making
    writable_dests = [Path(dest) for _, dest in writable]
    extra_ro = [p for p in map(Path, readonly) if not inside(p, system) or inside(p, writable_dests)]
    binds = [("--ro-bind", str(p), str(p)) for p in [*system, *python_dirs(), *extra_ro] if p.exists()]
    binds += [("--bind", str(src), dest) for src, dest in writable]
    binds.sort(key=lambda b: b[2].count("/"))  # parents before children
    argv = [
        "bwrap",
        "--as-pid-1",
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    if is_root():  # no user namespace: the command drops to an unprivileged uid (setpriv: confined_popen)
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    for tmp in ("/tmp", "/dev/shm"):
        argv += ["--perms", "1777", "--size", size, "--tmpfs", tmp]
    for folder in ancestors([b[2] for b in binds]):
        argv += ["--perms", "0755", "--dir", folder]
    for flag, src, dest in binds:
        argv += [flag, src, dest]
    if gpu:
        argv += [a for node in sorted(Path("/dev").glob("nvidia*")) for a in ("--dev-bind", str(node), str(node))]
    argv += [
        *extra,
        "--remount-ro",
        "/",
        "--remount-ro",
        "/dev",
        "--chdir",
        cwd,
        "--",
    ]  # only the tmpfs and binds stay writable
    return argv + [BASH, "-c", INIT, INIT_NAME, str(command_fd)]


def confined_popen(
    command: Sequence[str],
    policy: SandboxPolicy,
    *,
    cwd: str,
    gpu: bool = False,
    memory_mib: Optional[float] = None,
    writable: Sequence[Tuple[Path, str]] = (),
    readonly: Iterable[Path] = (),
    extra: Sequence[str] = (),
    **popen: Any,
) -> subprocess.Popen:
    """Start ``command`` under bubblewrap (:func:`bwrap_argv`): the sandbox's init gets, on a descriptor, as root the
    drop to the sandbox's uid (``setpriv``: the kernel's process limit does not bind root), the rlimits, ``command``."""
    chain = [*limits(policy, gpu, memory_mib), *command]
    if is_root():
        uid = str(sandbox_uid())
        chain = [
            "setpriv",
            "--reuid",
            uid,
            "--regid",
            uid,
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            *chain,
        ]
    fd = command_fd(chain)
    try:
        argv = bwrap_argv(policy, cwd=cwd, command_fd=fd, writable=writable, readonly=readonly, gpu=gpu, extra=extra)
        return subprocess.Popen(argv, pass_fds=(*popen.pop("pass_fds", ()), fd), **popen)
    finally:
        os.close(fd)


SELF_TEST_TRIES, SELF_TEST_TIMEOUT_S = 3, 30  # a probe that hangs (a loaded host) is tried again; a failure is final


@functools.lru_cache(maxsize=None)
def self_test() -> Optional[str]:
    """None when bubblewrap confines a command here, else why not (cached per process)."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    if is_root() and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    for _ in range(SELF_TEST_TRIES - 1):
        timed_out, reason = probe(SELF_TEST_TIMEOUT_S)
        if not timed_out:
            return reason
    return probe(SELF_TEST_TIMEOUT_S)[1]


def probe(timeout_s: float) -> Tuple[bool, Optional[str]]:
    """(whether it timed out, why bubblewrap cannot confine or None) of one confined, unprivileged command."""
    try:
        proc = confined_popen(
            ["sh", "-c", 'test "$(id -u)" != 0'],
            SandboxPolicy(),
            cwd="/",
            env=minimal_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except OSError as exc:
        return False, str(exc)
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.wait()
        return True, str(exc)
    if proc.returncode != 0:
        return False, (stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    return False, None


def require(policy: SandboxPolicy, probe: bool = True) -> None:
    """Raise (one line) unless ``policy`` can be honoured here: bwrap works (``probe``: test it), or the mode is
    explicitly unsafe."""
    if policy.mode not in MODES:
        raise KbsweepError(f"sandbox.mode must be one of {', '.join(MODES)}, got '{policy.mode}'")
    reason = self_test() if probe and policy.mode == "bwrap" else None
    if reason:
        raise SandboxUnavailable(
            f"sandbox.mode=bwrap but bubblewrap cannot confine commands here ({reason}); install bubblewrap and allow "
            "user namespaces, or run with sandbox.mode=unsafe (docs/sandbox.md)"
        )


GRADING_HIDDEN = ("solutions", "problem.yaml")  # a problem's entries no grading process sees


def grading_view(problem_root: Path) -> List[Path]:
    """What a grading process sees read-only besides the system and Python: kbsweep's package and the problem's
    files (the reference, its adapter, baselines), never its ``solutions/`` nor ``problem.yaml``: the referee gets the
    spec and the shapes it grades in its request, so no process of a check or benchmark can read the held-out shapes
    (single-process and multi-rank grades alike)."""
    return [REPO_ROOT / "kbsweep", *(p for p in sorted(Path(problem_root).iterdir()) if p.name not in GRADING_HIDDEN)]


def minimal_env(hide: Iterable[str] = (), **extra: str) -> Dict[str, str]:
    """The environment of a sandboxed command: Python's bin folder first on PATH, HOME and TMPDIR in /tmp, USER
    (getpass, even for a uid without a passwd entry), a few named variables of this process (never a secret's, see
    :func:`~kbsweep.sandbox.secret_env.secret_names`)."""
    hidden = secret_names(hide)
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ and k not in hidden}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
    env.update(HOME="/tmp", TMPDIR="/tmp", USER="sandbox", LOGNAME="sandbox", LANG=env.get("LANG", "C.UTF-8"), **extra)
    return env


def give(folders: Iterable[Path], uid: int) -> None:
    """Hand writable folders to the sandbox's uid (as root); never follows a symlink the sandbox planted."""
    for folder in folders:
        os.lchown(folder, uid, uid)
        for root, dirs, files in os.walk(folder):
            for name in dirs + files:
                os.lchown(os.path.join(root, name), uid, uid)


class Sandbox:
    """Runs untrusted commands under one policy. ``gpu``: expose the GPU device nodes. Construction refuses
    (:func:`require`) when the policy cannot be honoured here."""

    def __init__(self, policy: SandboxPolicy = SandboxPolicy(), gpu: bool = False):
        require(policy)
        self.policy, self.gpu = policy, gpu

    @property
    def confined(self) -> bool:
        return self.policy.mode == "bwrap"

    def popen(
        self,
        command: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        writable: Sequence[Tuple[Path, str]] = (),
        readonly: Iterable[Path] = (),
        memory_mib: Optional[float] = None,
        extra: Sequence[str] = (),
        **popen: Any,
    ) -> subprocess.Popen:
        """Start ``command`` confined, in a session of its own, with exactly ``env``. ``writable``: (host, sandbox)
        path pairs (unsafe mode: the command sees host paths, so ``cwd`` must be one)."""
        if not self.confined:
            return subprocess.Popen(
                [*limits(self.policy, self.gpu, memory_mib), *command],
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
                **popen,
            )
        if is_root():
            give([src for src, _ in writable], sandbox_uid())
        return confined_popen(
            command,
            self.policy,
            cwd=cwd,
            gpu=self.gpu,
            memory_mib=memory_mib,
            writable=writable,
            readonly=readonly,
            extra=extra,
            env=dict(env),
            start_new_session=True,
            **popen,
        )

    def shell(self, command: str, workspace: Path, hide: Iterable[str] = (), output_limit: int = 12_000) -> ShellResult:
        """``bash -c command`` in the workspace (seen as /workspace), under the policy's limits."""
        workspace = Path(workspace).resolve()
        env = minimal_env(hide)
        argv, extra, proxy = [BASH, "-c", command], [], None
        if self.confined and self.policy.network_allow:
            proxy = AllowProxy(self.policy.network_allow)
            url = f"http://127.0.0.1:{PROXY_PORT}"
            env.update(HTTP_PROXY=url, HTTPS_PROXY=url, http_proxy=url, https_proxy=url)
            argv, extra = (
                [BASH, "-c", WITH_FORWARDER, "kbsweep-shell", FORWARDER, command],
                ["--bind", str(proxy.path), PROXY_SOCKET],
            )
        cwd = WORKSPACE if self.confined else str(workspace)
        try:
            with tempfile.TemporaryFile() as out:
                proc = self.popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    writable=[(workspace, WORKSPACE)],
                    memory_mib=self.policy.memory_mib,
                    extra=extra,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
                breach = Watch(
                    proc, self.policy.wall_s, memory_cap_mib(self.policy.memory_mib), self.policy.disk_mib, [workspace]
                ).wait()
                result = ShellResult(124 if breach else proc.returncode, head_tail(out, output_limit))
        finally:
            if proxy:
                proxy.close()
        if breach:
            result.notes.append(breach[1])
        if proxy and proxy.refused:
            result.notes.append(
                f"refused network access to {', '.join(dict.fromkeys(proxy.refused))} (not in sandbox.network_allow)"
            )
        return result
