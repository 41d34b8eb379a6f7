"""The host-kernel path remembers meta kernels' results per argument geometry
(bridge/meta_cache.h). A remembered result must never stand in for a call
whose shapes, strides, dtypes or non-tensor arguments differ, and argument
errors must still be raised."""
import pytest
import torch
import torch.nn.functional as F

import torch_vtpu


def test_layer_norm_results_follow_shape_stride_and_arguments():
    torch.manual_seed(0)
    w = torch.randn(16)
    b = torch.randn(16)
    cases = [torch.randn(4, 16), torch.randn(4, 16), torch.randn(6, 16), torch.randn(16, 6).t(),
             torch.randn(2, 3, 16)]
    torch_vtpu.reset_metrics()
    for x in cases:
        for eps in (1e-5, 1e-2):
            got = F.layer_norm(x.to("vtpu"), (16,), w.to("vtpu"), b.to("vtpu"), eps)
            want = F.layer_norm(x, (16,), w, b, eps)
            assert got.shape == want.shape
            torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert torch_vtpu.metrics()["host_fallback_ops"].get("aten::native_layer_norm", 0) == 2 * len(cases)


def test_matmul_errors_are_raised_after_successful_calls():
    a = torch.randn(8, 5, device="vtpu")
    b = torch.randn(5, 3, device="vtpu")
    for _ in range(3):
        assert (a @ b).shape == (8, 3)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        a @ torch.randn(4, 3, device="vtpu")
    with pytest.raises(RuntimeError):
        torch.addmm(torch.randn(8, 3, device="vtpu"), a, torch.randn(6, 3, device="vtpu"))
    torch.testing.assert_close((a @ b).cpu(), a.cpu() @ b.cpu())


