"""The packages' public faces: ``import jaxlake`` / ``import llm`` expose a small documented API
(``__all__``, listed in the module docstring), and no public name shadows a module of the
package (``from llm import generate`` once gave a function while ``llm.generation.decode`` is a module,
so ``import llm.generation.decode as g`` yielded the function)."""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import types

import pytest

PACKAGES = ("jaxlake", "llm")


def _submodules(package: types.ModuleType) -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(package.__path__))


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_exported_and_documented(name):
    package = importlib.import_module(name)
    exported = package.__all__
    assert len(exported) == len(set(exported)), "duplicates in __all__"
    assert exported, f"{name}.__all__ is empty"
    doc = package.__doc__ or ""
    for public in exported:
        assert hasattr(package, public), f"{name}.__all__ names {public!r}, which {name} does not define"
        assert re.search(rf"\b{re.escape(public)}\b", doc), f"{name}'s docstring does not list {public!r}"
    namespace: dict = {}
    exec(f"from {name} import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(exported)


@pytest.mark.parametrize("name", PACKAGES)
def test_no_public_name_is_a_module_name(name):
    """A public name equal to a submodule's name must be that submodule, never something else."""
    package = importlib.import_module(name)
    modules = set(_submodules(package))
    assert modules, f"found no submodules of {name}"
    for public in package.__all__:
        assert public not in modules, (
            f"{name}.{public} is exported but {name}/{public}.py is a module: the name would shadow it")
    for mod in sorted(modules):
        here = getattr(package, mod, None)
        assert here is None or isinstance(here, types.ModuleType), (
            f"{name}.{mod} is {type(here).__name__} {here!r}, shadowing the module {name}.{mod}")


@pytest.mark.parametrize("name", PACKAGES)
def test_every_submodule_import_gives_the_module(name):
    """``import pkg.mod as m`` yields the module for every module of both packages."""
    package = importlib.import_module(name)
    bad = []
    for mod in _submodules(package):
        full = f"{name}.{mod}"
        importlib.import_module(full)
        got = getattr(package, mod)
        if got is not sys.modules[full]:
            bad.append(f"{full} is {type(got).__name__} {got!r}")
    assert not bad, bad


def test_llm_generate_is_the_module():
    import llm
    import llm.generation.decode as g
    import llm.generation.text as t

    assert isinstance(g, types.ModuleType) and g is sys.modules["llm.generation.decode"]
    assert llm.generation.decode is g
    assert isinstance(t, types.ModuleType) and t is sys.modules["llm.generation.text"]
    assert llm.generation.text is t
    assert llm.GenerationConfig is g.GenerationConfig and callable(t.generate)
