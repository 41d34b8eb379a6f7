"""Differential OpInfo sweep: every op of PyTorch's OpInfo database, run on
"vtpu" and on the CPU with the same sample inputs, must give the same result.

Variants per OpInfo entry (each where the op supports the dtype on the CPU):
  f32       float32 forward
  f32_grad  float32 gradients: backward through the op with a fixed random
            cotangent per differentiable output; input gradients compared
  bf16      bfloat16 forward
  i64       int64 forward
  f32_inplace  float32 forward of the entry's in-place variant (x.add_(y)):
            the result and the mutated input, or, where the CPU raises (an
            input that would have to grow to the broadcast shape, a result
            type the input cannot hold), an exception of the same type

By default (CI) a deterministic slice runs: every 8th OpInfo entry plus a
fixed list of important ops. VTPU_OPINFO_FULL=1 runs every entry.
VTPU_OPINFO_RESULTS=<path> appends one JSON line per (entry, variant) result
there (VTPU_OPINFO_FULL=1 alone writes docs/_generated_tmp/opinfo_results.jsonl);
tests/python/opinfo_report.py turns results into docs/opinfo_failures.md.

Each (entry, variant) runs in a worker process (Worker below): a crash in
the bridge or a hang fails that test only, with the signal and the worker's
last output, and the next test gets a fresh worker. Device memory is released
after each entry (and what stays allocated is recorded as leaked_bytes).

Other knobs: VTPU_OPINFO_MAX_SAMPLES (samples per entry and variant: the
first 4 in the CI slice, the first 32 in the full sweep), VTPU_OPINFO_TIMEOUT
(seconds per entry and variant, default 120), VTPU_OPINFO_ONLY (a
comma-separated list of entry or op names, e.g. "add,max.binary"),
VTPU_OPINFO_INPROCESS=1 (run in the pytest process, for a debugger).
"""
from __future__ import annotations

import contextlib
import faulthandler
import gc
import itertools
import json
import math
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
import torch
import torch_vtpu  # noqa: F401  registers the "vtpu" device
from torch.utils._python_dispatch import TorchDispatchMode


from torch.testing._internal.common_device_type import toleranceOverride  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

# op_db is a large object graph that lives for the whole run; a full
# collection walks all of it (~0.4 s). Freezing it keeps the per-entry
# collection that releases device memory cheap.
gc.collect()
gc.freeze()

DEVICE = "vtpu"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RESULTS = REPO_ROOT / "docs" / "_generated_tmp" / "opinfo_results.jsonl"

VARIANTS = ("f32", "f32_grad", "bf16", "i64", "f32_inplace")
VARIANT_DTYPE = {
    "f32": torch.float32,
    "f32_grad": torch.float32,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "f32_inplace": torch.float32,
}
VARIANT_LABEL = {
    "f32": "float32 fwd",
    "f32_grad": "float32 grad",
    "bf16": "bf16 fwd",
    "i64": "int64 fwd",
    "f32_inplace": "float32 in-place",
}

FULL = os.environ.get("VTPU_OPINFO_FULL", "") not in ("", "0")
# The CI slice keeps to a few samples for time; the full sweep can afford
# more (it runs in a few minutes), and later samples find more: odd memory
# formats, broadcasting, empty tensors.
CI_SAMPLES, FULL_SAMPLES = 4, 32
MAX_SAMPLES = int(os.environ.get("VTPU_OPINFO_MAX_SAMPLES", FULL_SAMPLES if FULL else CI_SAMPLES))
ENTRY_TIMEOUT_S = int(os.environ.get("VTPU_OPINFO_TIMEOUT", "120"))
CI_STRIDE = 8

# Always part of the CI slice (matched against op.name, so every variant of
# an op is included: softmax and softmax.with_dtype, var and var.unbiased).
IMPORTANT_OPS = (
    "add", "mul", "matmul", "mm", "bmm", "addmm", "softmax", "log_softmax",
    "nn.functional.layer_norm", "nn.functional.rms_norm", "nn.functional.conv2d", "nn.functional.cross_entropy",
    "sum", "mean", "var", "index_select", "gather", "scatter_add",
    "nn.functional.embedding", "where", "cat", "stack", "nonzero", "masked_select",
    "sort", "topk", "cumsum",
)

