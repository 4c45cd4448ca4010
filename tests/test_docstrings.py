"""Public functions and methods say what they do where their name does not say it all: every public
function of a module in `agent/`, `algo/` and `search/` has a docstring, and so does every public
method (and property) of its classes, its own or the one of the method it overrides (`inspect.getdoc`
reads it from the base class, verl's included)."""

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
    """The module's own public functions without a docstring, and `Class.method` of its own public classes
    whose public methods have no docstring, own or inherited."""
    found = []
    for name, member in vars(module).items():
        if inspect.isfunction(member) and not name.startswith("_") and member.__module__ == module.__name__:
            if not inspect.getdoc(member):
                found.append(name)
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


def test_the_check_sees_a_function_or_method_without_a_docstring():
    module = type(inspect)("verl_memagent.agent.example")

    def said():
        """Documented."""

    def unsaid():
        pass

    def _private():
        pass

    class Base:
        def said(self):
            """Documented once, in the base."""

    class Loop(Base):
        def said(self):
            pass

        def unsaid(self):
            pass

    for member in (said, unsaid, _private, Base, Loop):
        member.__module__ = module.__name__
        setattr(module, member.__name__, member)
    assert undocumented(module) == ["unsaid", "Loop.unsaid"]


@pytest.mark.parametrize("name", modules())
def test_public_functions_and_methods_are_documented(name):
    assert undocumented(importlib.import_module(name)) == []
