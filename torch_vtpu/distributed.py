"""torch.distributed for vtpu tensors: the process group backend "vtpu", with Gloo as transport.

`dist.init_process_group("vtpu")` (or no backend at all: "vtpu" is the default for the
vtpu device once torch_vtpu is imported) gives a process group whose collectives take vtpu
and CPU tensors, so `DistributedDataParallel` over a vtpu model, `all_reduce`,
`all_gather_into_tensor`, `broadcast`, point-to-point and object collectives work as
they do on CUDA with NCCL.

How: device memory of the host target is host memory. A collective first waits for the
work queued on the device stream (a flush point of fused mode, counted in
`metrics()["syncs"]["collective"]`; it depends on the program, never on timing, so every
rank cuts the same windows), then hands Gloo zero-copy CPU aliases of the vtpu tensors,
each holding its device storage alive until Gloo is done with it. The returned work
completes with the caller's vtpu tensors, not the aliases, so a DDP comm hook or a
`get_future()` user sees the device it passed. As on CUDA, a tensor handed to an
asynchronous collective must not be used before its work is waited on.

Gloo's own rules hold (supported reduce ops and dtypes, dense tensors, one tensor per
rank per call); its errors, raised at the call or by `wait()`, reach the caller unchanged.
"""
from __future__ import annotations

import atexit
import datetime
import gc

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from . import _C

BACKEND_NAME = "vtpu"


def _is_vtpu(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "vtpu"


def _contains_vtpu(value) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_contains_vtpu(v) for v in value)
    return _is_vtpu(value)


def _to_host(value, aliases: list[torch.Tensor], originals: list[torch.Tensor]):
    """The same nesting of lists with every vtpu tensor replaced by a CPU alias."""
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v, aliases, originals) for v in value)
    if not _is_vtpu(value):
        return value
    if value.layout != torch.strided:
        raise RuntimeError(f"vtpu collectives take dense (strided) tensors, got layout {value.layout}")
    alias = _C._host_alias(value)
    aliases.append(alias)
    originals.append(value)
    return alias


def _to_device(value, back: dict[int, torch.Tensor]):
    if isinstance(value, (list, tuple)):
        return [_to_device(v, back) for v in value]
    return back.get(id(value), value) if isinstance(value, torch.Tensor) else value


class _DeviceWork(dist.Work):
    """Gloo's work(s) for one call, answering in the caller's tensors.

    wait() and exception() are Gloo's: a collective that fails or times out raises, as on
    the CPU. result() and get_future() give the caller's vtpu tensors where Gloo has the
    host aliases. The work holds those tensors until it is dropped.
    """

    def __init__(self, gloo_works, aliases, originals):
        super().__init__()
        self._gloo_works = gloo_works
        self._aliases = aliases  # alive while _back is keyed by their ids
        self._back = dict(zip(map(id, aliases), originals))
        self._future = None
        if len(gloo_works) == 1:
            try:
                host_future = gloo_works[0].get_future()
            except RuntimeError:  # some of Gloo's works have none (reduce_scatter_tensor's)
                host_future = None
            if host_future is not None:
                # Completes with the caller's tensors in place of the aliases. Its callback
                # is C++: it runs on Gloo's thread, which may finish a work nobody waited
                # for while the interpreter is finalising (no GIL to be had then).
                self._future = _C._future_on_device(host_future, aliases, originals)

    def wait(self, timeout=datetime.timedelta(0)):
        done = [work.wait(timeout) for work in self._gloo_works]
        return all(done)

    def is_completed(self):
        return all(work.is_completed() for work in self._gloo_works)

    def is_success(self):
        return all(work.is_success() for work in self._gloo_works)

    def exception(self):
        for work in self._gloo_works:
            error = work.exception()
            if error is not None:
                return error
        return None

    def source_rank(self):
        return self._gloo_works[0].source_rank()

    def _source_rank(self):
        return self._gloo_works[0]._source_rank()

    def result(self):
        return _to_device(self._gloo_works[0].result(), self._back)

    def get_future(self):
        if self._future is None:
            raise RuntimeError("Work::getFuture not implemented for this collective (Gloo has no future for it)")
        return self._future


class _Call:
    """One collective: its arguments moved to host aliases, and the way back."""

    def __init__(self, args):
        self.aliases: list[torch.Tensor] = []
        self.originals: list[torch.Tensor] = []
        if _contains_vtpu(args):
            _C._synchronize_for_collective()
        self.args = _to_host(args, self.aliases, self.originals)

    def work(self, *gloo_works):
        if not self.originals and len(gloo_works) == 1:
            return gloo_works[0]  # CPU tensors only: Gloo's own work
        return _DeviceWork(list(gloo_works), self.aliases, self.originals)


def _forward(name: str):
    def collective(self, *args):
        call = _Call(args)
        return call.work(getattr(self._gloo, name)(*call.args))

    collective.__name__ = name
    collective.__doc__ = f"Gloo's {name} over host aliases of vtpu tensors."
    return collective


