// torch.vtpu.set_sync_debug_mode: warn about, or refuse, operations that make
// the host wait for the device without being asked to (torch.cuda's
// set_sync_debug_mode, for the device whose eager modes queue and fuse work:
// an unexpected host read stalls the queue and flushes the fused window).
#pragma once

namespace vtpu::bridge {

// CUDA's levels: 0 "default" (silent), 1 "warn", 2 "error".
enum class SyncDebugMode : int { kDefault = 0, kWarn = 1, kError = 2 };

void set_sync_debug_mode(SyncDebugMode mode);
SyncDebugMode sync_debug_mode();

// Called before a host synchronisation counted under `reason` (the reasons
// of metrics()["syncs"]) by op `op` (may be null). Explicit waits —
// torch.vtpu.synchronize(), stream and event synchronisation, empty_cache,
// a mode switch, a collective — pass silently, as they do on CUDA. Any other
// reason warns (kWarn) or raises RuntimeError (kError) before anything waits
// or flushes, so a refused read leaves queued and pending work as it was.
void check_host_sync(const char* reason, const char* op);

// The calling thread's host reads pass unreported while set (vtpu's own
// Python code reading on the user's behalf: torch_vtpu._sync_debug_exempt()).
void set_sync_debug_exempt(bool exempt);
bool sync_debug_exempt();

}  // namespace vtpu::bridge
