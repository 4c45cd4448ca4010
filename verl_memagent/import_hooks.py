"""Run a function on a module right after it is imported, without importing it earlier.

verl loads our plugin from `import verl`, long before (and in processes that never) import the heavy
modules we register into or patch, such as the FSDP engine. Importing them eagerly would slow every
Ray worker and risk circular imports inside `verl/__init__`; this runs each hook when its module is
first executed instead, or at once if it is already loaded.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from types import ModuleType

Hook = Callable[[ModuleType], None]


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """A meta-path finder that finds nothing itself; it wraps the real loader of hooked modules."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Hook]] = {}

    def find_spec(self, fullname, path, target=None):
        hooks = self.hooks.pop(fullname, None)
        if hooks is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_hook(module: ModuleType) -> None:
            exec_module(module)
            for hook in hooks:
                hook(module)

        spec.loader.exec_module = exec_then_hook
        return spec


_FINDER = _PostImportFinder()


def when_imported(module_name: str, hook: Hook) -> None:
    """Call `hook(module)` once `module_name` has been executed (now, if it already has)."""
    module = sys.modules.get(module_name)
    if module is not None:
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            raise RuntimeError(f"cannot hook {module_name} while it is being imported")
        hook(module)
        return
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    _FINDER.hooks.setdefault(module_name, []).append(hook)
