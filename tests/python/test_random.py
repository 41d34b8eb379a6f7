"""Random numbers: same seed, same values, in every mode; generator state."""
import pytest
import torch

import torch_vtpu


def _draw():
    return torch.cat([torch.randn(5, device="vtpu"), torch.rand(5, device="vtpu"),
                      torch.nn.functional.dropout(torch.ones(8, device="vtpu"), 0.5)]).cpu()


def test_manual_seed_reproduces():
    torch.vtpu.manual_seed(7)
    a = _draw()
    torch.vtpu.manual_seed(7)
    b = _draw()
    assert torch.equal(a, b)
    torch.vtpu.manual_seed(8)
    assert not torch.equal(a, _draw())


def test_same_values_in_every_mode():
    values = {}
    for name in ("debug", "strict", "fused"):
        with torch_vtpu.mode(name):
            torch.vtpu.manual_seed(3)
            values[name] = _draw()
    assert torch.equal(values["debug"], values["strict"])
    assert torch.equal(values["strict"], values["fused"])


def test_torch_manual_seed_seeds_vtpu():
    torch.manual_seed(11)
    a = torch.rand(4, device="vtpu").cpu()
    torch.manual_seed(11)
    assert torch.equal(a, torch.rand(4, device="vtpu").cpu())


def test_rng_state_roundtrip():
    torch.vtpu.manual_seed(5)
    torch.randn(3, device="vtpu")
    state = torch.vtpu.get_rng_state()
    a = torch.randn(4, device="vtpu").cpu()
    torch.vtpu.set_rng_state(state)
    assert torch.equal(a, torch.randn(4, device="vtpu").cpu())
    assert torch.vtpu.initial_seed() == 5
    with pytest.raises(RuntimeError, match="wrong size"):
        torch.vtpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
def test_generator_set_state_checks_its_tensor_as_cpu_and_cuda_do(mode):
    # The state's bytes are read directly: a strided view was read as if
    # contiguous, and a vtpu tensor's memory before its queued copy had run
    # (a silently wrong stream in both cases).
    torch_vtpu.set_mode(mode)
    g = torch.Generator(device="vtpu")
    g.manual_seed(77)
    torch.rand(3, device="vtpu", generator=g)
    state = g.get_state()
    expected = torch.rand(5, device="vtpu", generator=g).cpu()
    spread = torch.zeros(32, dtype=torch.uint8)
    spread[::2] = state
    with pytest.raises(RuntimeError, match="contiguous"):
        g.set_state(spread[::2])
    with pytest.raises(TypeError, match="ByteTensor"):
        g.set_state(state.to("vtpu"))
    with pytest.raises(TypeError, match="ByteTensor"):
        g.set_state(state.float())
    with pytest.raises(RuntimeError, match="wrong size"):
        g.set_state(torch.get_rng_state())
    g.set_state(state)
    assert torch.equal(torch.rand(5, device="vtpu", generator=g).cpu(), expected)
    # torch.vtpu.set_rng_state takes any layout and device, as torch.cuda's does.
    torch.vtpu.manual_seed(3)
    torch.rand(2, device="vtpu")
    default_state = torch.vtpu.get_rng_state()
    after = torch.rand(4, device="vtpu").cpu()
    spread[::2] = default_state
    torch.vtpu.set_rng_state(spread[::2].to("vtpu"))
    assert torch.equal(torch.rand(4, device="vtpu").cpu(), after)


def test_explicit_generator():
    g = torch.Generator(device="vtpu")
    g.manual_seed(1)
    a = torch.randn(4, device="vtpu", generator=g).cpu()
    g.manual_seed(1)
    assert torch.equal(a, torch.randn(4, device="vtpu", generator=g).cpu())


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_recomputes_dropout_with_the_same_mask(mode, use_reentrant):
    """torch.utils.checkpoint restores the device RNG state before recomputing,
    so dropout draws the forward's mask again and the gradients equal those of
    the same program without checkpointing (it drew a new mask: wrong grads)."""
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    torch_vtpu.set_mode(mode)
    w = torch.randn(32, 32).to("vtpu")

    def block(t):
        return F.dropout(torch.tanh(t @ w), 0.5, training=True)

    grads = []
    for checkpointed in (True, False):
        torch.manual_seed(0)
        x = torch.randn(8, 32).to("vtpu").requires_grad_()
        y = checkpoint(block, x, use_reentrant=use_reentrant, preserve_rng_state=True) if checkpointed else block(x)
        y.sum().backward()
        grads.append(x.grad.cpu())
    assert torch.equal(grads[0], grads[1])


def test_a_generator_of_a_missing_device_is_refused():
    # torch.Generator(device="vtpu:1") used to give a generator of vtpu:0
    # (found by a review); there is one vtpu device, as torch.cuda refuses an
    # index past its device count.
    assert torch.Generator(device="vtpu").device == torch.device("vtpu", 0)
    assert torch.Generator(device="vtpu:0").device == torch.device("vtpu", 0)
    with pytest.raises(RuntimeError, match="invalid device index 1"):
        torch.Generator(device="vtpu:1")
