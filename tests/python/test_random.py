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
    with pytest.raises(ValueError):
        torch.vtpu.set_rng_state(torch.zeros(3, dtype=torch.uint8))


def test_explicit_generator():
    g = torch.Generator(device="vtpu")
    g.manual_seed(1)
    a = torch.randn(4, device="vtpu", generator=g).cpu()
    g.manual_seed(1)
    assert torch.equal(a, torch.randn(4, device="vtpu", generator=g).cpu())
