"""Small host-kernel-path ops run ATen's CPU kernel on one thread
(bridge/host_path_rules.h, runs_serially): inside a step OpenMP's fork-join
costs more than such a kernel's work. Counted in
metrics()["host_serial_ops"]. Only ops on a list of work linear in data
(searches, indexing, cat, bags, plain reductions) qualify; matrix products,
fused layers and the rest keep ATen's threads, as do ops over the byte bound
(VTPU_SERIAL_HOST_OP_BYTES, default 1 MiB; 0 turns the rule off)."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_vtpu


def _serial_counts():
    torch.vtpu.synchronize()
    return dict(torch_vtpu.metrics()["host_serial_ops"])


def _small_ops(device):
    g = torch.Generator().manual_seed(3)
    sorted_seq = torch.arange(0, 2048, 4)
    queries = torch.randint(0, 2048, (2048,), generator=g)
    weight = torch.randn(1000, 16, generator=g)
    indices = torch.randint(0, 1000, (256,), generator=g)
    offsets = torch.arange(0, 256, 4)
    table = torch.randn(64, 33, generator=g)
    rows = torch.randint(0, 64, (40,), generator=g)
    return {
        "aten::searchsorted.Tensor": lambda: torch.searchsorted(sorted_seq.to(device), queries.to(device), right=True),
        "aten::_embedding_bag_forward_only": lambda: F.embedding_bag(indices.to(device), weight.to(device), offsets.to(device),
                                                        mode="sum"),
        "aten::index.Tensor": lambda: table.to(device)[rows.to(device)],
    }


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_small_host_ops_run_serially_with_the_cpus_results(mode):
    cpu_ops = _small_ops("cpu")
    with torch_vtpu.mode(mode):
        for name, fn in _small_ops("vtpu").items():
            before = _serial_counts().get(name, 0)
            got = fn().cpu()
            assert _serial_counts().get(name, 0) == before + 1, (name, _serial_counts())
            assert torch.equal(got, cpu_ops[name]()), name


def test_ops_over_the_byte_bound_or_off_the_list_keep_atens_threads():
    g = torch.Generator().manual_seed(4)
    before = _serial_counts()
    # 2 x 512 KiB of arguments and a 1 MiB result: over the 1 MiB bound.
    seq = torch.arange(0, 4 * 131072, 4)
    queries = torch.randint(0, 4 * 131072, (262144,), generator=g)
    big = torch.searchsorted(seq.vtpu(), queries.vtpu())
    # A small float64 matrix product stays on ATen's kernel (mm.out), and so
    # does a fused transformer layer: their work outgrows their data.
    a, b = torch.randn(8, 8, dtype=torch.float64, generator=g), torch.randn(8, 8, dtype=torch.float64, generator=g)
    product = a.vtpu() @ b.vtpu()
    layer = torch.nn.TransformerEncoderLayer(64, 4, 256, batch_first=True).eval()
    tokens = torch.randn(2, 16, 64, generator=g)
    with torch.no_grad():
        encoded = layer.to("vtpu")(tokens.vtpu()).cpu()
        expected = layer.to("cpu")(tokens)
    assert torch.equal(big.cpu(), torch.searchsorted(seq, queries))
    assert torch.equal(product.cpu(), a @ b)
    torch.testing.assert_close(encoded, expected)
    assert _serial_counts() == before, (before, _serial_counts())


PROGRAM = r"""
import json, torch, torch_vtpu
g = torch.Generator().manual_seed(0)
x = torch.randn(65536, generator=g) * 1000
torch.set_num_threads(1); one = x.sum()
torch.set_num_threads(2); two = x.sum()
# 1.6 MB, over the bound; the first seed whose sum tells one thread from two.
for seed in range(1, 40):
    big = torch.randn(400000, generator=torch.Generator().manual_seed(seed)) * 1000
    torch.set_num_threads(1); big_one = big.sum()
    torch.set_num_threads(2); big_two = big.sum()
    if big_one.item() != big_two.item():
        break
got = x.vtpu().sum().cpu()
# An error inside a serial kernel, then an op over the bound: its bits tell
# whether the stream's thread got ATen's threads back.
try:
    torch.randn(64, 33).vtpu()[torch.tensor([0, 64]).vtpu()].cpu()
    raised = None
except IndexError as error:
    raised = "IndexError"
big_got = big.vtpu().sum().cpu()
print(json.dumps({"one_thread": one.item(), "two_threads": two.item(), "vtpu": got.item(),
                  "big_one_thread": big_one.item(), "big_two_threads": big_two.item(), "big_vtpu": big_got.item(),
                  "raised": raised, "serial": torch_vtpu.metrics()["host_serial_ops"]}))
"""


def _sum_on_the_host_path(bound):
    # Generated kernels off: the sum runs ATen's CPU kernel on the host-kernel
    # path, and ATen's float sum of 65536 elements splits its work by thread
    # count, so its bits tell how many threads ran it.
    env = dict(os.environ, VTPU_GENERATED_KERNELS="0")
    env.pop("VTPU_SERIAL_HOST_OP_BYTES", None)
    if bound is not None:
        env["VTPU_SERIAL_HOST_OP_BYTES"] = bound
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="needs ATen's two-thread result to differ from one thread's")
def test_a_serial_kernel_runs_on_one_thread_and_the_bound_turns_it_off():
    serial, _ = _sum_on_the_host_path(None)
    assert serial["one_thread"] != serial["two_threads"], serial  # the probe can tell the two apart
    assert serial["big_one_thread"] != serial["big_two_threads"], serial
    assert serial["vtpu"] == serial["one_thread"], serial
    assert serial["raised"] == "IndexError", serial
    # After the failed serial kernel the stream's thread runs ATen's threads again.
    assert serial["big_vtpu"] == serial["big_two_threads"], serial
    assert serial["serial"] == {"aten::sum.IntList_out": 1, "aten::index.Tensor": 1}, serial
    threaded, _ = _sum_on_the_host_path("0")
    assert threaded["vtpu"] == threaded["two_threads"], threaded
    assert threaded["serial"] == {}, threaded


@pytest.mark.parametrize("bound", ["1MiB", "-1", "99999999999999999999999", " 5"])
def test_a_malformed_bound_is_reported_and_the_default_used(bound):
    report, stderr = _sum_on_the_host_path(bound)
    assert f"VTPU_SERIAL_HOST_OP_BYTES={bound} is not a non-negative integer" in stderr, stderr
    assert report["serial"].get("aten::index.Tensor") == 1, report


def test_an_error_in_a_serial_kernel_is_raised_and_the_process_stays_usable():
    table = torch.randn(64, 33).vtpu()
    with pytest.raises(IndexError):
        table[torch.tensor([0, 64]).vtpu()].cpu()
    rows = torch.tensor([1, 63])
    assert torch.equal(table[rows.vtpu()].cpu(), table.cpu()[rows])
