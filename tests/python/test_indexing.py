"""Advanced indexing (aten::index.Tensor) on vtpu against the CPU.

A boolean mask makes the result's shape depend on the data: the op runs once, at
the call, on ATen's CPU kernel (one synchronisation). index.Tensor's structured
composite used to take the mask's nonzero on the device first and then run
index.Tensor_out at the call again (two synchronisations, x[x > 0] 2.2-2.4x the
CPU's time; a performance review)."""
import pytest
import torch

import torch_vtpu

MODES = ["strict", "fused", "debug"]


@pytest.mark.parametrize("mode", MODES)
def test_a_boolean_mask_synchronises_once_and_gives_the_cpus_result(mode):
    torch.manual_seed(0)
    x = torch.randn(64, 33)
    mask = x > 0
    with torch_vtpu.mode(mode):
        xv, mv = x.to("vtpu"), mask.to("vtpu")
        torch.vtpu.synchronize()
        torch_vtpu.reset_metrics()
        got = xv[mv]
        syncs = torch_vtpu.metrics()["syncs"]
        assert torch.equal(got.cpu(), x[mask])
    assert syncs.get("data_dependent_op", 0) == 1, syncs


@pytest.mark.parametrize("mode", MODES)
def test_masks_mixed_with_integer_indices_slices_and_gradients(mode):
    torch.manual_seed(1)
    x = torch.randn(10, 12, 7)
    rows, cols = torch.rand(10) > 0.4, torch.rand(12) > 0.5
    idx = torch.tensor([0, 3, 3, 9])
    cases = [
        lambda t, r, c, i: t[r],
        lambda t, r, c, i: t[:, c],
        lambda t, r, c, i: t[r, 2:5],
        lambda t, r, c, i: t[i][:, c],
        lambda t, r, c, i: t[i, :, torch.tensor([1, 6, 2, 0], device=t.device)],  # integer indices only: queued
        lambda t, r, c, i: t[r.unsqueeze(1).expand(10, 12) & c],
    ]
    with torch_vtpu.mode(mode):
        for n, case in enumerate(cases):
            want = case(x, rows, cols, idx)
            got = case(x.to("vtpu"), rows.to("vtpu"), cols.to("vtpu"), idx.to("vtpu")).cpu()
            assert torch.equal(got, want), n
            leaf_c, leaf_v = x.clone().requires_grad_(), x.to("vtpu").requires_grad_()
            (case(leaf_c, rows, cols, idx) * 3).sum().backward()
            (case(leaf_v, rows.to("vtpu"), cols.to("vtpu"), idx.to("vtpu")) * 3).sum().backward()
            assert torch.equal(leaf_v.grad.cpu(), leaf_c.grad), n


def test_bad_masks_and_indices_raise_the_cpus_errors():
    x = torch.randn(6, 4)
    for index in (torch.ones(5, dtype=torch.bool), torch.tensor([6]), torch.tensor([-7])):
        with pytest.raises(IndexError) as cpu_error:
            x[index]
        with pytest.raises(IndexError) as vtpu_error:
            x.to("vtpu")[index.to("vtpu")].cpu()
        assert str(cpu_error.value).split(" at index")[0].split(" (")[0] in str(vtpu_error.value)
    # The device stays usable.
    assert torch.equal(x.to("vtpu")[x.to("vtpu") > 0].cpu(), x[x > 0])
