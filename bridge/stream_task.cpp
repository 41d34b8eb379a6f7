#include "stream_task.h"

#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

namespace vtpu::bridge {
namespace {

// A bound on what is kept between two synchronisations: a loop of warning
// kernels never synchronised must not grow memory without end.
constexpr std::size_t kMaxKeptWarnings = 1024;

struct KeptWarnings {
  std::mutex mutex;
  std::vector<c10::Warning> warnings;
  std::size_t dropped = 0;
  std::atomic<bool> any{false};
};

KeptWarnings& kept() {
  static auto* k = new KeptWarnings();  // never destroyed: the worker may outlive statics
  return *k;
}

class KeepingHandler : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    KeptWarnings& k = kept();
    std::lock_guard<std::mutex> lock(k.mutex);
    if (k.warnings.size() < kMaxKeptWarnings) {
      k.warnings.push_back(warning);
    } else {
      ++k.dropped;
    }
    k.any.store(true, std::memory_order_release);
  }
};

}  // namespace

void run_stream_task(const std::function<void()>& kernel) {
  static KeepingHandler handler;  // stateless: every thread may share it
  c10::WarningUtils::WarningHandlerGuard guard(&handler);
  c10::impl::ExcludeDispatchKeyGuard below_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
  kernel();
}

void issue_kept_warnings() {
  KeptWarnings& k = kept();
  if (!k.any.load(std::memory_order_acquire)) return;
  std::vector<c10::Warning> warnings;
  std::size_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(k.mutex);
    warnings.swap(k.warnings);
    std::swap(dropped, k.dropped);
    k.any.store(false, std::memory_order_release);
  }
  for (const c10::Warning& w : warnings) c10::warn(w);
  if (dropped > 0)
    TORCH_WARN("[vtpu] ", dropped, " more warnings of kernels run on the device stream since the last "
               "synchronisation were dropped (at most ", kMaxKeptWarnings, " are kept)");
}

}  // namespace vtpu::bridge
