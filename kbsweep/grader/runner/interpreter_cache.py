"""Triton's interpreter (CPU grades) with its builtins' wrappers made once per process, not at every launch.

Triton 3.7's interpreter patches ``triton.language`` at every kernel launch and every device-function call (``tl.max``
and ``tl.sum`` are ones): ``_patch_builtin`` runs ``inspect.getmembers`` over ``tl``, ``tl.core``, their tensor
class, ``tl.math`` and the tensor descriptor class, and wraps each member that holds a builtin in a new lambda
passing the interpreter's semantic: a third of a small interpreted call's CPU (docs/benchmarks.md,
"The 100-cell demo sweep"). Which names hold builtins, and their wrappers, do not change in a process, so :func:`install`, run by the
runner's zygote before any candidate exists, lists them once from the pristine modules (the wrappers made by
Triton's own ``_patch_attr``), and ``_patch_builtin`` patches from that list the names that hold a builtin, as
Triton does: the same attributes, to wrappers that do the same, restored by Triton's scope as before. An object
not listed (none in 3.7) is searched as before; a Triton of another minor version is left alone.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Tuple

VERSIONS = ("3.7.",)  # the interpreter this was written against (3.7.1): another one may patch differently


class Capture:
    """A patch scope that keeps what it is given instead of setting it: Triton's wrapper of one builtin."""

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        self.value = value


def wrappers_of(interpreter: Any) -> Dict[int, Tuple[Any, List[Tuple[str, Any, Any]]]]:
    """id(object) → (the object, [(name, the builtin, Triton's wrapper of it)]), for each object ``_patch_lang``
    searches."""
    tl, listed = interpreter.tl, {}
    for owner in (tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base):
        wrapped = []
        for name, member in inspect.getmembers(owner):
            if tl.core.is_builtin(member):
                capture = Capture()
                interpreter._patch_attr(owner, name, member, interpreter.interpreter_builder, capture)
                wrapped.append((name, member, capture.value))
        listed[id(owner)] = (owner, wrapped)
    return listed


def install() -> bool:
    """Replace the interpreter's ``_patch_builtin`` with the listed one; False where Triton is absent or another
    version, or this is installed already."""
    try:
        import triton
        from triton.runtime import interpreter
    except ImportError:
        return False
    search = getattr(interpreter, "_patch_builtin", None)
    if not triton.__version__.startswith(VERSIONS) or search is None or hasattr(search, "listed"):
        return False
    listed, is_builtin = wrappers_of(interpreter), interpreter.tl.core.is_builtin

    def patch_builtin(pkg, builder, scope) -> None:
        owner, wrapped = listed.get(id(pkg), (None, ()))
        if owner is not pkg:  # an object listed nowhere: searched as Triton does
            return search(pkg, builder, scope)
        for name, member, wrapper in wrapped:  # as Triton: a name is patched while it holds a builtin
            current = getattr(pkg, name, None)
            if current is member:
                scope.set_attr(pkg, name, wrapper)
            elif current is not wrapper and is_builtin(current):  # another builtin put there: wrapped afresh
                interpreter._patch_attr(pkg, name, current, builder, scope)

    patch_builtin.__dict__["listed"] = listed  # the mark that it is installed (checked above)
    interpreter._patch_builtin = patch_builtin
    return True
