"""Compressed sparse layouts (CSR, CSC, BSR, BSC) on vtpu (bridge/sparse_tensors.cpp):
ATen's SparseCsrTensorImpl with vtpu indices and values. Metadata ops are ATen's own
device-independent kernels; every other op runs ATen's SparseCsrCPU kernel on host
copies, so results are the CPU's bits. A graph-convolution layer (`torch.sparse.mm`
of a CSR adjacency) trains like the CPU in every mode."""
import warnings

import pytest
import torch

import torch_vtpu

MODES = ["strict", "fused", "debug"]

pytestmark = pytest.mark.filterwarnings("ignore:Sparse (CSR|CSC|BSR|BSC) tensor support is in beta")

DENSE = torch.tensor([[0.0, 1.5, 0.0, 0.0],
                      [2.0, 0.0, 3.0, 0.0],
                      [0.0, 0.0, 0.0, 0.0],
                      [4.0, 0.0, 5.0, -1.0]])


def _make(layout, device):
    if layout == "csr":
        return DENSE.to_sparse_csr().to(device)
    if layout == "csc":
        return DENSE.to_sparse_csc().to(device)
    if layout == "bsr":
        return DENSE.to_sparse_bsr((2, 2)).to(device)
    return DENSE.to_sparse_bsc((2, 2)).to(device)


def _host(value):
    if isinstance(value, (list, tuple)):
        return [_host(v) for v in value]
    if not isinstance(value, torch.Tensor):
        return value
    value = value.cpu()
    return value.to_dense() if value.layout != torch.strided else value


def _same(a, b):
    a, b = _host(a), _host(b)
    if isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b), (a, b)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["csr", "csc", "bsr", "bsc"])
def test_compressed_tensors_live_on_the_device(mode, layout):
    torch_vtpu.set_mode(mode)
    s = _make(layout, "vtpu")
    assert s.layout == getattr(torch, "sparse_" + layout) and s.device.type == "vtpu"
    assert s.values().device.type == "vtpu"
    reference = _make(layout, "cpu")
    if layout in ("csr", "bsr"):
        _same([s.crow_indices(), s.col_indices()], [reference.crow_indices(), reference.col_indices()])
    else:
        _same([s.ccol_indices(), s.row_indices()], [reference.ccol_indices(), reference.row_indices()])
    assert s._nnz() == reference._nnz() and s.sparse_dim() == 2 and s.dense_dim() == 0
    _same(s.values(), reference.values())
    _same(s.to_dense(), DENSE)
    back = s.cpu()
    assert back.layout == s.layout and back.device.type == "cpu"
    _same(back, DENSE)
    try:
        expected = reference @ torch.ones(4, 3)
    except RuntimeError as error:  # the CPU has no BSC product
        with pytest.raises(RuntimeError, match="not implemented for"):
            s @ torch.ones(4, 3, device="vtpu")
        assert layout == "bsc", error
    else:
        _same(s @ torch.ones(4, 3, device="vtpu"), expected)


CSR_OPS = {
    "mm": lambda s, d: torch.mm(s, d),
    "sparse_mm": lambda s, d: torch.sparse.mm(s, d),
    "addmm": lambda s, d: torch.addmm(d, s, d, beta=0.5, alpha=2.0),
    "mv": lambda s, d: s @ d[:, 0].contiguous(),
    "matmul_dense_left": lambda s, d: d.t() @ s,
    "add_csr": lambda s, d: s + s,
    "mul_scalar": lambda s, d: s * 2.5,
    "unary": lambda s, d: [s.sin(), s.neg(), s.abs(), s.abs().sqrt()],
    "sum": lambda s, d: s.sum(),
    "transpose_to_csc": lambda s, d: s.t(),
    "to_coo": lambda s, d: s.to_sparse(),
    "to_csc": lambda s, d: s.to_sparse_csc(),
    "dense_to_csr": lambda s, d: d.to_sparse_csr(),
    "clone": lambda s, d: s.clone(),
    "double": lambda s, d: s.double(),
    "select_row": lambda s, d: s.select(0, 1),
    "values_relu": lambda s, d: s.values().relu(),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CSR_OPS))
def test_csr_ops_give_the_cpus_results(mode, case):
    torch_vtpu.set_mode(mode)
    torch.manual_seed(0)
    dense = torch.randn(4, 5)
    fn = CSR_OPS[case]
    expected = fn(_make("csr", "cpu"), dense)
    got = fn(_make("csr", "vtpu"), dense.to("vtpu"))
    for g in (got if isinstance(got, list) else [got]):
        assert g.device.type == "vtpu"
    if case in ("transpose_to_csc", "to_coo", "to_csc", "dense_to_csr", "clone", "double"):
        assert got.layout == expected.layout
    _same(got, expected)


