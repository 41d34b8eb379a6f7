"""safetensors loads onto vtpu when asked by name.

safetensors' file reader (``safe_open``, behind ``safetensors.torch.load_file``,
``load_model``, accelerate's checkpoint and offload loaders and transformers'
sharded loading) parses its ``device`` argument itself and knows a fixed list of
device types: ``device="vtpu"`` raised "device vtpu is invalid" where
``device="cuda"`` works (found by a review of model loading). An integer device is
the current accelerator's index, which it accepts; so here a vtpu device, given as a
string or a ``torch.device``, is passed on as its index. Nothing else changes.
"""
from __future__ import annotations

import functools
import sys
from typing import Any

import torch

from . import _import_patches

_MARK = "_vtpu_device_names"


def _as_index(device: Any) -> Any:
    if isinstance(device, str) and device.split(":", 1)[0] == "vtpu":
        device = torch.device(device)  # a malformed name raises torch's error
    if isinstance(device, torch.device) and device.type == "vtpu":
        return 0 if device.index is None else device.index
    return device


def _patch(module: Any) -> None:
    original = getattr(module, "safe_open", None)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def safe_open(filename: Any, framework: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            args = (_as_index(args[0]),) + args[1:]
        if "device" in kwargs:
            kwargs["device"] = _as_index(kwargs["device"])
        return original(filename, framework, *args, **kwargs)

    setattr(safe_open, _MARK, True)
    module.safe_open = safe_open
    # Modules that took the name before this patch (safetensors.torch,
    # accelerate's and transformers' loaders imported before torch_vtpu).
    # Their namespaces are read directly: a lazy module's __getattr__ (as
    # transformers' are) must not run, and may import or raise.
    for other in list(sys.modules.values()):
        namespace = getattr(other, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get("safe_open") is original:
            other.safe_open = safe_open


def install() -> None:
    _import_patches.on_import("safetensors", _patch)
