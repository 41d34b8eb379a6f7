"""Compiled graphs with symbolic sizes run as native programs
(bridge/graph_program.cpp, bridge/size_arithmetic.cpp).

With dynamic shapes (`dynamic=True`, or Dynamo's automatic dynamic after a
size changes: a decoder's growing KV cache) a graph carries its sizes as
numbers: graph inputs, `sym_size` results, Python arithmetic on them, size
lists mixing them with constants, and numbers fed to ops as tensor operands.
Such graphs used to keep the Python program, whose per-op calls through
`OpOverload` made compiled decoding slower than eager decoding. Each test
checks the dumped program header (which of the two runs), compares the
native program with the Python program bit for bit and with eager/CPU
results, so an arithmetic rule that differs from Python's fails here.
"""
import math
from pathlib import Path

import pytest
import torch
import torch._dynamo

import torch_vtpu  # noqa: F401  (registers the device and the backend)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _program_kinds(dump_dir: Path) -> list:
    """'native' or 'python' for each dumped graph program."""
    kinds = []
    for p in sorted(dump_dir.glob("*.program.py")):
        header = p.read_text().splitlines()[1]
        kinds.append("native" if "native program" in header else "python")
    return kinds


def _compile(fn, tmp_path: Path, name: str, native: bool = True, **kwargs):
    options = {"native": native, "dump_dir": str(tmp_path / name)}
    return torch.compile(fn, backend="vtpu", options=options, **kwargs)


