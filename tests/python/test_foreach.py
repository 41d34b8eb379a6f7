"""Native foreach kernels (bridge/foreach_ops.cpp).

Each foreach op over device tensors must give, in every mode, exactly the bits
of its per-tensor ops (what ATen's generic foreach kernel runs, one dispatcher
call per tensor), values close to the CPU's foreach op, and ATen's errors for
arguments outside the common case.
"""
import pytest
import torch

import torch_vtpu

MODES = ["strict", "fused", "debug"]

SHAPES = [(7, 5), (64,), (3, 4, 9), (1,)]


def _lists(n_lists, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n_lists):
        ts = [torch.randn(s, generator=g, dtype=torch.float32).to(dtype) for s in SHAPES]
        if k == 2:  # a divisor: keep it away from zero
            ts = [t.abs() + 0.5 for t in ts]
        out.append(ts)
    return out


def _dev(ts):
    return [t.to("vtpu") for t in ts]


# (name, foreach call, per-tensor call, number of tensor lists it takes)
CASES = [
    ("add_scalar", lambda a: torch._foreach_add_(a[0], 0.75), lambda a, i: a[0][i].add_(0.75), 1),
    ("sub_scalar", lambda a: torch._foreach_sub_(a[0], -1.5), lambda a, i: a[0][i].sub_(-1.5), 1),
    ("mul_scalar", lambda a: torch._foreach_mul_(a[0], 0.999), lambda a, i: a[0][i].mul_(0.999), 1),
    ("mul_int_scalar", lambda a: torch._foreach_mul_(a[0], 3), lambda a, i: a[0][i].mul_(3), 1),
    ("div_scalar", lambda a: torch._foreach_div_(a[0], 0.3), lambda a, i: a[0][i].div_(0.3), 1),
    ("add_scalarlist", lambda a: torch._foreach_add_(a[0], [0.1, 2.0, -3.0, 0.1]),
     lambda a, i: a[0][i].add_([0.1, 2.0, -3.0, 0.1][i]), 1),
    ("div_scalarlist", lambda a: torch._foreach_div_(a[0], [0.7, 0.7, 1.3, 0.7]),
     lambda a, i: a[0][i].div_([0.7, 0.7, 1.3, 0.7][i]), 1),
    ("mul_scalarlist", lambda a: torch._foreach_mul_(a[0], [2, 0.5, -1.0, 3]),
     lambda a, i: a[0][i].mul_([2, 0.5, -1.0, 3][i]), 1),
    ("sub_scalarlist", lambda a: torch._foreach_sub_(a[0], [1.0, -0.0, 0.0, 2.5]),
     lambda a, i: a[0][i].sub_([1.0, -0.0, 0.0, 2.5][i]), 1),
    ("add_list_alpha", lambda a: torch._foreach_add_(a[0], a[1], alpha=-0.3),
     lambda a, i: a[0][i].add_(a[1][i], alpha=-0.3), 2),
    ("sub_list_alpha", lambda a: torch._foreach_sub_(a[0], a[1], alpha=2.5),
     lambda a, i: a[0][i].sub_(a[1][i], alpha=2.5), 2),
    ("mul_list", lambda a: torch._foreach_mul_(a[0], a[1]), lambda a, i: a[0][i].mul_(a[1][i]), 2),
    ("div_list", lambda a: torch._foreach_div_(a[0], a[2]), lambda a, i: a[0][i].div_(a[2][i]), 3),
    ("addcmul_scalar", lambda a: torch._foreach_addcmul_(a[0], a[1], a[1], value=0.001),
     lambda a, i: a[0][i].addcmul_(a[1][i], a[1][i], value=0.001), 2),
    ("addcmul_scalarlist", lambda a: torch._foreach_addcmul_(a[0], a[1], a[2], [0.5, -1.0, 2.0, 0.25]),
     lambda a, i: a[0][i].addcmul_(a[1][i], a[2][i], value=[0.5, -1.0, 2.0, 0.25][i]), 3),
    ("addcdiv_scalar", lambda a: torch._foreach_addcdiv_(a[0], a[1], a[2], value=-0.01),
     lambda a, i: a[0][i].addcdiv_(a[1][i], a[2][i], value=-0.01), 3),
    ("addcdiv_scalarlist", lambda a: torch._foreach_addcdiv_(a[0], a[1], a[2], [-0.1, -0.1, -0.2, -0.1]),
     lambda a, i: a[0][i].addcdiv_(a[1][i], a[2][i], value=[-0.1, -0.1, -0.2, -0.1][i]), 3),
    ("lerp_scalar", lambda a: torch._foreach_lerp_(a[0], a[1], 0.1), lambda a, i: a[0][i].lerp_(a[1][i], 0.1), 2),
    ("lerp_scalar_high", lambda a: torch._foreach_lerp_(a[0], a[1], 0.9),
     lambda a, i: a[0][i].lerp_(a[1][i], 0.9), 2),
    ("sqrt_inplace", lambda a: torch._foreach_sqrt_(a[2]), lambda a, i: a[2][i].sqrt_(), 3),
]

