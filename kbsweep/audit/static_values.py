"""The static layer's rules that follow values, not names: output caches (a container keyed on pointers,
identities or an input's values; an identity test on an input; ``lru_cache`` called with one), call counters
(warm-up detection) and precision casts (``tl.dot`` operands or inputs cast away from the problem's precision).

:class:`ValueRules` is a mixin of :class:`kbsweep.audit.static.Analyzer`: it uses the analyzer's name resolution
(``resolve``, ``raw``, ``pairs``, ``parents``), its context (``ancestors``, ``params``, ``in_kernel``, ``kernels``,
``precision``) and ``add`` for its findings.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Set

from kbsweep.audit.static_rules import CONTAINER_CALLS, VALUE_KEYS, dtype_class, precision_class


class ValueRules:
    """Output caches, call counters and precision casts (see the module's docstring)."""

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