# Entries never compared, keyed by entry name (op.name, plus
# ".variant_test_name" where the entry has one). Only entries whose output is
# not a function of the inputs, or that vtpu cannot run by design, belong
# here. At run time a sample is skipped as well when its CPU reference reaches
# a random op or differs between two CPU runs (see _check_reproducible).
_RANDOM = "random output: draws from a generator, so vtpu and CPU values differ by design"
_UNINIT = "output memory is uninitialised: its values are not defined"
SKIPPED_ENTRIES: Dict[str, str] = {
    "bernoulli": _RANDOM,
    "cauchy": _RANDOM,
    "exponential": _RANDOM,
    "geometric": _RANDOM,
    "log_normal": _RANDOM,
    "normal": _RANDOM,
    "normal.in_place": _RANDOM,
    "normal.number_mean": _RANDOM,
    "uniform": _RANDOM,
    "multinomial": _RANDOM,
    "rand_like": _RANDOM,
    "randn": _RANDOM,
    "randn_like": _RANDOM,
    "randint": _RANDOM,
    "randint_like": _RANDOM,
    "nn.functional.dropout": _RANDOM,
    "nn.functional.dropout2d": _RANDOM,
    "nn.functional.dropout3d": _RANDOM,
    "nn.functional.alpha_dropout": _RANDOM,
    "nn.functional.feature_alpha_dropout.with_train": _RANDOM,
    "nn.functional.rrelu": "random output: training-mode rrelu draws its slopes at random",
    "nn.functional.fractional_max_pool2d": "random output: pooling regions are drawn at random",
    "nn.functional.fractional_max_pool3d": "random output: pooling regions are drawn at random",
    "svd_lowrank": "random output: randomised range finder",
    "pca_lowrank": "random output: randomised range finder",
    "empty": _UNINIT,
    "empty_like": _UNINIT,
    "empty_strided": _UNINIT,
    "empty_permuted": _UNINIT,
    "new_empty": _UNINIT,
    "new_empty_strided": _UNINIT,
    "resize_": "output memory is uninitialised where the tensor grows",
    "resize_as_": "output memory is uninitialised where the tensor grows",
    # Not CPU ops: OpInfo lists CPU dtypes for them, but they compile CUDA code.
    "jiterator_unary": "CUDA-only: jiterator compiles a CUDA kernel",
    "jiterator_binary": "CUDA-only: jiterator compiles a CUDA kernel",
    "jiterator_4inputs_with_extra_args": "CUDA-only: jiterator compiles a CUDA kernel",
    "jiterator_binary_return_by_ref": "CUDA-only: jiterator compiles a CUDA kernel",
    "jiterator_2inputs_2outputs": "CUDA-only: jiterator compiles a CUDA kernel",
    "bmm.triton_optimized": "CUDA-only: a Triton kernel",
    # Sparse layouts are not supported by vtpu (strided tensors only).
    "to_sparse": "sparse layout: vtpu supports strided tensors only",
    "sparse.sampled_addmm": "sparse layout: vtpu supports strided tensors only",
    "sparse.mm.reduce": "sparse layout: vtpu supports strided tensors only",
}


# (entry, variant) pairs never compared, with the reason.
SKIPPED_VARIANTS: Dict[Tuple[str, str], str] = {
    (name, "bf16"): "accumulation dtype chosen per device type by torch: linear_cross_entropy's "
                    "acc_policy='auto' lists cpu and cuda (fp32 accumulation on cpu); other "
                    "devices get the bf16 'compact' fallback, so results differ by design"
    for name in ("nn.functional.linear_cross_entropy", "nn.functional.linear_cross_entropy.chunked",
                 "nn.functional.linear_cross_entropy.chunked_none")
}


def entry_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def select_entries(full: bool = FULL, only: Optional[str] = None) -> List[Any]:
    """The OpInfo entries of this run, in op_db order."""
    if only is None:
        only = os.environ.get("VTPU_OPINFO_ONLY", "").strip()
    if only:
        wanted = {name.strip() for name in only.split(",") if name.strip()}
        return [op for op in op_db if entry_name(op) in wanted or op.name in wanted]
    if full:
        return list(op_db)
    return [op for i, op in enumerate(op_db) if i % CI_STRIDE == 0 or op.name in IMPORTANT_OPS]


def static_skip_reason(op, variant: str) -> Optional[str]:
    """Why (op, variant) is not run at all, or None."""
    name = entry_name(op)
    if name in SKIPPED_ENTRIES:
        return SKIPPED_ENTRIES[name]
    if (name, variant) in SKIPPED_VARIANTS:
        return SKIPPED_VARIANTS[(name, variant)]
    dtype = VARIANT_DTYPE[variant]
    supported = op.supported_dtypes("cpu")
    if not supported:
        return "no CPU dtypes: the op does not run on the CPU"
    if dtype not in supported:
        complex_only = all(d.is_complex for d in supported)
        return ("complex-only op" if complex_only
                else f"{dtype} not supported by the op on the CPU")
    if variant == "f32_inplace" and op.inplace_variant is None:
        return "no in-place variant"
    if variant == "f32_grad":
        if not op.supports_autograd:
            return "op does not support autograd"
        if dtype not in op.supported_backward_dtypes("cpu"):
            return f"{dtype} not supported by the op's backward on the CPU"
    return None


# ---- tolerances --------------------------------------------------------------

