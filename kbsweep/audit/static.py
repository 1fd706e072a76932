"""Static layer: the candidate's source as an AST, every name resolved (:mod:`kbsweep.audit.names`), then checked
against the rules (their tables: :mod:`kbsweep.audit.static_rules`; the rules that follow values, caches, counters
and precision casts: :mod:`kbsweep.audit.static_values`).

Names are resolved through imports and their aliases, assignments (``mm = torch.matmul``, ``self.f = ...``),
``getattr``/``importlib.import_module``/``__import__``/``sys.modules[...]``/``vars(m)[...]`` whose string is
folded from constants (concatenation, f-strings, ``join``, slicing, ``str`` methods, ``chr``, base64), and
``exec``/``eval`` of a foldable string, which is parsed and checked like the rest of the file. String
constants are also read as C++/CUDA sources (``load_inline``) for ATen and vendor-library calls.
"""

from __future__ import annotations

import ast
import difflib
import io
import tokenize
from dataclasses import replace
from typing import AbstractSet, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from kbsweep.audit.kinds import Finding, finding
from kbsweep.audit.names import Resolver
from kbsweep.audit.static_attrs import AttrRules
from kbsweep.audit.static_rules import (
    BUILTINS,
    CPP_LIBRARIES,
    CPP_OPS,
    CUDA_KERNELS,
    FRAME_ATTRS,
    HEAVY,
    L2,
    LICENSE,
    LOCKS,
    NATIVE,
    OP_DEFINITIONS,
    OTHER_RUNS,
    PREFIX_RULES,
    SUBCLASS_ATTRS,
    Forbidden,
    op_token,
    prefix_match,
)
from kbsweep.audit.static_values import ValueRules


