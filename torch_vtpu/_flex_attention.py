"""FlexAttention (``torch.nn.attention.flex_attention``) on vtpu tensors.

torch checks the device against a fixed list (CUDA, CPU, XPU, HPU, MPS) before
anything else and raised ValueError for vtpu, although everything after the
check is device-generic: without torch.compile the higher-order op runs its
dense implementation (the full score matrix, ``score_mod`` and ``mask_mod``
applied with vmap over ordinary ATen ops, a softmax, a matmul) and its
backward the same way, as it does on CUDA without compile. Those are vtpu ops
like any other, so the check now lets vtpu through; every other device keeps
torch's check. Compiled, Dynamo captures the same dense computation and the
vtpu compiler runs it (no fused attention kernel is generated for it yet).
"""
from __future__ import annotations

from typing import Any

_MODULE = "torch.nn.attention.flex_attention"


def _patch(module: Any) -> None:
    original = getattr(module, "_validate_device", None)
    if original is None or getattr(original, "_vtpu", False):
        return

    def _validate_device(query: Any, key: Any, value: Any, _original=original) -> None:
        # torch has already checked that query, key and value share a device
        if query.device.type == "vtpu":
            return
        _original(query, key, value)

    _validate_device._vtpu = True  # type: ignore[attr-defined]
    module._validate_device = _validate_device


def install() -> None:
    from . import _import_patches

    _import_patches.on_import(_MODULE, _patch)