# torch.testing.assert_close's defaults, per dtype (rtol, atol); other dtypes
# (integers, bool) compare exactly.
_DEFAULT_TOL = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def _opinfo_overrides(op, dtype: torch.dtype) -> Tuple[float, float]:
    """The largest (rtol, atol) the OpInfo entry allows for `dtype` on the CPU
    in any of its tests (its toleranceOverride decorators); (0, 0) if none."""
    rtol = atol = 0.0
    for info in getattr(op, "decorators", ()) or ():
        if getattr(info, "device_type", None) not in (None, "cpu"):
            continue
        if getattr(info, "dtypes", None) is not None and dtype not in info.dtypes:
            continue
        for decorator in getattr(info, "decorators", ()) or ():
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                override = decorator.d[dtype]
                rtol, atol = max(rtol, override.rtol), max(atol, override.atol)
    return rtol, atol


class Tolerance:
    """(rtol, atol) per result dtype: assert_close's default for that dtype,
    raised to the OpInfo entry's overrides for the sample dtype and for the
    result dtype. An int64 sample may give float results (rad2deg, mean of
    a cast); those compare with float tolerances, integer results exactly."""

    def __init__(self, op, sample_dtype: torch.dtype):
        self._op = op
        self._sample_dtype = sample_dtype
        self._cache: Dict[torch.dtype, Tuple[float, float]] = {}

    def __call__(self, dtype: torch.dtype) -> Tuple[float, float]:
        if dtype not in self._cache:
            if dtype not in _DEFAULT_TOL:
                self._cache[dtype] = (0.0, 0.0)
            else:
                candidates = [_DEFAULT_TOL[dtype], _opinfo_overrides(self._op, dtype)]
                if self._sample_dtype in _DEFAULT_TOL:
                    candidates.append(_opinfo_overrides(self._op, self._sample_dtype))
                self._cache[dtype] = (max(c[0] for c in candidates), max(c[1] for c in candidates))
        return self._cache[dtype]


# ---- moving sample inputs ----------------------------------------------------

class UnsupportedSample(Exception):
    """A sample input vtpu cannot take by design (sparse layout, generator)."""


