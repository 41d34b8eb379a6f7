"""``device_map="auto"`` (and "balanced", "sequential") places a Hugging Face
model on vtpu.

accelerate's ``get_max_memory()``, which transformers asks when it infers a
device map, lists the accelerators it knows (CUDA, XPU, NPU, MLU, MUSA, SDAA,
HPU, MPS) by index and then the CPU. With vtpu it found none and put the whole
model on the CPU, silently, where with CUDA it lands on the GPU. Here, when the
caller gave no memory budget and accelerate found no accelerator, vtpu's free
memory becomes device index 0, which transformers and accelerate resolve to the
current accelerator, vtpu:0. The CPU budget is dropped, as accelerate drops it
for MPS and integrated GPUs: on the host target the device's memory is the
host's RAM, and counting both would plan twice the memory there is; what does
not fit goes to disk offload, as accelerate does for a full GPU. A budget the
caller gives (``max_memory=...``) is left as it is.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

import torch

from . import _import_patches

_MODULE = "accelerate.utils.modeling"
# Modules that bind accelerate's function under their own name when imported.
_ALIASES = (("accelerate.utils", "get_max_memory"),
            ("transformers.integrations.accelerate", "accelerate_max_memory"))
_MARK = "_vtpu_device_memory"


def _vtpu_free_memory() -> Optional[int]:
    vtpu = getattr(torch, "vtpu", None)
    if vtpu is None or not vtpu.is_available() or vtpu.device_count() < 1:
        return None
    return int(vtpu.mem_get_info(0)[0])


def _with_vtpu(original: Any) -> Any:
    def get_max_memory(max_memory: Any = None) -> Any:
        result = original(max_memory)
        if max_memory is not None or any(isinstance(k, int) for k in result):
            return result
        free = _vtpu_free_memory()
        if free is None:
            return result
        planned = {0: free}
        planned.update((k, v) for k, v in result.items() if k != "cpu")
        return planned

    get_max_memory.__doc__ = original.__doc__
    get_max_memory.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(get_max_memory, _MARK, True)
    return get_max_memory


def _rebind_aliases(original: Any, patched: Any) -> None:
    for module_name, attribute in _ALIASES:
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, attribute, None) is original:
            setattr(module, attribute, patched)


def _patch(module: Any) -> None:
    original = getattr(module, "get_max_memory", None)
    if original is None or getattr(original, _MARK, False):
        return
    patched = _with_vtpu(original)
    module.get_max_memory = patched
    _rebind_aliases(original, patched)


def install() -> None:
    # Imported after this, accelerate's re-export and transformers' alias bind the
    # patched function; imported before, _patch rebinds them.
    _import_patches.on_import(_MODULE, _patch)
