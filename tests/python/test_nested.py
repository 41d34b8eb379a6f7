"""Nested tensors (torch.nested, layout=torch.strided) on vtpu (bridge/nested_tensors.cpp):
ATen's NestedTensorImpl over device memory. Every nested op runs ATen's NestedTensorCPU
kernel on CPU aliases of the device buffers, so results are the CPU's bits. The case that
needs them: nn.TransformerEncoder in inference with a padding mask, whose default
(enable_nested_tensor=True) packs the batch into a nested tensor; it raised on vtpu."""
import pytest
import torch
from torch import nn

import torch_vtpu

MODES = ["strict", "fused", "debug"]

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")


def _pieces():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, generator=g), torch.randn(4, 3, generator=g), torch.randn(1, 3, generator=g)]


@pytest.mark.parametrize("mode", MODES)
def test_transformer_encoder_with_a_padding_mask_takes_the_nested_path_like_the_cpu(mode):
    torch_vtpu.set_mode(mode)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2).eval()
    assert encoder.use_nested_tensor
    x = torch.randn(3, 6, 16)
    pad = torch.arange(6).expand(3, 6) >= torch.tensor([[6], [4], [2]])
    with torch.no_grad():
        expected = encoder(x, src_key_padding_mask=pad)
        got = encoder.to("vtpu")(x.to("vtpu"), src_key_padding_mask=pad.to("vtpu"))
    assert got.device.type == "vtpu" and not got.is_nested
    assert torch.equal(got.cpu(), expected)
    # Padded positions are zeros, as the nested path gives them.
    assert torch.equal(got[2, 2:].cpu(), torch.zeros(4, 16))
    assert torch_vtpu.metrics()["host_fallback_ops"].get("aten::_transformer_encoder_layer_fwd", 0) > 0


NESTED_OPS = {
    "padded": lambda n: n.to_padded_tensor(0.0),
    "padded_with_size": lambda n: n.to_padded_tensor(-1.0, (3, 5, 4)),
    "elementwise": lambda n: (n * 2 + 1).relu().to_padded_tensor(0.0),
    "nested_plus_nested": lambda n: (n + n.sin()).to_padded_tensor(0.0),
    "softmax": lambda n: n.softmax(-1).to_padded_tensor(0.0),
    "matmul": lambda n: torch.matmul(n, n.transpose(-1, -2)).to_padded_tensor(0.0),
    "linear": lambda n: nn.functional.linear(n, torch.ones(5, 3, device=n.device)).to_padded_tensor(0.0),
    "unbind": lambda n: list(n.unbind()),
    "sizes": lambda n: n._nested_tensor_size(),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(NESTED_OPS))
def test_nested_ops_give_the_cpus_results(mode, case):
    torch_vtpu.set_mode(mode)
    expected = NESTED_OPS[case](torch.nested.nested_tensor(_pieces()))
    on_device = torch.nested.nested_tensor(_pieces(), device="vtpu")
    assert on_device.is_nested and on_device.device.type == "vtpu"
    got = NESTED_OPS[case](on_device)
    pairs = zip(got, expected) if isinstance(got, list) else [(got, expected)]
    for g, e in pairs:
        if case != "sizes":
            assert g.device.type == "vtpu"
        assert torch.equal(g.cpu(), e)


@pytest.mark.parametrize("mode", MODES)
def test_nested_transfers_views_and_in_place_ops(mode):
    torch_vtpu.set_mode(mode)
    cpu = torch.nested.nested_tensor(_pieces())
    nested = cpu.to("vtpu")
    back = nested.cpu()
    assert back.is_nested and back.device.type == "cpu"
    assert torch.equal(back.to_padded_tensor(0.0), cpu.to_padded_tensor(0.0))
    # unbind gives views of the device buffer, as on the CPU.
    first = nested.unbind()[0]
    first.add_(10.0)
    assert torch.equal(nested.unbind()[0].cpu(), _pieces()[0] + 10.0)
    nested.mul_(2.0)
    expected = [p * 2 for p in _pieces()]
    expected[0] = (_pieces()[0] + 10.0) * 2
    for got, want in zip(nested.unbind(), expected):
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("mode", MODES)
def test_an_op_without_a_nested_cpu_kernel_says_so(mode):
    torch_vtpu.set_mode(mode)
    nested = torch.nested.nested_tensor(_pieces(), device="vtpu")
    with pytest.raises(NotImplementedError) as cpu_error:
        torch.cumsum(torch.nested.nested_tensor(_pieces()), 0)
    with pytest.raises(NotImplementedError, match="nested vtpu tensors"):
        torch.cumsum(nested, 0)
    assert "NestedTensorCPU" in str(cpu_error.value)
