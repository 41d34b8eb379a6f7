"""Sparse COO tensors on vtpu (bridge/sparse_tensors.cpp): the sparse gradients of
nn.Embedding / nn.EmbeddingBag(sparse=True) and the optimizers that consume them, and
sparse ops against the CPU. Sparse ops run ATen's SparseCPU kernels on host copies, so
their results are the CPU's bits; the dense parts of a training step (the Linear head,
the loss) are the backend's own kernels, within rounding of the CPU."""
import io

import pytest
import torch

import torch_vtpu

MODES = ["strict", "fused", "debug"]


def _dense(t):
    t = t.cpu()
    return t.to_dense() if t.is_sparse else t


def _coo(device):
    indices = torch.tensor([[0, 1, 1, 0], [2, 0, 2, 2]])
    values = torch.tensor([3.0, 4.0, 5.0, 1.0])
    return torch.sparse_coo_tensor(indices, values, (2, 3)).to(device)


@pytest.mark.parametrize("mode", MODES)
def test_sparse_tensors_live_on_the_device(mode):
    torch_vtpu.set_mode(mode)
    s = _coo("vtpu")
    assert s.is_sparse and s.device.type == "vtpu"
    assert s._indices().device.type == "vtpu" and s._values().device.type == "vtpu"
    assert s._nnz() == 4 and s.sparse_dim() == 2 and s.dense_dim() == 0 and not s.is_coalesced()
    made_there = torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0]), (3,), device="vtpu")
    assert made_there.device.type == "vtpu" and torch.equal(_dense(made_there), torch.tensor([1.0, 2.0, 0.0]))
    back = s.cpu()
    assert back.is_sparse and back.device.type == "cpu"
    assert torch.equal(back.to_dense(), _coo("cpu").to_dense())
    assert "layout=torch.sparse_coo" in repr(s) and "vtpu" in repr(s)


SPARSE_OPS = {
    "coalesce": lambda s, d: s.coalesce(),
    "indices_values": lambda s, d: [s.coalesce().indices(), s.coalesce().values()],
    "to_dense": lambda s, d: s.to_dense(),
    "add_sparse": lambda s, d: s + s,
    "sub_to_nothing": lambda s, d: (s - s).coalesce(),
    "mul_scalar": lambda s, d: s * 2.5,
    "div_scalar": lambda s, d: s / 3,
    "neg_abs_pow": lambda s, d: [-s, s.abs(), s.coalesce().pow(2)],
    "dense_plus_sparse": lambda s, d: d + s,
    "sparse_mm": lambda s, d: torch.sparse.mm(s, d.t()),
    "sum_all": lambda s, d: s.sum(),
    "sparse_sum_dim": lambda s, d: torch.sparse.sum(s, dim=1),
    "transpose": lambda s, d: s.t().coalesce(),
    "sparse_mask": lambda s, d: d.sparse_mask(s.coalesce()),
    "to_sparse": lambda s, d: d.to_sparse(),
    "index_select": lambda s, d: s.index_select(0, torch.tensor([1], device=d.device)),
    "dtype_conversion": lambda s, d: s.double(),
    "clone_zero_": lambda s, d: [s.clone(), s.clone().zero_()],
    # smm calls sspaddmm(result, result, ...) with out=result: one tensor
    # twice, which raised a size error when the two became two host copies.
    "smm": lambda s, d: torch.smm(s, d.t()),
    "sspaddmm_out_self": lambda s, d: _sspaddmm_into_itself(s, d),
    "hspmm": lambda s, d: torch.hspmm(s, d.t()),
}


def _sspaddmm_into_itself(s, d):
    r = torch.empty(0, layout=torch.sparse_coo, device=d.device)  # resized by the op
    torch.sspaddmm(r, s, d.t(), beta=0.0, out=r)
    return r


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(SPARSE_OPS))
def test_sparse_ops_give_the_cpus_results(mode, case):
    # sum_all returned the sparse input itself before each SparseCPU kernel
    # was registered for vtpu (the composite sum won over the fallback).
    torch_vtpu.set_mode(mode)
    results = {}
    for device in ("cpu", "vtpu"):
        out = SPARSE_OPS[case](_coo(device), torch.arange(6.0).reshape(2, 3).to(device))
        results[device] = out if isinstance(out, list) else [out]
    torch.vtpu.synchronize()
    for want, got in zip(results["cpu"], results["vtpu"]):
        assert got.device.type == "vtpu"
        assert got.layout == want.layout and got.dtype == want.dtype and got.shape == want.shape
        if want.is_sparse:
            assert got.is_coalesced() == want.is_coalesced()
        assert torch.equal(_dense(got), _dense(want))


