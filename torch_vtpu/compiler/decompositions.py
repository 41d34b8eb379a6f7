"""The decompositions AOTAutograd applies to graphs compiled for vtpu: PyTorch's
core ATen decompositions, except for the composite ops eager mode runs as one
kernel. Decomposing those would replace one kernel by several and give other
bits than eager mode; every other composite (the losses' backward, tril, var,
...) becomes core ATen ops, most of which the engine generates and fused
execution groups."""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator

import torch
from torch._C import DispatchKey
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

# Host-kernel-path ops of vision models, found by a review (2026-12-07):
# decomposed, they gave other bits than eager mode (group norm's and ELU's
# gradients, Mish and its gradient, affine grids and their theta gradient, reflection padding's
# gradient, eval-mode batch norm's parameter gradients, 2-d cross entropy),
# and max_unpool2d's decomposition wrote an index of -1 to the last element
# where the kernel raises. (The upsampling ops' `.vec` overloads decompose in
# PyTorch's Python dispatcher before any table is consulted: not kept.)
VISION_HOST_KERNEL_WHOLE = (
    aten.native_group_norm_backward.default,
    aten.elu_backward.default,
    aten.mish.default,
    # Mish's backward is a composite of softplus, tanh and sigmoid (in eager
    # mode too), and softplus runs ATen's kernel in eager mode.
    aten.softplus.default,
    aten.softplus_backward.default,
    aten.affine_grid_generator.default,
    aten.affine_grid_generator_backward.default,
    aten.reflection_pad1d_backward.default,
    aten.reflection_pad2d_backward.default,
    aten.reflection_pad3d_backward.default,
    aten._native_batch_norm_legit_no_training.default,
    aten.nll_loss2d_forward.default,
    aten.nll_loss2d_backward.default,
    aten.max_unpool2d.default,
    aten.max_unpool3d.default,
)

# Interpolation, which eager mode runs on ATen's kernels too. PyTorch
# decomposes these in its Python dispatcher (kernels registered from Python
# at the Autograd and CompositeImplicitAutograd keys) before a decomposition
# table is consulted, so keeping them whole also takes those kernels out of
# the way while AOTAutograd traces (`interpolation_kept_whole`). Decomposed,
# a bilinear resize of uint8 was off by one, float16 bicubic by 2e-3 and a
# linear resize by 2.5e-5 from the CPU, and float32 results differed from
# eager mode's in the last bits (a review of vision workloads, 2026-12-07).
INTERPOLATION_WHOLE = tuple(
    getattr(getattr(aten, name), overload)
    for name in ("upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d",
                 "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa")
    for overload in ("default", "vec"))
_PYTHON_DISPATCHER_KEYS = (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)


@contextlib.contextmanager
def interpolation_kept_whole() -> Iterator[None]:
    """While AOTAutograd traces a vtpu graph: the interpolation ops reach the
    graph as the ATen ops eager mode runs (their C++ composite forms), not as
    PyTorch's Python decompositions. Restored on exit, exceptions included."""
    removed = []
    try:
        for op in INTERPOLATION_WHOLE:
            for key in _PYTHON_DISPATCHER_KEYS:
                if key in op.py_kernels:
                    removed.append((op, key, op.py_kernels.pop(key)))
            op._dispatch_cache.clear()
        yield
    finally:
        for op, key, kernel in removed:
            op.py_kernels[key] = kernel
        for op in INTERPOLATION_WHOLE:
            op._dispatch_cache.clear()

# Composites whose eager form on vtpu is a few generated kernels, where the core
# decomposition reaches the host-kernel path: `_safe_softmax` (the math SDPA's
# softmax) runs softmax, eq, all (a generated bool amin) and where in eager mode;
# decomposed, `all` becomes logical_not(any(logical_not(x))) with `any` and the
# -inf comparison on ATen's CPU kernels, two more kernels per attention layer.
EAGER_COMPOSITE_WHOLE = (aten._safe_softmax.default,)

# Core decompositions that give wrong values under AOTAutograd (found by fuzzing, an
# upstream bug, reproduced on the CPU with AOTAutograd and the core table): with dynamic
# shapes, `select_scatter` decomposed into where(...) made the replay of an as_strided view
# of a graph input with a storage offset read the wrong elements. Eager mode runs it whole.
WRONG_WHEN_DECOMPOSED = (aten.select_scatter.default,)
KEPT_WHOLE = (GENERATED_WHOLE + HOST_KERNEL_WHOLE + VISION_HOST_KERNEL_WHOLE + EAGER_COMPOSITE_WHOLE +
              WRONG_WHEN_DECOMPOSED)

# Composites whose core decomposition computes step by step in a float16/bfloat16
# dtype where ATen's kernel (eager mode's, on the host-kernel path) computes in float32
# and rounds once: bfloat16 `logit(x, eps=1e-3)` gave 6.9 where eager mode and the CPU
# give inf, float16 `xlogy` was 1-4 ulp off in a quarter of the elements (found by a
# fuzzing review). Kept whole for 16-bit operands; float32 and float64 keep the
# decomposition (within an ulp of the kernel, and fusable with their neighbours).
WHOLE_FOR_16_BIT = (
    aten.logit.default,
    aten.logit_backward.default,
    aten.xlogy.Tensor,
    aten.xlogy.Scalar_Self,
    aten.xlogy.Scalar_Other,
)

_16_BIT = (torch.float16, torch.bfloat16)


def _whole_for_16_bit(decomposition: Callable) -> Callable:
    def decompose(*args, **kwargs):
        for leaf in torch.utils._pytree.tree_leaves((args, kwargs)):
            if isinstance(leaf, torch.Tensor) and leaf.dtype in _16_BIT:
                return NotImplemented  # make_fx keeps the op as it is
        return decomposition(*args, **kwargs)
    return decompose


def vtpu_decompositions() -> Dict[torch._ops.OperatorBase, Callable]:
    table = dict(core_aten_decompositions())
    for op in KEPT_WHOLE:
        table.pop(op, None)
    for op in INTERPOLATION_WHOLE:
        for overload in op._overloadpacket.overloads():
            table.pop(getattr(op._overloadpacket, overload), None)
    for op in WHOLE_FOR_16_BIT:
        if op in table:
            table[op] = _whole_for_16_bit(table[op])
    return table
