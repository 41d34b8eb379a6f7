"""Matrix-product epilogues in fused eager mode: the elementwise ops recorded over
a float32 mm/addmm's result run inside the product's stream task, block by block
as the product is written (bridge/matmul_epilogue.h), with strict mode's bits.

Exact counts are asserted on a run after the patterns' kernels are built (a
pattern seen for the first time runs on strict's single-op kernels).
"""
import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_vtpu
from torch_vtpu import _C


@pytest.fixture(autouse=True)
def _fused_then_strict():
    torch_vtpu.set_mode("fused")
    yield
    torch_vtpu.set_mode("strict")


def _dev(*tensors):
    return [t.to("vtpu") for t in tensors]


def _steady(program, *args):
    """(first result, steady result, steady metrics) in fused mode."""
    first = program(*args)
    torch.vtpu.synchronize()
    first = first.cpu()
    _C._wait_for_fusion_compiles()
    program(*args)  # the allocator settles on the program's blocks
    torch.vtpu.synchronize()
    _C._wait_for_fusion_compiles()
    torch_vtpu.reset_metrics()
    result = program(*args)
    torch.vtpu.synchronize()
    return first, result.cpu(), torch_vtpu.metrics()


def _strict(program, *args):
    with torch_vtpu.mode("strict"):
        out = program(*args)
        torch.vtpu.synchronize()
    return out.cpu()


def _block_runs():
    return _C._gemm_row_block_runs(), _C._gemm_column_block_runs()


def test_linear_with_gelu_is_one_kernel():
    torch.manual_seed(0)
    x, w, b = torch.randn(256, 256), torch.randn(512, 256), torch.randn(512)

    def program(x, w, b):
        return F.gelu(F.linear(x, w, b))

    first, fused, m = _steady(program, *_dev(x, w, b))
    assert m["kernels_launched"] == 1, m
    assert m["matmul_epilogues"] == 1 and m["matmul_epilogue_ops"] == 1, m
    assert m["fused_kernels"] == 0, m
    strict = _strict(program, *_dev(x, w, b))
    assert torch.equal(fused, strict) and torch.equal(first, strict)
    torch.testing.assert_close(fused, program(x, w, b), rtol=1e-5, atol=1e-5 * 256 ** 0.5)


