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
rank per call); its errors reach the caller unchanged.
"""
from __future__ import annotations

import datetime

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


class _HeldWork(dist.Work):
    """Gloo's work, holding the caller's tensors until the work is dropped."""

    def __init__(self, gloo_work, originals):
        super().__init__()
        self._gloo_work = gloo_work
        self._originals = originals

    def wait(self, timeout=datetime.timedelta(0)):
        return self._gloo_work.wait(timeout) if timeout else self._gloo_work.wait()

    def is_completed(self):
        return self._gloo_work.is_completed()

    def is_success(self):
        return self._gloo_work.is_success()

    def exception(self):
        return self._gloo_work.exception()


class _Call:
    """One collective: its arguments moved to host aliases, and the way back."""

    def __init__(self, args):
        self.aliases: list[torch.Tensor] = []
        self.originals: list[torch.Tensor] = []
        if _contains_vtpu(args):
            _C._synchronize_for_collective()
        self.args = _to_host(args, self.aliases, self.originals)

    def work(self, gloo_work):
        if not self.originals:
            return gloo_work
        try:
            gloo_future = gloo_work.get_future()
        except RuntimeError:
            # Some of Gloo's works have no future (reduce_scatter_tensor's).
            return _HeldWork(gloo_work, self.originals)
        # Completes with the caller's tensors in place of the aliases, and holds both
        # until then. Its callback is C++: it runs on Gloo's thread, which may finish a
        # work nobody waited for while the interpreter is finalising.
        return _c10d._create_work_from_future(_C._future_on_device(gloo_future, self.aliases, self.originals))


def _forward(name: str):
    def collective(self, *args):
        call = _Call(args)
        return call.work(getattr(self._gloo, name)(*call.args))

    collective.__name__ = name
    collective.__doc__ = f"Gloo's {name} over host aliases of vtpu tensors."
    return collective


def _unsupported(name: str):
    def collective(self, *args):
        raise RuntimeError(f"Backend {BACKEND_NAME} (Gloo transport) does not support {name}")

    collective.__name__ = name
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
    all_gather_single = _forward("_allgather_base")
    _allgather_base = _forward("_allgather_base")
    gather = _forward("gather")
    scatter = _forward("scatter")
    reduce_scatter = _forward("reduce_scatter")
    reduce_scatter_single = _forward("_reduce_scatter_base")
    _reduce_scatter_base = _forward("_reduce_scatter_base")
    alltoall = _forward("alltoall")
    all_to_all_single = _forward("alltoall_base")
    alltoall_base = _forward("alltoall_base")
    send = _forward("send")
    # Gloo has no coalesced single-tensor gather/scatter; c10d raises as for Gloo on the CPU.
    all_gather_single_coalesced = _unsupported("all_gather_single_coalesced")
    allgather_into_tensor_coalesced = _unsupported("allgather_into_tensor_coalesced")
    reduce_scatter_single_coalesced = _unsupported("reduce_scatter_single_coalesced")
    reduce_scatter_tensor_coalesced = _unsupported("reduce_scatter_tensor_coalesced")
    recv = _forward("recv")
    recv_anysource = _forward("recv_anysource")


def _create_process_group(store, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupVtpu:
    return ProcessGroupVtpu(store, rank, size, timeout)


def register() -> None:
    """Registers the "vtpu" c10d backend, the default for the vtpu device (idempotent)."""
    if not dist.is_available() or BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, devices=["cpu", BACKEND_NAME])
