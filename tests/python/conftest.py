import os

# Fused-mode tests use small tensors to stay fast, and they test fusion: every op is
# recorded (by default ops on < 4096 elements that would start a window launch as in
# strict mode; test_fused.py::test_small_ops_start_no_window_by_default covers that).
# Subprocesses started by tests inherit it.
os.environ.setdefault("VTPU_FUSED_MIN_ELEMENTS", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_vtpu  # noqa: E402,F401  (registers the device)

_SESSION_FUSED_MIN_ELEMENTS = torch_vtpu.fused_min_elements()


@pytest.fixture(autouse=True)
def _clean_device_state():
    """Each test starts in strict mode with no pending errors."""
    torch_vtpu.set_mode("strict")
    try:
        torch.vtpu.synchronize()
    except Exception:  # an earlier test's deliberate async error
        pass
    yield
    torch.vtpu.set_sync_debug_mode("default")
    torch_vtpu.set_mode("strict")
    torch_vtpu.set_fused_min_elements(_SESSION_FUSED_MIN_ELEMENTS)