# Out-of-place forms return new tensors: (name, foreach call, per-tensor call, lists).
FRESH = [
    ("add_scalar", lambda a: torch._foreach_add(a[0], 0.75), lambda a, i: torch.add(a[0][i], 0.75), 1),
    ("mul_scalarlist", lambda a: torch._foreach_mul(a[0], [2, 0.5, -1.0, 3]),
     lambda a, i: torch.mul(a[0][i], [2, 0.5, -1.0, 3][i]), 1),
    ("sub_list", lambda a: torch._foreach_sub(a[0], a[1], alpha=0.5),
     lambda a, i: torch.sub(a[0][i], a[1][i], alpha=0.5), 2),
    ("div_list", lambda a: torch._foreach_div(a[0], a[2]), lambda a, i: torch.div(a[0][i], a[2][i]), 3),
    ("addcdiv_scalar", lambda a: torch._foreach_addcdiv(a[0], a[1], a[2], value=0.2),
     lambda a, i: torch.addcdiv(a[0][i], a[1][i], a[2][i], value=0.2), 3),
    ("addcmul_scalarlist", lambda a: torch._foreach_addcmul(a[0], a[1], a[2], [1.0, 2.0, 3.0, 4.0]),
     lambda a, i: torch.addcmul(a[0][i], a[1][i], a[2][i], value=[1.0, 2.0, 3.0, 4.0][i]), 3),
    ("lerp_scalar", lambda a: torch._foreach_lerp(a[0], a[1], 0.3), lambda a, i: torch.lerp(a[0][i], a[1][i], 0.3), 2),
    ("sqrt", lambda a: torch._foreach_sqrt(a[2]), lambda a, i: torch.sqrt(a[2][i]), 3),
]


def _assert_bitwise(got, want):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.cpu().view(torch.int32 if g.dtype == torch.float32 else torch.int16),
                           w.cpu().view(torch.int32 if w.dtype == torch.float32 else torch.int16))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_in_place_foreach_matches_per_tensor_ops_bitwise_and_cpu(mode, case):
    _, foreach_call, per_tensor, n_lists = case
    host = _lists(3)
    torch_vtpu.set_mode(mode)
    via_foreach = [_dev(ts) for ts in host]
    via_loop = [_dev(ts) for ts in host]
    foreach_call(via_foreach)
    for i in range(len(SHAPES)):
        per_tensor(via_loop, i)
    torch.vtpu.synchronize()
    written = 2 if case[0] == "sqrt_inplace" else 0
    _assert_bitwise(via_foreach[written], via_loop[written])
    cpu = [list(ts) for ts in _lists(3)]
    foreach_call(cpu)
    for g, w in zip(via_foreach[written], cpu[written]):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", FRESH, ids=[c[0] for c in FRESH])
