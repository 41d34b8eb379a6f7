import pytest
import torch

import torch_vtpu  # noqa: F401  (registers the device)


@pytest.fixture(autouse=True)
def _clean_device_state():
    """Each test starts in strict mode with no pending errors."""
    torch_vtpu.set_mode("strict")
    try:
        torch.vtpu.synchronize()
    except Exception:  # an earlier test's deliberate async error
        pass
    yield
    torch_vtpu.set_mode("strict")
