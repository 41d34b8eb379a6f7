"""nn.EmbeddingBag on vtpu against the CPU.

The forward runs ATen's CPU kernel (host-kernel path). The backward of mode
"sum" without per-sample weights, scale_grad_by_freq or include_last_offset
runs as generated kernels (each index's bag row of the gradient, then
embedding_dense_backward's sorted accumulation in double): equal to the CPU's
up to summation order, and bitwise equal across vtpu's modes. The other cases
stay on ATen's kernel.
"""
import pytest
import torch
from torch import nn

import torch_vtpu

ROWS, DIM = 50, 8


def _bags(index_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, ROWS, (40,), generator=g)
    indices[::7] = 3  # repeats: rows with several contributions
    # Bag starts, with an empty bag (two equal offsets) in the middle.
    offsets = torch.tensor([0, 5, 5, 12, 20, 33])
    return indices.to(index_dtype), offsets.to(index_dtype)


def _step(device, bag_kwargs, indices, offsets, weight, use_offsets=True):
    torch.manual_seed(0)
    bag = nn.EmbeddingBag(ROWS, DIM, **bag_kwargs)
    with torch.no_grad():
        bag.weight.copy_(weight)
    bag = bag.to(device)
    if use_offsets:
        out = bag(indices.to(device), offsets.to(device))
    else:  # 2-dim input: fixed-size bags, no offsets
        out = bag(indices.view(-1, 4).to(device))
    grad = torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device)
    out.backward(grad)
    return out.detach().cpu(), bag.weight.grad.cpu()


CASES = {
    "sum": dict(mode="sum"),
    "sum_padding_idx": dict(mode="sum", padding_idx=3),
    "sum_scale_grad_by_freq": dict(mode="sum", scale_grad_by_freq=True),
    "sum_include_last_offset": dict(mode="sum", include_last_offset=True),
    "mean": dict(mode="mean"),
    "max": dict(mode="max"),
}
GENERATED_BACKWARD = {"sum", "sum_padding_idx"}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_forward_and_weight_gradient_match_cpu(name, index_dtype):
    indices, offsets = _bags(index_dtype, seed=1)
    if CASES[name].get("include_last_offset"):  # the last offset closes the last bag
        offsets = torch.cat([offsets, torch.tensor([indices.numel()], dtype=index_dtype)])
    weight = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(2))
    torch_vtpu.reset_metrics()
    cpu_out, cpu_grad = _step("cpu", CASES[name], indices, offsets, weight)
    out, grad = _step("vtpu", CASES[name], indices, offsets, weight)
    torch.testing.assert_close(out, cpu_out, rtol=0, atol=0)  # ATen's forward kernel
    torch.testing.assert_close(grad, cpu_grad, rtol=1e-6, atol=1e-6)
    fallbacks = torch_vtpu.metrics()["host_fallback_ops"]
    on_aten = any("_embedding_bag_backward" in op for op in fallbacks)
    assert on_aten == (name not in GENERATED_BACKWARD), fallbacks


def test_fixed_size_bags_without_offsets_match_cpu():
    indices, offsets = _bags(torch.int64, seed=3)
    weight = torch.randn(ROWS, DIM)
    _, cpu_grad = _step("cpu", dict(mode="sum"), indices, offsets, weight, use_offsets=False)
    _, grad = _step("vtpu", dict(mode="sum"), indices, offsets, weight, use_offsets=False)
    torch.testing.assert_close(grad, cpu_grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["debug", "fused"])
def test_modes_give_strict_bits(mode):
    indices, offsets = _bags(torch.int64, seed=4)
    weight = torch.randn(ROWS, DIM)
    _, strict = _step("vtpu", dict(mode="sum"), indices, offsets, weight)
    with torch_vtpu.mode(mode):
        _, other = _step("vtpu", dict(mode="sum"), indices, offsets, weight)
        torch.vtpu.synchronize()
    assert torch.equal(other, strict)


def test_gradient_adds_each_bag_row_once_per_index():
    """A hand-checked case: index 1 in two bags, index 2 twice in one bag."""
    weight = torch.zeros(4, 2, device="vtpu", requires_grad=True)
    out = nn.functional.embedding_bag(torch.tensor([1, 2, 2, 1], device="vtpu"), weight,
                                      torch.tensor([0, 3], device="vtpu"), mode="sum")
    out.backward(torch.tensor([[1.0, 2.0], [10.0, 20.0]], device="vtpu"))
    assert torch.equal(weight.grad.cpu(), torch.tensor([[0.0, 0.0], [11.0, 22.0], [2.0, 4.0], [0.0, 0.0]]))


