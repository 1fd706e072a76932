"""The static layer's tables: the op families, problem.yaml's forbidden entries (:class:`Forbidden`), and the names,
attributes and source patterns each rule of :mod:`kbsweep.audit.static` flags."""

from __future__ import annotations

import re
from typing import List, Optional, Set

ALIASES = {"F": "torch.nn.functional", "nn": "torch.nn", "tl": "triton.language", "np": "numpy"}


FAMILIES = {
    "gemm": {
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "addbmm",
        "einsum",
        "linear",
        "tensordot",
        "chain_matmul",
        "__matmul__",
        "_scaled_mm",
        "_grouped_mm",
        "_scaled_grouped_mm",
        "_weight_int4pack_mm",
        "_int_mm",
        "bilinear",
    },
    "softmax": {"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"},
    "select": {"topk", "sort", "argsort", "kthvalue", "msort"},
    "attention": {
        "scaled_dot_product_attention",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "multi_head_attention_forward",
        "multiheadattention",
    },
    "conv": {
        "conv1d",
        "conv2d",
        "conv3d",
        "convolution",
        "_convolution",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
    },
}


HEAVY = set().union(*FAMILIES.values()) | {"cumsum", "cumprod", "cdist", "fft", "linalg", "embedding_bag"}


PREFIX_RULES = [
    (
        "frame_inspection",
        [
            "inspect.stack",
            "inspect.currentframe",
            "inspect.getouterframes",
            "inspect.getinnerframes",
            "inspect.getframeinfo",
            "inspect.trace",
            "sys._getframe",
            "sys._current_frames",
            "sys.settrace",
            "sys.setprofile",
            "sys.modules",
            "traceback.extract_stack",
            "traceback.walk_stack",
            "traceback.format_stack",
            "traceback.print_stack",
            "gc.get_objects",
            "gc.get_referrers",
            "gc.get_referents",
            "threading.settrace",
            "threading.setprofile",
        ],
    ),
    ("thread", ["threading", "_thread", "concurrent.futures", "multiprocessing", "asyncio"]),
    (
        "subprocess",
        [
            "subprocess",
            "os.system",
            "os.popen",
            "os.fork",
            "os.forkpty",
            "os.exec",
            "os.spawn",
            "os.posix_spawn",
            "pty",
        ],
    ),
    ("network", ["socket", "urllib", "http", "requests", "httpx", "aiohttp", "ftplib", "smtplib"]),
    ("dir_listing", ["os.listdir", "os.scandir", "os.walk", "glob"]),
    (
        "file_access",
        [
            "open",
            "io.open",
            "builtins.open",
            "os.open",
            "os.remove",
            "os.unlink",
            "os.rename",
            "os.replace",
            "os.rmdir",
            "os.makedirs",
            "os.mkdir",
            "os.path",
            "shutil",
            "pathlib",
            "tempfile",
            "torch.load",
            "torch.save",
            "numpy.load",
            "numpy.save",
            "numpy.fromfile",
            "pickle",
            "mmap",
            "linecache",
        ],
    ),
    ("env_access", ["os.environ", "os.getenv", "os.putenv", "os.unsetenv"]),
    (
        "dynamic_code",
        [
            "exec",
            "eval",
            "compile",
            "__import__",
            "builtins",
            "importlib",
            "runpy",
            "types.FunctionType",
            "types.CodeType",
            "marshal",
            "globals",
            "vars",
            "locals",
        ],
    ),
    (
        "native_code",
        [
            "ctypes",
            "cffi",
            "cupy",
            "numba",
            "pycuda",
            "cuda.bindings",
            "cuda.cudart",
            "cuda.cuda",
            "torch.ops.load_library",
            "torch.cuda.jiterator",
            "torch.classes.load_library",
        ],
    ),
    (
        "torch_compile",
        ["torch.compile", "torch._dynamo", "torch._inductor", "torch.jit.script", "torch.jit.trace", "torch.export"],
    ),
    (
        "side_stream",
        [
            "torch.cuda.Stream",
            "torch.cuda.stream",
            "torch.cuda.set_stream",
            "torch.cuda.ExternalStream",
            "torch.Stream",
            "torch.cuda.StreamContext",
            "torch.cuda.streams",
        ],
    ),
    (
        "cuda_graph",
        [
            "torch.cuda.CUDAGraph",
            "torch.cuda.graph",
            "torch.cuda.make_graphed_callables",
            "torch.cuda.graph_pool_handle",
        ],
    ),
    (
        "rng_access",
        [
            "torch.initial_seed",
            "torch.seed",
            "torch.manual_seed",
            "torch.get_rng_state",
            "torch.set_rng_state",
            "torch.random",
            "torch.default_generator",
            "torch.cuda.manual_seed",
            "torch.cuda.manual_seed_all",
            "torch.cuda.initial_seed",
            "torch.cuda.get_rng_state",
            "torch.cuda.set_rng_state",
            "torch.cuda.seed",
            "random",
            "numpy.random",
        ],
    ),
    (
        "global_flag",
        [
            "torch.set_float32_matmul_precision",
            "torch.set_default_dtype",
            "torch.set_default_tensor_type",
            "torch.use_deterministic_algorithms",
            "torch.set_flush_denormal",
            "torch._C._set_",
        ],
    ),
    ("reference_use", ["reference", "kbsweep", "kbsweep_reference", "kbsweep_sota", "sota"]),
    (
        "tensor_subclass",
        [
            "torch.Tensor._make_subclass",
            "torch.Tensor._make_wrapper_subclass",
            "torch._C.TensorBase",
            "torch._C._TensorBase",
        ],
    ),
]