class _Transfer:
    """Copies a sample's structure to a device, tensors with their exact
    geometry (sizes, strides, storage offset, aliasing between arguments) and
    requires_grad flags. Remembers (original, copy) pairs.

    `keep_on_cpu[i]`, where given, says that the i-th tensor met (in the
    order input, args, kwargs, depth first) stays a CPU tensor: the sample
    generator made it on the CPU whatever device it was asked for (the
    indices of tensor_split), as a CUDA test would pass it."""

    def __init__(self, device: str, keep_on_cpu: Optional[List[bool]] = None):
        self.device = device
        self.pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self._keep_on_cpu = keep_on_cpu
        self._position = 0
        self._by_id: Dict[int, torch.Tensor] = {}
        self._bases: Dict[Tuple[str, int, int], torch.Tensor] = {}

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        position = self._position
        self._position += 1
        if id(t) in self._by_id:
            return self._by_id[id(t)]
        if t.layout != torch.strided:
            raise UnsupportedSample(f"{t.layout} input: vtpu supports strided tensors only")
        device = self.device
        if self._keep_on_cpu is not None and position < len(self._keep_on_cpu) \
                and self._keep_on_cpu[position]:
            device = "cpu"
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        with torch.no_grad():
            storage = t.untyped_storage()
            numel = storage.nbytes() // t.element_size()
            key = (device, storage.data_ptr(), storage.nbytes())
            base = self._bases.get(key) if storage.nbytes() else None
            if base is None:
                base = torch.empty((numel,), dtype=t.dtype, device=device)
                if numel:
                    base.copy_(t.detach().as_strided((numel,), (1,), 0))
                if storage.nbytes():
                    self._bases[key] = base
            out = base.as_strided(t.size(), t.stride(), t.storage_offset())
        if t.requires_grad:
            out.requires_grad_(True)
        self._by_id[id(t)] = out
        self.pairs.append((t, out))
        return out

    def __call__(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if isinstance(value, torch.device):
            return torch.device(self.device) if value.type == "cpu" else value
        if isinstance(value, str) and (value == "cpu" or value.startswith("cpu:")):
            return self.device  # a device argument: `x.to("cpu")`, `device="cpu"`
        if isinstance(value, torch.Generator):
            raise UnsupportedSample("sample passes a CPU generator")
        if isinstance(value, torch.Size):
            return value
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(self(v) for v in value)
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        return value


def _sample_tensors(value: Any) -> List[torch.Tensor]:
    """The tensors of a sample structure in _Transfer's order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return [t for v in value for t in _sample_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _sample_tensors(v)]
    return []


def _placement(meta_sample) -> Optional[List[bool]]:
    """Per tensor of a sample generated for device "meta": whether the
    generator put it on the CPU anyway."""
    if meta_sample is None:
        return None
    tensors = _sample_tensors([meta_sample.input, tuple(meta_sample.args), dict(meta_sample.kwargs)])
    return [t.device.type == "cpu" for t in tensors]


def _transfer_sample(sample, device: str, keep_on_cpu: Optional[List[bool]] = None
                     ) -> Tuple[Any, tuple, dict, _Transfer]:
    if keep_on_cpu is not None and len(keep_on_cpu) != len(
            _sample_tensors([sample.input, tuple(sample.args), dict(sample.kwargs)])):
        keep_on_cpu = None  # the meta sample has another structure: move everything
    transfer = _Transfer(device, keep_on_cpu)
    return transfer(sample.input), transfer(tuple(sample.args)), transfer(dict(sample.kwargs)), transfer


# ---- comparing results -------------------------------------------------------

def _leaves(value: Any) -> List[Any]:
    """Tensors and scalars of a result, in a fixed order."""
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, dict):
        return [leaf for k in sorted(value, key=str) for leaf in _leaves(value[k])]
    return [value]


class Mismatch(AssertionError):
    pass


def _compare(actual: Any, expected: Any, tol: Callable[[torch.dtype], Tuple[float, float]],
             what: str, check_device: bool = True) -> None:
    actual_leaves, expected_leaves = _leaves(actual), _leaves(expected)
    if len(actual_leaves) != len(expected_leaves):
        raise Mismatch(f"{what}: {len(actual_leaves)} values on vtpu, {len(expected_leaves)} on cpu")
    for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        where = f"{what}[{i}]" if len(expected_leaves) > 1 else what
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{where}: vtpu returned {type(a).__name__}, cpu a tensor")
            if check_device and e.device.type == "cpu" and a.device.type != DEVICE:
                raise Mismatch(f"{where}: result on {a.device}, expected on {DEVICE}")
            a_host = a.detach().to("cpu")
            e_host = e.detach()
            if a_host.dtype != e_host.dtype or a_host.shape != e_host.shape:
                raise Mismatch(f"{where}: vtpu gave {a_host.dtype}{list(a_host.shape)}, "
                               f"cpu {e_host.dtype}{list(e_host.shape)}")
            rtol, atol = tol(e_host.dtype)
            try:
                torch.testing.assert_close(a_host, e_host, rtol=rtol, atol=atol, equal_nan=True,
                                           check_device=False, check_stride=False)
            except AssertionError as error:
                raise Mismatch(f"{where}: {error}") from None
        elif isinstance(e, float) and isinstance(a, float):
            rtol, atol = tol(torch.float64)
            if not (math.isclose(a, e, rel_tol=rtol, abs_tol=atol) or (math.isnan(a) and math.isnan(e))):
                raise Mismatch(f"{where}: vtpu gave {a!r}, cpu {e!r}")
        elif type(a) is not type(e) or a != e:
            raise Mismatch(f"{where}: vtpu gave {a!r}, cpu {e!r}")


def _bitwise_equal(a: Any, b: Any) -> bool:
    """Whether two CPU results are identical (NaNs equal)."""
    la, lb = _leaves(a), _leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                return False
            try:
                torch.testing.assert_close(x.detach(), y.detach(), rtol=0, atol=0, equal_nan=True,
                                           check_stride=False)
            except AssertionError:
                return False
        elif isinstance(x, float) and isinstance(y, float):
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            return False
    return True


# ---- running one sample ------------------------------------------------------

class SampleSkipped(Exception):
    """The sample cannot be compared (the CPU reference fails or is random)."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".strip()


def _clone_sample_cpu(sample) -> Tuple[Any, tuple, dict]:
    transfer = _Transfer("cpu")
    return transfer(sample.input), transfer(tuple(sample.args)), transfer(dict(sample.kwargs))


def _call(fn: Callable, inp: Any, args: tuple, kwargs: dict) -> Any:
    return fn(inp, *args, **kwargs)


class _RandomOpDetector(TorchDispatchMode):
    """Notes the ATen ops tagged nondeterministic_seeded (bernoulli_,
    native_dropout, normal_, ...) that a call reaches. OpInfo reseeds the CPU
    generator inside some ops (wrapper_set_seed), which makes their CPU output
    reproducible although it is random; vtpu's Philox generator draws other
    numbers by design."""

    def __init__(self):
        super().__init__()
        self.random_ops: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.random_ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _rerun_cpu(fn: Callable, inp: Any, args: tuple, kwargs: dict) -> Tuple[Any, List[str]]:
    """A second CPU run on a pristine copy of the sample: its output and the
    random ops it reached."""
    detector = _RandomOpDetector()
    try:
        with detector:
            return _call(fn, inp, args, kwargs), detector.random_ops
    except Exception:
        # Some ops do not run under a Python dispatch mode; rerun plainly.
        return _call(fn, inp, args, kwargs), detector.random_ops


def _check_reproducible(expected: Any, again: Any, random_ops: List[str]) -> None:
    if random_ops:
        raise SampleSkipped(f"random output: the op draws random numbers ({random_ops[0]})")
    if not _bitwise_equal(expected, again):
        raise SampleSkipped("cpu reference is not reproducible (random or uninitialised output)")


def _run_forward_sample(op, sample, tol: Tolerance, keep_on_cpu: Optional[List[bool]]) -> None:
    # Copies first: the op may write to its inputs.
    d_input, d_args, d_kwargs, d_transfer = _transfer_sample(sample, DEVICE, keep_on_cpu)
    c2_input, c2_args, c2_kwargs = _clone_sample_cpu(sample)
    try:
        expected = _call(op, sample.input, sample.args, sample.kwargs)
    except Exception as error:
        raise SampleSkipped(f"cpu reference raised {_first_line(error)}") from None
    _check_cpu_rerun(op, (c2_input, c2_args, c2_kwargs), expected)

    # A factory call with neither tensors nor a device argument (arange(2))
    # creates on the default device: make that vtpu, as a user would.
    default_device = torch.device(DEVICE) if not d_transfer.pairs else contextlib.nullcontext()
    with default_device:
        actual = _call(op, d_input, d_args, d_kwargs)
    _compare_result_and_inputs(actual, expected, tol, d_transfer)


def _check_cpu_rerun(fn: Callable, sample_copy: Tuple[Any, tuple, dict], expected: Any) -> None:
    """The CPU reference, run again on a copy of the sample, must repeat."""
    try:
        again, random_ops = _rerun_cpu(fn, *sample_copy)
    except Exception as error:
        raise SampleSkipped(f"cpu reference raised on a rerun: {_first_line(error)}") from None
    _check_reproducible(expected, again, random_ops)


def _compare_result_and_inputs(actual: Any, expected: Any, tol: Tolerance, d_transfer) -> None:
    _compare(actual, expected, tol, "output")
    # In-place and out= behaviour: the inputs must end up the same too.
    for original, copy in d_transfer.pairs:
        _compare(copy, original, tol, "input after the op", check_device=False)


def _run_inplace_sample(op, sample, tol: Tolerance, keep_on_cpu: Optional[List[bool]]) -> None:
    """The entry's in-place variant: the same result and mutated input as the
    CPU's, or an exception of the CPU's type where the CPU raises (an input
    that would have to grow to the broadcast shape was grown and computed
    from fresh memory before 2026-12-05)."""
    fn = op.inplace_variant
    d_input, d_args, d_kwargs, d_transfer = _transfer_sample(sample, DEVICE, keep_on_cpu)
    c2_input, c2_args, c2_kwargs = _clone_sample_cpu(sample)
    try:
        expected = _call(fn, sample.input, sample.args, sample.kwargs)
    except Exception as cpu_error:
        try:
            _call(fn, d_input, d_args, d_kwargs)
            torch.vtpu.synchronize()
        except Exception as error:
            if not isinstance(error, type(cpu_error)):
                raise Mismatch(f"cpu raised {type(cpu_error).__name__}: {_first_line(cpu_error)}; "
                               f"vtpu raised {type(error).__name__}: {_first_line(error)}") from None
            return
        raise Mismatch(f"cpu raised {type(cpu_error).__name__}: {_first_line(cpu_error)}; vtpu did not") from None
    _check_cpu_rerun(fn, (c2_input, c2_args, c2_kwargs), expected)
    _compare_result_and_inputs(_call(fn, d_input, d_args, d_kwargs), expected, tol, d_transfer)


def _differentiable(value: Any) -> List[Tuple[int, torch.Tensor]]:
    return [(i, t) for i, t in enumerate(_leaves(value))
            if isinstance(t, torch.Tensor) and t.requires_grad
            and (t.is_floating_point() or t.is_complex())]


def _run_grad_sample(op, sample, tol: Tolerance, keep_on_cpu: Optional[List[bool]]) -> None:
    d_input, d_args, d_kwargs, d_transfer = _transfer_sample(sample, DEVICE, keep_on_cpu)
    c2_input, c2_args, c2_kwargs = _clone_sample_cpu(sample)
    wrapped = lambda *a, **k: op.gradcheck_wrapper(op.get_op(), *a, **k)  # noqa: E731

    try:
        expected = sample.output_process_fn_grad(_call(wrapped, sample.input, sample.args, sample.kwargs))
        again, random_ops = _rerun_cpu(wrapped, c2_input, c2_args, c2_kwargs)
        again = sample.output_process_fn_grad(again)
    except Exception as error:
        raise SampleSkipped(f"cpu reference raised {_first_line(error)}") from None
    _check_reproducible(expected, again, random_ops)
    del again
    outputs = _differentiable(expected)
    inputs = [(o, c) for o, c in d_transfer.pairs if o.requires_grad]
    if not outputs or not inputs:
        raise SampleSkipped("no differentiable outputs or inputs")

    generator = torch.Generator().manual_seed(1234)
    cotangents = [torch.randn(t.shape, dtype=t.dtype, generator=generator) for _, t in outputs]
    try:
        expected_grads = torch.autograd.grad([t for _, t in outputs], [o for o, _ in inputs],
                                             cotangents, allow_unused=True)
    except Exception as error:
        raise SampleSkipped(f"cpu backward raised {_first_line(error)}") from None

    actual = sample.output_process_fn_grad(_call(wrapped, d_input, d_args, d_kwargs))
    leaves = _leaves(actual)
    if len(leaves) != len(_leaves(expected)):
        raise Mismatch(f"output: {len(leaves)} values on vtpu, {len(_leaves(expected))} on cpu")
    d_outputs = []
    for i, _ in outputs:
        t = leaves[i]
        if not isinstance(t, torch.Tensor) or not t.requires_grad:
            raise Mismatch(f"output[{i}] does not require grad on vtpu")
        d_outputs.append(t)
    d_cotangents = [c.to(DEVICE) for c in cotangents]
    actual_grads = torch.autograd.grad(d_outputs, [c for _, c in inputs], d_cotangents,
                                       allow_unused=True)
    for k, (a, e) in enumerate(zip(actual_grads, expected_grads)):
        if (a is None) != (e is None):
            raise Mismatch(f"grad[{k}]: {'None' if a is None else 'a tensor'} on vtpu, "
                           f"{'None' if e is None else 'a tensor'} on cpu")
        if a is not None:
            _compare(a, e, tol, f"grad[{k}]")


# ---- running one entry -------------------------------------------------------

class _MetaPlacements:
    """The same samples generated for device "meta" (same seeds, so the same
    structure), read in step with the CPU ones to learn which tensors the
    generator keeps on the CPU. Any trouble (a generator that cannot run on
    meta) turns placement off: every tensor then moves to vtpu."""

    def __init__(self, op, dtype: torch.dtype, grad: bool):
        try:
            self._iter: Optional[Iterator[Any]] = iter(op.sample_inputs("meta", dtype, requires_grad=grad))
        except Exception:
            self._iter = None

    def next(self) -> Optional[List[bool]]:
        if self._iter is None:
            return None
        try:
            return _placement(next(self._iter))
        except Exception:
            self._iter = None
            return None


class EntryTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    """Raises EntryTimeout in the main thread after `seconds` (best effort: a
    thread blocked inside C++ only sees it when it returns to Python; the
    report runner kills hung worker processes from outside)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "SIGALRM"):
        yield
        return

    def on_alarm(signum, frame):
        raise EntryTimeout(f"timed out after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _drain_device() -> Optional[str]:
    """Waits for queued vtpu work; returns the first line of an error it raised."""
    try:
        torch.vtpu.synchronize()
    except Exception as error:  # an asynchronous kernel error surfaces here
        return _first_line(error)
    return None


def run_entry(op, variant: str, max_samples: int = MAX_SAMPLES,
              timeout_s: int = ENTRY_TIMEOUT_S) -> Dict[str, Any]:
    """Runs one (OpInfo entry, variant) on vtpu and the CPU. Returns a result
    dict: status "pass" | "fail" | "skip", reason (first line), details, and
    leaked_bytes: device memory still allocated after the entry released
    everything it held. A leak counts only if every one of three runs leaks
    (the least of them is reported): a cache that some run fills once is not
    a leak."""
    result = _run_entry_once(op, variant, max_samples, timeout_s)
    for _ in range(2):
        if result["leaked_bytes"] == 0 or result["status"] == "skip":
            break
        again = _run_entry_once(op, variant, max_samples, timeout_s)["leaked_bytes"]
        result["leaked_bytes"] = min(result["leaked_bytes"], again)
    return result


def _run_entry_once(op, variant: str, max_samples: int, timeout_s: int) -> Dict[str, Any]:
    result: Dict[str, Any] = {
        "entry": entry_name(op), "op": op.name, "variant": variant,
        "status": "skip", "reason": "", "detail": "", "compared": 0, "skipped_samples": 0,
        "seconds": 0.0, "leaked_bytes": 0,
    }
    reason = static_skip_reason(op, variant)
    if reason is not None:
        result["reason"] = reason
        return result

    dtype = VARIANT_DTYPE[variant]
    grad = variant == "f32_grad"
    tol = Tolerance(op, dtype)
    run_sample = (_run_grad_sample if grad else _run_inplace_sample if variant == "f32_inplace"
                  else _run_forward_sample)
    start = time.monotonic()
    stale = _drain_device()  # an earlier entry's late error must not land here
    memory_before = torch.vtpu.memory_allocated()
    failures: List[Tuple[int, str, str]] = []
    skip_reasons: List[str] = []
    try:
        with _time_limit(timeout_s):
            samples = op.sample_inputs("cpu", dtype, requires_grad=grad)
            placements = _MetaPlacements(op, dtype, grad)
            for index, sample in enumerate(itertools.islice(samples, max_samples)):
                keep_on_cpu = placements.next()
                try:
                    run_sample(op, sample, tol, keep_on_cpu)
                    late = _drain_device()
                    if late is not None:
                        raise RuntimeError(f"asynchronous error: {late}")
                    result["compared"] += 1
                except (SampleSkipped, UnsupportedSample) as skip:
                    skip_reasons.append(str(skip))
                except EntryTimeout:
                    raise
                except Exception as error:
                    result["compared"] += 1
                    failures.append((index, _first_line(error),
                                     "".join(traceback.format_exception_only(type(error), error))))
                    _drain_device()
                finally:
                    sample = None
    except EntryTimeout as error:
        failures.append((-1, f"EntryTimeout: {error}", ""))
    except Exception as error:
        # Only the sample generator (CPU code of the OpInfo database) gets
        # here: every sample's own errors are caught above. The samples
        # compared before it stopped stand.
        skip_reasons.append(f"sample inputs raised {_first_line(error)}")

    # Release everything this entry allocated on the device.
    gc.collect()
    late = _drain_device()
    if late is not None:
        failures.append((-1, f"asynchronous error: {late}", ""))
    torch.vtpu.empty_cache()
    result["leaked_bytes"] = max(0, torch.vtpu.memory_allocated() - memory_before)
    result["seconds"] = round(time.monotonic() - start, 3)
    result["skipped_samples"] = len(skip_reasons)
    if stale is not None:
        result["stale_error"] = stale

    if failures:
        index, first, detail = failures[0]
        result["status"] = "fail"
        result["reason"] = first
        result["detail"] = (f"sample {index}: " if index >= 0 else "") + detail[:4000]
        result["failed_samples"] = len(failures)
    elif result["compared"] == 0:
        result["status"] = "skip"
        result["reason"] = ("no comparable samples: " + skip_reasons[0]) if skip_reasons \
            else "no sample inputs"
    else:
        result["status"] = "pass"
    return result


# ---- isolation: entries run in a worker process ------------------------------

def bridge_build_id() -> str:
    """Identifies the installed bridge build (its shared object's mtime and size)."""
    so = Path(torch_vtpu._C.__file__)
    stat = so.stat()
    return f"{so.name}:{int(stat.st_mtime)}:{stat.st_size}"


def run_header(full: bool, max_samples: int = MAX_SAMPLES) -> Dict[str, Any]:
    return {
        "kind": "header", "torch": torch.__version__, "vtpu": torch_vtpu.__version__,
        "bridge_build": bridge_build_id(), "mode": torch_vtpu.get_mode(), "full": full,
        "max_samples": max_samples, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _worker_main() -> None:
    """`python test_opinfo.py --worker`: reads {"entry", "variant"} requests,
    one JSON line each, on stdin and answers one result line each."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # whatever ops print must not corrupt the protocol
    faulthandler.enable()
    threads = os.environ.get("VTPU_OPINFO_THREADS", "")
    if threads:
        torch.set_num_threads(int(threads))
    ops = {entry_name(op): op for op in op_db}
    protocol.write(json.dumps(run_header(FULL)) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.write(f"[opinfo worker] {request['entry']} {request['variant']}\n")
        sys.stderr.flush()
        result = run_entry(ops[request["entry"]], request["variant"],
                           max_samples=int(request.get("max_samples", MAX_SAMPLES)),
                           timeout_s=int(request.get("timeout_s", ENTRY_TIMEOUT_S)))
        protocol.write(json.dumps(result) + "\n")


class WorkerStartError(RuntimeError):
    """The worker process did not come up (torch_vtpu does not import)."""


class Worker:
    """A worker process that runs entries for this one. A crash (a segfault
    in the bridge) or a hang fails only the entry that caused it; the next
    request starts a fresh worker."""

    STARTUP_TIMEOUT_S = 300

    def __init__(self, env: Optional[Dict[str, str]] = None):
        self._env = {**os.environ, **(env or {})}
        self._proc: Optional[subprocess.Popen] = None
        self._stderr = None
        self.header: Optional[Dict[str, Any]] = None
        self.restarts = 0

    def _start(self) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+b")
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            env=self._env, start_new_session=True, text=True, bufsize=1)
        line = self._read_line(self.STARTUP_TIMEOUT_S)
        if not line:
            tail = self._stderr_tail()
            self.close()
            raise WorkerStartError(f"opinfo worker failed to start:\n{tail}")
        self.header = json.loads(line)

    def _read_line(self, timeout_s: float) -> Optional[str]:
        """The worker's next line; "" when it closed its end (it died), None
        when nothing came within timeout_s (it hangs)."""
        assert self._proc is not None and self._proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            if not selector.select(timeout_s):
                return None
        return self._proc.stdout.readline()

    def _stderr_tail(self, limit: int = 3000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - limit))
        return self._stderr.read().decode("utf-8", "replace")

    def run(self, entry: str, variant: str, timeout_s: int = ENTRY_TIMEOUT_S,
            max_samples: int = MAX_SAMPLES) -> Dict[str, Any]:
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"entry": entry, "variant": variant, "timeout_s": timeout_s,
                                           "max_samples": max_samples}) + "\n")
        self._proc.stdin.flush()
        # The worker's own alarm fires at timeout_s; this is the hard limit
        # for hangs inside C++ (a deadlocked stream), which it cannot see.
        line = self._read_line(timeout_s + 30)
        if line:
            return json.loads(line)
        code = None
        if line == "":  # end of file: the worker is dying; let it finish
            try:
                code = self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        if code is None:
            reason = f"EntryTimeout: no answer within {timeout_s + 30} s; worker killed"
        else:
            name = signal.Signals(-code).name if code < 0 else f"exit code {code}"
            reason = f"WorkerCrash: the process died ({name})"
        detail = self._stderr_tail()
        # faulthandler lists the crashing thread's frames innermost first.
        frame = re.search(r'most recent call first\):\n\s+File "([^"]+)", line (\d+) in (\S+)', detail)
        if code is not None and frame:
            reason += f" in {Path(frame.group(1)).name}:{frame.group(2)} {frame.group(3)}"
        self.close()
        self.restarts += 1
        return {"entry": entry, "variant": variant, "status": "fail", "reason": reason,
                "detail": detail, "compared": 1, "skipped_samples": 0, "seconds": 0.0,
                "leaked_bytes": 0}

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    stream.close()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


# ---- results file ------------------------------------------------------------

def results_path() -> Optional[Path]:
    path = os.environ.get("VTPU_OPINFO_RESULTS", "")
    if path:
        return Path(path)
    return DEFAULT_RESULTS if FULL else None


class ResultWriter:
    """Appends one JSON line per result, flushed at once, so a run that
    stops part-way leaves every result before that on disk."""

    def __init__(self, path: Path, header: Dict[str, Any], truncate: bool = True):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w" if truncate else "a", encoding="utf-8")
        self._lock = threading.Lock()
        self.write(header)

    def write(self, record: Dict[str, Any]) -> None:
        with self._lock:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


# ---- pytest ------------------------------------------------------------------

# VTPU_OPINFO_INPROCESS=1 runs entries in the pytest process itself (easier
# to debug; a crashing op then ends the whole run).
IN_PROCESS = os.environ.get("VTPU_OPINFO_INPROCESS", "") not in ("", "0")


def param_id(op, variant: str) -> str:
    return f"{op.name}.{variant}" + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _params() -> List[Any]:
    return [pytest.param(op, variant, id=param_id(op, variant))
            for op in select_entries() for variant in VARIANTS]


@pytest.fixture(scope="module")
def runner():
    worker = None if IN_PROCESS else Worker()
    path = results_path()
    writer = ResultWriter(path, run_header(FULL)) if path is not None else None

    def run(op, variant: str) -> Dict[str, Any]:
        if static_skip_reason(op, variant) is not None or worker is None:
            result = run_entry(op, variant)
        else:
            result = worker.run(entry_name(op), variant)
        if writer is not None:
            writer.write({"kind": "result", "bridge_build": bridge_build_id(), **result})
        return result

    yield run
    if worker is not None:
        worker.close()
    if writer is not None:
        writer.close()


@pytest.mark.parametrize("op, variant", _params())
def test_opinfo(op, variant, runner):
    result = runner(op, variant)
    if result["status"] == "skip":
        pytest.skip(result["reason"])
    if result["status"] == "fail":
        pytest.fail(f"{result['entry']} [{VARIANT_LABEL[variant]}] {result['reason']}\n{result['detail']}",
                    pytrace=False)
    assert result["status"] == "pass" and result["compared"] > 0


def test_selection_is_deterministic_and_covers_important_ops():
    slice_a = [entry_name(op) for op in select_entries(full=False, only="")]
    slice_b = [entry_name(op) for op in select_entries(full=False, only="")]
    assert slice_a == slice_b
    assert len(slice_a) < len(op_db) // 4
    names = {op.name for op in select_entries(full=False, only="")}
    missing = [name for name in IMPORTANT_OPS if name not in names]
    assert not missing, f"important ops absent from op_db: {missing}"
    known = {entry_name(op) for op in op_db}
    unknown = sorted((set(SKIPPED_ENTRIES) | {e for e, _ in SKIPPED_VARIANTS}) - known)
    assert not unknown, f"skip list names entries op_db does not have: {unknown}"


def test_sweep_machinery_compares_and_detects_a_wrong_result():
    # The harness itself: a correct op passes, and a deliberately wrong vtpu
    # result is caught (the comparison is not vacuous).
    op = next(op for op in op_db if entry_name(op) == "add")
    assert run_entry(op, "f32")["status"] == "pass"
    sample = next(iter(op.sample_inputs("cpu", torch.float32)))
    d_input, d_args, d_kwargs, _ = _transfer_sample(sample, DEVICE)
    assert d_input.device.type == DEVICE
    assert d_input.stride() == sample.input.stride()
    wrong = op(d_input, *d_args, **d_kwargs) + 1
    with pytest.raises(Mismatch):
        _compare(wrong, op(sample.input, *sample.args, **sample.kwargs), Tolerance(op, torch.float32), "output")


if __name__ == "__main__" and "--worker" in sys.argv:
    _worker_main()
