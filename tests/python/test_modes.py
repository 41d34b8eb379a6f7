"""Modes: the API, VTPU_MODE, and strict/debug/fused equality."""
import os
import subprocess
import sys

import pytest
import torch

import torch_vtpu


def test_default_mode_is_strict():
    assert torch_vtpu.get_mode() == "strict"


def test_set_and_scoped_mode():
    torch_vtpu.set_mode("debug")
    assert torch_vtpu.get_mode() == "debug"
    torch_vtpu.set_mode("strict")
    with torch_vtpu.mode("fused"):
        assert torch_vtpu.get_mode() == "fused"
        with torch_vtpu.mode("debug"):
            assert torch_vtpu.get_mode() == "debug"
        assert torch_vtpu.get_mode() == "fused"
    assert torch_vtpu.get_mode() == "strict"


def test_scoped_mode_restored_on_error():
    with pytest.raises(KeyError):
        with torch_vtpu.mode("debug"):
            raise KeyError("boom")
    assert torch_vtpu.get_mode() == "strict"


def test_bad_mode_names():
    with pytest.raises(ValueError, match="expected one of"):
        torch_vtpu.set_mode("turbo")
    with pytest.raises(TypeError):
        torch_vtpu.set_mode(3)
    assert torch_vtpu.get_mode() == "strict"


def test_env_mode():
    code = "import torch_vtpu; print(torch_vtpu.get_mode())"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, VTPU_MODE="debug"),
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "debug", out.stderr


def _program():
    torch.vtpu.manual_seed(123)
    x = torch.randn(16, 16, device="vtpu")
    w = torch.randn(16, 16, device="vtpu", requires_grad=True)
    y = torch.nn.functional.gelu(x @ w).softmax(-1)
    loss = (y * torch.rand_like(y)).sum()
    loss.backward()
    return torch.cat([y.detach().flatten(), w.grad.flatten()]).cpu()


def test_modes_are_bitwise_equal():
    results = {}
    for name in ("strict", "debug", "fused"):
        with torch_vtpu.mode(name):
            results[name] = _program()
    assert torch.equal(results["strict"], results["debug"])
    assert torch.equal(results["strict"], results["fused"])


def test_strict_mode_does_not_wait_for_kernels():
    torch.vtpu.synchronize()
    torch_vtpu.reset_metrics()
    x = torch.randn(256, 256, device="vtpu")
    for _ in range(20):
        x = torch.tanh(x @ x)
    m = torch_vtpu.metrics()
    assert sum(m["syncs"].values()) == 0, m["syncs"]
    torch.vtpu.synchronize()
    assert torch_vtpu.metrics()["syncs"]["synchronize"] == 1


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_copies_and_fills_inside_inference_mode(mode):
    # Queued copies, fills and host-path kernels ran copy_/fill_ on the worker
    # thread, outside the caller's InferenceMode, on CPU aliases that were
    # inference tensors: "Inplace update to inference tensor outside
    # InferenceMode" at the next sync (strict and fused mode; found by review).
    torch_vtpu.set_mode(mode)
    linear = torch.nn.Linear(3, 2)
    linear_vtpu = torch.nn.Linear(3, 2).to("vtpu")
    linear_vtpu.load_state_dict(linear.state_dict())
    with torch.inference_mode():
        x = torch.arange(3.0).to("vtpu")  # host-to-device copy
        y = torch.empty(3, device="vtpu")
        y.copy_(x)  # device-to-device copy
        filled = torch.empty(3, device="vtpu").fill_(2.5)
        zeroed = torch.ones(3, device="vtpu").zero_()
        out = linear_vtpu(x)
        torch.vtpu.synchronize()
        assert x.is_inference() and out.is_inference()
        want = linear(torch.arange(3.0))
    assert torch.equal(y.cpu(), torch.arange(3.0))
    assert torch.equal(filled.cpu(), torch.full((3,), 2.5))
    assert torch.equal(zeroed.cpu(), torch.zeros(3))
    torch.testing.assert_close(out.cpu(), want)