BUILTINS = {"open", "exec", "eval", "compile", "__import__", "globals", "vars", "locals"}


# threading's locks run nothing elsewhere (a lock around a lazy init); the module's other names stay the thread rule's
LOCKS = {
    "threading",
    "threading.Lock",
    "threading.RLock",
    "threading.Condition",
    "threading.Semaphore",
    "threading.BoundedSemaphore",
}


OP_DEFINITIONS = {
    "torch.library.custom_op",
    "torch.library.triton_op",
    "torch.library.define",
}  # given "namespace::op" first


# a pointer reduced to its alignment (``x.data_ptr() % 16``, ``& 15``): at most this many values, never an identity
MAX_ALIGNMENT = 256


ATTR_CALLS = {  # callables that fetch, set or delete the attribute one argument names: (target's position, name's position, stores)
    "getattr": (0, 1, False),
    "hasattr": (0, 1, False),
    "setattr": (0, 1, True),
    "delattr": (0, 1, True),
    "inspect.getattr_static": (0, 1, False),
    "unittest.mock.patch.object": (0, 1, True),
}


ATTR_DUNDERS = {  # method -> (its arguments when bound to its target: one more is the unbound form, target first; stores)
    "__getattribute__": (1, False),
    "__getattr__": (1, False),
    "__setattr__": (2, True),
    "__delattr__": (1, True),
}


NAMESPACE_METHODS = {  # methods of an attribute dict (m.__dict__, vars(m)), and operator's, whose key names an attribute: stores
    "get": False,
    "__getitem__": False,
    "getitem": False,
    "__setitem__": True,
    "setitem": True,
    "__delitem__": True,
    "delitem": True,
    "setdefault": True,
    "pop": True,
    "update": True,
}


PATH_CALLS = {
    "importlib.import_module",
    "__import__",
    "pkgutil.resolve_name",
    "pydoc.locate",
    "unittest.mock.patch",
    "operator.attrgetter",
    "operator.methodcaller",
}  # callables given a dotted path as a string


FRAME_ATTRS = {
    "f_back",
    "f_globals",
    "f_locals",
    "f_code",
    "f_builtins",
    "tb_frame",
    "gi_frame",
    "cr_frame",
    "co_filename",
}


SUBCLASS_ATTRS = {"as_subclass", "__torch_function__", "__torch_dispatch__"}


VALUE_KEYS = {
    "data_ptr",
    "untyped_storage",
    "storage",
    "item",
    "tolist",
    "tobytes",
    "numpy",
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "norm",
    "std",
    "_version",
    "_cdata",
}


CONTAINER_CALLS = {
    "dict",
    "list",
    "set",
    "collections.OrderedDict",
    "collections.defaultdict",
    "weakref.WeakKeyDictionary",
    "weakref.WeakValueDictionary",
}


