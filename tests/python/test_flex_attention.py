"""FlexAttention on vtpu (torch_vtpu/_flex_attention.py): torch's device check
raised ValueError for vtpu; its dense implementation runs on vtpu ops, forward
and backward, eager and compiled."""
import math
import warnings

import pytest
import torch
import torch._dynamo
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

import torch_vtpu

B, H, HKV, L, E = 2, 4, 2, 128, 64


@pytest.fixture(autouse=True)
def _quiet():
    # torch warns that flex_attention without torch.compile materialises the scores
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield
    torch._dynamo.reset()


def _relative_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.01 - h * 0.1


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _inputs(heads_kv=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=g)
    k = torch.randn(B, heads_kv, L, E, generator=g)
    v = torch.randn(B, heads_kv, L, E, generator=g)
    return q, k, v


def _reference(q, k, v):
    """The same attention in plain ATen math on the CPU: scores scaled, biased
    as _relative_bias does, causally masked, softmax, times v (GQA repeats kv)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    qi = torch.arange(L)[:, None]
    ki = torch.arange(L)[None, :]
    heads = torch.arange(q.shape[1])[:, None, None]
    scores = scores + (qi - ki) * 0.01 - heads * 0.1
    scores = scores.masked_fill(qi < ki, float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_forward_matches_the_cpu(mode, gqa):
    q, k, v = _inputs(HKV if gqa else H)
    expected_block = create_block_mask(_causal, B, H, L, L, device="cpu")
    expected, expected_aux = flex_attention(q, k, v, score_mod=_relative_bias, block_mask=expected_block,
                                            enable_gqa=gqa, return_aux=AuxRequest(lse=True))
    with torch_vtpu.mode(mode):
        block = create_block_mask(_causal, B, H, L, L, device="vtpu")
        out, aux = flex_attention(q.to("vtpu"), k.to("vtpu"), v.to("vtpu"), score_mod=_relative_bias,
                                  block_mask=block, enable_gqa=gqa, return_aux=AuxRequest(lse=True))
        assert out.device.type == "vtpu" and aux.lse.device.type == "vtpu"
        torch.testing.assert_close(out.cpu(), expected)
        torch.testing.assert_close(aux.lse.cpu(), expected_aux.lse)
        torch.testing.assert_close(out.cpu(), _reference(q, k, v), atol=2e-5, rtol=1e-5)


def _train_step(mode, gqa):
    q, k, v = (t.to("vtpu").requires_grad_() for t in _inputs(HKV if gqa else H, seed=1))
    with torch_vtpu.mode(mode):
        block = create_block_mask(_causal, B, H, L, L, device="vtpu")
        out = flex_attention(q, k, v, score_mod=_relative_bias, block_mask=block, enable_gqa=gqa)
        (out * torch.linspace(-1, 1, E, device="vtpu")).sum().backward()
        torch.vtpu.synchronize()
    return out.detach().cpu(), q.grad.cpu(), k.grad.cpu(), v.grad.cpu()


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_backward_matches_plain_attention_and_the_modes_agree_bitwise(gqa):
    # torch's CPU flex attention has no backward: the reference is plain autograd math
    strict = _train_step("strict", gqa)
    fused = _train_step("fused", gqa)
    for a, b in zip(strict, fused):
        assert torch.equal(a, b)
    q, k, v = (t.requires_grad_() for t in _inputs(HKV if gqa else H, seed=1))
    out = _reference(q, k, v)
    (out * torch.linspace(-1, 1, E)).sum().backward()
    for actual, expected in zip(strict, (out.detach(), q.grad, k.grad, v.grad)):
        torch.testing.assert_close(actual, expected, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["vtpu", None], ids=["vtpu", "default"])
def test_compiled_gives_eagers_bits(backend):
    q, k, v = (t.to("vtpu") for t in _inputs(seed=2))
    block = create_block_mask(_causal, B, H, L, L, device="vtpu")
    eager_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    eager = flex_attention(*eager_inputs, score_mod=_relative_bias, block_mask=block)
    eager.sum().backward()
    compiled_fn = torch.compile(flex_attention, backend=backend) if backend else torch.compile(flex_attention)
    compiled_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    compiled = compiled_fn(*compiled_inputs, score_mod=_relative_bias, block_mask=block)
    compiled.sum().backward()
    assert torch.equal(compiled.detach().cpu(), eager.detach().cpu())
    for c, e in zip(compiled_inputs, eager_inputs):
        assert torch.equal(c.grad.cpu(), e.grad.cpu())


def test_compiled_block_mask_equals_the_eager_one():
    eager = create_block_mask(_causal, B, H, L, L, device="vtpu", BLOCK_SIZE=32)
    compiled = torch.compile(create_block_mask)(_causal, B, H, L, L, device="vtpu", BLOCK_SIZE=32)
    assert compiled.kv_num_blocks.device.type == "vtpu"
    for a, b in zip(compiled.as_tuple(), eager.as_tuple()):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a.cpu(), b.cpu())
        else:
            assert a == b


def test_other_devices_keep_torchs_check():
    q = torch.empty(1, 1, 16, 8, device="meta")
    with pytest.raises(ValueError, match="only supported on"):
        flex_attention(q, q, q)
    cpu = [t.requires_grad_() for t in _inputs()]
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(*cpu)
