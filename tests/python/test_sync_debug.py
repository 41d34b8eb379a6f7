"""torch.vtpu.set_sync_debug_mode: implicit host synchronisations warn or raise,
the waits a user asks for do not (torch.cuda's semantics)."""
import warnings

import pytest
import torch

import torch_vtpu

PHRASE = "called a synchronizing vtpu operation"


def _sync_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught if PHRASE in str(w.message)]


def test_modes_round_trip_and_bad_values_are_refused():
    assert torch.vtpu.get_sync_debug_mode() == 0
    for value, level in [("warn", 1), ("error", 2), ("default", 0), (1, 1), (2, 2), (0, 0)]:
        torch.vtpu.set_sync_debug_mode(value)
        assert torch.vtpu.get_sync_debug_mode() == level
    with pytest.raises(RuntimeError, match="expected one of"):
        torch.vtpu.set_sync_debug_mode("loud")
    with pytest.raises(RuntimeError, match="0, 1 or 2"):
        torch.vtpu.set_sync_debug_mode(3)
    for bad in (1.0, None, True):
        with pytest.raises(TypeError):
            torch.vtpu.set_sync_debug_mode(bad)
    assert torch.vtpu.get_sync_debug_mode() == 0


HOST_SYNCS = {
    # name: (function of a vtpu tensor and its CPU twin, reason in the message)
    "item": (lambda t: t.sum().item(), "syncs\"][\"item\"]"),
    "bool": (lambda t: bool((t > 100).any()), "syncs\"][\"item\"]"),
    "cpu": (lambda t: t.cpu(), "copy_to_cpu"),
    "tolist": (lambda t: t.tolist(), "copy_to_cpu"),
    "repr": (lambda t: repr(t).replace(", device='vtpu:0'", ""), "copy_to_cpu"),
    "nonzero": (lambda t: torch.nonzero(t > 2), "aten::nonzero, whose output shape depends on the values"),
    "masked_select": (lambda t: torch.masked_select(t, t > 2), "aten::masked_select"),
}


def _same(got, want):
    if isinstance(got, torch.Tensor):
        return torch.equal(got.cpu(), want)
    return got == want


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("case", list(HOST_SYNCS))
def test_warn_mode_warns_at_each_host_sync_with_the_cpu_values(mode, case):
    fn, reason = HOST_SYNCS[case]
    x = torch.arange(6.0)
    torch.vtpu.set_sync_debug_mode("warn")
    with torch_vtpu.mode(mode):
        xv = x.to("vtpu") * 1.0  # queued (strict) or recorded (fused)
        got, messages = _sync_warnings(lambda: fn(xv))
    # printing runs torch's formatting ops on the device: several syncs
    assert any(reason in m for m in messages), messages
    torch.vtpu.set_sync_debug_mode("default")
    assert _same(got, fn(x * 1.0)) if case != "repr" else got == repr(x * 1.0)


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_device_work_and_the_waits_asked_for_pass_in_error_mode(mode):
    x = torch.randn(64, 64, device="vtpu")
    torch.vtpu.set_sync_debug_mode("error")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even a warning
        with torch_vtpu.mode(mode):
            y = torch.relu(x @ x + 1).sum(0).softmax(0)
            torch.vtpu.synchronize()
            s = torch.vtpu.Stream()
            s.synchronize()
            torch.vtpu.current_stream().synchronize()
            e = torch.vtpu.Event()
            e.record()
            e.synchronize()
            torch.vtpu.empty_cache()
            z = y * 2
            torch_vtpu.flush()
        torch_vtpu.set_mode("fused")  # a mode switch flushes and waits: asked for
        torch_vtpu.set_mode("strict")
    torch.vtpu.set_sync_debug_mode("default")
    xc = x.cpu()
    torch.testing.assert_close(z.cpu(), torch.relu(xc @ xc + 1).sum(0).softmax(0) * 2)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_error_mode_refuses_before_waiting_and_loses_nothing(mode):
    x = torch.arange(10.0)
    with torch_vtpu.mode(mode):
        xv = x.to("vtpu")
        y = (xv * 3 + 1).exp().sum()  # pending: queued or in the fused window
        before = torch_vtpu.metrics()["syncs"].get("item", 0)
        torch.vtpu.set_sync_debug_mode("error")
        with pytest.raises(RuntimeError, match=PHRASE):
            y.item()
        with pytest.raises(RuntimeError, match="aten::nonzero"):
            torch.nonzero(xv)
        # refused before the wait: not counted as a synchronisation
        assert torch_vtpu.metrics()["syncs"].get("item", 0) == before
        torch.vtpu.set_sync_debug_mode("default")
        assert y.item() == pytest.approx((x * 3 + 1).exp().sum().item(), rel=1e-6)
        assert torch.equal(torch.nonzero(xv).cpu(), torch.nonzero(x))


def test_a_large_blocking_upload_warns_and_a_queued_one_does_not():
    big = torch.ones(5 << 20)  # 20 MiB: more than the 16 MiB queued-upload limit
    small = torch.ones(1024)
    torch.vtpu.set_sync_debug_mode("warn")
    _, queued = _sync_warnings(lambda: small.to("vtpu"))
    _, asynchronous = _sync_warnings(lambda: big.to("vtpu", non_blocking=True))
    got, blocking = _sync_warnings(lambda: big.to("vtpu"))
    assert queued == [] and asynchronous == []
    assert len(blocking) == 1 and "large_upload" in blocking[0]
    torch.vtpu.set_sync_debug_mode("default")
    assert torch.equal(got.cpu(), big)


def test_default_mode_is_silent():
    x = torch.arange(4.0, device="vtpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert x.sum().item() == 6.0
        assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
        assert torch.nonzero(x).shape == (3, 1)


def test_out_and_storage_resizes_pass_in_error_mode_and_leave_a_whole_tensor():
    # A storage resize is no synchronisation on CUDA, and its callers change the
    # tensor's sizes first: refused, it left a tensor larger than its storage and a
    # later write crashed the process (found by review).
    a = torch.randn(1 << 18, device="vtpu")
    small = torch.zeros(4, device="vtpu")
    grown = torch.zeros(4, device="vtpu")
    torch.vtpu.set_sync_debug_mode("error")
    torch.add(a, a, out=small)
    grown.resize_(1 << 16)
    grown.fill_(1.0)
    torch.vtpu.set_sync_debug_mode("default")
    assert small.untyped_storage().nbytes() >= small.numel() * 4
    assert torch.equal(small.cpu(), (a + a).cpu())
    assert grown.cpu().sum().item() == float(1 << 16)


def test_vtpus_own_reads_pass_error_mode():
    # debug mode's CPU cross-check reads every result on the host for the user
    import torch_vtpu.debug as debug

    x = torch.randn(64)
    with torch_vtpu.mode("debug"):
        debug.crosscheck(True)
        try:
            torch.vtpu.set_sync_debug_mode("error")
            y = torch.relu(x.to("vtpu")) + 1
        finally:
            torch.vtpu.set_sync_debug_mode("default")
            debug.crosscheck(False)
    assert torch.equal(y.cpu(), torch.relu(x) + 1)
