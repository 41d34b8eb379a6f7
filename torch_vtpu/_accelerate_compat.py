"""Hugging Face accelerate (and transformers through it) choose vtpu where they
would choose an accelerator they know.

Memory planning: ``device_map="auto"`` (and "balanced", "sequential") places a
Hugging Face model on vtpu.

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

The default device: accelerate's ``PartialState.default_device`` (what an
``Accelerator`` and transformers' ``Trainer`` run on when not distributed) and
``TrainingArguments`` check a fixed list of device types and fell back to the
CPU: a Trainer trained on the CPU while vtpu was the process's accelerator.
When torch's current accelerator is vtpu and they would choose the CPU, they
choose vtpu:0 (and ``bf16=True`` is accepted: vtpu supports bfloat16);
``use_cpu=True``/``Accelerator(cpu=True)`` and ``ACCELERATE_TORCH_DEVICE``
still decide first.
"""
from __future__ import annotations

import functools
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


def _vtpu_is_the_accelerator() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "vtpu" and torch.vtpu.is_available()


def _patch_state(module: Any) -> None:
    state_class = getattr(module, "PartialState", None)
    chooser = getattr(state_class, "__dict__", {}).get("default_device")
    if not isinstance(chooser, property) or getattr(chooser.fget, _MARK, False):
        return
    original = chooser.fget

    def default_device(self: Any) -> torch.device:
        device = original(self)
        if device.type == "cpu" and _vtpu_is_the_accelerator():
            return torch.device("vtpu", torch.vtpu.current_device())
        return device

    setattr(default_device, _MARK, True)
    state_class.default_device = property(default_device, doc=chooser.__doc__)


def _patch_training_args(module: Any) -> None:
    args_class = getattr(module, "TrainingArguments", None)
    setup = getattr(args_class, "__dict__", {}).get("_setup_devices")
    if not isinstance(setup, functools.cached_property) or getattr(setup.func, _MARK, False):
        return
    original = setup.func

    def _setup_devices(self: Any) -> torch.device:
        device = original(self)
        # Not distributed, transformers picks from its own list of device types and
        # lands on the CPU; accelerate's state (above) already holds vtpu.
        chosen = getattr(getattr(self, "distributed_state", None), "device", None)
        if (device.type == "cpu" and not self.use_cpu and isinstance(chosen, torch.device)
                and chosen.type == "vtpu"):
            self._n_gpu = 1  # one device for this process, as for MPS and XPU
            return chosen
        return device

    setattr(_setup_devices, _MARK, True)
    patched = functools.cached_property(_setup_devices)
    patched.__set_name__(args_class, "_setup_devices")
    args_class._setup_devices = patched

    # bf16=True is refused unless a device on transformers' list supports it
    bf16_check = getattr(module, "is_torch_bf16_gpu_available", None)
    if callable(bf16_check):
        def is_torch_bf16_gpu_available() -> bool:
            return bool(bf16_check()) or (_vtpu_is_the_accelerator() and torch.vtpu.is_bf16_supported())

        module.is_torch_bf16_gpu_available = is_torch_bf16_gpu_available


def install() -> None:
    # Imported after this, accelerate's re-export and transformers' alias bind the
    # patched function; imported before, _patch rebinds them.
    _import_patches.on_import(_MODULE, _patch)
    _import_patches.on_import("accelerate.state", _patch_state)
    _import_patches.on_import("transformers.training_args", _patch_training_args)
