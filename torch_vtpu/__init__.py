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

from . import _C  # registers kernels, allocator, guard and hooks for PrivateUse1
from ._modes import flush, get_mode, mode, set_mode
from ._metrics import metrics, reset_metrics

__version__ = "0.1.0"
__all__ = ["set_mode", "get_mode", "mode", "flush", "metrics", "reset_metrics", "__version__"]


def _register_device() -> None:
    if torch._C._get_privateuse1_backend_name() != "vtpu":
        torch.utils.rename_privateuse1_backend("vtpu")
    from . import _device

    if not hasattr(torch, "vtpu"):
        torch._register_device_module("vtpu", _device)
    if not hasattr(torch.Tensor, "is_vtpu"):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True
        )


_register_device()
atexit.register(_C._shutdown)
_modes._apply_env_mode()