# (name, program, operands, route): row blocks for a row-major right-hand
# matrix, column blocks for nn.Linear's transposed weight; flat epilogue
# kernels, kernels that keep their dims (a broadcast operand), and 3-d
# activations whose rows a block splits across the batch dim.
def _cases():
    torch.manual_seed(1)
    x = torch.randn(256, 256)
    w_rows = torch.randn(256, 512)   # x @ w_rows: row blocks
    w_cols = torch.randn(512, 256)   # x @ w_cols.t(): column blocks
    r = torch.randn(256, 512)
    b = torch.randn(512)
    x3 = torch.randn(3, 100, 256)    # 300 rows: blocks of 38 rows cross the batch dim
    pos = torch.randn(100, 512)
    return [
        ("rows_relu_residual", lambda x, w, r: torch.relu(x @ w) + r, (x, w_rows, r), "rows"),
        ("rows_bias_row", lambda x, w, b: (x @ w + b).tanh(), (x, w_rows, b), "rows"),
        ("cols_silu_times", lambda x, w, r: F.silu(x @ w.t()) * r, (x, w_cols, r), "cols"),
        ("cols_bias_row", lambda x, w, b: (x @ w.t() - b) * 0.5, (x, w_cols, b), "cols"),
        ("rows_3d_broadcast", lambda x, w, p: torch.sigmoid((x @ w) * p + 1.0), (x3, w_rows, pos), "rows"),
        ("cols_3d_broadcast", lambda x, w, p: (F.linear(x, w) + p).exp(), (x3, w_cols, pos), "cols"),
        ("addmm_3d_flat", lambda x, w, b: F.gelu(F.linear(x, w, b)) * 2.0, (x3, w_cols, b), "cols"),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_epilogue_gives_strict_bits(case):
    _, program, operands, route = case
    before = _block_runs()
    first, fused, m = _steady(program, *_dev(*operands))
    after = _block_runs()
    assert m["matmul_epilogues"] == 1 and m["kernels_launched"] == 1, m
    rows, cols = after[0] - before[0], after[1] - before[1]
    assert (cols > 0) if route == "cols" else (rows > cols), (rows, cols)
    strict = _strict(program, *_dev(*operands))
    assert torch.equal(fused, strict), (fused - strict).abs().max()
    assert torch.equal(first, strict)  # unfused first sighting: same bits
    torch.testing.assert_close(fused, program(*operands), rtol=1e-4, atol=1e-4)


def test_ops_that_cannot_run_per_block_stay_out():
    """A transposed read of the result and a reduction over it need the whole
    product: they run after it, in kernels of their own."""
    torch.manual_seed(2)
    x, w = torch.randn(256, 256), torch.randn(256, 512)

    def program(x, w):
        y = x @ w
        return (y.t() * 2.0).sum() + y.sum(-1).mean()

    _, fused, m = _steady(program, *_dev(x, w))
    assert m["matmul_epilogues"] == 0, m
    assert torch.equal(fused, _strict(program, *_dev(x, w)))


def test_a_reduction_takes_the_epilogue_back():
    """RMSNorm after a residual projection: the reduction needs whole rows, so
    the product runs alone and add, pow and mean stay one kernel that never
    stores the squares (as without epilogues)."""
    torch.manual_seed(8)
    x, w, r = torch.randn(256, 256), torch.randn(256, 512), torch.randn(256, 512)

    def program(x, w, r):
        h = r + x @ w
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)

    _, fused, m = _steady(program, *_dev(x, w, r))
    assert m["matmul_epilogues"] == 0, m
    assert m["dead_stores_skipped"] >= 1, m  # the squares
    assert torch.equal(fused, _strict(program, *_dev(x, w, r)))
    torch.testing.assert_close(fused, program(x, w, r), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("transposed", [False, True], ids=["rows", "cols"])
def test_write_to_an_operand_waits_for_the_product(transposed):
    """x.add_(x @ w) must not write x inside the product's task: a column
    block reads all of x."""
    torch.manual_seed(3)
    x0, w = torch.randn(256, 256), torch.randn(256, 256)

    def program(x0, w):
        x = x0.clone()
        y = x @ (w.t() if transposed else w)
        x.add_(y)
        return y * 3.0 + x

    _, fused, m = _steady(program, *_dev(x0, w))
    assert m["matmul_epilogues"] == 0, m  # the add_ and what reads after it follow the product
    assert torch.equal(fused, _strict(program, *_dev(x0, w)))
    y = x0 @ (w.t() if transposed else w)
    torch.testing.assert_close(fused, y * 3.0 + x0 + y, rtol=1e-4, atol=1e-4)


def test_dropped_operand_block_reused_by_the_epilogue():
    """The transposed copy dies after the product is issued; its block goes to
    the relu's result, which must then wait for the product's reads."""
    torch.manual_seed(4)
    x, w = torch.randn(256, 256), torch.randn(512, 256)

    def program(x, w):
        return torch.relu(x @ w.t().contiguous()) - 0.5

    first, fused, _ = _steady(program, *_dev(x, w))
    strict = _strict(program, *_dev(x, w))
    assert torch.equal(fused, strict) and torch.equal(first, strict)
    torch.testing.assert_close(fused, program(x, w), rtol=1e-5, atol=1e-5 * 256 ** 0.5)


def test_in_place_epilogue_and_dead_intermediates():
    torch.manual_seed(5)
    x, w = torch.randn(256, 256), torch.randn(512, 256)

    def in_place(x, w):
        y = x @ w.t()
        y.relu_()
        y.mul_(2.0)
        return y

    def chain(x, w):  # the product and the gelu's result are never stored again
        return (F.gelu(x @ w.t()) * 1.5).tanh()

    for program in (in_place, chain):
        _, fused, m = _steady(program, *_dev(x, w))
        assert m["matmul_epilogues"] == 1 and m["kernels_launched"] == 1, (program.__name__, m)
        assert torch.equal(fused, _strict(program, *_dev(x, w))), program.__name__


def test_product_without_epilogue_and_an_error_in_between():
    """A product nobody reads elementwise still runs at the next flush; an op
    raising at dispatch while it waits leaves it and the process intact."""
    torch.manual_seed(6)
    x, w = _dev(torch.randn(256, 256), torch.randn(256, 512))
    y = x @ w
    with pytest.raises(RuntimeError):
        torch.ones(3, device="vtpu") + torch.ones(4, device="vtpu")
    out = y.cpu()
    torch.testing.assert_close(out, x.cpu() @ w.cpu(), rtol=1e-4, atol=1e-4)
    assert torch.equal(out, _strict(lambda a, b: a @ b, x, w))


def test_training_steps_match_strict_bitwise():
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    data, target = torch.randn(256, 256), torch.randint(0, 10, (256,))

    def train(mode):
        m = copy.deepcopy(model).to("vtpu")
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        x, t = data.to("vtpu"), target.to("vtpu")
        losses = []
        with torch_vtpu.mode(mode):
            for _ in range(4):
                opt.zero_grad()
                loss = F.cross_entropy(m(x), t)
                loss.backward()
                opt.step()
                losses.append(loss.detach().cpu())
            torch.vtpu.synchronize()
        return torch.stack(losses), [p.detach().cpu() for p in m.parameters()]

    strict_losses, strict_params = train("strict")
    _C._wait_for_fusion_compiles()
    torch_vtpu.reset_metrics()
    fused_losses, fused_params = train("fused")
    assert torch_vtpu.metrics()["matmul_epilogues"] > 0
    assert torch.equal(fused_losses, strict_losses)
    assert all(torch.equal(a, b) for a, b in zip(fused_params, strict_params))


def test_switched_off_by_environment():
    code = (
        "import torch, torch_vtpu, torch.nn.functional as F\n"
        "from torch_vtpu import _C\n"
        "torch_vtpu.set_mode('fused')\n"
        "x, w = torch.randn(256, 256, device='vtpu'), torch.randn(512, 256, device='vtpu')\n"
        "for _ in range(3):\n"
        "    torch_vtpu.reset_metrics(); y = F.gelu(x @ w.t()) * 2.0; torch.vtpu.synchronize()\n"
        "    _C._wait_for_fusion_compiles()\n"
        "m = torch_vtpu.metrics()\n"
        "print(m['matmul_epilogues'], m['kernels_launched'])\n"
    )
    env = dict(os.environ, VTPU_MATMUL_EPILOGUES="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "2"], out.stdout


def test_small_product_starts_no_window():
    """As for elementwise ops (fused_min_elements): a product with a small
    result is queued at once into an empty window, and held when the window
    already holds work."""
    torch.manual_seed(9)
    x, w, big = _dev(torch.randn(32, 64), torch.randn(64, 32), torch.randn(8192))
    torch_vtpu.set_fused_min_elements(4096)

    def alone(x, w):
        return F.gelu(x @ w)

    def after_work(x, w):
        b = big * 2.0  # starts a window
        return F.gelu(x @ w) + b[:1]

    for program, epilogues in ((alone, 0), (after_work, 1)):
        _, fused, m = _steady(program, x, w)
        assert m["matmul_epilogues"] == epilogues, (program.__name__, m)
        assert torch.equal(fused, _strict(program, x, w)), program.__name__
