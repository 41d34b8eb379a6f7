// Page-locked ("pinned") host memory as torch sees it for vtpu: what
// `tensor.pin_memory()`, `torch.empty(..., pin_memory=True)` and DataLoader's
// pin_memory thread allocate, and what `is_pinned()` recognises.
#pragma once

#include <c10/core/Allocator.h>

namespace vtpu::bridge {

// The host target reads host memory directly, so pinning is bookkeeping:
// blocks come from the CPU allocator and are remembered while they live.
c10::Allocator* pinned_memory_allocator();

// True when `ptr` lies inside a live block of pinned_memory_allocator().
bool is_pinned_pointer(const void* ptr);

}  // namespace vtpu::bridge