def test_out_of_place_foreach_matches_per_tensor_ops_bitwise_and_cpu(mode, case):
    _, foreach_call, per_tensor, n_lists = case
    host = _lists(3)
    torch_vtpu.set_mode(mode)
    dev = [_dev(ts) for ts in host]
    got = foreach_call(dev)
    want = [per_tensor(dev, i) for i in range(len(SHAPES))]
    torch.vtpu.synchronize()
    assert all(t.device.type == "vtpu" for t in got)
    _assert_bitwise(got, want)
    for g, w in zip(got, foreach_call(_lists(3))):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-6, atol=1e-6)
    # The inputs are untouched.
    for d, h in zip(dev[0], host[0]):
        assert torch.equal(d.cpu(), h)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_floating_dtypes_match_per_tensor_ops(dtype):
    host = _lists(3, dtype=dtype)
    torch_vtpu.set_mode("fused")
    a = [_dev(ts) for ts in host]
    b = [_dev(ts) for ts in host]
    torch._foreach_addcdiv_(a[0], a[1], a[2], value=0.3)
    torch._foreach_lerp_(a[0], a[1], 0.25)
    for i in range(len(SHAPES)):
        b[0][i].addcdiv_(b[1][i], b[2][i], value=0.3)
        b[0][i].lerp_(b[1][i], 0.25)
    torch.vtpu.synchronize()
    for g, w in zip(a[0], b[0]):
        assert torch.equal(g.cpu(), w.cpu())


def test_uncommon_cases_take_atens_kernel_with_its_results():
    """Non-contiguous tensors, integer tensors, mixed shapes and dtypes per index,
    broadcasting, CPU tensors in a device list: ATen's generic kernel, the
    CPU's values."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(6, 8, generator=g)
    cases = [
        ([base.t()], [torch.randn(8, 6, generator=g)]),                      # non-contiguous self
        ([torch.arange(12).reshape(3, 4)], [torch.arange(12).reshape(3, 4)]),  # integers
        ([torch.randn(3, 4, generator=g)], [torch.randn(4, generator=g)]),   # broadcast other
        ([torch.randn(3, generator=g, dtype=torch.float64)], [torch.randn(3, generator=g)]),  # dtypes differ
    ]
    for self_host, other_host in cases:
        cpu = [t.clone() for t in self_host]
        torch._foreach_add_(cpu, other_host, alpha=2)
        dev = [t.to("vtpu") for t in self_host]
        torch._foreach_add_(dev, [t.to("vtpu") for t in other_host], alpha=2)
        for d, c in zip(dev, cpu):
            assert d.dtype == c.dtype
            assert torch.equal(d.cpu(), c)
    # An integer tensor multiplied by a float scalar: in-place it cannot hold the result.
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch._foreach_mul_([torch.arange(4).to("vtpu")], 0.5)
    # A complex scalar on float tensors promotes out of place, as on the CPU.
    out = torch._foreach_mul([torch.ones(3).to("vtpu")], 1 + 2j)
    assert out[0].dtype == torch.complex64 and torch.equal(out[0].cpu(), torch._foreach_mul([torch.ones(3)], 1 + 2j)[0])


def _raised(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001  (the type and message are compared)
        return type(e), str(e)
    return None


@pytest.mark.parametrize("bad", [
    lambda dev: torch._foreach_add_([dev(torch.ones(3)), dev(torch.ones(3))], [dev(torch.ones(3))]),
    lambda dev: torch._foreach_mul_([dev(torch.ones(3)), dev(torch.ones(3))], [1.0, 2.0, 3.0]),
    lambda dev: torch._foreach_addcmul_([], [], [], value=1.0),
    lambda dev: torch._foreach_addcdiv_([dev(torch.ones(3))], [dev(torch.ones(3))], [], value=1.0),
    lambda dev: torch._foreach_lerp_([dev(torch.ones(3))], [dev(torch.ones(3)), dev(torch.ones(3))], 0.5),
    lambda dev: torch._foreach_add_([dev(torch.ones(3))], [dev(torch.ones(4))]),
], ids=["lengths", "scalar_list_length", "empty", "ternary_lengths", "lerp_lengths", "shapes"])
def test_bad_arguments_raise_the_cpus_errors(bad):
    want = _raised(lambda: bad(lambda t: t))
    assert want is not None
    got = _raised(lambda: bad(lambda t: t.to("vtpu")))
    assert got is not None and got[0] is want[0]
    assert got[1].replace("vtpu:0", "cpu").replace("vtpu", "cpu") == want[1] or got[1].split("\n")[0] == want[1].split("\n")[0]
    torch.vtpu.synchronize()  # nothing pending, the device is usable


def test_overlapping_operands_take_the_per_tensor_op():
    """An in-place op whose other operand partly overlaps it: the generated
    launch refuses, the per-tensor op raises the CPU's error."""
    base = torch.arange(10, dtype=torch.float32).to("vtpu")
    with pytest.raises(RuntimeError, match="(?i)overlap|single memory location"):
        torch._foreach_add_([base[1:9]], [base[0:8]])
    # Whole aliasing is fine and gives the CPU's values.
    t = torch.arange(6, dtype=torch.float32)
    d = t.to("vtpu")
    torch._foreach_add_([d], [d], alpha=0.5)
    torch._foreach_add_([t], [t], alpha=0.5)
    assert torch.equal(d.cpu(), t)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_foreach_optimizer_steps_match_the_for_loop_implementation_bitwise(mode):
    """AdamW and SGD with momentum, foreach (the default on vtpu) against the
    per-parameter for-loop implementation: the same ops in the same rounding."""
    torch_vtpu.set_mode(mode)
    g = torch.Generator().manual_seed(3)
    shapes = [(16, 8), (8,), (4, 4, 4)]
    init = [torch.randn(s, generator=g) for s in shapes]
    grads = [[torch.randn(s, generator=g) for s in shapes] for _ in range(3)]
    for make in (lambda ps, fe: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=fe),
                 lambda ps, fe: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=0.01, foreach=fe),
                 lambda ps, fe: torch.optim.Adam(ps, lr=1e-2, foreach=fe)):
        results = []
        for foreach in (True, False):
            ps = [t.to("vtpu").requires_grad_() for t in init]
            opt = make(ps, foreach)
            for step in grads:
                for p, gr in zip(ps, step):
                    p.grad = gr.to("vtpu")
                opt.step()
            torch.vtpu.synchronize()
            results.append([p.detach().cpu() for p in ps])
        for a, b in zip(*results):
            assert torch.equal(a, b)
        cpu_ps = [t.clone().requires_grad_() for t in init]
        cpu_opt = make(cpu_ps, True)
        for step in grads:
            for p, gr in zip(cpu_ps, step):
                p.grad = gr.clone()
            cpu_opt.step()
        for a, c in zip(results[0], cpu_ps):
            torch.testing.assert_close(a, c.detach(), rtol=1e-5, atol=1e-6)


