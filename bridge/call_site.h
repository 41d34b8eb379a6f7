// The user's Python call site of an op, captured cheaply at dispatch so that
// an error surfacing later (at a sync, from the device stream) can name the
// line that issued the op. No ATen and no Python headers here.
//
// Capture keeps only (code object, instruction index); strings are resolved
// when an error is formatted. Code objects seen by capture are kept alive by
// a process-wide registry, so a recorded site never dangles.
#pragma once

#include <cstdint>

#include <atomic>
#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace vtpu::bridge {

struct CallSite {
  const void* code = nullptr;  // PyCodeObject*, owned by the registry
  int lasti = -1;              // index (in code units) of the issuing instruction
  bool captured = false;       // capture was on and ran for this op
  bool has_frame() const { return code != nullptr; }
};

struct ResolvedCallSite {
  std::string file;  // relative to the working directory when under it
  int line = 0;
  std::string function;
};

namespace detail {
extern std::atomic<bool> call_site_capture_on;
extern thread_local const CallSite* call_site_override;
CallSite capture_call_site_slow();
}  // namespace detail

// On by default; VTPU_CALL_SITES=0 or set_call_site_capture(false) turns it off.
inline bool call_site_capture_enabled() {
  return detail::call_site_capture_on.load(std::memory_order_relaxed);
}
void set_call_site_capture(bool on);

// The innermost frame of the calling thread outside torch/ and torch_vtpu/
// (torch_vtpu/models/ counts as user code). Works with or without the GIL
// held by this thread; empty when capture is off or the thread runs no Python
// (autograd's backward worker).
inline CallSite capture_call_site() {
  if (!call_site_capture_enabled()) return {};
  if (detail::call_site_override != nullptr) return *detail::call_site_override;
  return detail::capture_call_site_slow();
}

// While alive, capture_call_site() on this thread returns the site captured
// when it was made. Work queued under a lock (the fused window's flush) uses
// it: capturing may take the GIL, and a thread holding the GIL may be waiting
// for that lock (an Event.record() or a scalar fill in another thread: a
// deadlock, found by review). Capture first, then lock.
class CallSiteScope {
 public:
  CallSiteScope() : CallSiteScope(capture_call_site()) {}
  explicit CallSiteScope(CallSite site) : site_(site), previous_(detail::call_site_override) {
    detail::call_site_override = &site_;
  }
  ~CallSiteScope() { detail::call_site_override = previous_; }
  CallSiteScope(const CallSiteScope&) = delete;
  CallSiteScope& operator=(const CallSiteScope&) = delete;

 private:
  CallSite site_;
  const CallSite* previous_;
};

// Directory prefixes whose frames are library code, and prefixes inside them
// that are user code after all. Set once by torch_vtpu at import.
void set_library_paths(std::vector<std::string> internal, std::vector<std::string> user);

// Takes the GIL. Empty when the site has no frame or Python is gone.
std::optional<ResolvedCallSite> resolve_call_site(const CallSite& site);
// "issued at f.py:12 in step", "issued from autograd backward (no Python
// frame)", or "" when capture was off.
std::string describe_call_site(const CallSite& site);

// An error of a kernel that ran on the device stream, with what is needed to
// name it later on the Python thread: the op and its call site.
struct PendingOpError : std::exception {
  PendingOpError(std::exception_ptr original, std::string op, CallSite site, std::uint64_t issuer)
      : original(std::move(original)), op(std::move(op)), site(site), issuer(issuer) {}
  const char* what() const noexcept override { return "vtpu: asynchronous kernel error"; }
  std::exception_ptr original;
  std::string op;
  CallSite site;
  std::uint64_t issuer;  // current_thread_token() of the thread that issued the op
};

// A number naming the calling thread, never reused by another thread (native
// thread ids are: a new thread may get an exited one's).
std::uint64_t current_thread_token();

// Rethrows `original` as the same exception type with the message
// "[op] <message> (issued at file:line in fn)". Installed by the ATen side
// (op_errors.cpp); until then the original is rethrown unchanged.
using ErrorAnnotator = void (*)(std::exception_ptr original, const std::string& op, const CallSite& site);
void set_error_annotator(ErrorAnnotator annotator);
[[noreturn]] void rethrow_annotated(std::exception_ptr original, const std::string& op, const CallSite& site);

}  // namespace vtpu::bridge
