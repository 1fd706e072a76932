"""What a candidate's names and strings stand for, read from its AST without running it: imports and their aliases,
assignments (``mm = torch.matmul``, ``self.f = ...``), ``getattr``/``operator.attrgetter``/``importlib.import_module``/
``__import__``/``pkgutil.resolve_name``/``sys.modules[...]``/``vars(m)[...]``, and strings folded from constants
(concatenation, f-strings, ``join``, slicing, ``str`` methods, ``chr``, base64). The static layer's rules
(:mod:`kbsweep.audit.static`) run on these names."""

from __future__ import annotations

import ast
import base64
import codecs
from typing import Any, Dict, Iterator, Optional, Set, Tuple

MAX_DEPTH = 20
IMPORTS = ("importlib.import_module", "__import__", "builtins.__import__", "pkgutil.resolve_name", "pydoc.locate")


def fold_callable(name: Optional[str]) -> Optional[Any]:
    return {
        "base64.b64decode": base64.b64decode,
        "codecs.decode": codecs.decode,
        "bytes.fromhex": bytes.fromhex,
        "chr": chr,
        "str": str,
    }.get(name or "")


class Resolver:
    """The bindings of one module (a fixpoint over its imports and assignments), and name resolution and string
    folding through them. ``bindings`` and ``strings`` carry over into code ``exec``'d from the module."""

    def __init__(
        self, tree: ast.Module, bindings: Optional[Dict[str, str]] = None, strings: Optional[Dict[str, str]] = None
    ):
        self.tree = tree
        self.bindings: Dict[str, str] = dict(bindings or {})
        self.strings: Dict[str, str] = dict(strings or {})
        self.roots: Set[str] = {v.split(".")[0] for v in self.bindings.values()}
        self.parents: Dict[ast.AST, ast.AST] = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        self.bind()

    def bind(self) -> None:
        for _ in range(3):  # to a fixpoint for chains of assignments in any order
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        self.bind_name(
                            alias.asname or alias.name.split(".")[0],
                            alias.name if alias.asname else alias.name.split(".")[0],
                        )
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
        if (
            isinstance(target, (ast.Tuple, ast.List))
            and isinstance(value, (ast.Tuple, ast.List))
            and len(target.elts) == len(value.elts)
        ):
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
                return self.attribute(node.args[0], node.args[1])
            if (
                isinstance(node.func, ast.Call)
                and self.resolve(node.func.func) == "operator.attrgetter"
                and node.func.args
                and node.args
            ):
                return self.attribute(node.args[0], node.func.args[0])  # attrgetter(name)(target)
            if func in IMPORTS and node.args:
                module = self.fold(node.args[0])
                if module:
                    module = module.replace(":", ".")  # resolve_name's "package.module:attribute"
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

    def attribute(self, target: ast.AST, name: ast.AST) -> Optional[str]:
        attr, base = self.fold(name), self.resolve(target)
        return f"{base}.{attr}" if attr and base else None

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
            texts = [p for p in parts if p is not None]
            return "".join(texts) if len(texts) == len(parts) else None
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
            if method is None or node.func.attr not in (
                "join",
                "replace",
                "lower",
                "upper",
                "strip",
                "lstrip",
                "rstrip",
                "format",
                "title",
                "swapcase",
            ):
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
