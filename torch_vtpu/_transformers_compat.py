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
import inspect
from typing import Any, Optional

import torch

from . import _import_patches

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


def install() -> None:
    _import_patches.on_import(_MODULE, _patch)
