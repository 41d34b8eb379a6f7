"""Patches to third-party modules, applied when each is imported, before or after
torch_vtpu (``import torch`` autoloads torch_vtpu, so it usually comes first).

``on_import(name, patch)`` calls ``patch(module)`` at once if ``name`` is imported
already, else right after its import: a meta-path finder wraps that module's loader.
A patch must be idempotent and leave a module it does not recognise alone.
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable, Dict

_PATCHES: Dict[str, Callable[[Any], None]] = {}


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the patch."""

    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[Any], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):  # noqa: D102
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: D102
        self._loader.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds a patched module through the other finders and wraps its loader."""

    def find_spec(self, fullname, path, target=None):  # noqa: D102
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def on_import(name: str, patch: Callable[[Any], None]) -> None:
    _PATCHES[name] = patch
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