def test_foreach_adamw_fuses_one_kernel_per_parameter():
    """The native kernels record into fused mode's window like the per-tensor
    ops did: an AdamW step is still one kernel per parameter."""
    torch_vtpu.set_mode("fused")
    ps = [torch.randn(64, 32).to("vtpu").requires_grad_() for _ in range(6)]
    for p in ps:
        p.grad = torch.randn(64, 32).to("vtpu")
    opt = torch.optim.AdamW(ps, lr=1e-3)
    for _ in range(2):
        opt.step()
    torch.vtpu.synchronize()
    torch_vtpu._C._wait_for_fusion_compiles()
    opt.step()
    torch.vtpu.synchronize()
    before = torch_vtpu.metrics()
    opt.step()
    torch.vtpu.synchronize()
    after = torch_vtpu.metrics()
    assert after["fused_kernels"] - before["fused_kernels"] == len(ps)
    assert after["kernels_launched"] - before["kernels_launched"] == len(ps)


def test_in_place_foreach_bumps_versions_as_on_the_cpu():
    """Autograd's in-place checks see foreach updates: each in-place foreach
    call bumps each tensor's version once, as ATen's per-tensor ops do."""
    for dev in ("cpu", "vtpu"):
        ps = [torch.ones(3, device=dev) for _ in range(2)]
        torch._foreach_mul_(ps, 2.0)
        torch._foreach_addcdiv_(ps, ps, ps, [0.5, 0.5])
        torch._foreach_lerp_(ps, [p * 2 for p in ps], 0.5)
        torch._foreach_sqrt_(ps)
        torch._foreach_add_(ps, ps, alpha=0.5)
        assert [p._version for p in ps] == [5, 5], dev
    x = torch.ones(3, device="vtpu", requires_grad=True)
    y = x * 1
    z = (y * y).sum()  # saves y
    torch._foreach_mul_([y], 2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
