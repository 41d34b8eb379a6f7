"""float16/bfloat16 ops with an operand of another dtype give the CPU's bits.

ATen's CPU kernels convert each operand of a 16-bit op that has another dtype
(an int32 tensor, a float32 zero-dim tensor, a Python number) to the 16-bit
type before computing in float: half(0.5) + 2049 is 2048 on the CPU. Only the
single-value second operand of mul and div, and lerp's scalar weight, are
read at their original precision. vTPU's generated kernels used to compute
with the unrounded operand (1 ulp apart in up to 44% of `x.half() + 0.1`'s
elements). Each case here failed before, except the mul/div/lerp ones, which
check that the exceptions stay exceptions.
"""
import pytest
import torch

import torch_vtpu

MODES = ["strict", "fused", "debug"]
DTYPES = [torch.float16, torch.bfloat16]


def _operands(dtype):
    gen = torch.Generator().manual_seed(7)
    # 4096 elements: a multiple of every vector width, so ATen's vectorised
    # body computes every element (its scalar remainder loop rounds
    # `sub(..., alpha=)` differently from its own vector body).
    x = (torch.randn(4096, generator=gen) * 30).to(dtype)
    ints = torch.randint(-5000, 5000, (4096,), generator=gen, dtype=torch.int32)
    return x, ints, torch.tensor(0.1234567), torch.tensor(2049, dtype=torch.int32)


CASES = {
    "add a Python float": lambda x, i, f, j: x + 0.1,
    "add a large int": lambda x, i, f, j: x + 2049,
    "sub a Python float": lambda x, i, f, j: x - 0.7,
    "add with alpha": lambda x, i, f, j: torch.add(x, x, alpha=0.1),
    "pow of a Python float": lambda x, i, f, j: x.abs() ** 0.3,
    "add an int32 tensor": lambda x, i, f, j: x + i,
    "int32 tensor plus": lambda x, i, f, j: i + x,
    "mul an int32 tensor": lambda x, i, f, j: x * i,
    "compare an int32 tensor": lambda x, i, f, j: x == i,
    "add a float32 0-dim tensor": lambda x, i, f, j: x + f,
    "add an int32 0-dim tensor": lambda x, i, f, j: x + j,
    "0-dim tensor times": lambda x, i, f, j: f * x,
    "in-place add of an int32 tensor": lambda x, i, f, j: x.clone().add_(i),
    "fused chain": lambda x, i, f, j: ((x + 0.1) * 0.3 - i) / 0.7,
    "reduction of a sum": lambda x, i, f, j: (x + 0.1).sum(),
    # the exceptions: ATen reads these at their original precision
    "mul a Python float": lambda x, i, f, j: x * 0.3,
    "mul a large int": lambda x, i, f, j: x * 2049,
    "div a Python float": lambda x, i, f, j: x / 0.3,
    "mul a 0-dim tensor": lambda x, i, f, j: x * f,
    "div an int32 0-dim tensor": lambda x, i, f, j: x / j,
    "lerp weight": lambda x, i, f, j: torch.lerp(x, x * 2, 0.3),
    "addcmul value": lambda x, i, f, j: torch.addcmul(x, x, x, value=0.1),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_mixed_operands_give_the_cpus_bits(mode, dtype, case):
    torch_vtpu.set_mode(mode)
    fn = CASES[case]
    x, ints, f0, i0 = _operands(dtype)
    want = fn(x, ints, f0, i0)
    got = fn(x.to("vtpu"), ints.to("vtpu"), f0.to("vtpu"), i0.to("vtpu")).cpu()
    assert got.dtype == want.dtype
    assert torch.equal(got, want), f"{int((got != want).sum())} of {want.numel()} elements differ"


@pytest.mark.parametrize("mode", MODES)
def test_the_documented_example(mode):
    torch_vtpu.set_mode(mode)
    half = torch.tensor([0.5], dtype=torch.float16)
    assert (half.to("vtpu") + 2049).item() == (half + 2049).item() == 2048
    assert (torch.tensor([2048.0], dtype=torch.float16, device="vtpu") ==
            torch.tensor([2049], dtype=torch.int32, device="vtpu")).item()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("exponent", [3.0, -2.0, 2.0, 0.5, -0.5, -1.0, 4.0, -3.0, 1.5])
def test_pow_by_a_number_gives_the_cpus_bits(mode, dtype, exponent):
    # bfloat16's pow by 3 and -2 rounds x * x to bfloat16 first in ATen's
    # kernel; vTPU rounded once (890 of 4096 elements off for x ** 3: GPT-2's
    # GELU in bf16; found by a Hugging Face review).
    torch_vtpu.set_mode(mode)
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4096, generator=gen) * 2).to(dtype)
    if exponent != int(exponent):
        x = x.abs() + 0.01
    want = torch.pow(x, exponent)
    assert torch.equal(torch.pow(x.to("vtpu"), exponent).cpu(), want)
    assert torch.equal(x.to("vtpu").pow_(exponent).cpu(), want)


@pytest.mark.parametrize("mode", MODES)
def test_float16_conversions_are_the_cpus_for_every_half_and_the_float_edges(mode):
    # Generated kernels convert float16 with integer arithmetic (GCC keeps
    # _Float16 conversions scalar without AVX512-FP16, which made float16
    # kernels 10-25x slower than the CPU's): the values must stay the x86
    # conversion instructions' that ATen's kernels use.
    torch_vtpu.set_mode(mode)
    every_half = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    want = every_half.float()
    got = every_half.to("vtpu").float().cpu()
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))  # signed zeros, subnormals, inf
    g = torch.Generator().manual_seed(3)
    edges = torch.tensor([65504.0, 65519.996, 65520.0, 65536.0, -65520.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25,
                          1.5 * 2.0 ** -25, 2.0 ** -26, 3.0 * 2.0 ** -25, 0.0, -0.0, float("inf"), -float("inf"),
                          1.0 + 2.0 ** -11, 1.0 + 3.0 * 2.0 ** -11, 6.1e-5, -5.9e-8, 1e-40])
    random = torch.randn(200_000, generator=g) * torch.exp2(torch.randint(-30, 20, (200_000,), generator=g).float())
    bits = torch.randint(-2**31, 2**31, (100_000,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    for floats in (edges, random, bits):  # `bits` includes NaNs with payloads: quieted, as the CPU's
        want = floats.half()
        got = floats.to("vtpu").half().cpu()
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    # Arithmetic with a launch scalar rounded to float16 (alpha), a select and
    # a reduction: the CPU's bits, and the same in every mode.
    x, y = (torch.randn(4096, generator=g).half() for _ in range(2))
    assert torch.equal(torch.add(x.to("vtpu"), y.to("vtpu"), alpha=0.3).cpu(), torch.add(x, y, alpha=0.3))
    assert torch.equal(torch.relu(x.to("vtpu")).cpu(), torch.relu(x))
    torch.testing.assert_close(x.to("vtpu").view(64, 64).sum(-1).cpu(), x.view(64, 64).sum(-1), rtol=2e-3, atol=1e-2)
