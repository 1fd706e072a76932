"""The static layer's rule on attribute names chosen at run time. An attribute of a module, or of an object reached
from a module's namespace (``torch.Tensor``, ``torch.nn.functional``), fetched, set or deleted

* through a call (``getattr``/``hasattr``/``setattr``/``delattr``, the ``__getattribute__``/``__setattr__`` family
  bound or unbound, ``inspect.getattr_static``, ``mock.patch.object``),
* through its namespace dict (``m.__dict__``, ``vars(m)``: subscripts, ``get``/``__setitem__``/``update``/...),
* or named by a dotted path (``importlib.import_module``, ``pkgutil.resolve_name``, ``operator.attrgetter``, ...),

under a name that does not fold to constants is ``dynamic_code``: what it reaches cannot be read from the source.
Names that fold, to one string or to several (a loop over a constant tuple, the constant arguments of every call of
a local helper), are checked as if written out: forbidden names, torch compute, stores into torch (``grader_patch``).
A fetched name on any other object is checked as a method (``getattr(x, "topk")`` is ``x.topk``).

Which values may be modules, and which strings a name may hold, are followed through local variables (in the scope
Python binds them in), containers, conditionals and the parameters of local functions: their calls, and calls they
are handed to beside a module (``map(f, [torch])``, ``functools.partial(f, torch)``). Using ``getattr`` and its kin
as values (``reduce(getattr, ...)``, ``g = getattr``) hides both the target and the name: a finding too.

:class:`AttrRules` is a mixin of :class:`kbsweep.audit.static.Analyzer`: it uses its resolution (``resolve``, ``fold``,
``raw``, ``pairs``, ``rooted``, ``bindings``, ``parents``, ``ancestors``), ``check_site``, ``store`` and ``add``.
"""

from __future__ import annotations

import ast
import functools
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, TypeVar

from kbsweep.audit.names import Resolver
from kbsweep.audit.static_rules import ATTR_CALLS, ATTR_DUNDERS, NAMESPACE_METHODS, PATH_CALLS

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
LOOPS = (ast.For, ast.AsyncFor, ast.comprehension)
DEPTH = 8  # how many variables and parameters a value is followed through
WRAPPERS = {"tuple", "list", "set", "frozenset", "sorted", "reversed"}  # the same elements as their argument
ITEM_METHODS = {"get", "pop", "setdefault", "__getitem__"}  # methods that return an item of a container
# methods that put values into a container
MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "__setitem__"}
# What a name is bound to: ("value", expr), ("element", loop) (an element of the loop's iterable), ("opaque", expr)
# (something derived from expr: an unpacked tuple, an augmented assignment, a context manager) or ("import", node).
Site = Tuple[str, ast.AST]
Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
Definition = ast.FunctionDef | ast.AsyncFunctionDef
T = TypeVar("T")


def union(parts: List[Optional[Set[str]]]) -> Optional[Set[str]]:
    """The strings of every part, or None when one part may not fold."""
    known = [p for p in parts if p is not None]
    return set().union(*known) if len(known) == len(parts) else None


def stores_name(target: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(target))


def refers(node: ast.AST, name: Optional[str]) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