OTHER_RUNS = re.compile(
    r"(^|[/\\])(outputs|sweeps|mlruns|mlartifacts)([/\\]|$)|\b(result|grade|audit)\.json\b|transcript\.jsonl|\.\./"
)


NATIVE = re.compile(r"#include|__global__|\bat::|\btorch::|cublas|cudnn")


LICENSE = re.compile(r"copyright|spdx-license|licensed under|all rights reserved", re.I)


CPP_OPS = re.compile(r"\b(?:at|torch)::(?:native::)?(\w+)\s*\(")


CPP_LIBRARIES = re.compile(r"\b(cublas\w*|cudnn\w*|cutlass)\b")


CUDA_KERNELS = re.compile(r"__global__\s+void\s+(\w+)")


def prefix_match(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".") or (prefix.endswith("_") and name.startswith(prefix))


def expand_alias(name: str) -> str:
    head, _, rest = name.partition(".")
    return f"{ALIASES[head]}.{rest}" if rest and head in ALIASES else name


class Forbidden:
    """problem.yaml's forbidden entries, in their four spellings, plus the op families they name.

    ``from x``/``import x``: module x; ``.op(``: any name ending in op (methods, triton.language too);
    ``a.b`` (aliases such as ``F.`` expanded): that name; a bare word: any name with that component. An entry
    naming one op of a family (GEMM, softmax, selection, attention, conv) forbids the family's torch spellings.
    """

    def __init__(self, entries: List[str]):
        self.modules: Set[str] = set()
        self.methods: Set[str] = set()
        self.dotted: Set[str] = set()
        self.bare: Set[str] = set()
        self.families: Set[str] = set()
        for entry in entries:
            text = entry.strip()
            if text.startswith(("from ", "import ")):
                self.modules.add(text.split(None, 1)[1].strip())
                continue
            token = text.strip(".(").rsplit(".", 1)[-1]
            if text.startswith("."):
                self.methods.add(token)
            elif "." in text:
                self.dotted.add(expand_alias(text.rstrip("(")))
            else:
                self.bare.add(text.rstrip("("))
            self.families |= {name for name, ops in FAMILIES.items() if token in ops}
        self.family_ops = set().union(*(FAMILIES[f] for f in self.families)) if self.families else set()
        self.tokens = self.methods | self.bare | {d.rsplit(".", 1)[-1] for d in self.dotted} | self.family_ops

    def name(self, name: str, method: bool = False, in_kernel: bool = False) -> Optional[str]:
        """The entry (or family) a resolved name falls under, or None."""
        parts = name.lstrip(".").split(".")
        for module in self.modules:
            if prefix_match(name, module):
                return f"import {module}"
        for dotted in self.dotted:
            if prefix_match(name, dotted):
                return dotted
        for word in self.bare | self.methods:
            if word in parts and (word in self.bare or parts[-1] == word):
                return word
        torch_like = method or name.startswith("torch.")
        if not in_kernel and torch_like and op_token(name) in self.family_ops:
            return f"{'/'.join(sorted(self.families))} family"
        return None

    def op(self, op: str) -> Optional[str]:
        """The entry an aten/ATen op name (``mm``, ``topk``) falls under, or None."""
        return op if op in self.tokens else None


def op_token(name: str) -> str:
    """The op a torch name calls: the last component (``torch.ops.<ns>.<op>.<overload>``: the op), lowercased."""
    parts = name.lstrip(".").split(".")
    return (parts[3] if parts[:2] == ["torch", "ops"] and len(parts) > 3 else parts[-1]).lower()


def precision_class(precision: Optional[str]) -> Optional[str]:
    text = (precision or "").lower()
    if "fp8" in text:
        return "fp8"
    if text == "fp32":
        return "fp32"
    return "bf16" if "bf16" in text or "fp16" in text else None


def dtype_class(name: str) -> str:
    last = name.rsplit(".", 1)[-1]
    if last.startswith("float8"):
        return "fp8"
    if last in ("bfloat16", "float16", "half"):
        return "half"
    return "fp32" if last in ("float32", "float") else "other"


L2 = re.compile(
    r"persist\w*l2|l2\w*persist|accesspolicywindow|access_policy_window|streamsetattribute|devicesetlimit|hitprop|missprop",
    re.I,
)
