"""vTPU: an eager-first native PyTorch backend. Importing it adds the device "vtpu".

    import torch, torch_vtpu
    x = torch.randn(8, 8, device="vtpu")
"""


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: `import torch` alone then
    brings the vtpu device. Defined before `import torch`, because torch's
    autoload may call it while this module is still importing torch."""


import atexit  # noqa: E402

import torch  # noqa: E402

import os  # noqa: E402
import sys  # noqa: E402

from . import _mkl_vml  # noqa: E402

_mkl_vml.warm_up()  # before any CPU kernel of ours or the user's can race on MKL's dispatch

from . import _C  # registers kernels, allocator, guard and hooks for PrivateUse1
from ._modes import flush, fused_min_elements, get_mode, mode, set_fused_min_elements, set_mode
from ._metrics import metrics, profile_ops, reset_metrics
from . import debug  # noqa: E402
from . import _multiprocessing  # noqa: E402
from .advisor import advise  # noqa: E402

__version__ = "0.1.0"
__all__ = ["set_mode", "get_mode", "mode", "flush", "fused_min_elements", "set_fused_min_elements", "metrics",
           "profile_ops", "reset_metrics", "debug", "advise", "__version__"]


def _set_library_paths() -> None:
    """Frames under torch/ and torch_vtpu/ are library code for call sites; the
    example models in torch_vtpu/models/ are user code."""
    def dirs(path: str):
        return {os.path.join(p, "") for p in (path, os.path.realpath(path))}

    here = os.path.dirname(os.path.abspath(__file__))
    internal = dirs(os.path.dirname(os.path.abspath(torch.__file__))) | dirs(here)
    _C._set_library_paths(sorted(internal), sorted(dirs(os.path.join(here, "models"))))


def _register_device() -> None:
    if torch._C._get_privateuse1_backend_name() != "vtpu":
        torch.utils.rename_privateuse1_backend("vtpu")
    from . import _device

    if not hasattr(torch, "vtpu"):
        torch._register_device_module("vtpu", _device)
        # Named as sys.modules knows it (torch.cuda's is "torch.cuda"):
        # transformers reads the device type from the device module's name.
        # Its classes keep __module__ torch_vtpu._device, where pickle finds them.
        _device.__name__ = "torch.vtpu"
    if not hasattr(torch.Tensor, "is_vtpu"):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True
        )


def _drain_autograd_device_thread() -> None:
    """Autograd's vtpu worker thread drops the last reference to a finished
    backward's graph task after the caller has moved on; that task holds Python
    objects (torch stashes a contextvars context in it), and dropping them once
    the interpreter is finalising aborts the process. A last tiny backward,
    run on that thread without the stash, makes the thread finish the previous
    iteration first; its own task holds no Python objects. It launches no kernel:
    a view's backward is a view and the values are never read (a kernel here was
    compiled at the exit of every process without the ahead-of-time library). The
    gradient is accumulated, not returned: a task that captures its outputs (as
    torch.autograd.grad does) is itself what must not be finished last."""
    from torch.autograd.variable import Variable

    try:
        with torch.enable_grad():
            x = torch.empty((), device="vtpu", requires_grad=True)
            y = x.view(())
        Variable._execution_engine.run_backward((y,), (torch.empty((), device="vtpu"),), False, False, (),
                                                True, True)
    except Exception:  # best effort at exit: never let it mask the program's own outcome
        pass


def _report_unraised_error() -> None:
    """An error of a queued kernel that no synchronisation raised before exit is
    printed, not dropped: the CPU would have raised it at the op (a review found a
    program with an out-of-range index_select exiting 0 without a word)."""
    try:
        _C._synchronize()
    except Exception as error:  # noqa: BLE001 - reported, whatever its type
        sys.stderr.write("vtpu: an error of a queued kernel was never raised (the program ended without "
                         f"synchronizing): {type(error).__name__}: {error}\n")


def _shutdown() -> None:
    if _C._in_forked_child():  # the parent owns the device; nothing here to drain
        return
    _report_unraised_error()
    debug._uninstall_checker()  # its dispatch mode is a Python object in autograd's TLS copy
    # Only a process that made vtpu tensors can have run a vtpu backward. Every
    # `import torch` autoloads this package: a program that never used the
    # device must not run device work at its exit (it compiled a kernel into
    # VTPU_CACHE_DIR, or warned about an unusable cache, in every PyTorch program).
    if _C._device_was_used():
        _drain_autograd_device_thread()
    _C._shutdown()


_register_device()
_set_library_paths()
_multiprocessing.install()
from . import _accelerate_compat, _fake_layout, _flex_attention, _inductor_route, _rng_hops, _safetensors_compat, _transformers_compat  # noqa: E402

_transformers_compat.install()
_safetensors_compat.install()
_fake_layout.install()
_rng_hops.install()
_inductor_route.install()
_flex_attention.install()
_accelerate_compat.install()

from . import distributed  # noqa: E402

distributed.register()
atexit.register(_shutdown)
_modes._apply_env_mode()
debug._sync_checker()
# backend="vtpu" for torch.compile. Dynamo costs seconds to import, so it is not
# imported here: if it is not loaded yet, torch.compile finds the backend through
# the torch_dynamo_backends entry point (torch_vtpu.compiler registers it then).
if "torch._dynamo" in sys.modules:
    from . import compiler  # noqa: F401,E402
