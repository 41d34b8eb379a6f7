"""The alignment advisor: matmul-like ops against a target's tile."""
import os
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_vtpu
from torch_vtpu.advisor import TARGETS, profile
from torch_vtpu.models.qwen3_mini import Qwen3Mini, Qwen3MiniConfig

HERE = os.path.basename(__file__)


def line_of(path: str, text: str) -> int:
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if text in line:
                return number
    raise AssertionError(f"{text!r} not in {path}")


def qwen3(head_dim: int) -> Qwen3Mini:
    torch.manual_seed(0)
    # 4 heads; hidden 256 and intermediate 512 are multiples of every tile, and
    # the sequence (256) too: only head_dim decides the attention's utilisation.
    config = Qwen3MiniConfig(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=head_dim, vocab_size=256)
    return Qwen3Mini(config).to("vtpu").eval()


def attention(report):
    return [f for f in report.findings if f["op"].startswith("scaled_dot_product_attention")]


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 256, (1, 256), device="vtpu")


@pytest.mark.parametrize("head_dim,target,expected", [(64, "tpu-v5e", 0.5), (64, "tpu-v7", 0.25),
                                                      (64, "tpu-v6e", 0.25), (128, "tpu-v5e", 1.0)])
def test_qwen3_attention_utilisation(ids, head_dim, target, expected):
    report = torch_vtpu.advise(qwen3(head_dim), (ids,), target=target)
    found = attention(report)
    assert {f["op"] for f in found} == {"scaled_dot_product_attention (Q@K^T)",
                                        "scaled_dot_product_attention (P@V)"}
    sdpa_line = line_of(torch_vtpu.models.qwen3_mini.__file__, "out = F.scaled_dot_product_attention(q, k, v, is_causal")
    for f in found:
        assert f["utilization"] == pytest.approx(expected)
        assert f["location"].endswith(f"qwen3_mini.py:{sdpa_line} in Attention.forward")
        assert f["count"] == 2  # one per decoder layer, same line
        assert f["shapes"][0] == (1, 4, 256, head_dim)
        if expected < 1:
            assert f["dim"] == f"head_dim={head_dim}"
            assert f"use head_dim {profile(target).k_tile}" in f["suggestion"]
        else:
            assert f["dim"] == "" and f["suggestion"] == "aligned"
    # The projections: k/v are 2 heads wide (2*head_dim), the rest multiples of 256.
    for f in report.findings:
        if f["op"] == "linear":
            n = f["shapes"][1][0]
            tile = profile(target).n_tile
            assert f["utilization"] == pytest.approx(n / (-(-n // tile) * tile))
    # Worst first.
    utils = [f["utilization"] for f in report.findings]
    assert utils == sorted(utils)


def test_report_table_and_findings_fields(ids):
    report = torch_vtpu.advise(qwen3(64), (ids,), target="tpu-v5e")
    text = str(report)
    assert text.splitlines()[0].startswith("alignment report for tpu-v5e (128x128 MXU")
    assert "scaled_dot_product_attention (Q@K^T)" in text and "50%" in text and "head_dim=64" in text
    for f in report.findings:
        assert {"op", "shapes", "dim", "utilization", "location", "suggestion"} <= set(f)


def test_conv_and_linear_as_gemm():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 64, 3, padding=1)
            self.fc = torch.nn.Linear(100, 200)

        def forward(self, x, v):
            return self.conv(x).sum(), self.fc(v)  # <net>

    net = Net().to("vtpu")
    x, v = torch.randn(2, 3, 8, 8, device="vtpu"), torch.randn(4, 100, device="vtpu")
    report = torch_vtpu.advise(net, (x, v), target="h200")
    conv = next(f for f in report.findings if f["op"] == "conv2d")
    # Implicit GEMM: K = Cin*kh*kw = 27, N = Cout = 64 on 64-element granules.
    assert conv["dim"] == "Cin*kernel=27"
    assert conv["utilization"] == pytest.approx(27 / 64)
    linear = next(f for f in report.findings if f["op"] == "linear")
    assert linear["dim"] == "in_features=100, out_features=200"
    assert linear["utilization"] == pytest.approx((100 / 128) * (200 / 256))
    assert "pad in_features 100 to 128" in linear["suggestion"]
    assert f"{HERE}:" in linear["location"] and "Net.forward" in linear["location"]


def test_matmul_functions():
    def fn(a, b, c):
        return torch.bmm(a, b), a @ b, torch.matmul(c, c)

    a, b, c = torch.randn(2, 8, 96), torch.randn(2, 96, 200), torch.randn(128, 128)
    report = torch_vtpu.advise(fn, (a, b, c), target="tpu-v5e")
    by_op = {f["op"]: f for f in report.findings}
    assert by_op["bmm"]["utilization"] == pytest.approx((96 / 128) * (200 / 256))
    assert by_op["matmul"]["utilization"] in (pytest.approx((96 / 128) * (200 / 256)), 1.0)
    assert any(f["utilization"] == 1.0 for f in report.findings)  # the 128x128 matmul


def test_host_profile_follows_the_isa():
    host = profile("host")
    lanes = {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability(), 4)
    assert host.n_tile == lanes and host.k_tile == 1
    report = torch_vtpu.advise(torch.nn.Linear(64, lanes + 1), torch.randn(2, 64), target="host")
    assert report.findings[0]["utilization"] == pytest.approx((lanes + 1) / (2 * lanes))


def test_bad_arguments():
    with pytest.raises(ValueError) as info:
        torch_vtpu.advise(torch.nn.Linear(4, 4), torch.randn(2, 4), target="tpu-v9")
    for name in TARGETS:
        assert name in str(info.value)
    with pytest.raises(TypeError):
        torch_vtpu.advise(torch.nn.Linear(4, 4), torch.randn(2, 4), target=5)
    with pytest.raises(TypeError):
        torch_vtpu.advise("not a model", torch.randn(2, 4))
    with pytest.raises(TypeError):
        torch_vtpu.advise(torch.nn.Linear(4, 4), 3.0)
    with pytest.raises(ValueError):
        torch_vtpu.debug.advise_target("tpu-v9")


def test_debug_mode_warns_once_per_call_site():
    a = torch.randn(256, 64, device="vtpu")
    b = torch.randn(64, 256, device="vtpu")
    torch_vtpu.debug.advise_target("tpu-v5e")
    try:
        with torch_vtpu.mode("debug"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                a @ b  # <warn_site>
            a @ b  # <other_site>
    finally:
        torch_vtpu.debug.advise_target(None)
    alignment = [w for w in caught if issubclass(w.category, torch_vtpu.debug.AlignmentWarning)]
    assert len(alignment) == 2, [str(w.message) for w in alignment]
    assert "[mm] K=64: 50% of the tpu-v5e tile" in str(alignment[0].message)
    assert f"{HERE}:{line_of(__file__, '# <warn_site>')}" in str(alignment[0].message)
    assert f"{HERE}:{line_of(__file__, '# <other_site>')}" in str(alignment[1].message)
