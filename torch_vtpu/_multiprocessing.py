"""Sending vtpu tensors to other processes (torch.multiprocessing, DataLoader workers).

torch pickles a tensor for another process by sharing its storage: CUDA through IPC
handles, CPU through shared memory. A vtpu storage has neither, and torch's reducer
failed inside multiprocessing's queue feeder thread, where nobody sees the error: a
DataLoader whose spawned workers returned vtpu tensors waited forever. A vtpu tensor
now travels as a CPU copy in shared memory and is moved back to vtpu by the receiver:
the receiver gets equal values, not shared memory (an in-place change on one side is
not seen on the other, unlike CUDA's IPC), and each tensor of a message is its own copy
(a view and its base arrive as two tensors that share no storage).
"""
import multiprocessing
from multiprocessing import reduction

import torch
import torch.multiprocessing.reductions as _torch_reductions

_torch_reduce_tensor = _torch_reductions.reduce_tensor


def _rebuild_on_device(cls, host: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    on_device = host.to("vtpu")
    if cls is torch.nn.Parameter:
        return torch.nn.Parameter(on_device, requires_grad=requires_grad)
    return on_device.requires_grad_(requires_grad)


def reduce_tensor(tensor: torch.Tensor):
    if tensor.device.type != "vtpu":
        return _torch_reduce_tensor(tensor)
    if tensor.requires_grad and not tensor.is_leaf:
        return _torch_reduce_tensor(tensor)  # torch's own error for non-leaf tensors that require grad
    from ._device import _sync_debug_exempt

    with _sync_debug_exempt():  # often in a queue's feeder thread, where an error is lost
        host = tensor.detach().to("cpu")
    popen = multiprocessing.context.get_spawning_popen()
    if popen is not None:
        # Pickled as a spawned process's arguments: spawn and forkserver hand the child
        # the shared memory's file descriptor itself, not a duplicate, when the process
        # starts, after pickling. The copy, which nothing else holds, closed it first and
        # the child failed to unpickle ("unable to resize file"): it lives as long as the
        # process's Popen object. (Queues duplicate the descriptor as they pickle.)
        kept = getattr(popen, "_vtpu_host_copies", None)
        if kept is None:
            kept = []
            popen._vtpu_host_copies = kept
        kept.append(host)
    return (_rebuild_on_device, (type(tensor), host, tensor.requires_grad))


def install() -> None:
    """Puts the vtpu-aware reducer where torch registered its own."""
    for cls in (torch.Tensor, torch.nn.Parameter, *torch._tensor_classes):
        reduction.register(cls, reduce_tensor)
