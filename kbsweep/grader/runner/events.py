"""What the grading worker's :class:`~kbsweep.grader.runner.runtime.Monitor` listens for: Python's audit events by the
finding kind each becomes, the toolchain folders whose own events are routine, the watched files' hashes and the
global torch flags that change the reference's numerics."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

EVENTS = {
    "open": "file_access",
    "os.listdir": "dir_listing",
    "os.scandir": "dir_listing",
    "glob.glob": "dir_listing",
    "os.remove": "file_write",
    "os.rename": "file_write",
    "os.truncate": "file_write",
    "shutil.copyfile": "file_write",
    "shutil.rmtree": "file_write",
    "subprocess.Popen": "subprocess",
    "os.system": "subprocess",
    "os.exec": "subprocess",
    "os.posix_spawn": "subprocess",
    "os.spawn": "subprocess",
    "os.fork": "subprocess",
    "os.forkpty": "subprocess",
    "socket.__new__": "network",
    "socket.connect": "network",
    "socket.getaddrinfo": "network",
    "urllib.Request": "network",
    "ctypes.dlopen": "native_code",
    "ctypes.dlsym": "native_code",
    "ctypes.call_function": "native_code",
    "sys._getframe": "frame_inspection",
    "sys._current_frames": "frame_inspection",
    "sys.settrace": "frame_inspection",
    "sys.setprofile": "frame_inspection",
    "object.__getattr__": "frame_inspection",
    "gc.get_objects": "frame_inspection",
    "gc.get_referrers": "frame_inspection",
    "gc.get_referents": "frame_inspection",
    "object.__setattr__": "class_patch",
    "object.__delattr__": "class_patch",
    "exec": "dynamic_code",
    "compile": "dynamic_code",
    "marshal.loads": "dynamic_code",
    "import": "import",
    "builtins.id": "identity",
    "os.putenv": "env_write",
    "os.unsetenv": "env_write",
}


MAX_EVENTS = 60


MACHINERY = ("dynamic_code", "identity", "frame_inspection", "class_patch")


def toolchain_dirs() -> Tuple[str, ...]:
    import torch

    from kbsweep.paths import REPO_ROOT

    dirs = [Path(torch.__file__).parent, REPO_ROOT / "kbsweep"]
    try:
        import triton

        dirs.append(Path(triton.__file__).parent)
    except ImportError:
        pass
    return tuple(str(d) + "/" for d in dirs)


def file_hashes(paths: List[Path]) -> Dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


def numeric_flags() -> List[Tuple[str, Callable[[], Any], Callable[[Any], None]]]:
    """Global torch state that changes the reference's numerics: (name, get, set)."""
    import torch

    def attribute(obj: Any, name: str):
        return (lambda: getattr(obj, name), lambda value: setattr(obj, name, value))

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return [
        ("torch.get_float32_matmul_precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        ("torch.backends.cuda.matmul.allow_tf32", *attribute(matmul, "allow_tf32")),
        (
            "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
            *attribute(matmul, "allow_fp16_reduced_precision_reduction"),
        ),
        (
            "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
            *attribute(matmul, "allow_bf16_reduced_precision_reduction"),
        ),
        ("torch.backends.cudnn.allow_tf32", *attribute(cudnn, "allow_tf32")),
        ("torch.backends.cudnn.enabled", *attribute(cudnn, "enabled")),
        ("torch.get_default_dtype", torch.get_default_dtype, torch.set_default_dtype),
        (
            "torch.are_deterministic_algorithms_enabled",
            torch.are_deterministic_algorithms_enabled,
            torch.use_deterministic_algorithms,
        ),
    ]
