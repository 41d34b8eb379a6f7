"""Hugging Face transformers' pipelines keep a model that lives on vtpu there.

``transformers.Pipeline`` resolves ``device=None`` (also what ``pipeline(...,
device_map="vtpu")`` leaves it) to device index 0 and maps index 0 only onto the
accelerators it knows (cuda, xpu, npu, mps, ...), otherwise the CPU, and then calls
``model.to(that device)``: a model loaded with ``device_map="vtpu"`` was moved back to
the CPU, the user's own model object included, and the pipeline ran there, silently
(found by a review of generation with transformers 5.23). With CUDA the same flow stays
on the GPU.

Here, when no device is given and the model is on vtpu (and not spread by accelerate,
``hf_device_map``), the pipeline is given the model's device. Nothing changes for models
on other devices, or when a device is given. The patch is applied when
``transformers.pipelines.base`` is imported (before or after torch_vtpu).
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
from typing import Any, Optional

import torch

_MODULE = "transformers.pipelines.base"
_MARK = "_vtpu_keeps_model_device"


def _vtpu_device_of(model: Any) -> Optional[torch.device]:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device) and device.type == "vtpu":
        return device
    return None


def _patch(module: Any) -> None:
    pipeline_class = getattr(module, "Pipeline", None)
    if pipeline_class is None or getattr(pipeline_class.__init__, _MARK, False):
        return
    original = pipeline_class.__init__
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        return
    if "device" not in signature.parameters or "model" not in signature.parameters:
        return  # another transformers: leave it alone rather than guess

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)  # let transformers raise its own error
        model = bound.arguments.get("model")
        if (bound.arguments.get("device") is None and getattr(model, "hf_device_map", None) is None
                and _vtpu_device_of(model) is not None):
            bound.arguments["device"] = _vtpu_device_of(model)
            return original(*bound.args, **bound.kwargs)
        return original(self, *args, **kwargs)

    setattr(__init__, _MARK, True)
    pipeline_class.__init__ = __init__


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the patch."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec):  # noqa: D102
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: D102
        self._loader.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``transformers.pipelines.base`` through the other finders and wraps its loader."""

    def find_spec(self, fullname, path, target=None):  # noqa: D102
        if fullname != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install() -> None:
    module = sys.modules.get(_MODULE)
    if module is not None:
        _patch(module)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