@pytest.mark.parametrize("mode", MODES)
def test_in_place_ops_on_sparse_tensors_write_the_device_tensor(mode):
    torch_vtpu.set_mode(mode)
    results = {}
    for device in ("cpu", "vtpu"):
        s = _coo(device)
        grown = s.clone()
        grown.add_(s)  # new components, held by the same tensor
        grown.mul_(3)
        dense = torch.zeros(2, 3, device=device)
        dense.add_(grown, alpha=0.5)
        results[device] = (grown, dense)
    assert torch.equal(_dense(results["vtpu"][0]), _dense(results["cpu"][0]))
    assert torch.equal(results["vtpu"][1].cpu(), results["cpu"][1])


@pytest.mark.parametrize("mode", MODES)
def test_errors_of_sparse_ops_are_the_cpus(mode):
    torch_vtpu.set_mode(mode)
    for device in ("cpu", "vtpu"):
        with pytest.raises(RuntimeError, match="add\\(sparse, dense\\) is not supported"):
            _coo(device) + torch.ones(2, 3, device=device)
            torch.vtpu.synchronize()
    for device in ("cpu", "vtpu"):
        with pytest.raises(RuntimeError, match="size is 3 but found index 5"):
            torch.sparse_coo_tensor(torch.tensor([[0, 5]]), torch.tensor([1.0, 2.0]), (3,), device=device,
                                    check_invariants=True)
    # A queued in-place update raises at the next synchronisation (at the
    # call in debug mode), naming the op and the line.
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 3]]), torch.tensor([1.0, 2.0]), (4,))
    for device in ("cpu", "vtpu"):
        with pytest.raises(RuntimeError, match="expected 'self' and 'other' to have same size"):
            torch.zeros(3, device=device).add_(sparse.to(device))
            torch.vtpu.synchronize()
    # The process and the device stay usable.
    assert torch.equal(_dense(_coo("vtpu") * 1), _coo("cpu").to_dense())


@pytest.mark.parametrize("mode", MODES)
def test_sparse_tensor_round_trips_through_torch_save(mode):
    torch_vtpu.set_mode(mode)
    buffer = io.BytesIO()
    torch.save(_coo("vtpu"), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded.is_sparse and loaded.device.type == "vtpu"
    assert torch.equal(_dense(loaded), _coo("cpu").to_dense())


def _train(device, module, optimizer, steps=3, **module_args):
    torch.manual_seed(1)
    if module == "embedding":
        table = torch.nn.Embedding(20, 6, sparse=True, **module_args)
    else:
        table = torch.nn.EmbeddingBag(20, 6, sparse=True, **module_args)
    head = torch.nn.Linear(6, 1)
    table, head = table.to(device), head.to(device)
    make = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
        "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
        "sparse_adam": lambda p: torch.optim.SparseAdam(p, lr=0.1),
    }
    opt = make[optimizer](list(table.parameters()))
    g = torch.Generator().manual_seed(5)
    losses, grads = [], []
    for _ in range(steps):
        idx = torch.randint(0, 20, (8, 3), generator=g)
        weights = torch.rand(8, 3, generator=g)
        if module == "embedding":
            pooled = table(idx.to(device)).sum(1)
        elif module_args.get("mode", "mean") == "sum":
            pooled = table(idx.to(device), per_sample_weights=weights.to(device))
        else:
            pooled = table(idx.to(device))
        loss = head(pooled).square().mean()
        opt.zero_grad()
        loss.backward()
        assert table.weight.grad.is_sparse
        grads.append(_dense(table.weight.grad))
        opt.step()
        losses.append(loss.detach().cpu())
    return torch.stack(losses), torch.stack(grads), table.weight.detach().cpu()


