"""The runner zygote's cache of Triton's interpreter patches (kbsweep.grader.runner.interpreter_cache): the same attributes
patched as Triton patches them, kernels computing the same, ``triton.language`` pristine after a launch, and a
Triton of another version left alone."""

from __future__ import annotations

import importlib.util
import inspect

import pytest
import torch
import triton
from triton.runtime import interpreter

from kbsweep.grader.runner import interpreter_cache
from kbsweep.paths import REPO_ROOT

pytestmark = pytest.mark.fast
tl = interpreter.tl


@pytest.fixture
def pristine(monkeypatch):
    """Triton's own ``_patch_builtin`` restored after the test, whatever it installed."""
    monkeypatch.setattr(interpreter, "_patch_builtin", interpreter._patch_builtin)
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def softmax_module():
    """The demo's row_softmax solution, jitted for the interpreter (``tl.max`` and ``tl.sum`` are device functions,
    patched again inside each program)."""
    spec = importlib.util.spec_from_file_location(
        "softmax_solution", REPO_ROOT / "problems/demo/row_softmax/solutions/triton.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def snapshot() -> dict:
    """Every attribute of every object a launch patches and restores, by identity. Not ``tl.core``'s: a device
    function's own patches (``tl.max``'s module names ``tl.core``) are never restored, by Triton itself."""
    owners = (tl, tl.tensor, tl.math, tl.core.tensor_descriptor_base, tl.dtype)
    return {(id(o), name): id(inspect.getattr_static(o, name)) for o in owners for name in dir(o)}


def patched(fn) -> list:
    """(object, attribute) in the order one launch's ``_patch_lang`` sets them; restored after."""
    scope = interpreter._patch_lang(fn)
    changes = [(id(obj), name) for obj, name, _ in scope._changes]
    scope.restore()
    return changes


def test_the_listed_patches_are_tritons(pristine, monkeypatch):
    kernel = softmax_module().softmax_kernel.fn
    searched = patched(kernel)
    monkeypatch.setattr(tl, "exp", lambda x: x)  # a name that no longer holds a builtin is not patched
    searched_plain = patched(kernel)
    assert (id(tl), "exp") in searched and (id(tl), "exp") not in searched_plain
    monkeypatch.undo()
    monkeypatch.setattr(interpreter, "_patch_builtin", interpreter._patch_builtin)
    before = snapshot()
    assert interpreter_cache.install()
    assert patched(kernel) == searched  # the same attributes, in the same order
    assert snapshot() == before  # and all of them restored
    listed = interpreter._patch_builtin.listed[id(tl)][1]
    assert {name for name, _, _ in listed} == {name for name, m in inspect.getmembers(tl) if tl.core.is_builtin(m)}
    assert not any(tl.core.is_builtin(w) for _, _, w in listed)  # Triton's wrappers, not the builtins
    monkeypatch.setattr(tl, "exp", lambda x: x)
    assert patched(kernel) == searched_plain
    log = tl.log
    monkeypatch.setattr(tl, "exp", log)  # another builtin under a listed name: wrapped, as Triton wraps it
    scope = interpreter._patch_lang(kernel)
    assert tl.exp.__kwdefaults__["member"] is log
    scope.restore()
    assert tl.exp is log


def test_kernels_compute_the_same_and_leave_triton_language_pristine(pristine):
    torch.manual_seed(0)
    inputs = [torch.randn(3, 100), torch.randn(2, 513) * 100]
    model = softmax_module().ModelNew()
    searched = [model(x) for x in inputs]
    before = snapshot()
    assert interpreter_cache.install()
    listed = [model(x) for x in inputs]
    assert snapshot() == before
    for x, a, b in zip(inputs, searched, listed):
        assert torch.equal(a, b)
        torch.testing.assert_close(b, torch.softmax(x, dim=1))


def test_another_triton_or_a_second_install_is_left_alone(pristine, monkeypatch):
    search = interpreter._patch_builtin
    monkeypatch.setattr(triton, "__version__", "3.8.0")
    assert not interpreter_cache.install()
    assert interpreter._patch_builtin is search
    monkeypatch.setattr(triton, "__version__", "3.7.1")
    assert interpreter_cache.install()
    listed = interpreter._patch_builtin
    assert not interpreter_cache.install()
    assert interpreter._patch_builtin is listed
