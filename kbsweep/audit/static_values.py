"""The static layer's rules that follow values, not names: output caches (a container keyed on pointers,
identities or an input's values; an identity test on an input; ``lru_cache`` called with one), call counters
(warm-up detection) and precision casts (``tl.dot`` operands or inputs cast away from the problem's precision).
What is not a finding: a key that holds a pointer's alignment only (``x.data_ptr() % 16``), and a counter's test
for the first call that guards one-time preparation, after which every call takes the same path.

:class:`ValueRules` is a mixin of :class:`kbsweep.audit.static.Analyzer`: it uses the analyzer's name resolution
(``resolve``, ``raw``, ``pairs``, ``parents``, ``own_nodes``), its context (``ancestors``, ``params``, ``in_kernel``,
``kernels``, ``precision``) and ``add`` for its findings.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Set

from kbsweep.audit.names import Resolver
from kbsweep.audit.static_rules import CONTAINER_CALLS, MAX_ALIGNMENT, VALUE_KEYS, dtype_class, precision_class

FLIPPED = {ast.Eq: ast.Eq, ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE}
EXITS = (ast.Return, ast.Raise, ast.Break, ast.Continue, ast.Yield, ast.YieldFrom)  # a body that leaves the common path
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


class ValueRules(Resolver):
    """Output caches, call counters and precision casts (see the module's docstring)."""

    kernels: Set[ast.FunctionDef]  # the analyzer's context (kbsweep.audit.static.Analyzer), and its methods below
    precision: Optional[str]
    if TYPE_CHECKING:

        @staticmethod
        def own_nodes(scope: ast.AST) -> Iterator[ast.AST]: ...
        def ancestors(self, node: ast.AST) -> Iterator[ast.AST]: ...
        def in_kernel(self, node: ast.AST) -> bool: ...
        def params(self, node: ast.AST) -> Set[str]: ...
        def add(self, kind: str, node: ast.AST, detail: str) -> None: ...

    def containers(self) -> Set[str]:
        """Names and attributes bound to dict/list/set values anywhere (candidate caches)."""
        found: Set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                value = node.value
                container = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp)) or (
                    isinstance(value, ast.Call) and self.resolve(value.func) in CONTAINER_CALLS
                )
                if container:
                    written = [self.raw(t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
                    found.update(name for name in written if name is not None)
        return found

    def keyed_on_values(self, key: ast.AST, depth: int = 0) -> bool:
        """A key built from pointers, identities, versions or tensor values, or an input tensor itself
        (through the local assignments of a key variable)."""
        if isinstance(key, ast.Name) and key.id in self.params(key):
            return True
        if isinstance(key, ast.Name) and depth < 3:
            scope = next((a for a in self.ancestors(key) if isinstance(a, ast.FunctionDef)), self.tree)
            values = [
                n.value
                for n in ast.walk(scope)
                if isinstance(n, ast.Assign) and any(self.raw(t) == key.id for t in n.targets)
            ]
            return any(self.keyed_on_values(v, depth + 1) for v in values)
        stack = [key]
        while stack:
            n = stack.pop()
            if isinstance(n, ast.Attribute) and n.attr in VALUE_KEYS:
                return True
            if isinstance(n, ast.Call) and self.resolve(n.func) in ("id", "hash", "builtins.id", "builtins.hash"):
                return True
            if not alignment(n):
                stack.extend(ast.iter_child_nodes(n))
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
            elif (
                isinstance(node, ast.Compare)
                and isinstance(node.ops[0], (ast.In, ast.NotIn))
                and self.raw(node.comparators[0]) in stores
            ):
                key = node.left
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "setdefault", "pop")
                and self.raw(node.func.value) in stores
                and node.args
            ):
                key = node.args[0]
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.Is, ast.IsNot)):
                sides = [node.left, node.comparators[0]]
                if not any(isinstance(s, ast.Constant) for s in sides) and any(
                    isinstance(s, ast.Name) and s.id in self.params(node) for s in sides
                ):
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
        """``self.n += 1`` (or a global) in a method, and a comparison that reads it, unless it is a first-call test
        guarding one-time preparation (:meth:`first_call_guard`)."""
        counters = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
                name = self.raw(node.target)
                declared = any(
                    isinstance(a, ast.FunctionDef)
                    and any(isinstance(g, ast.Global) and name in g.names for g in ast.walk(a))
                    for a in self.ancestors(node)
                )
                if name and (name.startswith("self.") or declared):
                    counters.add(name)
        for node in ast.walk(self.tree):
            if (
                isinstance(node, ast.Compare)
                and any(self.raw(n) in counters for n in ast.walk(node))
                and not self.first_call_guard(node)
            ):
                self.add("call_counter", node, ast.unparse(node)[:120])

    def first_call_guard(self, node: ast.Compare) -> bool:
        """``if n == 1:`` (``< 2``, ``<= 1``, ``== 0``, ...) with no else, whose body falls through to the code every call
        runs, on a counter only ever set to 0 and incremented by 1: true on the first call alone, it prepares state
        once (a warm-up counter switches every later call to another path)."""
        parent = self.parents.get(node)
        if not (isinstance(parent, ast.If) and parent.test is node and not parent.orelse and len(node.ops) == 1):
            return False
        (op,), left, right = node.ops, node.left, node.comparators[0]
        if isinstance(left, ast.Constant):
            left, right, op = right, left, FLIPPED.get(type(op), ast.NotEq)()
        name, bound = self.raw(left), right.value if isinstance(right, ast.Constant) else None
        if not name or type(bound) is not int:
            return False
        first = {ast.Eq: bound in (0, 1), ast.Lt: bound <= 2, ast.LtE: bound <= 1}.get(type(op), False)
        body = [n for s in parent.body if not isinstance(s, DEFINITIONS) for n in (s, *self.own_nodes(s))]
        return first and self.counts_from_zero(name) and not any(isinstance(n, EXITS) for n in body)

    def counts_from_zero(self, name: str) -> bool:
        """Every store into ``name`` (or a class attribute of its ``self.`` name) sets 0 or adds 1."""
        attr = name.removeprefix("self.")
        for node in ast.walk(self.tree):
            if isinstance(node, ast.AugAssign) and self.raw(node.target) == name:
                if not (
                    isinstance(node.op, ast.Add) and isinstance(node.value, ast.Constant) and node.value.value == 1
                ):
                    return False
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                in_class = isinstance(self.parents.get(node), ast.ClassDef)
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if self.raw(target) == name or (in_class and self.raw(target) == attr):
                        if not (isinstance(node.value, ast.Constant) and node.value.value == 0):
                            return False
        return True

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
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and not self.in_kernel(node)
                and self.of_input(node.func.value)
            ):
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


def alignment(node: ast.AST) -> bool:
    """``p.data_ptr() % m`` or ``p.data_ptr() & (m - 1)``, m a power of two up to MAX_ALIGNMENT: a pointer's alignment."""
    if not (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, (ast.Mod, ast.BitAnd))
        and isinstance(node.right, ast.Constant)
    ):
        return False
    pointer = node.left
    if not (
        isinstance(pointer, ast.Call) and isinstance(pointer.func, ast.Attribute) and pointer.func.attr == "data_ptr"
    ):
        return False
    m = node.right.value + (1 if isinstance(node.op, ast.BitAnd) else 0) if type(node.right.value) is int else 0
    return 0 < m <= MAX_ALIGNMENT and m & (m - 1) == 0