class AttrRules(Resolver):
    """Attributes reached under computed names (see the module's docstring)."""

    if TYPE_CHECKING:  # the analyzer's (kbsweep.audit.static.Analyzer)

        def ancestors(self, node: ast.AST) -> Iterator[ast.AST]: ...
        def check_site(self, node: ast.AST, name: str, method: bool) -> None: ...
        def store(self, node: ast.AST, name: str) -> None: ...
        def add(self, kind: str, node: ast.AST, detail: str) -> None: ...

    # -- where a name's value comes from ------------------------------------------------------------------------
    @staticmethod
    def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
        """The nodes of one scope, without the bodies of the functions and classes it defines."""
        stack = list(ast.iter_child_nodes(scope))
        while stack:
            node = stack.pop()
            yield node
            if not isinstance(node, FUNCTIONS + (ast.ClassDef,)):
                stack.extend(ast.iter_child_nodes(node))

    def memo(self, key: Tuple[Any, ...], compute: Callable[[], T]) -> T:
        """``compute()``, once per key for this module (scopes and calls are walked once, not per query)."""
        cache: Dict[Tuple[Any, ...], Any] = self.__dict__.setdefault("_attr_memo", {})
        if key not in cache:
            cache[key] = compute()
        return cache[key]

    def name_sites(self, node: ast.Name) -> Optional[List[Site]]:
        """What a name may be bound to in the innermost scope that binds it; None when no scope of the file does."""
        for scope in [a for a in self.ancestors(node) if isinstance(a, FUNCTIONS)] + [self.tree]:
            found = self.memo(("scope", scope, node.id), functools.partial(self.scope_sites, scope, node.id))
            if found is not None:
                return found
        return None

    def scope_sites(self, scope: ast.AST, name: str) -> Optional[List[Site]]:
        """The bindings of a name in one scope; None when the scope does not bind it."""
        nodes = self.memo(("nodes", scope), lambda: list(self.own_nodes(scope)))
        if scope is not self.tree and any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in nodes):
            return None
        if scope is self.tree:  # functions declaring it global assign the module's name
            declared = self.memo(
                ("global",),
                lambda: [
                    (g, f)
                    for f in ast.walk(self.tree)
                    if isinstance(f, FUNCTIONS[:2])
                    for g in self.own_nodes(f)
                    if isinstance(g, ast.Global)
                ],
            )
            nodes = nodes + [n for g, f in declared if name in g.names for n in self.own_nodes(f)]
        found = [site for n in nodes for site in self.binds(n, name)]
        params = self.param_sites(scope, name) if isinstance(scope, FUNCTIONS) else None
        return found + (params or []) if found or params is not None else None

    def binds(self, node: ast.AST, name: str) -> List[Site]:
        """The sites one node gives a name; an item stored into it or a mutating method called on it (``mods[0] = m``,
        ``mods.append(m)``) binds it to something derived from its argument."""
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            found = []
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for t, v in self.pairs(target, node.value):
                    if stores_name(t, name):
                        found.append(("value" if isinstance(t, ast.Name) else "opaque", v))
                    elif isinstance(t, ast.Subscript) and refers(t.value, name) and isinstance(t.value, ast.Name):
                        found.append(("opaque", v))
            return found
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == name
        ):
            return [("opaque", a) for a in node.args + [k.value for k in node.keywords]]
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and stores_name(node.target, name):
            return [("element", node)]
        if isinstance(node, ast.AugAssign) and stores_name(node.target, name):
            return [("opaque", node.value)]
        if isinstance(node, ast.withitem) and node.optional_vars is not None and stores_name(node.optional_vars, name):
            return [("opaque", node.context_expr)]
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            return [("import", node)]
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler))
            and node.name == name
        ):
            return [("opaque", node)]
        return []

    def attr_sites(self, node: ast.Attribute) -> List[Site]:
        """Assignments to the attribute as written (``self.ns = ...``), and for ``self.X``/``cls.X``, class-level ``X = ...``."""
        written = self.raw(node)
        return self.memo(("attr", written), lambda: self.assigned(written, node.attr)) if written else []

    def assigned(self, written: str, attr: str) -> List[Site]:
        found: List[Site] = []
        for n in ast.walk(self.tree):
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                found += [
                    ("value", v)
                    for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    for t, v in self.pairs(target, n.value)
                    if self.raw(t) == written
                ]
            if isinstance(n, ast.ClassDef) and written.split(".")[0] in ("self", "cls"):
                found += [
                    ("value", a.value)
                    for a in n.body
                    if isinstance(a, ast.Assign) and any(refers(t, attr) for t in a.targets)
                ]
        return found

    def param_sites(self, fn: Function, name: str) -> Optional[List[Site]]:
        """The arguments a local function's parameter may receive (None: not a parameter): its defaults, its calls'
        arguments, and every other argument of a call it is handed to."""
        a = fn.args
        positional = [p.arg for p in a.posonlyargs + a.args]
        packed = [p.arg for p in (a.vararg, a.kwarg) if p]
        if name not in positional + [p.arg for p in a.kwonlyargs] + packed:
            return None
        defaults = dict(zip(positional[len(positional) - len(a.defaults) :], a.defaults))
        defaults.update((p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None)
        found: List[Site] = [("value", defaults[name])] if name in defaults else []
        direct, handed = self.memo(("callers", fn), lambda: self.callers(fn))
        for call, shift in direct:
            index = positional.index(name) - shift if name in positional else None
            for i, arg in enumerate(call.args):
                starred = isinstance(arg, ast.Starred)
                if name in packed or (starred and index is not None and i <= index):
                    found.append(("opaque", arg.value if isinstance(arg, ast.Starred) else arg))
                elif i == index:
                    found.append(("value", arg))
            found += [
                ("value" if k.arg == name else "opaque", k.value)
                for k in call.keywords
                if k.arg in (name, None) or name in packed
            ]
        for call in handed:
            others = [
                arg
                for arg in call.args + [k.value for k in call.keywords]
                if arg is not fn and not refers(arg, self.label(fn))
            ]
            found += [("opaque", arg) for arg in others]
        return found

    def functions(self, func: ast.AST) -> List[Definition]:
        """The local functions a call's callee may be: those of its name (a method's, for ``x.name(...)``)."""
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        return self.memo(
            ("functions", name),
            lambda: [n for n in ast.walk(self.tree) if isinstance(n, FUNCTIONS[:2]) and n.name == name],
        )

    def label(self, fn: Function) -> Optional[str]:
        """The name a function is called by (a lambda's: the variable it is assigned to)."""
        if isinstance(fn, ast.Lambda):
            parent = self.parents.get(fn)
            targets = parent.targets if isinstance(parent, ast.Assign) else []
            return targets[0].id if len(targets) == 1 and isinstance(targets[0], ast.Name) else None
        return fn.name

    def callers(self, fn: Function) -> Tuple[List[Tuple[ast.Call, int]], List[ast.Call]]:
        """The calls of a local function, each with how many leading parameters it binds itself (a method's self:
        a class's ``__init__`` is called by the class's name), and the calls it is handed to as an argument."""
        name, owner = self.label(fn), self.parents.get(fn)
        owner = owner if isinstance(owner, ast.ClassDef) else None
        decorators = {self.resolve(d) for d in getattr(fn, "decorator_list", [])}
        classes = {n.name for n in ast.walk(self.tree) if isinstance(n, ast.ClassDef)}
        parent = self.parents.get(fn)
        parent = self.parents.get(parent) if isinstance(parent, ast.keyword) else parent
        direct, handed = [], [parent] if isinstance(parent, ast.Call) else []  # an inline lambda
        for call in (n for n in ast.walk(self.tree) if isinstance(n, ast.Call)):
            unbound = (
                isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id in classes
            )
            if (
                owner is not None
                and name == "__init__"
                and refers(call.func, owner.name)
                and isinstance(call.func, ast.Name)
            ):
                direct.append((call, 1))
            elif name and refers(call.func, name):
                method = owner is not None and "staticmethod" not in decorators
                direct.append((call, int(method and ("classmethod" in decorators or not unbound))))
            if name and any(refers(arg, name) for arg in call.args + [k.value for k in call.keywords]):
                handed.append(call)
        return direct, handed

    # -- what a value may be ------------------------------------------------------------------------------------
    def targets(self, node: ast.AST, depth: int = 0) -> Set[str]:
        """The module-rooted names an expression may stand for: a module, or an object reached from one."""
        if depth > DEPTH or node is None:
            return set()
        step = lambda n: self.targets(n, depth + 1)  # noqa: E731
        if isinstance(node, ast.Name):
            sites = self.name_sites(node)
            if sites is None:
                name = self.resolve(node)
                return {name} if name and self.rooted(name) else set()
            return set().union(*(self.site_targets(s, node, depth + 1) for s in sites))
        if isinstance(node, ast.Attribute):
            found = {f"{t}.{node.attr}" for t in step(node.value)}
            written = self.bindings.get(self.raw(node) or "")
            found |= {written} if written and self.rooted(written) else set()
            return found.union(*(self.site_targets(s, node, depth + 1) for s in self.attr_sites(node)))
        if isinstance(node, (ast.Call, ast.Subscript)):
            name = self.resolve(node)
            if name and self.rooted(name):
                return {name}
            if isinstance(node, ast.Subscript):  # an element of a container that holds modules
                return step(node.value)
            access = self.attr_call(node, depth + 1)
            if access and not access[2]:
                owners, attr, _ = access
                attrs = self.values(attr, depth + 1) if attr is not None else None
                return {f"{t}.{v}" for t in owners for v in (attrs or ())}
            if isinstance(node.func, ast.Attribute) and node.func.attr in ITEM_METHODS:  # an item of a container
                return step(node.func.value)
            if self.resolve(node.func) in WRAPPERS | {"iter", "next"} and node.args:
                return step(node.args[0])
            returned = [
                r.value
                for fn in self.functions(node.func)
                for r in self.own_nodes(fn)
                if isinstance(r, ast.Return) and r.value
            ]
            return set().union(*(step(r) for r in returned))
        parts = {ast.Tuple: "elts", ast.List: "elts", ast.Set: "elts", ast.Dict: "values", ast.BoolOp: "values"}.get(
            type(node)
        )
        if parts:
            return set().union(*(step(n) for n in getattr(node, parts)))
        if isinstance(node, ast.IfExp):
            return step(node.body) | step(node.orelse)
        if isinstance(node, (ast.Starred, ast.NamedExpr, ast.Await)):
            return step(node.value)
        return set()

    def site_targets(self, site: Site, node: ast.AST, depth: int) -> Set[str]:
        kind, where = site
        if kind == "import":
            name = self.resolve(node)
            return {name} if name and self.rooted(name) else set()
        if kind == "element":
            assert isinstance(where, LOOPS)  # binds gives "element" sites only to loops
            return self.targets(where.iter, depth)
        return self.targets(where, depth)

    def values(self, node: ast.AST, depth: int = 0) -> Optional[Set[str]]:
        """The strings an expression may evaluate to, each folded from constants; None when one may not fold."""
        if depth > DEPTH:
            return None
        if isinstance(node, ast.IfExp):
            return union([self.values(node.body, depth + 1), self.values(node.orelse, depth + 1)])
        if isinstance(node, (ast.Name, ast.Attribute)):
            sites = self.name_sites(node) if isinstance(node, ast.Name) else (self.attr_sites(node) or None)
            if sites is None:  # bound nowhere in this file: a constant carried into exec'd code, or not a string
                text = self.fold(node)
                return {text} if text is not None else None
            return union([self.site_values(s, node, depth + 1) for s in sites] or [None])
        text = self.fold(node)
        if text is None and isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
            items = self.elements(node.value, depth + 1, items=True)  # an item of a constant container
            return union([self.values(e, depth + 1) for e in items]) if items else None
        if text is None:
            return None
        # the fold read each variable's last constant: it stands only if that is the one string the variable holds
        for n in ast.walk(node):
            if n is not node and isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load):
                folded = self.fold(n)
                if folded is not None and self.values(n, depth + 1) != {folded}:
                    return None
        return {text}

    def site_values(self, site: Site, node: ast.Name | ast.Attribute, depth: int) -> Optional[Set[str]]:
        kind, where = site
        if kind == "value":
            return self.values(where, depth)
        if kind != "element":
            return None
        assert isinstance(where, LOOPS) and isinstance(node, ast.Name)  # an attribute's sites are all "value" ones
        elements = self.elements(where.iter, depth)
        if not elements:
            return None
        found: List[Optional[Set[str]]] = []
        for element in elements:
            matched = [v for t, v in self.pairs(where.target, element) if isinstance(t, ast.Name) and t.id == node.id]
            found.append(self.values(matched[0], depth) if matched else None)
        return union(found)

    def elements(self, node: ast.AST, depth: int, items: bool = False) -> Optional[List[ast.expr]]:
        """The elements of a constant container (a literal, a variable bound only to literals and never filled, or
        either wrapped in tuple/sorted/...; a dict's keys, or its values with ``items``), or None."""
        if depth > DEPTH:
            return None
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return node.elts
        if isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None]  # a None key unpacks a mapping (**m): keys unknown
            return node.values if items else keys if len(keys) == len(node.keys) else None
        if isinstance(node, ast.Call) and self.resolve(node.func) in WRAPPERS and len(node.args) == 1:
            return self.elements(node.args[0], depth + 1, items)
        sites = self.name_sites(node) if isinstance(node, ast.Name) else None
        if not sites or any(kind != "value" for kind, _ in sites):
            return None
        found: List[ast.expr] = []
        for _, value in sites:
            part = self.elements(value, depth + 1, items)
            if part is None:
                return None
            found += part
        return found

    def namespace(self, node: ast.AST, depth: int = 0) -> Set[str]:
        """The modules (or objects reached from one) whose attribute dict an expression is: ``m.__dict__``, ``vars(m)``."""
        if depth > DEPTH:
            return set()
        if isinstance(node, ast.Call) and self.callee(node) == "vars" and node.args:
            return self.targets(node.args[0], depth + 1)
        found = {t.removesuffix(".__dict__") for t in self.targets(node, depth) if t.endswith(".__dict__")}
        if isinstance(node, ast.Name):  # bound to vars(m)
            found = found.union(
                *(self.namespace(v, depth + 1) for kind, v in self.name_sites(node) or [] if kind == "value")
            )
        return found

    # -- the rule -----------------------------------------------------------------------------------------------
    def callee(self, call: ast.Call) -> str:
        return (self.resolve(call.func) or "").removeprefix("builtins.").removeprefix("__builtins__.")

    def attr_call(self, call: ast.Call, depth: int = 0) -> Optional[Tuple[Set[str], Optional[ast.AST], bool]]:
        """(the targets, the name's expression, stores) of a call that fetches, sets or deletes one attribute, or None.
        Packed arguments (``*args``, or keywords in place of the target or name) may each be the target, and leave
        the name unknown (None)."""
        target: Optional[int]
        func = self.callee(call)
        method = call.func.attr if isinstance(call.func, ast.Attribute) else func.rsplit(".", 1)[-1]
        if func in ATTR_CALLS:
            target, name, stores = ATTR_CALLS[func]
        elif method in ATTR_DUNDERS:
            bound, stores = ATTR_DUNDERS[method]
            # an argument more than bound: the unbound form, target first (object.__setattr__(target, name, value))
            target, name = (0, 1) if len(call.args) > bound else (None, 0)
        else:
            return None
        receiver: Set[str] = {t.rsplit(".", 1)[0] for t in self.targets(call.func, depth)} if target is None else set()
        if any(isinstance(a, ast.Starred) for a in call.args) or (call.keywords and len(call.args) <= name):
            packed = [a.value if isinstance(a, ast.Starred) else a for a in call.args] + [
                k.value for k in call.keywords
            ]
            return receiver.union(*(self.targets(a, depth) for a in packed)), None, stores
        if len(call.args) <= name:
            return None
        return (receiver if target is None else self.targets(call.args[target], depth)), call.args[name], stores

    def check_attributes(self) -> None:
        """Every attribute call, attribute-dict subscript and attribute function used as a value of the module."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                self.check_call(node)
            elif isinstance(node, ast.Subscript) and (owners := self.namespace(node.value)):
                names = self.values(node.slice)
                if isinstance(node.ctx, ast.Load) or names is None:  # assignments through it are check_stores'
                    self.check_names(node, owners, names, False, "attribute dict subscript")
            elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
                name = (self.resolve(node) or "").removeprefix("builtins.")
                parent = self.parents.get(node)
                called = isinstance(parent, ast.Call) and parent.func is node
                inner = isinstance(parent, ast.Attribute) and parent.value is node
                if name in set(ATTR_CALLS) | PATH_CALLS and not called and not inner:
                    self.add(
                        "dynamic_code", node, f"{name} used as a value: the attributes it reaches cannot be checked"
                    )

    def check_call(self, call: ast.Call) -> None:
        func, access = self.callee(call), self.attr_call(call)
        method = call.func.attr if isinstance(call.func, ast.Attribute) else func.rsplit(".", 1)[-1]
        if access:
            owners, name, stores = access
            self.check_names(call, owners, self.values(name) if name else None, stores, func or method, method=True)
        elif method in NAMESPACE_METHODS:
            owners, args = self.namespace(call.func.value) if isinstance(call.func, ast.Attribute) else set(), call.args
            if not owners and args:  # unbound: operator.setitem(m.__dict__, name, value), dict.get(vars(m), name)
                owners, args = self.namespace(args[0]), args[1:]
            if owners:
                keys = self.dict_keys(method, args, call.keywords)
                self.check_names(call, owners, keys, NAMESPACE_METHODS[method], f"{method} on an attribute dict")
        elif func in PATH_CALLS and call.args:
            paths = union([self.values(a) for a in (call.args if func == "operator.attrgetter" else call.args[:1])])
            if paths is None:
                self.add("dynamic_code", call, f"{func} of a path that does not fold")
            for path in sorted(paths or ()):
                if func == "unittest.mock.patch":
                    self.store(call, path)
                elif func.startswith("operator."):  # applied to a value: each part is an attribute of it
                    for part in path.split("."):
                        self.check_site(call, f".{part}", True)

    def dict_keys(self, method: str, args: Sequence[ast.expr], keywords: List[ast.keyword]) -> Optional[Set[str]]:
        """The keys a dict method is given: the first argument, or every key of ``update``'s dicts and keywords."""
        if method != "update":
            return self.values(args[0]) if args else None
        keys = [k for d in args for k in (d.keys if isinstance(d, ast.Dict) else [None])]
        return union(
            [self.values(k) if k is not None else None for k in keys] + [{k.arg} if k.arg else None for k in keywords]
        )

    def check_names(
        self, node: ast.AST, owners: Set[str], names: Optional[Set[str]], stores: bool, label: str, method: bool = False
    ) -> None:
        """One attribute access: a computed name on a module is a finding; folded names are checked as written."""
        if not owners:  # not a module: a folded name fetched from a value is one of its methods
            for name in sorted(names or ()) if method and not stores else []:
                self.check_site(node, f".{name}", True)
            return
        if names is None:
            self.add(
                "dynamic_code", node, f"{label}: an attribute of {min(owners)} named by a value that does not fold"
            )
            names = {"<computed>"} if stores else set()
        for owner in sorted(owners):
            for name in sorted(names):
                full = f"{owner}.{name}"
                if stores:
                    self.store(node, full)
                elif self.resolve(node) != full:  # else check_sites saw it already
                    self.check_site(node, full, False)
