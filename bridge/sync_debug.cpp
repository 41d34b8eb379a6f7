#include "sync_debug.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstring>
#include <string>

namespace vtpu::bridge {
namespace {

std::atomic<int> g_mode{static_cast<int>(SyncDebugMode::kDefault)};

// Host reads vtpu's own Python code makes on the user's behalf (debug mode's
// CPU cross-check, a tensor pickled for another process): not the user's.
thread_local bool t_exempt = false;

// Waits the user asked for (torch.cuda's sync debug mode does not report
// torch.cuda.synchronize() or Event.synchronize() either), and storage copies
// and resizes, which are no synchronisation on CUDA and which callers reach
// with the tensor's sizes already changed (a refusal there left a tensor
// larger than its storage: a later write crashed). Listing these, rather
// than the implicit ones, flags a new implicit reason by default.
bool is_explicit(const char* reason) {
  for (const char* name : {"synchronize", "device_synchronize", "stream_synchronize", "empty_cache", "mode_change",
                           "collective", "storage_resize", "storage_copy"})
    if (std::strcmp(reason, name) == 0) return true;
  return false;
}

// What makes the host wait, in the user's terms.
std::string describe(const char* reason, const char* op) {
  const std::string r = reason;
  if (r == "item") return "reading a device value on the host (.item(), bool(), int(), float())";
  if (r == "copy_to_cpu") return "copying a vtpu tensor to the host (.cpu(), .to(\"cpu\"), .numpy(), .tolist(), printing)";
  if (r == "large_upload") return "a blocking host-to-device copy too large to queue (non_blocking=True queues it)";
  const std::string name = op != nullptr && *op != '\0' ? std::string(op) : std::string("an op");
  // Also where the meta kernel refused the arguments: the CPU kernel then
  // raises the op's own error, which "default" shows.
  if (r == "data_dependent_op") return name + ", whose output shape depends on the values (or whose arguments it refuses)";
  if (r == "host_value_op") return name + ", which returns a host value";
  return name + ", which runs at once on the host";
}

}  // namespace

void set_sync_debug_mode(SyncDebugMode mode) { g_mode.store(static_cast<int>(mode), std::memory_order_relaxed); }

SyncDebugMode sync_debug_mode() { return static_cast<SyncDebugMode>(g_mode.load(std::memory_order_relaxed)); }

void set_sync_debug_exempt(bool exempt) { t_exempt = exempt; }

bool sync_debug_exempt() { return t_exempt; }

void check_host_sync(const char* reason, const char* op) {
  const SyncDebugMode mode = sync_debug_mode();
  if (mode == SyncDebugMode::kDefault || t_exempt || reason == nullptr || is_explicit(reason)) return;
  const std::string message = "called a synchronizing vtpu operation: " + describe(reason, op) + " (metrics()[\"syncs\"][\"" +
                              reason + "\"]); torch.vtpu.set_sync_debug_mode(\"default\") allows it";
  TORCH_CHECK(mode != SyncDebugMode::kError, message);
  TORCH_WARN(message);
}

}  // namespace vtpu::bridge