def _as_stacked(flat: torch.Tensor, part: torch.Tensor, world: int) -> torch.Tensor:
    """`flat` viewed as `world` copies of `part` stacked along dim 0, when it holds exactly
    that many elements and is contiguous. NCCL takes any shape of the right size (SyncBatchNorm
    gathers into a [1, world * n] tensor); Gloo checks the stacked shape."""
    if flat.numel() != part.numel() * world or not flat.is_contiguous():
        return flat
    shape = (world * part.shape[0], *part.shape[1:]) if part.dim() > 0 else (world,)
    return flat.view(shape)


def _gather_into_tensor(name: str):
    def collective(self, output, input, *rest):
        call = _Call((output, input))
        out, inp = call.args
        return call.work(self._gloo._allgather_base(_as_stacked(out, inp, self.size()), inp, *rest))

    collective.__name__ = name
    collective.__doc__ = "Gloo's _allgather_base, taking an output of any shape with the gathered size, as NCCL."
    return collective


def _reduce_scatter_tensor(name: str):
    def collective(self, output, input, *rest):
        call = _Call((output, input))
        out, inp = call.args
        return call.work(self._gloo._reduce_scatter_base(out, _as_stacked(inp, out, self.size()), *rest))

    collective.__name__ = name
    collective.__doc__ = "Gloo's _reduce_scatter_base, taking an input of any shape with the scattered size, as NCCL."
    return collective


def _coalesced(name: str, single: str):
    """Gloo's backend has coalesced single-tensor gathers and scatters, its Python binding
    does not: one `single` call per pair of tensors, in order on every rank."""

    def collective(self, outputs, inputs, opts=None):
        call = _Call((outputs, inputs))
        method = getattr(self._gloo, single)
        outs, ins = call.args
        extra = () if opts is None else (opts,)
        return call.work(*[method(o, i, *extra) for o, i in zip(outs, ins, strict=True)])

    collective.__name__ = name
    collective.__doc__ = _coalesced.__doc__
    return collective


class ProcessGroupVtpu(dist.ProcessGroup):
    """A process group for vtpu (and CPU) tensors over a Gloo process group."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._gloo = _c10d.ProcessGroupGloo(store, rank, size, timeout)
        # Gloo is this group's backend for the CPU in c10d's own bookkeeping too: the
        # group's name (which functional collectives resolve groups by) lives on it, and
        # C++ callers with CPU tensors reach it directly.
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)

    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    def barrier(self, opts=None):
        # A barrier orders processes, not device work: no device wait, as NCCL's.
        return self._gloo.barrier(opts) if opts is not None else self._gloo.barrier()

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        return self._gloo.monitored_barrier(timeout, wait_all_ranks)

    # Collectives that move tensors: same arguments as the Gloo backend's methods
    # (torch/distributed/distributed_c10d.py calls them by these names; DDP's reducer
    # reaches allreduce, broadcast and allgather through c10d's Python trampoline).
    allreduce = _forward("allreduce")
    allreduce_coalesced = _forward("allreduce_coalesced")
    broadcast = _forward("broadcast")
    reduce = _forward("reduce")
    allgather = _forward("allgather")
    allgather_coalesced = _forward("allgather_coalesced")
    all_gather_single = _gather_into_tensor("all_gather_single")
    _allgather_base = _gather_into_tensor("_allgather_base")
    gather = _forward("gather")
    scatter = _forward("scatter")
    reduce_scatter = _forward("reduce_scatter")
    reduce_scatter_single = _reduce_scatter_tensor("reduce_scatter_single")
    _reduce_scatter_base = _reduce_scatter_tensor("_reduce_scatter_base")
    alltoall = _forward("alltoall")
    all_to_all_single = _forward("alltoall_base")
    alltoall_base = _forward("alltoall_base")
    send = _forward("send")
    all_gather_single_coalesced = _coalesced("all_gather_single_coalesced", "_allgather_base")
    allgather_into_tensor_coalesced = _coalesced("allgather_into_tensor_coalesced", "_allgather_base")
    reduce_scatter_single_coalesced = _coalesced("reduce_scatter_single_coalesced", "_reduce_scatter_base")
    reduce_scatter_tensor_coalesced = _coalesced("reduce_scatter_tensor_coalesced", "_reduce_scatter_base")
    recv = _forward("recv")
    recv_anysource = _forward("recv_anysource")


_groups_created = 0


def _create_process_group(store, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupVtpu:
    global _groups_created
    _groups_created += 1
    return ProcessGroupVtpu(store, rank, size, timeout)


def _free_destroyed_groups() -> None:
    """At exit, before the interpreter finalises. A group `destroy_process_group` let go of
    still owns its Gloo threads until the garbage collector frees it (c10d's Python wrapper
    makes a reference cycle). Freed during finalisation, a Gloo thread still releasing a
    finished work's tensors needs the GIL, which it cannot take then: the process aborts.
    Collecting here joins those threads first."""
    if _groups_created:
        gc.collect()


def register() -> None:
    """Registers the "vtpu" c10d backend, the default for the vtpu device (idempotent)."""
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, devices=["cpu", BACKEND_NAME])
    atexit.register(_free_destroyed_groups)