@pytest.mark.parametrize("mode", MODES)
def test_in_place_ops_and_copies_write_the_device_tensor(mode):
    torch_vtpu.set_mode(mode)
    s = _make("csr", "vtpu")
    s.mul_(3.0)
    _same(s, DENSE * 3)
    s.values().add_(1.0)
    expected = _make("csr", "cpu")
    expected.values().mul_(3.0).add_(1.0)
    _same(s, expected)
    target = _make("csr", "vtpu")
    target.copy_(_make("csr", "cpu").mul(-2.0))
    _same(target, DENSE * -2)
    s.zero_()  # the CPU's zero_ drops every element
    assert s._nnz() == 0 and torch.equal(s.crow_indices().cpu(), torch.zeros(5, dtype=torch.int64))
    _same(s, torch.zeros(4, 4))


@pytest.mark.parametrize("mode", MODES)
def test_errors_of_compressed_ops_are_the_cpus(mode):
    torch_vtpu.set_mode(mode)
    s = _make("csr", "vtpu")
    with pytest.raises(RuntimeError) as cpu_error:
        torch.mm(_make("csr", "cpu"), torch.ones(3, 2))
    with pytest.raises(RuntimeError) as vtpu_error:
        torch.mm(s, torch.ones(3, 2, device="vtpu"))
    assert str(cpu_error.value).split("\n")[0] in str(vtpu_error.value)
    # An op the CPU has no compressed kernel for says so, naming the device.
    with pytest.raises(NotImplementedError, match="cumsum.*vtpu"):
        torch.cumsum(s, 0)


def _gcn_step(device, steps=3):
    """A two-layer graph convolution: H' = relu(A @ (H @ W)), A a normalised
    adjacency in CSR. Returns the losses and the final weights."""
    torch.manual_seed(0)
    nodes, features = 24, 8
    edges = torch.randint(0, nodes, (2, 80))
    adjacency = torch.zeros(nodes, nodes)
    adjacency[edges[0], edges[1]] = 1.0
    adjacency += torch.eye(nodes)
    adjacency /= adjacency.sum(1, keepdim=True)
    a = adjacency.to_sparse_csr().to(device)
    x = torch.randn(nodes, features).to(device)
    labels = torch.randint(0, 3, (nodes,)).to(device)
    w1 = torch.nn.Parameter((torch.randn(features, 16) * 0.3).to(device))
    w2 = torch.nn.Parameter((torch.randn(16, 3) * 0.3).to(device))
    opt = torch.optim.SGD([w1, w2], lr=0.5)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        h = torch.relu(torch.sparse.mm(a, x @ w1))
        logits = torch.sparse.mm(a, h @ w2)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    return torch.stack(losses), w1.detach().cpu(), w2.detach().cpu()


def test_a_graph_convolution_with_a_csr_adjacency_trains_like_the_cpu():
    expected = _gcn_step("cpu")
    by_mode = {}
    for mode in MODES:
        torch_vtpu.set_mode(mode)
        by_mode[mode] = _gcn_step("vtpu")
        for got, want in zip(by_mode[mode], expected):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for mode in ("fused", "debug"):
        for got, want in zip(by_mode[mode], by_mode["strict"]):
            assert torch.equal(got, want)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_compressed_tensor_round_trips_through_torch_save(mode, tmp_path):
    torch_vtpu.set_mode(mode)
    s = _make("csr", "vtpu")
    torch.save(s, tmp_path / "s.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = torch.load(tmp_path / "s.pt", map_location="vtpu")
    assert loaded.layout == torch.sparse_csr and loaded.device.type == "vtpu"
    _same(loaded, DENSE)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_dense_update_by_a_compressed_tensor_is_queued_without_synchronising(mode):
    # `dense.add_(csr)` writes only its dense argument: it is queued like a
    # host-kernel-path op, with the compressed operand's components captured.
    torch_vtpu.set_mode(mode)
    s = _make("csr", "vtpu")
    d = torch.ones(4, 4, device="vtpu")
    torch.vtpu.synchronize()
    torch_vtpu.reset_metrics()
    d.add_(s, alpha=2.0)
    d.add_(s)
    assert set(torch_vtpu.metrics()["syncs"]) <= {"unfused_op"}, torch_vtpu.metrics()["syncs"]
    _same(d, torch.ones(4, 4) + 3 * DENSE)