def _forward_cases():
    for op in ("_embedding_bag", "_embedding_bag_forward_only"):
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            for mode in (0, 1, 2):
                for padding_idx in (-1, 2):
                    for include_last_offset in (False, True):
                        for layout in ("contiguous", "transposed"):
                            for index_dtypes in ((torch.int64, torch.int64), (torch.int32, torch.int32),
                                                 (torch.int32, torch.int64)):
                                yield op, dtype, mode, padding_idx, include_last_offset, layout, index_dtypes
            # per-sample weights (mode "sum" only), contiguous and strided
            for psw_stride in (1, 2):
                yield op, torch.float32, 0, -1, False, "contiguous", (torch.int64, torch.int64), psw_stride


def test_forward_results_have_the_cpu_kernels_shapes_without_synchronising():
    """The index results' shapes and dtypes come from a rule (host_path_rules.cpp), not a sync:
    every combination gives the CPU kernel's four results, values included."""
    torch_vtpu.reset_metrics()
    checked = 0
    for case in _forward_cases():
        op, dtype, mode, padding_idx, include_last_offset, layout, (index_dtype, offset_dtype) = case[:7]
        psw_stride = case[7] if len(case) > 7 else None
        weight = torch.randn(10, 4, dtype=dtype) if layout == "contiguous" else torch.randn(4, 10, dtype=dtype).t()
        indices = torch.tensor([1, 2, 3, 3, 4, 5], dtype=index_dtype)
        offsets = torch.tensor([0, 2, 4] + ([6] if include_last_offset else []), dtype=offset_dtype)
        psw_base = None if psw_stride is None else torch.rand(6 * psw_stride, dtype=dtype)
        psw = None if psw_base is None else psw_base[::psw_stride]
        args = (False, mode, False, psw, include_last_offset, padding_idx)
        fn = getattr(torch.ops.aten, op)
        expected = fn(weight, indices, offsets, *args)
        to_dev = lambda t: None if t is None else t.to("vtpu")
        weight_v = weight.to("vtpu") if layout == "contiguous" else weight.t().contiguous().to("vtpu").t()
        psw_v = None if psw_base is None else psw_base.to("vtpu")[::psw_stride]  # the same strides as on the CPU
        got = fn(weight_v, to_dev(indices), to_dev(offsets), False, mode, False, psw_v, include_last_offset,
                 padding_idx)
        for k, (g, e) in enumerate(zip(got, expected)):
            assert g.shape == e.shape and g.dtype == e.dtype, (case, k, g.shape, e.shape, g.dtype, e.dtype)
            if k == 0 or k == 2 or (k == 3 and mode == 2):  # the bags' values (the rest is scratch)
                assert torch.equal(g.cpu(), e), (case, k)
        checked += 1
    torch.vtpu.synchronize()
    assert checked == 2 * 3 * (3 * 2 * 2 * 2 * 3 + 2)  # ops x dtypes x (combinations + weighted)
    assert "meta_disagrees_with_cpu" not in torch_vtpu.metrics()["syncs"], torch_vtpu.metrics()["syncs"]


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
@pytest.mark.parametrize("bag_mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 5])
def test_offsets_out_of_order_or_range_raise(mode, bag_mode, padding_idx):
    # ATen's CPU kernel checks the offsets only on its multi-threaded path; on
    # one thread (where the host-kernel path runs small ops) it returned
    # uninitialised memory for decreasing offsets, silently.
    torch_vtpu.set_mode(mode)
    torch.manual_seed(0)
    w = torch.randn(10, 4).to("vtpu")
    idx = torch.tensor([1, 2, 3], device="vtpu")
    kwargs = dict(mode=bag_mode, padding_idx=padding_idx)
    for bad, message in (([0, 2, 1], "non-decreasing.*offsets\\[2\\] = 1"), ([0, 1, 4], "offsets\\[2\\] = 4 is outside the 3")):
        with pytest.raises(RuntimeError, match=message):
            nn.functional.embedding_bag(idx, w, torch.tensor(bad, device="vtpu"), **kwargs).cpu()
    # Valid offsets, with empty bags and a bag ending at the last index, still match the CPU.
    off = torch.tensor([0, 0, 2, 3])
    got = nn.functional.embedding_bag(idx, w, off.to("vtpu"), **kwargs).cpu()
    expected = nn.functional.embedding_bag(idx.cpu(), w.cpu(), off, **kwargs)
    torch.testing.assert_close(got, expected)