TRAINING = [
    ("embedding", "sgd", {}),
    ("embedding", "sgd_momentum", {}),
    ("embedding", "adagrad", {"padding_idx": 3}),
    ("embedding", "sparse_adam", {}),
    ("bag", "sgd", {"mode": "mean"}),
    ("bag", "adagrad", {"mode": "sum"}),
    ("bag", "sparse_adam", {"mode": "mean", "padding_idx": 2}),
]


@pytest.mark.parametrize("module,optimizer,module_args", TRAINING, ids=lambda x: str(x))
def test_training_with_sparse_gradients_matches_the_cpu_and_across_modes(module, optimizer, module_args):
    # Raised NotImplementedError ("Sparsevtpu") before sparse vtpu tensors existed.
    want = _train("cpu", module, optimizer, **module_args)
    by_mode = {}
    for mode in MODES:
        torch_vtpu.set_mode(mode)
        by_mode[mode] = _train("vtpu", module, optimizer, **module_args)
    for got in by_mode.values():
        for w, g in zip(want, got):
            # The dense head's reductions round differently from the CPU's by an ulp.
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    for mode in ("fused", "debug"):
        for s, g in zip(by_mode["strict"], by_mode[mode]):
            assert torch.equal(s, g), mode


@pytest.mark.parametrize("mode", MODES)
def test_sparse_gradients_accumulate_over_backward_calls(mode):
    torch_vtpu.set_mode(mode)
    results = {}
    for device in ("cpu", "vtpu"):
        table = torch.nn.Embedding(10, 3, sparse=True).to(device)
        with torch.no_grad():
            table.weight.copy_(torch.arange(30.0).reshape(10, 3))
        for rows in ([1, 2], [2, 3, 3]):
            table(torch.tensor(rows, device=device)).pow(2).sum().backward()
        results[device] = table.weight.grad
    got, want = results["vtpu"], results["cpu"]
    assert got.is_sparse and got._nnz() == want._nnz()
    assert torch.equal(_dense(got), want.to_dense())


@pytest.mark.parametrize("mode", MODES)
def test_gradients_flow_through_sparse_ops(mode):
    torch_vtpu.set_mode(mode)
    grads = {}
    for device in ("cpu", "vtpu"):
        dense = torch.arange(6.0).reshape(3, 2).to(device).requires_grad_(True)
        torch.sparse.mm(_coo(device), dense).square().sum().backward()
        grads[device] = dense.grad
    assert torch.equal(grads["vtpu"].cpu(), grads["cpu"])


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("bag_mode", ["sum", "mean"])
def test_a_sparse_embedding_bag_sgd_step_is_queued_without_synchronising(mode, bag_mode):
    # The bag's sparse backward ran on the host-kernel path and SGD's
    # param.add_(sparse grad) drained the stream: two synchronisations per
    # table and step (DLRM's reference training uses sparse bags with SGD).
    torch_vtpu.set_mode(mode)
    g = torch.Generator().manual_seed(0)
    indices, offsets = torch.randint(0, 50, (32,), generator=g), torch.arange(0, 32, 4)
    weights = {}
    for device in ("cpu", "vtpu"):
        torch.manual_seed(3)
        bag = torch.nn.EmbeddingBag(50, 8, mode=bag_mode, sparse=True).to(device)
        opt = torch.optim.SGD(bag.parameters(), lr=0.1)
        idx, off = indices.to(device), offsets.to(device)

        def step():
            opt.zero_grad()
            bag(idx, off).square().sum().backward()
            opt.step()

        step()
        if device == "vtpu":
            torch.vtpu.synchronize()
            torch_vtpu.reset_metrics()
        step()
        step()
        if device == "vtpu":
            # Fused mode flushes its window before each launch outside it
            # ("unfused_op"); nothing waits for the device.
            assert set(torch_vtpu.metrics()["syncs"]) <= {"unfused_op"}, torch_vtpu.metrics()["syncs"]
        weights[device] = bag.weight.detach().cpu()
    torch.testing.assert_close(weights["vtpu"], weights["cpu"], rtol=1e-6, atol=1e-6)
