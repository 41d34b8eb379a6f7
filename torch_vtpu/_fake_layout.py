"""Fake tensors of vtpu convolutions get the layout the device gives.

On vtpu, a 2-d convolution runs the CPU's kernel (the host-kernel path) and
returns channels-last when its input or weight is channels-last, as the CPU
does (bridge/host_path_rules.cpp). torch's fake convolution decides the
layout by asking ``_select_conv_backend``, which has no backend for
PrivateUse1 and answers contiguous. Dynamo and AOTAutograd trace with fake
tensors, so a compiled channels-last CNN was traced for NCHW results: a
flatten after a convolution became a ``view`` that the real, channels-last
tensor cannot take, and the compiled model raised at its first call. The
wrapper below gives vtpu fake convolutions the CPU's layout rule; other
devices are untouched. Installed when torch_vtpu is imported; applied when
torch's fake tensors are (importing them costs time torch_vtpu does not spend).
"""
from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten
_FORWARD = (aten.convolution.default, aten._convolution.default, aten._convolution.deprecated)


def _channels_last(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.dim() == 4 and not t.is_contiguous()
            and t.is_contiguous(memory_format=torch.channels_last))


def _with_device_layout(original):
    def fake_convolution(fake_mode, func, *args, **kwargs):
        out = original(fake_mode, func, *args, **kwargs)
        input_ = args[0] if args else kwargs.get("input")
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        device = getattr(input_, "fake_device", None)
        if (device is not None and device.type == "vtpu" and isinstance(out, torch.Tensor) and out.dim() == 4
                and (_channels_last(input_) or _channels_last(weight))):
            with fake_mode:
                out = out.contiguous(memory_format=torch.channels_last)
        return out

    fake_convolution._vtpu_wrapped = True
    return fake_convolution


def _patch(fake_impls: Any) -> None:
    """Wraps torch's fake convolution implementations (idempotent)."""
    table = getattr(fake_impls, "op_implementations_dict", None)
    if not isinstance(table, dict):
        return  # another torch's layout: left alone
    for op in _FORWARD:
        original = table.get(op)
        if original is None or getattr(original, "_vtpu_wrapped", False):
            continue
        table[op] = _with_device_layout(original)


def install() -> None:
    """Applies the patch whenever torch's fake tensors are imported (at once if
    they are): FakeTensorMode users, torch.export and every torch.compile
    backend trace vtpu convolutions with it, not only backend="vtpu"."""
    from . import _import_patches

    _import_patches.on_import("torch._subclasses.fake_impls", _patch)