class Analyzer(AttrRules, ValueRules, Resolver):
    """One pass of bindings (:class:`~kbsweep.audit.names.Resolver`), then rules over every reference site of the module."""

    def __init__(
        self,
        tree: ast.Module,
        forbidden: Forbidden,
        precision: Optional[str],
        depth: int = 0,
        bindings: Optional[Dict[str, str]] = None,
        strings: Optional[Dict[str, str]] = None,
        local_modules: AbstractSet[str] = frozenset(),
        compute_rules: bool = True,
    ):
        super().__init__(tree, bindings, strings)
        self.forbidden, self.precision, self.depth = forbidden, precision, depth
        self.compute_rules = compute_rules
        self.local_modules = set(local_modules)
        self.findings: List[Finding] = []
        self.local_names = (
            {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            | {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            | {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
        )
        self.kernels = {n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and self.is_kernel(n)}
        self.own_ops = self.defined_ops()

    # -- context ----------------------------------------------------------------------
    def is_kernel(self, node: ast.FunctionDef) -> bool:
        for decorator in node.decorator_list:
            name = self.resolve(decorator.func if isinstance(decorator, ast.Call) else decorator) or ""
            if name.startswith("triton."):
                return True
        return False

    def defined_ops(self) -> Set[str]:
        """The dispatcher ops the file defines itself (``custom_op``/``triton_op``/``define`` of "ns::op"), as
        ``torch.ops.ns.op``."""
        found = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and node.args and self.resolve(node.func) in OP_DEFINITIONS:
                namespace, _, op = (self.fold(node.args[0]) or "").partition("::")
                if namespace and op:
                    found.add(f"torch.ops.{namespace}.{op}")
        return found

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
                name = self.resolve(node)
                if name:
                    yield node, name, False
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
            self.check_site(node, name, method)

    def check_site(self, node: ast.AST, name: str, method: bool) -> None:
        """The name rules on one reference: forbidden names, frames, subclasses, L2, torch compute, the prefix rules."""
        kernel, own = self.in_kernel(node), self.own(name, method)
        hit = None if own else self.forbidden.name(name, method, kernel)
        if hit:
            self.add("forbidden_name", node, f"{name.lstrip('.')} (forbidden: {hit})")
        parts = name.lstrip(".").split(".")
        if parts[-1] in FRAME_ATTRS:
            self.add("frame_inspection", node, name.lstrip("."))
        if parts[-1] in SUBCLASS_ATTRS:
            self.add("tensor_subclass", node, name.lstrip("."))
        if L2.search(name):
            self.add("l2_persistence", node, name.lstrip("."))
        if (
            self.compute_rules
            and not kernel
            and not own
            and (method or name.startswith("torch."))
            and op_token(name) in HEAVY
        ):
            if not hit:
                self.add("torch_compute", node, name.lstrip("."))
            if any(isinstance(a, ast.ExceptHandler) for a in self.ancestors(node)):
                self.add("fallback", node, f"{name.lstrip('.')} in an except handler")
        if method or not (self.rooted(name) or (isinstance(node, ast.Name) and name in BUILTINS - self.local_names)):
            return
        for kind, prefixes in PREFIX_RULES:
            if (
                any(prefix_match(name, p) for p in prefixes)
                and not (kind == "env_access" and self.triton_env(node))
                and not (kind == "thread" and name in LOCKS)
            ):
                self.add(kind, node, name)
                break

    def own(self, name: str, method: bool) -> bool:
        """A name the candidate defined itself (a local, from its own helper modules, or a dispatcher op it defines):
        its spelling is free."""
        return not method and (
            not self.rooted(name)
            or name.split(".")[0] in self.local_modules
            or any(prefix_match(name, op) for op in self.own_ops)
        )

    def triton_env(self, node: ast.AST) -> bool:
        """``os.environ.get("TRITON_...")``-style reads (the interpreter switch) are not findings."""
        parent = self.parents.get(node)
        key = None
        if isinstance(parent, ast.Call) and parent.func is node and parent.args:
            key = self.fold(parent.args[0])
        elif isinstance(parent, ast.Subscript) and parent.value is node:
            key = self.fold(parent.slice)
        return key is not None and key.startswith("TRITON_")

    def check_stores(self) -> None:
        """Assignments into other modules and classes: timers, comparisons, flags (setattr and its kin:
        :meth:`~kbsweep.audit.static_attrs.AttrRules.check_attributes`)."""
        for node in ast.walk(self.tree):
            targets: Sequence[ast.expr] = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
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

    def check_strings(self) -> None:
        """String constants: other runs' paths, L2 persistence, C++/CUDA sources, exec'd code."""
        file_use = any(f.kind in ("file_access", "dir_listing") for f in self.findings)
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(self.tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(self.tree):
            if id(node) in docstrings or not isinstance(node, (ast.Constant, ast.JoinedStr, ast.BinOp, ast.Call)):
                continue
            text = self.fold(node)
            if not text or (
                not isinstance(node, ast.Constant) and isinstance(self.parents.get(node), (ast.BinOp, ast.JoinedStr))
            ):
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
            if (
                isinstance(node, ast.Call)
                and self.resolve(node.func) in ("exec", "eval", "builtins.exec", "builtins.eval")
                and node.args
            ):
                code = self.fold(node.args[0])
                if code is None or self.depth >= 3:
                    continue
                try:
                    inner = ast.parse(code, mode="exec")
                except SyntaxError:
                    continue
                sub = Analyzer(
                    inner,
                    self.forbidden,
                    self.precision,
                    self.depth + 1,
                    self.bindings,
                    self.strings,
                    self.local_modules,
                    self.compute_rules,
                )
                for f in sub.run():
                    self.findings.append(
                        replace(f, detail=f"in exec'd code: {f.detail}", where={**f.where, "line": node.lineno})
                    )

    def run(self) -> List[Finding]:
        self.check_sites()
        self.check_stores()
        self.check_attributes()
        self.check_classes()
        self.check_caches()
        self.check_counters()
        self.check_precision()
        self.check_strings()
        self.check_exec()
        return self.findings


def license_lines(source: str) -> List[Tuple[int, str]]:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    return [
        (t.start[0], t.string.strip()[:120])
        for t in tokens
        if t.type in (tokenize.COMMENT, tokenize.STRING) and LICENSE.search(t.string)
    ]


def forward_of(tree: ast.Module, cls: str) -> Optional[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    body = (
                        item.body[1:]
                        if item.body
                        and isinstance(item.body[0], ast.Expr)
                        and isinstance(item.body[0].value, ast.Constant)
                        else item.body
                    )
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


def analyze(
    source: str,
    forbidden: List[str],
    precision: Optional[str] = None,
    reference: Optional[str] = None,
    local_modules: AbstractSet[str] = frozenset(),
    compute_rules: bool = True,
) -> List[Finding]:
    """Static findings for one candidate file (``reference``: the problem's reference source, for copies;
    ``local_modules``: the candidate's own helper modules, whose names are its own; ``compute_rules``: torch
    compute is a finding, as it is where the problem scores the candidate's own kernels)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [finding("syntax_error", "static", str(exc), line=exc.lineno)]
    findings = Analyzer(
        tree, Forbidden(forbidden), precision, local_modules=local_modules, compute_rules=compute_rules
    ).run()
    findings += [finding("license_header", "static", text, line=line) for line, text in license_lines(source)]
    if reference:
        mine, theirs = forward_of(tree, "ModelNew"), forward_of(ast.parse(reference), "Model")
        if mine and theirs and difflib.SequenceMatcher(None, mine, theirs).ratio() >= 0.9:
            findings.append(finding("reference_copy", "static", "ModelNew.forward matches the reference's forward"))
    return findings
