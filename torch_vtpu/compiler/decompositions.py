"""The decompositions AOTAutograd applies to graphs compiled for vtpu: PyTorch's
core ATen decompositions, except for the composite ops eager mode runs as one
kernel. Decomposing those would replace one kernel by several and give other
bits than eager mode; every other composite (the losses' backward, tril, var,
...) becomes core ATen ops, most of which the engine generates and fused
execution groups."""
from __future__ import annotations

from typing import Callable, Dict

import torch
from torch._decomp import core_aten_decompositions

aten = torch.ops.aten

# Each of these runs on one generated kernel in eager mode (bridge/generated_lowering.cpp);
# tests/python/test_compile.py checks that none reaches the host-kernel path.
GENERATED_WHOLE = (
    aten._softmax_backward_data.default,
    aten._log_softmax_backward_data.default,
    aten.gelu_backward.default,
    aten.threshold_backward.default,
    aten.sigmoid_backward.default,
    aten.tanh_backward.default,
    aten.silu.default,
    aten.silu_backward.default,
    aten.addcmul.default,
    aten.addcdiv.default,
    aten.lerp.Scalar,
    aten.lerp.Tensor,
    aten.nll_loss_forward.default,
    aten.nll_loss_backward.default,
    aten.embedding_dense_backward.default,
    aten.logsumexp.default,
)

# Each of these runs as one ATen CPU kernel on the host-kernel path in eager mode;
# their decompositions are a dozen generated kernels and reductions that are
# slower on the host target and round differently.
HOST_KERNEL_WHOLE = (
    aten.native_layer_norm_backward.default,
    aten.native_batch_norm_backward.default,
    # SDPA takes ATen's CPU policy on vtpu (bridge/composite_ops.cpp): its
    # flash kernel, whose backward AOTAutograd keeps whole anyway; decomposed,
    # the forward would be the math path's bmm/softmax beside that backward.
    aten._scaled_dot_product_flash_attention_for_cpu.default,
)

# Composites whose eager form on vtpu is a few generated kernels, where the core
# decomposition reaches the host-kernel path: `_safe_softmax` (the math SDPA's
# softmax) runs softmax, eq, all (a generated bool amin) and where in eager mode;
# decomposed, `all` becomes logical_not(any(logical_not(x))) with `any` and the
# -inf comparison on ATen's CPU kernels, two more kernels per attention layer.
EAGER_COMPOSITE_WHOLE = (aten._safe_softmax.default,)

KEPT_WHOLE = GENERATED_WHOLE + HOST_KERNEL_WHOLE + EAGER_COMPOSITE_WHOLE


def vtpu_decompositions() -> Dict[torch._ops.OperatorBase, Callable]:
    table = dict(core_aten_decompositions())
    for op in KEPT_WHOLE:
        table.pop(op, None)
    return table
