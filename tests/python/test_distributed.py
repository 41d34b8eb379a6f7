"""torch.distributed over vtpu tensors: the "vtpu" c10d backend (torch_vtpu/distributed.py).

Each test starts two ranks (torch.multiprocessing.spawn) that meet through a file store.
Differential: every collective on vtpu tensors is checked against the same collective on
CPU copies through a plain Gloo group (the same transport, so bitwise), and DDP training
against CPU DDP over Gloo and across the eager modes.
"""
import datetime
import gc
import os
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="this torch build has no torch.distributed")

WORLD = 2


def _entry(rank, fn, store_path, backend, args):
    import torch_vtpu  # noqa: F401  (a spawned process starts without it)

    kwargs = {} if backend is None else {"backend": backend}
    dist.init_process_group(init_method=f"file://{store_path}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120), **kwargs)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()
        # Gloo's threads drop a finished work's tensors after its waiter returns; a tensor
        # with a Python object needs the GIL for that, which a thread cannot take once the
        # interpreter finalises (the process aborts: stock torch with Gloo on the CPU has
        # the same race at exit). Collecting the groups now joins those threads first.
        gc.collect()


def _run_ranks(fn, *args, backend="vtpu"):
    """Runs fn(rank, *args) in WORLD processes; a failure in any rank fails the test."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_entry, args=(fn, os.path.join(tmp, "store"), backend, args), nprocs=WORLD, join=True)


def _rank_tensor(rank, shape, dtype, device):
    values = torch.arange(1, 1 + torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
    values = (values * (rank + 2) / 3).to(dtype)
    return values.to(device)


def _collectives(rank, mode):
    import torch_vtpu

    torch_vtpu.set_mode(mode)
    reference = dist.new_group(backend="gloo")

    def check(name, run):
        """run(device, group) -> tensors; vtpu through the world group, CPU through Gloo."""
        got = [t.cpu() for t in run("vtpu", None)]
        want = run("cpu", reference)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and torch.equal(g, w), f"{name} on rank {rank}: {g} != {w}"

    for dtype in (torch.float32, torch.float64, torch.int64):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
            def all_reduce(device, group, dtype=dtype, op=op):
                # The input is pending device work in fused mode: the collective must
                # wait for it. A view with a storage offset checks the alias's offset.
                base = _rank_tensor(rank, (5, 3), dtype, device) * 2 - 1
                view = base[1:]
                dist.all_reduce(view, op=op, group=group)
                return [base]
            check(f"all_reduce {dtype} {op}", all_reduce)

    def all_gather(device, group):
        outs = [torch.zeros(4, 3, device=device) for _ in range(WORLD)]
        dist.all_gather(outs, _rank_tensor(rank, (4, 3), torch.float32, device) * 3 - 1, group=group)
        return outs
    check("all_gather", all_gather)

    def all_gather_into_tensor(device, group):
        out = torch.zeros(WORLD * 4, 3, device=device)
        dist.all_gather_into_tensor(out, _rank_tensor(rank, (4, 3), torch.float32, device) * 0.25 + 2, group=group)
        return [out]
    check("all_gather_into_tensor", all_gather_into_tensor)

    def reduce_scatter_tensor(device, group):
        out = torch.zeros(3, 2, device=device)
        dist.reduce_scatter_tensor(out, _rank_tensor(rank, (WORLD * 3, 2), torch.float32, device) + 0.5,
                                   group=group)
        return [out]
    check("reduce_scatter_tensor", reduce_scatter_tensor)

    def broadcast_reduce_gather_scatter(device, group):
        src = 1
        b = _rank_tensor(rank, (6,), torch.float32, device).neg()
        dist.broadcast(b, src=dist.get_global_rank(group, src) if group else src, group=group)
        r = _rank_tensor(rank, (6,), torch.float64, device)
        dist.reduce(r, dst=0, group=group)
        gathered = [torch.zeros(2, device=device) for _ in range(WORLD)] if rank == 0 else None
        dist.gather(_rank_tensor(rank, (2,), torch.float32, device), gathered, dst=0, group=group)
        scattered = torch.zeros(3, device=device)
        parts = [torch.full((3,), float(i + 7), device=device) for i in range(WORLD)] if rank == 0 else None
        dist.scatter(scattered, parts, src=0, group=group)
        # Only the root's result of a reduce is defined.
        return [b, scattered] + ([r, *gathered] if rank == 0 else [])
    check("broadcast/reduce/gather/scatter", broadcast_reduce_gather_scatter)

    def all_to_all_single(device, group):
        out = torch.zeros(WORLD * 2, device=device)
        dist.all_to_all_single(out, _rank_tensor(rank, (WORLD * 2,), torch.float32, device), group=group)
        return [out]
    check("all_to_all_single", all_to_all_single)

    def send_recv(device, group):
        peer = 1 - rank
        mine = _rank_tensor(rank, (3, 2), torch.float32, device) - 4
        theirs = torch.zeros(3, 2, device=device)
        if rank == 0:
            dist.send(mine, peer, group=group)
            dist.recv(theirs, peer, group=group)
        else:
            dist.recv(theirs, peer, group=group)
            dist.send(mine, peer, group=group)
        return [theirs]
    check("send/recv", send_recv)

    objects = [None] * WORLD
    dist.all_gather_object(objects, {"rank": rank, "t": torch.ones(2, device="vtpu") * rank})
    assert [o["rank"] for o in objects] == [0, 1]
    assert all(o["t"].device.type == "vtpu" and o["t"].cpu().tolist() == [r, r] for r, o in enumerate(objects))
    dist.barrier()
    # Every collective with vtpu tensors waited for the device at the same program points.
    syncs = [None] * WORLD
    dist.all_gather_object(syncs, torch_vtpu.metrics()["syncs"].get("collective", 0))
    assert syncs[0] == syncs[1] > 0


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_collectives_match_gloo_on_cpu(mode):
    _run_ranks(_collectives, mode)


def _async_and_errors(rank):
    t = torch.full((4,), float(rank + 1), device="vtpu")
    work = dist.all_reduce(t, async_op=True)
    result = work.get_future().wait()
    # The future completes with the caller's tensor, on the caller's device.
    assert result[0] is t and t.cpu().tolist() == [3.0] * 4
    # A tensor dropped before its work is waited on stays alive until Gloo is done
    # with it (Gloo's work holds the host alias, and the alias its device memory).
    for collective in ("all_reduce", "reduce_scatter_tensor"):
        u = torch.full((1 << 16,), 1.0, device="vtpu") * (rank + 1)
        out = torch.zeros(1 << 15, device="vtpu")
        # At least these two stay allocated. (An earlier round's input can be released
        # a moment after its wait returns, on Gloo's thread: not counted on.)
        held = (u.numel() + out.numel()) * 4
        if collective == "all_reduce":
            work = dist.all_reduce(u, async_op=True)
        else:
            work = dist.reduce_scatter_tensor(out, u, async_op=True)
        del u
        torch.vtpu.empty_cache()
        assert torch.vtpu.memory_allocated() >= held, collective
        work.wait()
        del work  # it still holds this round's input
        if collective == "reduce_scatter_tensor":
            assert out.cpu().eq(3.0).all()
    # Fire and forget: neither the tensor nor the work is kept, and the peer has not
    # joined yet (it waits for this rank's check), so Gloo still holds the host alias,
    # and the alias the device memory.
    store = dist.distributed_c10d._get_default_store()
    u = torch.full((1 << 16,), 1.0, device="vtpu") * (rank + 1)
    held = (u.numel() + out.numel()) * 4
    if rank == 0:
        dist.all_reduce(u, async_op=True)
        del u
        torch.vtpu.empty_cache()
        assert torch.vtpu.memory_allocated() >= held
        store.set("fire_and_forget_checked", "1")
    else:
        store.wait(["fire_and_forget_checked"])
        dist.all_reduce(u)
        assert u.cpu().eq(3.0).all()
    # Gloo's errors reach the caller with the CPU's exception type.
    for device in ("cpu", "vtpu"):
        bad_out = torch.zeros(5, device=device)
        with pytest.raises(Exception) as raised:
            dist.all_gather_into_tensor(bad_out, torch.ones(3, device=device))
        if device == "cpu":
            cpu_type = raised.type
        else:
            assert raised.type is cpu_type
    # Errors Gloo raises only when the work runs (int32 AVG) reach the caller too, from the
    # call and from wait(), with the CPU's type; the work reports them like Gloo's own.
    reference = dist.new_group(backend="gloo")
    for device, group in (("cpu", reference), ("vtpu", None)):
        with pytest.raises(Exception) as raised:
            dist.all_reduce(torch.ones(2, dtype=torch.int32, device=device), op=dist.ReduceOp.AVG, group=group)
        if device == "cpu":
            cpu_type = raised.type
        else:
            assert raised.type is cpu_type
    work = dist.all_reduce(torch.ones(2, dtype=torch.int32, device="vtpu"), op=dist.ReduceOp.AVG, async_op=True)
    with pytest.raises(cpu_type):
        work.wait()
    assert not work.is_success() and work.exception() is not None
    sparse = torch.ones(2, 2).to_sparse().to("vtpu")
    with pytest.raises(RuntimeError, match="dense"):
        dist.all_reduce(sparse)
    # The rest of Gloo's work interface: a bounded wait, result(), a receive from any rank.
    t = torch.full((3,), float(rank), device="vtpu")
    work = dist.all_reduce(t, async_op=True)
    assert work.wait(datetime.timedelta(seconds=60))
    assert work.result()[0] is t and t.cpu().tolist() == [1.0] * 3
    got = torch.zeros(2, device="vtpu")
    if rank == 0:
        dist.send(torch.full((2,), 5.0, device="vtpu"), 1)
    else:
        assert dist.recv(got) == 0 and got.cpu().tolist() == [5.0, 5.0]
    # Coalesced single-tensor gathers and scatters (FSDP2's), one call per pair.
    outs = [torch.zeros(WORLD * 2, device="vtpu"), torch.zeros(WORLD, device="vtpu")]
    ins = [torch.full((2,), float(rank + 1), device="vtpu"), torch.full((1,), float(10 * rank), device="vtpu")]
    dist.group.WORLD.allgather_into_tensor_coalesced(outs, ins).wait()
    assert outs[0].cpu().tolist() == [1.0, 1.0, 2.0, 2.0] and outs[1].cpu().tolist() == [0.0, 10.0]
    outs = [torch.zeros(2, device="vtpu"), torch.zeros(1, device="vtpu")]
    ins = [torch.arange(4.0, device="vtpu") + rank, torch.arange(2.0, device="vtpu") * (rank + 1)]
    dist.group.WORLD.reduce_scatter_tensor_coalesced(outs, ins).wait()
    assert outs[0].cpu().tolist() == [1.0, 3.0] if rank == 0 else outs[0].cpu().tolist() == [5.0, 7.0]
    assert outs[1].cpu().tolist() == ([0.0] if rank == 0 else [3.0])
    # The group is usable after the errors.
    v = torch.ones(2, device="vtpu")
    dist.all_reduce(v)
    assert v.cpu().tolist() == [2.0, 2.0], v.cpu()


def test_async_work_and_errors():
    _run_ranks(_async_and_errors)


def _default_backend(rank):
    # No backend named: torch_vtpu made "vtpu" the default for vtpu tensors.
    t = torch.ones(3, device="vtpu") * (rank + 1)
    dist.all_reduce(t)
    c = torch.ones(3) * (rank + 1)
    dist.all_reduce(c)
    assert t.cpu().tolist() == c.tolist() == [3.0] * 3
    import torch.distributed._functional_collectives as functional

    reduced = functional.all_reduce(torch.arange(4.0, device="vtpu") + rank, "sum", dist.group.WORLD)
    assert reduced.device.type == "vtpu" and reduced.cpu().tolist() == [1.0, 3.0, 5.0, 7.0]


def test_default_backend_and_functional_collectives():
    _run_ranks(_default_backend, backend=None)


def _train(rank, device, mode, group, steps=4):
    import torch_vtpu

    torch_vtpu.set_mode(mode)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 1)).to(device)
    # Small buckets: several allreduces per backward, each started from autograd's thread.
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.001)
    opt = torch.optim.AdamW(ddp.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        x = torch.randn(16, 12, generator=torch.Generator().manual_seed(100 * step + rank)).to(device)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    torch_vtpu.set_mode("strict")
    return [p.detach().cpu() for p in model.parameters()], torch.stack(losses).cpu()


class _HalfUsed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(4, 2)
        self.unused = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.used(x)


def _ddp(rank):
    import torch_vtpu

    reference = dist.new_group(backend="gloo")
    cpu_params, cpu_losses = _train(rank, "cpu", "strict", reference)
    torch_vtpu.reset_metrics()
    strict_params, strict_losses = _train(rank, "vtpu", "strict", None)
    fused_params, fused_losses = _train(rank, "vtpu", "fused", None)
    assert torch.equal(strict_losses, fused_losses)
    for s, f, c in zip(strict_params, fused_params, cpu_params, strict=True):
        assert torch.equal(s, f)
        torch.testing.assert_close(s, c, rtol=1e-5, atol=1e-6)
    # The replicas stayed identical: gradients were averaged over both ranks.
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, strict_params)
    assert all(torch.equal(a, b) for a, b in zip(*gathered, strict=True))
    syncs = [None] * WORLD
    dist.all_gather_object(syncs, torch_vtpu.metrics()["syncs"])
    assert syncs[0] == syncs[1]

    # A parameter without a gradient in this step (DDP pins a host buffer to find it).
    for device in ("cpu", "vtpu"):
        torch.manual_seed(2)
        model = _HalfUsed().to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True,
                                                        process_group=reference if device == "cpu" else None)
        ddp(torch.ones(3, 4, device=device) * (rank + 1)).sum().backward()
        if device == "cpu":
            cpu_grad = model.used.weight.grad
        else:
            torch.testing.assert_close(model.used.weight.grad.cpu(), cpu_grad)
            assert model.unused.weight.grad is None

    # Compiled DDP (Dynamo's DDPOptimizer splits graphs at bucket boundaries).
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)).to("vtpu")
    eager_grads = []
    for compiled in (False, True):
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        run = torch.compile(ddp, backend="vtpu") if compiled else ddp
        model.zero_grad()
        run(torch.ones(4, 12, device="vtpu") * (rank + 1)).sum().backward()
        grads = [p.grad.cpu() for p in model.parameters()]
        if compiled:
            for e, g in zip(eager_grads, grads, strict=True):
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
        eager_grads = grads


def test_ddp_training_matches_cpu_and_modes():
    _run_ranks(_ddp)


_EXIT_WITH_WORK_IN_FLIGHT = r"""
import atexit, datetime, sys, time
import torch, torch.distributed as dist, torch_vtpu
rank, path = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("vtpu", init_method=f"file://{path}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
store = dist.distributed_c10d._get_default_store()
u = torch.ones(1024, device="vtpu")
if rank == 0:
    dist.all_reduce(u, async_op=True)  # never waited for
    atexit.register(lambda: store.set("rank0_exiting", "1"))
else:
    store.wait(["rank0_exiting"])
    time.sleep(0.2)
    dist.all_reduce(u)
    assert u.cpu().eq(2.0).all()
    dist.destroy_process_group()
"""


def test_work_completing_while_the_interpreter_finalises():
    """Rank 0 exits with an all_reduce in flight that completes during its finalisation,
    on Gloo's thread. A Python callback in the work's future aborted the process there
    (SIGABRT: the thread cannot take the GIL once the interpreter finalises)."""
    with tempfile.TemporaryDirectory() as tmp:
        ranks = [subprocess.Popen([sys.executable, "-c", _EXIT_WITH_WORK_IN_FLIGHT, str(r), os.path.join(tmp, "store")])
                 for r in range(WORLD)]
        try:
            codes = [p.wait(timeout=240) for p in ranks]
        finally:
            for p in ranks:
                p.kill()
    assert codes == [0, 0]


def _fsdp2(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    losses = {}
    for device in ("cpu", "vtpu"):
        mesh = init_device_mesh(device, (WORLD,))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
        for layer in (model[0], model[2], model):
            fully_shard(layer, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        for step in range(3):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + rank)).to(device)
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses[device] = loss.detach().cpu()
    torch.testing.assert_close(losses["vtpu"], losses["cpu"], rtol=1e-5, atol=1e-7)


def test_fsdp2_matches_cpu():
    """fully_shard (FSDP2): sharded parameters all-gathered for compute and gradients
    reduce-scattered, on vtpu as on the CPU."""
    _run_ranks(_fsdp2)


def _sync_batch_norm(rank, mode):
    import torch_vtpu

    torch_vtpu.set_mode(mode)
    g = torch.Generator().manual_seed(3)
    full = torch.randn(2 * WORLD, 3, 5, 4, generator=g) * 2 + 1
    grad_full = torch.randn(full.shape, generator=g)
    # The CPU reference: plain BatchNorm over the whole batch in one process.
    reference = torch.nn.BatchNorm2d(3)
    x_ref = full.clone().requires_grad_(True)
    reference(x_ref).backward(grad_full)

    torch.manual_seed(0)
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm2d(3))).to("vtpu")
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    mine = slice(2 * rank, 2 * rank + 2)
    x = full[mine].to("vtpu").requires_grad_(True)
    out = ddp(x)
    out.backward(grad_full[mine].to("vtpu"))
    expected_out = torch.nn.functional.batch_norm(full, None, None, training=True)[mine]
    torch.testing.assert_close(out.detach().cpu(), expected_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.cpu(), x_ref.grad[mine], rtol=1e-5, atol=1e-5)
    bn = model[0]
    torch.testing.assert_close(bn.running_mean.cpu(), reference.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var.cpu(), reference.running_var, rtol=1e-5, atol=1e-6)
    # DDP averages the ranks' parameter gradients; the whole batch's are their sum.
    torch.testing.assert_close(bn.weight.grad.cpu() * WORLD, reference.weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn.bias.grad.cpu() * WORLD, reference.bias.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_sync_batch_norm_matches_batch_norm_over_the_whole_batch(mode):
    """nn.SyncBatchNorm on vtpu (ATen's kernels for its pieces are CUDA-only: it raised
    NotImplementedError for batch_norm_stats): two ranks with half a batch each give the
    outputs, input gradients and running statistics of one BatchNorm over the whole batch."""
    _run_ranks(_sync_batch_norm, mode)
