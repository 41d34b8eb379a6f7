"""torch.compile's default backend (Inductor) on vtpu tensors: graphs over vtpu
tensors go to the vtpu compiler (torch_vtpu/_inductor_route.py); Inductor used
to fail in its lowering with ``KeyError: 'vtpu'``."""
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.fx as fx
from torch import nn

import torch_vtpu
from torch_vtpu import _inductor_route

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(_inductor_route, "_warned_settings", False)
    yield
    torch._dynamo.reset()


def _graphs():
    # "compiled" appears once the vtpu compiler has run in this process
    compiled = torch_vtpu.metrics().get("compiled", {"graphs": {"forward": 0, "backward": 0}})
    return dict(compiled["graphs"])


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.LayerNorm(96), nn.Linear(96, 8)).to("vtpu")


def _step(fn, x):
    x = x.detach().requires_grad_(True)
    y = fn(x)
    y.square().mean().backward()
    return y.detach(), x.grad


def test_default_backend_compiles_vtpu_graphs_with_the_vtpu_compiler():
    model = _model()
    x = torch.randn(128, 64, device="vtpu")
    before = _graphs()
    with warnings.catch_warnings():
        # the default mode has no settings to warn about
        warnings.filterwarnings("error", message="torch.compile: graphs over vtpu")
        y_default, g_default = _step(torch.compile(model), x)
    after = _graphs()
    assert after["forward"] == before["forward"] + 1
    assert after["backward"] == before["backward"] + 1
    torch._dynamo.reset()
    y_vtpu, g_vtpu = _step(torch.compile(model, backend="vtpu"), x)
    assert torch.equal(y_default, y_vtpu) and torch.equal(g_default, g_vtpu)
    y_cpu, g_cpu = _step(_model().cpu(), x.cpu())
    torch.testing.assert_close(y_default.cpu(), y_cpu)
    torch.testing.assert_close(g_default.cpu(), g_cpu)


def test_inductor_settings_are_said_to_have_no_effect_once():
    model = _model()
    x = torch.randn(16, 64, device="vtpu")
    with pytest.warns(UserWarning, match=r"vtpu backend.*max_autotune"):
        y = torch.compile(model, mode="max-autotune-no-cudagraphs")(x)
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), rtol=0, atol=0)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torch.compile: graphs over vtpu")
        torch.compile(model, mode="max-autotune-no-cudagraphs")(x)


def test_aot_inductor_refuses_vtpu_graphs_clearly():
    model = nn.Linear(8, 8).to("vtpu")
    exported = torch.export.export(model, (torch.randn(2, 8, device="vtpu"),))
    with pytest.raises(NotImplementedError, match="backend=.vtpu"):
        torch._inductor.aoti_compile_and_package(exported)


def test_a_graph_that_makes_vtpu_tensors_is_routed_without_vtpu_inputs():
    # flex attention's compiled create_block_mask(..., device="vtpu") takes no tensor
    def make(n):
        i = torch.arange(n, device="vtpu")
        return (i[:, None] >= i[None, :]).sum(-1) * 2

    actual = torch.compile(make)(64)
    assert actual.device.type == "vtpu"
    assert torch.equal(actual.cpu(), make(64).cpu())


def test_only_torch_compiles_calls_over_vtpu_tensors_are_routed():
    calls = []

    def inductor(model_, inputs, *args, **kwargs):
        calls.append((args, sorted(kwargs)))
        return "inductor"

    routed = _inductor_route._routed(inductor)
    gm = fx.symbolic_trace(lambda a: ((a * 2.0).sin(),))  # Dynamo's graphs return tuples
    cpu, dev = [torch.randn(8)], [torch.randn(8, device="vtpu")]
    assert routed(gm, cpu) == "inductor"
    assert routed(gm, cpu, config_patches={}) == "inductor"
    # Inductor's ahead-of-time paths pass an inner compiler or other arguments:
    # over vtpu tensors they are refused clearly (Inductor raised KeyError: 'vtpu')
    for args, kwargs in (((), dict(inner_compile=None, config_patches={})), ((), dict(ignore_shape_env=True)),
                         ((None,), {})):
        with pytest.raises(NotImplementedError, match="AOTInductor"):
            routed(gm, dev, *args, **kwargs)
    assert routed(gm, cpu, inner_compile=None) == "inductor"
    assert len(calls) == 3
    compiled = routed(gm, dev, config_patches={}, compile_region_name=None)
    assert len(calls) == 3, "a torch.compile call over vtpu tensors reached Inductor"
    out = compiled(*dev)
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert out.device.type == "vtpu"
    torch.testing.assert_close(out.cpu(), (dev[0].cpu() * 2.0).sin())


@pytest.mark.parametrize("inductor_first", [True, False], ids=["inductor_first", "vtpu_first"])
def test_route_is_installed_whichever_module_is_imported_first(inductor_first):
    imports = ["import torch._inductor.compile_fx as cfx", "import torch_vtpu"]
    if not inductor_first:
        imports.reverse()
    code = "\n".join(["import torch"] + imports + [
        "import torch._inductor.compile_fx as cfx",
        "assert getattr(cfx.compile_fx, '_vtpu_routed', False), 'compile_fx not routed'",
        "print('routed')",
    ])
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=300, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "routed" in out.stdout
