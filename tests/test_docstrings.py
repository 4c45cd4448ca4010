"""Public methods say what they do where their name does not say it all: every public method (and
property) of a class in `agent/`, `algo/` and `search/` has a docstring, its own or the one of the
method it overrides (`inspect.getdoc` reads it from the base class, verl's included)."""

from __future__ import annotations

import importlib
import inspect
from functools import cached_property
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "algo", "search")


def modules() -> list[str]:
    paths = sorted(path for package in PACKAGES for path in (REPO / "verl_memagent" / package).glob("*.py"))
    return [f"verl_memagent.{path.parent.name}.{path.stem}".removesuffix(".__init__") for path in paths]


def undocumented(module) -> list[str]:
    """`Class.method` of the module's own public classes whose public methods have no docstring, own or inherited."""
    found = []
    for class_name, cls in vars(module).items():
        if class_name.startswith("_") or not inspect.isclass(cls) or cls.__module__ != module.__name__:
            continue
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            if isinstance(member, property | cached_property):
                documented = member.__doc__
            elif inspect.isfunction(getattr(member, "__func__", member)):  # a method, classmethod or staticmethod
                documented = inspect.getdoc(getattr(member, "__func__", member))
            else:
                continue
            if not documented and not any(inspect.getdoc(getattr(base, name, None)) for base in cls.__mro__[1:]):
                found.append(f"{class_name}.{name}")
    return found


def test_the_check_sees_a_method_without_a_docstring():
    module = type(inspect)("verl_memagent.agent.example")

    class Base:
        def said(self):
            """Documented once, in the base."""

    class Loop(Base):
        def said(self):
            pass

        def unsaid(self):
            pass

    for cls in (Base, Loop):
        cls.__module__ = module.__name__
        setattr(module, cls.__name__, cls)
    assert undocumented(module) == ["Loop.unsaid"]


@pytest.mark.parametrize("name", modules())
def test_public_methods_are_documented(name):
    assert undocumented(importlib.import_module(name)) == []
