"""Static layer: the candidate's source as an AST, every name resolved, then checked against the rules.

Names are resolved through imports and their aliases, assignments (``mm = torch.matmul``, ``self.f = ...``),
``getattr``/``importlib.import_module``/``__import__``/``sys.modules[...]``/``vars(m)[...]`` whose string is
folded from constants (concatenation, f-strings, ``join``, slicing, ``str`` methods, ``chr``, base64), and
``exec``/``eval`` of a foldable string, which is parsed and checked like the rest of the file. String
constants are also read as C++/CUDA sources (``load_inline``) for ATen and vendor-library calls.
"""
from __future__ import annotations

import ast
import base64
import codecs
import difflib
import io
import re
import tokenize
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from kbsweep.audit.kinds import finding

ALIASES = {"F": "torch.nn.functional", "nn": "torch.nn", "tl": "triton.language", "np": "numpy"}
FAMILIES = {
    "gemm": {"matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum", "linear", "tensordot", "chain_matmul",
             "__matmul__", "_scaled_mm", "_grouped_mm", "_scaled_grouped_mm", "_weight_int4pack_mm", "_int_mm", "bilinear"},
    "softmax": {"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"},
    "select": {"topk", "sort", "argsort", "kthvalue", "msort"},
    "attention": {"scaled_dot_product_attention", "_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                  "_scaled_dot_product_flash_attention_for_cpu", "multi_head_attention_forward", "multiheadattention"},
    "conv": {"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"},
}
HEAVY = set().union(*FAMILIES.values()) | {"cumsum", "cumprod", "cdist", "fft", "linalg", "embedding_bag"}
PREFIX_RULES = [
    ("frame_inspection", ["inspect.stack", "inspect.currentframe", "inspect.getouterframes", "inspect.getinnerframes",
                          "inspect.getframeinfo", "inspect.trace", "sys._getframe", "sys._current_frames", "sys.settrace",
                          "sys.setprofile", "sys.modules", "traceback.extract_stack", "traceback.walk_stack",
                          "traceback.format_stack", "traceback.print_stack", "gc.get_objects", "gc.get_referrers",
                          "gc.get_referents", "threading.settrace", "threading.setprofile"]),
    ("thread", ["threading", "_thread", "concurrent.futures", "multiprocessing", "asyncio"]),
    ("subprocess", ["subprocess", "os.system", "os.popen", "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "pty"]),
    ("network", ["socket", "urllib", "http", "requests", "httpx", "aiohttp", "ftplib", "smtplib"]),
    ("dir_listing", ["os.listdir", "os.scandir", "os.walk", "glob"]),
    ("file_access", ["open", "io.open", "builtins.open", "os.open", "os.remove", "os.unlink", "os.rename", "os.replace",
                     "os.rmdir", "os.makedirs", "os.mkdir", "os.path", "shutil", "pathlib", "tempfile", "torch.load",
                     "torch.save", "numpy.load", "numpy.save", "numpy.fromfile", "pickle", "mmap", "linecache"]),
    ("env_access", ["os.environ", "os.getenv", "os.putenv", "os.unsetenv"]),
    ("dynamic_code", ["exec", "eval", "compile", "__import__", "builtins", "importlib", "runpy", "types.FunctionType",
                      "types.CodeType", "marshal", "globals", "vars", "locals"]),
    ("native_code", ["ctypes", "cffi", "cupy", "numba", "pycuda", "cuda.bindings", "cuda.cudart", "cuda.cuda",
                     "torch.ops.load_library", "torch.cuda.jiterator", "torch.classes.load_library"]),
    ("torch_compile", ["torch.compile", "torch._dynamo", "torch._inductor", "torch.jit.script", "torch.jit.trace", "torch.export"]),
    ("side_stream", ["torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream", "torch.cuda.ExternalStream",
                     "torch.Stream", "torch.cuda.StreamContext", "torch.cuda.streams"]),
    ("cuda_graph", ["torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.make_graphed_callables", "torch.cuda.graph_pool_handle"]),
    ("rng_access", ["torch.initial_seed", "torch.seed", "torch.manual_seed", "torch.get_rng_state", "torch.set_rng_state",
                    "torch.random", "torch.default_generator", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all",
                    "torch.cuda.initial_seed", "torch.cuda.get_rng_state", "torch.cuda.set_rng_state", "torch.cuda.seed",
                    "random", "numpy.random"]),
    ("global_flag", ["torch.set_float32_matmul_precision", "torch.set_default_dtype", "torch.set_default_tensor_type",
                     "torch.use_deterministic_algorithms", "torch.set_flush_denormal", "torch._C._set_"]),
    ("reference_use", ["reference", "kbsweep", "kbsweep_reference", "kbsweep_sota", "sota"]),
    ("tensor_subclass", ["torch.Tensor._make_subclass", "torch.Tensor._make_wrapper_subclass", "torch._C.TensorBase",
                         "torch._C._TensorBase"]),
]
BUILTINS = {"open", "exec", "eval", "compile", "__import__", "globals", "vars", "locals"}
FRAME_ATTRS = {"f_back", "f_globals", "f_locals", "f_code", "f_builtins", "tb_frame", "gi_frame", "cr_frame", "co_filename"}
SUBCLASS_ATTRS = {"as_subclass", "__torch_function__", "__torch_dispatch__"}
VALUE_KEYS = {"data_ptr", "untyped_storage", "storage", "item", "tolist", "tobytes", "numpy", "sum", "mean", "amax", "amin",
              "max", "min", "norm", "std", "_version", "_cdata"}
CONTAINER_CALLS = {"dict", "list", "set", "collections.OrderedDict", "collections.defaultdict", "weakref.WeakKeyDictionary",
                   "weakref.WeakValueDictionary"}
OTHER_RUNS = re.compile(r"(^|[/\\])(outputs|sweeps|mlruns|mlartifacts)([/\\]|$)|\b(result|grade|audit)\.json\b|transcript\.jsonl|\.\./")
L2 = re.compile(r"persist\w*l2|l2\w*persist|accesspolicywindow|access_policy_window|streamsetattribute|devicesetlimit|hitprop|missprop", re.I)
NATIVE = re.compile(r"#include|__global__|\bat::|\btorch::|cublas|cudnn")
LICENSE = re.compile(r"copyright|spdx-license|licensed under|all rights reserved", re.I)
CPP_OPS = re.compile(r"\b(?:at|torch)::(?:native::)?(\w+)\s*\(")
CPP_LIBRARIES = re.compile(r"\b(cublas\w*|cudnn\w*|cutlass)\b")
CUDA_KERNELS = re.compile(r"__global__\s+void\s+(\w+)")
MAX_DEPTH = 20


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


def fold_callable(name: Optional[str]) -> Optional[Any]:
    return {"base64.b64decode": base64.b64decode, "codecs.decode": codecs.decode, "bytes.fromhex": bytes.fromhex, "chr": chr, "str": str}.get(name or "")


class Analyzer:
    """One pass of bindings, then rules over every reference site of the module."""

    def __init__(self, tree: ast.Module, forbidden: Forbidden, precision: Optional[str], depth: int = 0,
                 bindings: Optional[Dict[str, str]] = None, strings: Optional[Dict[str, str]] = None, local_modules: Set[str] = frozenset(),
                 compute_rules: bool = True):
        self.tree, self.forbidden, self.precision, self.depth = tree, forbidden, precision, depth
        self.compute_rules = compute_rules
        self.local_modules = set(local_modules)
        self.bindings: Dict[str, str] = dict(bindings or {})
        self.strings: Dict[str, str] = dict(strings or {})
        self.roots: Set[str] = {v.split(".")[0] for v in self.bindings.values()}
        self.parents: Dict[ast.AST, ast.AST] = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        self.findings: List[Dict[str, Any]] = []
        self.bind()
        self.local_names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | {
            n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
            a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
        self.kernels = {n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and self.is_kernel(n)}

    # -- resolution -------------------------------------------------------------------
    def bind(self) -> None:
        for _ in range(3):  # to a fixpoint for chains of assignments in any order
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        self.bind_name(alias.asname or alias.name.split(".")[0], alias.name if alias.asname else alias.name.split(".")[0])
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    for alias in node.names:
                        self.bind_name(alias.asname or alias.name, f"{base}.{alias.name}" if base else alias.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        for t, v in self.pairs(target, node.value):
                            self.bind_value(t, v)

    @staticmethod
    def pairs(target: ast.AST, value: ast.AST) -> Iterator[Tuple[ast.AST, ast.AST]]:
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                yield t, v
        else:
            yield target, value

    def bind_name(self, name: str, value: str) -> None:
        self.bindings[name] = value
        self.roots.add(value.split(".")[0])

    def bind_value(self, target: ast.AST, value: ast.AST) -> None:
        key = self.raw(target)
        if key is None:
            return
        text = self.fold(value)
        if text is not None:
            self.strings[key] = text
            return
        resolved = self.resolve(value)
        if resolved and self.rooted(resolved):
            self.bindings[key] = resolved

    def raw(self, node: ast.AST) -> Optional[str]:
        """The dotted spelling of a Name/Attribute chain as written (``self.fn``), without resolution."""
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            base = self.raw(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def rooted(self, name: str) -> bool:
        return name.split(".")[0] in self.roots

    def resolve(self, node: ast.AST) -> Optional[str]:
        """The dotted name an expression stands for, through aliases, getattr, importlib and sys.modules."""
        if isinstance(node, ast.Name):
            return self.bindings.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            written = self.raw(node)
            if written in self.bindings:
                return self.bindings[written]
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            func = self.resolve(node.func)
            if func in ("getattr", "builtins.getattr") and len(node.args) >= 2:
                attr, base = self.fold(node.args[1]), self.resolve(node.args[0])
                return f"{base}.{attr}" if attr and base else None
            if func in ("importlib.import_module", "__import__", "builtins.__import__") and node.args:
                module = self.fold(node.args[0])
                if module:
                    self.roots.add(module.split(".")[0])
                return module
            if func in ("vars", "builtins.vars") and node.args:
                return self.resolve(node.args[0])
        if isinstance(node, ast.Subscript):
            key, base = self.fold(node.slice), self.resolve(node.value)
            if key and base == "sys.modules":
                self.roots.add(key.split(".")[0])
                return key
            if key and base and (base.endswith(".__dict__") or isinstance(node.value, ast.Call)):
                return f"{base.removesuffix('.__dict__')}.{key}"
        return None

    def fold(self, node: ast.AST, depth: int = 0) -> Optional[str]:
        """The constant string an expression evaluates to, or None."""
        if depth > MAX_DEPTH:
            return None
        sub = lambda n: self.fold(n, depth + 1)  # noqa: E731
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, ast.Name):
            return self.strings.get(node.id)
        if isinstance(node, ast.Attribute):
            return self.strings.get(self.raw(node) or "")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = sub(node.left), sub(node.right)
            return left + right if left is not None and right is not None else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and isinstance(node.right, ast.Constant):
            left = sub(node.left)
            return left * node.right.value if left is not None and isinstance(node.right.value, int) else None
        if isinstance(node, ast.JoinedStr):
            parts = [sub(v.value) if isinstance(v, ast.FormattedValue) else sub(v) for v in node.values]
            return "".join(parts) if all(p is not None for p in parts) else None
        if isinstance(node, ast.Subscript):
            text = sub(node.value)
            if text is None:
                return None
            try:
                if isinstance(node.slice, ast.Slice):
                    bounds = (node.slice.lower, node.slice.upper, node.slice.step)
                    return text[slice(*(ast.literal_eval(b) if b is not None else None for b in bounds))]
                return text[ast.literal_eval(node.slice)]
            except (ValueError, TypeError, IndexError, SyntaxError):
                return None
        if isinstance(node, ast.Call):
            return self.fold_call(node, sub)
        return None

    def fold_call(self, node: ast.Call, sub) -> Optional[str]:
        args = [sub(a) if not isinstance(a, (ast.List, ast.Tuple)) else [sub(e) for e in a.elts] for a in node.args]
        if isinstance(node.func, ast.Attribute):
            base = sub(node.func.value)
            inner = node.func.value
            if base is None and isinstance(inner, ast.Call):  # bytes-returning helpers: b64decode(...).decode()
                raw = self.fold_bytes(inner, sub)
                return raw.decode(errors="replace") if raw is not None and node.func.attr == "decode" else None
            method = getattr(str, node.func.attr, None) if base is not None else None
            if method is None or node.func.attr not in ("join", "replace", "lower", "upper", "strip", "lstrip", "rstrip", "format", "title", "swapcase"):
                return None
            if any(a is None or (isinstance(a, list) and None in a) for a in args):
                return None
            result = method(base, *args)
            return result if isinstance(result, str) else None
        function = fold_callable(self.resolve(node.func))
        if function in (chr, str) and len(node.args) == 1:
            value = ast.literal_eval(node.args[0]) if isinstance(node.args[0], ast.Constant) else args[0]
            return function(value) if value is not None else None
        if function is codecs.decode and len(args) == 2 and None not in args:
            return codecs.decode(args[0], args[1])
        return None

    def fold_bytes(self, node: ast.Call, sub) -> Optional[bytes]:
        function = fold_callable(self.resolve(node.func))
        text = sub(node.args[0]) if node.args else None
        if text is None or function not in (base64.b64decode, bytes.fromhex):
            return None
        try:
            return function(text)
        except ValueError:
            return None

    # -- context ----------------------------------------------------------------------
    def is_kernel(self, node: ast.FunctionDef) -> bool:
        for decorator in node.decorator_list:
            name = self.resolve(decorator.func if isinstance(decorator, ast.Call) else decorator) or ""
            if name.startswith("triton."):
                return True
        return False

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def in_kernel(self, node: ast.AST) -> bool:
        return any(a in self.kernels for a in self.ancestors(node))

    def params(self, node: ast.AST) -> Set[str]:
        for a in self.ancestors(node):
            if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return {p.arg for p in a.args.args + a.args.kwonlyargs} - {"self"}
        return set()

    def add(self, kind: str, node: ast.AST, detail: str) -> None:
        self.findings.append(finding(kind, "static", detail, line=getattr(node, "lineno", None)))

    # -- rules ------------------------------------------------------------------------
    def sites(self) -> Iterator[Tuple[ast.AST, str, bool]]:
        """(node, resolved name, is a method on a value) for every outermost reference in the module."""
        for node in ast.walk(self.tree):
            parent = self.parents.get(node)
            outer = not (isinstance(parent, ast.Attribute) and parent.value is node)
            if isinstance(node, ast.Name) and outer and isinstance(node.ctx, ast.Load):
                yield node, self.resolve(node), False
            elif isinstance(node, ast.Attribute) and outer:
                name = self.resolve(node)
                if name and self.rooted(name):
                    yield node, name, False
                else:
                    yield node, f".{node.attr}", True
            elif isinstance(node, (ast.Call, ast.Subscript)):
                name = self.resolve(node)
                if name and self.rooted(name):
                    yield node, name, False
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                yield node, "torch.matmul", False
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield node, alias.name, False
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    yield node, f"{node.module}.{alias.name}", False

    def check_sites(self) -> None:
        for node, name, method in self.sites():
            if not name:
                continue
            kernel = self.in_kernel(node)
            hit = None if self.own(name, method) else self.forbidden.name(name, method, kernel)
            if hit:
                self.add("forbidden_name", node, f"{name.lstrip('.')} (forbidden: {hit})")
            parts = name.lstrip(".").split(".")
            if parts[-1] in FRAME_ATTRS:
                self.add("frame_inspection", node, name.lstrip("."))
            if parts[-1] in SUBCLASS_ATTRS:
                self.add("tensor_subclass", node, name.lstrip("."))
            if L2.search(name):
                self.add("l2_persistence", node, name.lstrip("."))
            if self.compute_rules and not kernel and (method or name.startswith("torch.")) and op_token(name) in HEAVY:
                if not hit:
                    self.add("torch_compute", node, name.lstrip("."))
                if any(isinstance(a, ast.ExceptHandler) for a in self.ancestors(node)):
                    self.add("fallback", node, f"{name.lstrip('.')} in an except handler")
            if method or not (self.rooted(name) or (isinstance(node, ast.Name) and name in BUILTINS - self.local_names)):
                continue
            for kind, prefixes in PREFIX_RULES:
                if any(prefix_match(name, p) for p in prefixes) and not (kind == "env_access" and self.triton_env(node)):
                    self.add(kind, node, name)
                    break

    def own(self, name: str, method: bool) -> bool:
        """A name the candidate defined itself (a local, or from its own helper modules): its spelling is free."""
        return not method and (not self.rooted(name) or name.split(".")[0] in self.local_modules)

    def triton_env(self, node: ast.AST) -> bool:
        """``os.environ.get("TRITON_...")``-style reads (the interpreter switch) are not findings."""
        parent = self.parents.get(node)
        key = None
        if isinstance(parent, ast.Call) and parent.func is node and parent.args:
            key = self.fold(parent.args[0])
        elif isinstance(parent, ast.Subscript) and parent.value is node:
            key = self.fold(parent.slice)
        return bool(key) and key.startswith("TRITON_")

    def check_stores(self) -> None:
        """Assignments into other modules and classes: timers, comparisons, flags."""
        for node in ast.walk(self.tree):
            targets: List[ast.AST] = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = getattr(node, "targets", None) or [node.target]
            elif isinstance(node, ast.Call) and self.resolve(node.func) in ("setattr", "builtins.setattr", "object.__setattr__") and len(node.args) >= 2:
                base, attr = self.resolve(node.args[0]), self.fold(node.args[1])
                if base and self.rooted(base):
                    self.store(node, f"{base}.{attr or '<computed>'}")
                continue
            for target in targets:
                if isinstance(target, (ast.Attribute, ast.Subscript)):
                    name = self.resolve(target.value if isinstance(target, ast.Subscript) else target)
                    if name and self.rooted(name):
                        self.store(node, name)

    def store(self, node: ast.AST, name: str) -> None:
        if name.startswith("torch.backends."):
            self.add("global_flag", node, f"{name} assigned")
        elif name.startswith(("torch._dynamo", "torch._inductor")):
            self.add("torch_compile", node, f"{name} assigned")
        else:
            self.add("grader_patch", node, f"{name} assigned")

    def check_classes(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    name = self.resolve(base) or ""
                    if name in ("torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase"):
                        self.add("tensor_subclass", node, f"class {node.name}({name})")
            elif isinstance(node, ast.FunctionDef) and node.name in ("__torch_function__", "__torch_dispatch__"):
                self.add("tensor_subclass", node, f"defines {node.name}")

    def containers(self) -> Set[str]:
        """Names and attributes bound to dict/list/set values anywhere (candidate caches)."""
        found = set()
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                value = node.value
                container = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp)) or (
                    isinstance(value, ast.Call) and self.resolve(value.func) in CONTAINER_CALLS
                )
                if container:
                    for target in getattr(node, "targets", None) or [node.target]:
                        found.add(self.raw(target))
        return found - {None}

    def keyed_on_values(self, key: ast.AST, depth: int = 0) -> bool:
        """A key built from pointers, identities, versions or tensor values, or an input tensor itself
        (through the local assignments of a key variable)."""
        if isinstance(key, ast.Name) and key.id in self.params(key):
            return True
        if isinstance(key, ast.Name) and depth < 3:
            scope = next((a for a in self.ancestors(key) if isinstance(a, ast.FunctionDef)), self.tree)
            values = [n.value for n in ast.walk(scope) if isinstance(n, ast.Assign) and any(self.raw(t) == key.id for t in n.targets)]
            return any(self.keyed_on_values(v, depth + 1) for v in values)
        for n in ast.walk(key):
            if isinstance(n, ast.Attribute) and n.attr in VALUE_KEYS:
                return True
            if isinstance(n, ast.Call) and self.resolve(n.func) in ("id", "hash", "builtins.id", "builtins.hash"):
                return True
        return False

    def called_on_values(self, function: str) -> bool:
        """Whether ``function`` is called with an argument that carries a call's values (a parameter, or a local
        made from one through a value key): a cache of configurations keyed on sizes is not an output cache."""
        return any(
            isinstance(n, ast.Call) and self.raw(n.func) == function and any(self.keyed_on_values(a) for a in n.args)
            for n in ast.walk(self.tree)
        )

    def check_caches(self) -> None:
        stores = self.containers()
        for node in ast.walk(self.tree):
            if self.in_kernel(node):
                continue
            key = None
            if isinstance(node, ast.Subscript) and self.raw(node.value) in stores:
                key = node.slice
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)) and self.raw(node.comparators[0]) in stores:
                key = node.left
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "setdefault", "pop") \
                    and self.raw(node.func.value) in stores and node.args:
                key = node.args[0]
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.Is, ast.IsNot)):
                sides = [node.left, node.comparators[0]]
                if not any(isinstance(s, ast.Constant) for s in sides) and any(isinstance(s, ast.Name) and s.id in self.params(node) for s in sides):
                    self.add("output_cache", node, f"identity test: {ast.unparse(node)[:120]}")
                continue
            elif isinstance(node, ast.FunctionDef):
                for decorator in node.decorator_list:
                    name = self.resolve(decorator.func if isinstance(decorator, ast.Call) else decorator) or ""
                    if name in ("functools.lru_cache", "functools.cache") and self.called_on_values(node.name):
                        self.add("output_cache", node, f"{name} on {node.name}, called with a value the call was given")
            if key is not None and self.keyed_on_values(key):
                self.add("output_cache", node, f"cache keyed on {ast.unparse(key)[:120]}")

    def check_counters(self) -> None:
        """``self.n += 1`` (or a global) in a method, and a comparison that reads it."""
        counters = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
                name = self.raw(node.target)
                declared = any(isinstance(a, ast.FunctionDef) and any(isinstance(g, ast.Global) and name in g.names for g in ast.walk(a))
                               for a in self.ancestors(node))
                if name and (name.startswith("self.") or declared):
                    counters.add(name)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Compare) and any(self.raw(n) in counters for n in ast.walk(node)):
                self.add("call_counter", node, ast.unparse(node)[:120])

    def check_precision(self) -> None:
        """Dot operands cast away from the problem's precision (fp8 upcast, fp32 downcast or TF32)."""
        wanted = precision_class(self.precision)
        if wanted is None:
            return
        bad = {"fp8": {"half", "fp32"}, "fp32": {"half", "fp8"}, "bf16": {"fp8"}}[wanted]
        for kernel in self.kernels:
            casts: Dict[str, List[ast.AST]] = {}
            for node in ast.walk(kernel):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        for t, v in self.pairs(target, node.value):
                            if isinstance(t, ast.Name):
                                casts.setdefault(t.id, []).append(v)
            for node in ast.walk(kernel):
                if isinstance(node, ast.Call) and self.resolve(node.func) == "triton.language.dot":
                    for operand in node.args[:2]:
                        for dtype in self.cast_classes(operand, casts, 0) & bad:
                            self.add("precision", node, f"tl.dot operand cast to {dtype} in a {wanted} problem")
                    if wanted == "fp32":
                        options = {k.arg: k.value for k in node.keywords}
                        precision = options.get("input_precision")
                        if not (isinstance(precision, ast.Constant) and precision.value == "ieee"):
                            self.add("precision", node, "tl.dot on fp32 without input_precision='ieee' (TF32)")
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not self.in_kernel(node) and self.of_input(node.func.value):
                classes = {"half": {"half"}, "bfloat16": {"half"}}.get(node.func.attr, set())
                if node.func.attr in ("to", "type") and node.args:
                    classes = {dtype_class(self.resolve(node.args[0]) or "")}
                for dtype in classes & (bad - {"fp32"}):
                    self.add("precision", node, f"tensor cast to {dtype} in a {wanted} problem")

    def of_input(self, node: ast.AST) -> bool:
        """An expression rooted at an input (a parameter) or a weight (``self.x``), through method chains."""
        while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                return True
            node = node.func if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and node.id in self.params(node)

    def cast_classes(self, node: ast.AST, casts: Dict[str, List[ast.AST]], depth: int) -> Set[str]:
        if depth > 4:
            return set()
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to" and node.args:
            return {dtype_class(self.resolve(node.args[0]) or "")}
        if isinstance(node, ast.Call) and self.resolve(node.func) == "triton.language.cast" and len(node.args) > 1:
            return {dtype_class(self.resolve(node.args[1]) or "")}
        if isinstance(node, ast.Name):
            return set().union(*(self.cast_classes(v, casts, depth + 1) for v in casts.get(node.id, [])), set())
        return set()

    def check_strings(self) -> None:
        """String constants: other runs' paths, L2 persistence, C++/CUDA sources, exec'd code."""
        file_use = any(f["kind"] in ("file_access", "dir_listing") for f in self.findings)
        docstrings = {id(n.body[0].value) for n in ast.walk(self.tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(self.tree):
            if id(node) in docstrings or not isinstance(node, (ast.Constant, ast.JoinedStr, ast.BinOp, ast.Call)):
                continue
            text = self.fold(node)
            if not text or (not isinstance(node, ast.Constant) and isinstance(self.parents.get(node), (ast.BinOp, ast.JoinedStr))):
                continue
            if OTHER_RUNS.search(text) or (file_use and "solution.py" in text):
                self.add("other_runs", node, repr(text[:120]))
            if L2.search(text):
                self.add("l2_persistence", node, repr(text[:120]))
            if NATIVE.search(text):
                self.check_native(node, text)

    def check_native(self, node: ast.AST, text: str) -> None:
        for op in CPP_OPS.findall(text):
            hit = self.forbidden.op(op)
            if hit:
                self.add("forbidden_name", node, f"ATen {op} in C++ source (forbidden: {hit})")
            elif op.lower() in HEAVY:
                self.add("library_call", node, f"ATen {op} in C++ source")
        for library in set(CPP_LIBRARIES.findall(text)):
            if library.startswith("cublas") and "gemm" in self.forbidden.families:
                self.add("forbidden_name", node, f"{library} in C++ source (GEMM family forbidden)")
            else:
                self.add("library_call", node, f"{library} in C++ source")

    def check_exec(self) -> None:
        """Code handed to exec/eval as a foldable string is checked like the file (bindings carried over)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and self.resolve(node.func) in ("exec", "eval", "builtins.exec", "builtins.eval") and node.args:
                code = self.fold(node.args[0])
                if code is None or self.depth >= 3:
                    continue
                try:
                    inner = ast.parse(code, mode="exec")
                except SyntaxError:
                    continue
                sub = Analyzer(inner, self.forbidden, self.precision, self.depth + 1, self.bindings, self.strings, self.local_modules,
                               self.compute_rules)
                for f in sub.run():
                    self.findings.append({**f, "line": node.lineno, "detail": f"in exec'd code: {f['detail']}"})

    def run(self) -> List[Dict[str, Any]]:
        self.check_sites()
        self.check_stores()
        self.check_classes()
        self.check_caches()
        self.check_counters()
        self.check_precision()
        self.check_strings()
        self.check_exec()
        return self.findings


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


def license_lines(source: str) -> List[Tuple[int, str]]:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    return [(t.start[0], t.string.strip()[:120]) for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING) and LICENSE.search(t.string)]


def forward_of(tree: ast.Module, cls: str) -> Optional[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    body = item.body[1:] if item.body and isinstance(item.body[0], ast.Expr) and isinstance(item.body[0].value, ast.Constant) else item.body
                    return "\n".join(ast.unparse(s) for s in body)
    return None


def kernel_names(source: str) -> List[str]:
    """The candidate's own kernels: Triton functions and ``__global__`` functions of its CUDA sources."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    analyzer = Analyzer(tree, Forbidden([]), None)
    names = {k.name for k in analyzer.kernels}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.update(CUDA_KERNELS.findall(node.value))
    return sorted(names)


def analyze(source: str, forbidden: List[str], precision: Optional[str] = None, reference: Optional[str] = None,
            local_modules: Set[str] = frozenset(), compute_rules: bool = True) -> List[Dict[str, Any]]:
    """Static findings for one candidate file (``reference``: the problem's reference source, for copies;
    ``local_modules``: the candidate's own helper modules, whose names are its own; ``compute_rules``: torch
    compute is a finding, as it is where the problem scores the candidate's own kernels)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [finding("syntax_error", "static", str(exc), line=exc.lineno)]
    findings = Analyzer(tree, Forbidden(forbidden), precision, local_modules=local_modules, compute_rules=compute_rules).run()
    findings += [finding("license_header", "static", text, line=line) for line, text in license_lines(source)]
    if reference:
        mine, theirs = forward_of(tree, "ModelNew"), forward_of(ast.parse(reference), "Model")
        if mine and theirs and difflib.SequenceMatcher(None, mine, theirs).ratio() >= 0.9:
            findings.append(finding("reference_copy", "static", "ModelNew.forward matches the reference's forward"))
    return findings