def test_batch_norm_training_updates_running_stats_each_call():
    bn = torch.nn.BatchNorm2d(4)
    dev = torch.nn.BatchNorm2d(4).to("vtpu")
    for i in range(3):
        x = torch.randn(2, 4, 5, 5) * (i + 1)
        torch.testing.assert_close(dev(x.to("vtpu")).cpu(), bn(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dev.running_mean.cpu(), bn.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dev.running_var.cpu(), bn.running_var, rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_functional_batch_norm_writes_running_stats_once_per_call(memory_format):
    """`_native_batch_norm_legit` (the form compiled graphs call) writes its
    running statistics and returns fresh tensors: the host path runs it through
    its out= variant, snapshotting the statistics in case the out= call has to
    be abandoned; either way each call must update them exactly once."""
    torch.manual_seed(0)
    weight, bias = torch.randn(4), torch.randn(4)
    mean, var = torch.zeros(4), torch.ones(4)
    dev = [t.to("vtpu") for t in (weight, bias, mean, var)]
    for i in range(3):
        x = (torch.randn(2, 4, 5, 5) * (i + 1)).to(memory_format=memory_format)
        want = torch.ops.aten._native_batch_norm_legit(x, weight, bias, mean, var, True, 0.1, 1e-5)
        got = torch.ops.aten._native_batch_norm_legit(x.to("vtpu"), *dev, True, 0.1, 1e-5)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.stride() == w.stride()
            # Training-mode batch norm runs vTPU's ops (test_batch_norm.py):
            # equal to rounding; a second update would be off by ~10%.
            torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dev[2].cpu(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dev[3].cpu(), var, rtol=1e-5, atol=1e-6)

def test_out_arguments_are_resized_as_their_first_call_said():
    a = torch.randn(8, 5)
    b = torch.randn(5, 3)
    da, db = a.to("vtpu"), b.to("vtpu")
    for _ in range(3):
        out = torch.empty(0, device="vtpu")
        torch.mm(da, db, out=out)
        assert out.shape == (8, 3)
        torch.testing.assert_close(out.cpu(), a @ b)
    sized = torch.empty(8, 3, device="vtpu")
    torch.mm(da, db, out=sized)
    torch.testing.assert_close(sized.cpu(), a @ b)
    # Same shapes, the other operand order: a different key, a different shape.
    out = torch.empty(0, device="vtpu")
    torch.mm(db.t(), da.t(), out=out)
    assert out.shape == (3, 8)
    torch.testing.assert_close(out.cpu(), b.t() @ a.t())


def test_in_place_shape_errors_are_raised_after_successful_calls():
    x = torch.randn(4, 6, device="vtpu")
    m1, m2 = torch.randn(4, 2, device="vtpu"), torch.randn(2, 6, device="vtpu")
    for _ in range(3):
        x.addmm_(m1, m2)
    with pytest.raises(RuntimeError):
        x.addmm_(torch.randn(4, 2, device="vtpu"), torch.randn(2, 7, device="vtpu"))
    want = torch.randn(4, 6)
    got = want.to("vtpu")
    got.addmm_(m1, m2)
    torch.testing.assert_close(got.cpu(), want.addmm(m1.cpu(), m2.cpu()))


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_cpu_masks_decide_shapes_by_their_values(mode):
    # An integer or bool CPU tensor argument is read by the meta kernel: its
    # values, not only its shape, decide the result's shape. Remembered by
    # metadata, x[all-false CPU mask] came back with the rows of an earlier
    # mask of the same shape (and the asynchronous check raised later), which
    # also broke index_put's gradient (found by the OpInfo sweep).
    torch_vtpu.set_mode(mode)
    try:
        x = torch.randn(5, 5)
        masks = [torch.tensor([True, True, False, True, False]), torch.zeros(5, dtype=torch.bool),
                 torch.ones(5, dtype=torch.bool), torch.tensor([True, True, False, True, False])]
        for mask in masks:
            got = x.to("vtpu")[mask]
            assert got.shape == x[mask].shape
            assert torch.equal(got.cpu(), x[mask])
        for mask in masks:
            leaf = torch.randn(5, 5, requires_grad=True)
            v = torch.randn(5, requires_grad=True)
            cot = torch.randn(5, 5)
            want = torch.autograd.grad([torch.index_put(leaf, (mask,), v, accumulate=True)], [leaf, v], [cot])
            d_leaf, d_v = leaf.detach().to("vtpu").requires_grad_(), v.detach().to("vtpu").requires_grad_()
            got = torch.autograd.grad([torch.index_put(d_leaf, (mask,), d_v, accumulate=True)], [d_leaf, d_v],
                                      [cot.to("vtpu")])
            for g, w in zip(got, want):  # v's gradient is a sum over the chosen rows: last bits
                assert g.shape == w.shape
                torch.testing.assert_close(g.cpu(), w, rtol=1e-6, atol=1e-6)
        torch.vtpu.synchronize()
    finally:
        torch_vtpu.set_mode("strict")


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_a_python_number_and_a_zero_dim_tensor_promote_apart(mode):
    # A wrapped Python number promotes as a number (int64 // 1.0 is float32),
    # a 0-dim float64 tensor as a tensor (float64). Keyed alike, whichever
    # call came first decided the other's dtype (found by review: floor
    # division, which takes the host-kernel path).
    torch_vtpu.set_mode(mode)
    try:
        x = torch.tensor([16777217, 3], dtype=torch.int64)
        for divisor in (1.0, torch.tensor(1.0, dtype=torch.float64), 2.0, torch.tensor(2.0, dtype=torch.float64)):
            for fn in (lambda a, b: a // b, lambda a, b: torch.floor_divide(b, a) if isinstance(b, float) else b // a):
                want = fn(x, divisor)
                got = fn(x.to("vtpu"), divisor)
                assert got.dtype == want.dtype, (divisor, got.dtype, want.dtype)
                assert torch.equal(got.cpu(), want)
    finally:
        torch_vtpu.set_mode("strict")
