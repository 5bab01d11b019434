"""The library's public API is typed (the package ships py.typed): every function and public method that the
packages export has annotated parameters and a return annotation."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

PACKAGES = ["tokenseam.vocab", "tokenseam.grammar", "tokenseam.healing", "tokenseam.respcache"]


def _untyped(fn) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    missing = [
        p.name
        for p in sig.parameters.values()
        if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty
    ]
    if sig.return_annotation is inspect.Signature.empty and fn.__name__ != "__init__":
        missing.append("return")
    return missing


def _members(obj):
    for name, member in vars(obj).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            member = member.fget
        if inspect.isfunction(member):
            yield name, member


@pytest.mark.parametrize("package", PACKAGES)
def test_exported_functions_and_methods_are_annotated(package):
    mod = importlib.import_module(package)
    problems = []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if inspect.isfunction(obj):
            if m := _untyped(obj):
                problems.append(f"{name}: {m}")
        elif inspect.isclass(obj) and obj.__module__.startswith("tokenseam"):
            for mname, fn in _members(obj):
                if fn.__module__.startswith("tokenseam") and (m := _untyped(fn)):
                    problems.append(f"{name}.{mname}: {m}")
    assert not problems, problems


def test_the_package_ships_its_typed_marker():
    import tokenseam

    assert (Path(tokenseam.__file__).parent / "py.typed").is_file()
