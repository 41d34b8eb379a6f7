"""Metrics count what really happened."""
import torch

import torch_vtpu

CONTRACT_KEYS = {"ops", "kernels_launched", "fused_kernels", "compiles", "cache_hits",
                 "cache_misses", "host_fallback_ops", "syncs"}


def test_contract_keys():
    m = torch_vtpu.metrics()
    assert CONTRACT_KEYS <= set(m)
    assert set(m["cache_hits"]) == {"memory", "disk", "shared"}


def test_counts_ops_kernels_fallbacks_and_syncs():
    x = torch.randn(8, device="vtpu")
    torch.vtpu.synchronize()
    torch_vtpu.reset_metrics()
    y = torch.cumsum(x, 0)  # host-kernel path
    z = y + 1  # native pointwise path
    value = z.sum().item()
    m = torch_vtpu.metrics()
    assert m["ops"] >= 4
    assert m["kernels_launched"] >= 3
    assert m["host_fallback_ops"].get("aten::cumsum.out", 0) + m["host_fallback_ops"].get("aten::cumsum", 0) >= 1
    assert m["syncs"] == {"item": 1}
    assert abs(value - (torch.cumsum(x.cpu(), 0) + 1).sum().item()) < 1e-4
    torch_vtpu.reset_metrics()
    assert torch_vtpu.metrics()["ops"] == 0


def test_data_dependent_op_syncs_with_reason():
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], device="vtpu")
    torch.vtpu.synchronize()
    torch_vtpu.reset_metrics()
    nz = torch.nonzero(x)
    assert nz.shape == (2, 1)
    syncs = torch_vtpu.metrics()["syncs"]
    assert syncs.get("data_dependent_op", 0) + syncs.get("op_without_meta", 0) >= 1


def test_per_op_device_time_only_while_profiling():
    import pytest

    a = torch.randn(64, 64, device="vtpu")
    torch_vtpu.reset_metrics()
    (a @ a).sum()
    torch.vtpu.synchronize()
    assert "device_time_by_op" not in torch_vtpu.metrics()
    torch_vtpu.profile_ops(True)
    try:
        torch_vtpu.reset_metrics()
        for _ in range(3):
            b = torch.exp(a @ a)
        torch.vtpu.synchronize()
        by_op = torch_vtpu.metrics()["device_time_by_op"]
        assert by_op["aten::mm.out"][1] == 3 and by_op["aten::mm.out"][0] > 0, by_op
        assert by_op["exp"][1] == 3, by_op
        torch.testing.assert_close(b.cpu(), torch.exp(a.cpu() @ a.cpu()))
    finally:
        torch_vtpu.profile_ops(False)
    with pytest.raises(TypeError, match="bool"):
        torch_vtpu.profile_ops("yes")