def _size_arithmetic(x, k, m):
    """Every operation of the native size arithmetic, on int arguments Dynamo
    makes symbolic, each result reaching a tensor (so it is a graph value)."""
    return torch.stack([
        x * (k // m), x * (k % m), x * (k + m), x * (k - m), x * (k * m), x * (-k),
        x * (k / m), x * torch.sym_max(k, m), x * torch.sym_min(k, m),
        x * (k < m), x * (k <= m), x * (k > m), x * (k >= m), x * (k == m), x * (k != m),
        x * torch.sym_float(k) / 4, x * torch.sym_int(k / m), x * math.floor(k / m), x * math.ceil(k / m),
    ])


# Signs in every combination: Python floors `//` and gives `%` the divisor's
# sign, where C++ truncates; ties for max/min/comparisons.
_PAIRS = [(7, 3), (-7, 3), (7, -3), (-7, -3), (9, 3), (-9, 4), (5, 5), (2, 8), (-2, -8), (13, 2)]


def test_size_arithmetic_follows_python(tmp_path):
    x = torch.linspace(-2, 2, 5)
    compiled = {native: _compile(_size_arithmetic, tmp_path, str(native), native=native, dynamic=True)
                for native in (True, False)}
    xv = x.to("vtpu")
    for k, m in _PAIRS:
        want = _size_arithmetic(x, k, m)
        got = {native: fn(xv, k, m).cpu() for native, fn in compiled.items()}
        assert torch.equal(got[True], got[False]), (k, m)
        torch.testing.assert_close(got[True], want, rtol=0, atol=0, msg=f"k={k} m={m}")
    assert _program_kinds(tmp_path / "True") and set(_program_kinds(tmp_path / "True")) == {"native"}
    assert set(_program_kinds(tmp_path / "False")) == {"python"}


def test_symbolic_size_lists_and_sym_size(tmp_path):
    """`view`/`expand`/`new_zeros` with sizes computed from a symbolic batch:
    int lists mixing slots and constants, `sym_size` calls, numbers as tensor
    operands (`x * x.shape[0]`)."""

    def f(x):
        n = x.shape[0]
        y = x.view(n // 2, 2, -1).expand(3, n // 2, 2, x.shape[1]) * n
        return y.sum(0) + x.new_zeros(n // 2, 2 * x.shape[1]).view(n // 2, 2, -1) - x.shape[1]

    native = _compile(f, tmp_path, "native", dynamic=True)
    python = _compile(f, tmp_path, "python", native=False, dynamic=True)
    for n in (4, 6, 10, 2):
        x = torch.randn(n, 3, generator=torch.Generator().manual_seed(n))
        got = native(x.to("vtpu")).cpu()
        assert torch.equal(got, python(x.to("vtpu")).cpu()), n
        torch.testing.assert_close(got, f(x), rtol=1e-6, atol=1e-6)
    assert set(_program_kinds(tmp_path / "native")) == {"native"}


@pytest.mark.parametrize("dynamic", [True, None])
def test_decoding_with_a_growing_cache_runs_native_with_eager_tokens(tmp_path, dynamic):
    """Greedy decoding of the Qwen3-style model with its KV cache: with
    `dynamic=True`, and with the default (Dynamo's automatic dynamic, after the
    cache length changed once), every graph is a native program, recompiles
    stop after the cache becomes symbolic, and the tokens and logits are the
    Python program's bits and eager mode's tokens."""
    from torch_vtpu.models.qwen3_mini import Qwen3Mini, Qwen3MiniConfig, generate_greedy

    torch.manual_seed(0)
    config = Qwen3MiniConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    model = Qwen3Mini(config).eval().to("vtpu")
    prompt = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1)).to("vtpu")
    with torch.no_grad():
        want = generate_greedy(model, prompt, 12).cpu()
        native = _compile(model, tmp_path, "native", dynamic=dynamic)
        got = generate_greedy(native, prompt, 12).cpu()
        graphs_after_first = len(_program_kinds(tmp_path / "native"))
        assert torch.equal(generate_greedy(native, prompt, 12).cpu(), got)
        # A second decode of the same lengths compiles nothing more.
        assert len(_program_kinds(tmp_path / "native")) == graphs_after_first
        python = _compile(model, tmp_path, "python", native=False, dynamic=dynamic)
        logits_native, cache = native(prompt, use_cache=True)
        logits_python, _ = python(prompt, use_cache=True)
        step_native, _ = native(prompt[:, -1:], past_key_values=cache, use_cache=True)
        step_python, _ = python(prompt[:, -1:], past_key_values=cache, use_cache=True)
    assert torch.equal(got, want)
    assert torch.equal(logits_native.cpu(), logits_python.cpu())
    assert torch.equal(step_native.cpu(), step_python.cpu())
    kinds = _program_kinds(tmp_path / "native")
    assert kinds and set(kinds) == {"native"}, kinds
    # prompt, first step (static), then one symbolic graph for the rest.
    assert graphs_after_first <= 3, graphs_after_first


def _lcg(x, step):
    """Int arithmetic past int64 on a Python int argument: Python's ints grow,
    the program's fast path gives way to Python (the native program raised
    OverflowError; found by a review)."""
    h = (step * 6364136223846793005 + 1442695040888963407) % 9223372036854775783
    return x * (h % 7), h, step * 2**40 * 2**40


def test_ints_past_int64_and_exact_true_division_follow_python(tmp_path):
    native = _compile(_lcg, tmp_path, "native", dynamic=True)
    python = _compile(_lcg, tmp_path, "python", native=False, dynamic=True)
    x = torch.ones(2)
    for step in (3, 5, 2**63, -(2**70), 12345678901234567):
        got, want, reference = native(x.to("vtpu"), step), python(x.to("vtpu"), step), _lcg(x, step)
        assert got[1:] == want[1:] == reference[1:], step
        assert torch.equal(got[0].cpu(), reference[0]) and torch.equal(got[0].cpu(), want[0].cpu()), step
    # An int beyond 2^53 divided: Python rounds the exact quotient once, two
    # doubles would round the dividend first (3207668833033704.0).
    divide = _compile(lambda x, a, b: (x + 1, a / b, a < b * 1.5), tmp_path, "divide", dynamic=True)
    for a, b in ((7, 3), (2004793020646064781, 625), (2**53 + 1, 1)):
        out = divide(torch.ones(1, device="vtpu"), a, b)
        assert out[1] == a / b and out[2] == (a < b * 1.5), (a, b, out[1:])
    assert set(_program_kinds(tmp_path / "native")) == {"native"}
    assert set(_program_kinds(tmp_path / "divide")) == {"native"}


def test_other_number_functions_and_constant_outputs_stay_native(tmp_path):
    """torch.sym_sum (the length of a cat over a symbolic cache), `abs`, `**`
    and a constant among the outputs used to send the graph to the Python
    program; they now run natively, as the Python function for the ones
    without a fast path."""

    def step(cache, new, k):
        kv = torch.cat([cache, new], dim=2)
        b, h, t, d = kv.shape
        return kv.view(b * h, t, d).sum(1) * abs(k - 7) + k ** 2, kv, None

    native = _compile(step, tmp_path, "native", dynamic=True)
    python = _compile(step, tmp_path, "python", native=False, dynamic=True)
    g = torch.Generator().manual_seed(0)
    for n, k in ((3, 2), (4, 9), (6, -3)):
        cache, new = torch.randn(1, 2, n, 4, generator=g), torch.randn(1, 2, 1, 4, generator=g)
        got = native(cache.to("vtpu"), new.to("vtpu"), k)
        want = python(cache.to("vtpu"), new.to("vtpu"), k)
        reference = step(cache, new, k)
        assert got[2] is None
        for a, b, c in zip(got[:2], want[:2], reference[:2]):
            assert torch.equal(a.cpu(), b.cpu())
            torch.testing.assert_close(a.cpu(), c, rtol=1e-6, atol=1e-6)
    kinds = _program_kinds(tmp_path / "native")
    assert kinds and set(kinds) == {"native"}, kinds
    sources = "".join(p.read_text() for p in (tmp_path / "native").glob("*.fx.py"))
    assert "sym_sum" in sources, "the graph no longer exercises torch.sym_sum"


_HUGE_ARGUMENT_CASES = {
    "tensor_operand": (lambda x, k: x * (k * k), OverflowError),
    "scalar_fill": (lambda x, k: torch.full((2,), k * k, device=x.device), OverflowError),
    "scalar_bound": (lambda x, k: x.clamp(max=k * k), OverflowError),
    "scalar_alpha": (lambda x, k: torch.add(x, x, alpha=k * k), OverflowError),
    "size_list": (lambda x, k: x.new_zeros(k * k), TypeError),
}


@pytest.mark.parametrize("case", sorted(_HUGE_ARGUMENT_CASES))
def test_an_int_past_int64_as_an_op_argument_raises_as_in_eager(tmp_path, case):
    # The native program handed the held Python int to the op: RuntimeError
    # "IValue is not a Scalar" (found by a compiled-mode fuzzer).
    fn, error = _HUGE_ARGUMENT_CASES[case]
    x = torch.ones(3, device="vtpu")
    with pytest.raises(error):
        fn(x, 2**40 + 3)
    native = _compile(fn, tmp_path, "native", dynamic=True)
    native(x, 3)
    with pytest.raises(error):
        native(x, 2**40 + 3)
    assert torch.equal(native(x, 5).cpu(), fn(x, 5).cpu()), "the program is usable after the error"
    assert set(_program_kinds(tmp_path / "native")) == {"native"}
