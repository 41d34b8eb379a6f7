// Call-site capture. torch's Python bindings release the GIL before they
// dispatch, so the hot path reads this thread's own interpreter frames
// without the GIL: they cannot change while the thread is in C++ (it is the
// only one executing them), and the code objects they point to stay alive
// for as long as the frames do. The GIL is taken only the first time a code
// object is seen (to read its filename and keep a reference) and when an
// error is formatted.
#include <Python.h>
#include <frameobject.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define VTPU_READ_INTERPRETER_FRAMES 1
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif

#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "call_site.h"
#include "env_knobs.h"

#include <atomic>

namespace vtpu::bridge {
namespace detail {

std::atomic<bool> call_site_capture_on{env_switch("VTPU_CALL_SITES", true)};

}  // namespace detail

namespace {

// Deep Python stacks (nn.Module nesting) are a few dozen frames; beyond this
// the op is reported without a site rather than walked forever.
constexpr int kMaxFrames = 256;

struct Registry {
  std::mutex mutex;
  std::vector<std::string> internal;  // library directory prefixes
  std::vector<std::string> user;      // user-code prefixes inside them
  // Verdict per code object; the registry owns a reference to each key, so a
  // pointer is never reused for another code object while it is recorded.
  std::unordered_map<const void*, bool> is_library;
  std::atomic<std::uint64_t> generation{1};
};

Registry& registry() {
  static Registry* r = new Registry();  // leaked: used during interpreter shutdown
  return *r;
}

bool has_prefix(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// Called with the GIL held.
bool classify(PyCodeObject* code, Registry& r) {
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  if (file == nullptr) {
    PyErr_Clear();
    return true;
  }
  const std::string path(file);
  bool library = false;
  for (const auto& p : r.internal) library |= has_prefix(path, p);
  for (const auto& p : r.user) library &= !has_prefix(path, p);
  return library;
}

// Per-thread front cache of the registry: the hot path takes no lock.
struct ThreadCache {
  std::uint64_t generation = 0;
  std::unordered_map<const void*, bool> verdicts;
};

bool is_library_code(PyCodeObject* code) {
  thread_local ThreadCache cache;
  Registry& r = registry();
  const std::uint64_t generation = r.generation.load(std::memory_order_acquire);
  if (cache.generation != generation) {
    cache.verdicts.clear();
    cache.generation = generation;
  }
  if (auto it = cache.verdicts.find(code); it != cache.verdicts.end()) return it->second;
  bool verdict;
  {
    PyGILState_STATE gil = PyGILState_Ensure();
    {
      std::lock_guard<std::mutex> lock(r.mutex);
      auto it = r.is_library.find(code);
      if (it == r.is_library.end()) {
        Py_INCREF(code);
        it = r.is_library.emplace(code, classify(code, r)).first;
      }
      verdict = it->second;
    }
    PyGILState_Release(gil);
  }
  cache.verdicts.emplace(code, verdict);
  return verdict;
}

}  // namespace

thread_local const CallSite* detail::call_site_override = nullptr;

void set_call_site_capture(bool on) { detail::call_site_capture_on.store(on, std::memory_order_relaxed); }

void set_library_paths(std::vector<std::string> internal, std::vector<std::string> user) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.internal = std::move(internal);
  r.user = std::move(user);
  // Verdicts change; the references stay owned (recorded sites may use them).
  for (auto& [code, library] : r.is_library) library = classify((PyCodeObject*)code, r);
  r.generation.fetch_add(1, std::memory_order_acq_rel);
}

CallSite detail::capture_call_site_slow() {
  CallSite site;
  site.captured = true;
  if (!Py_IsInitialized()) return site;
  PyThreadState* tstate = PyGILState_GetThisThreadState();
  if (tstate == nullptr) return site;  // a thread that never ran Python
#ifdef VTPU_READ_INTERPRETER_FRAMES
  if (tstate->cframe == nullptr) return site;
  _PyInterpreterFrame* frame = tstate->cframe->current_frame;
  for (int depth = 0; frame != nullptr && depth < kMaxFrames; frame = frame->previous, ++depth) {
    PyCodeObject* code = frame->f_code;
    if (_PyFrame_IsIncomplete(frame)) continue;
    if (is_library_code(code)) continue;
    site.code = code;
    site.lasti = _PyInterpreterFrame_LASTI(frame);
    return site;
  }
  return site;
#else
  // Other Python versions: the public frame API, under the GIL.
  PyGILState_STATE gil = PyGILState_Ensure();
  PyFrameObject* frame = PyThreadState_GetFrame(tstate);
  for (int depth = 0; frame != nullptr && depth < kMaxFrames; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    const bool library = is_library_code(code);
    Py_DECREF(code);  // the registry holds its own reference
    if (!library) {
      site.code = code;
      site.lasti = PyFrame_GetLasti(frame) / 2;
      Py_DECREF(frame);
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  PyGILState_Release(gil);
  return site;
#endif
}

std::optional<ResolvedCallSite> resolve_call_site(const CallSite& site) {
  if (!site.has_frame() || !Py_IsInitialized()) return std::nullopt;
  ResolvedCallSite out;
  PyGILState_STATE gil = PyGILState_Ensure();
  auto* code = (PyCodeObject*)site.code;
  out.line = PyCode_Addr2Line(code, site.lasti * static_cast<int>(sizeof(_Py_CODEUNIT)));
  if (const char* file = PyUnicode_AsUTF8(code->co_filename)) out.file = file;
  if (const char* name = PyUnicode_AsUTF8(code->co_qualname)) out.function = name;
  PyErr_Clear();
  PyGILState_Release(gil);
  char cwd[PATH_MAX];
  if (getcwd(cwd, sizeof(cwd)) != nullptr) {
    const std::string prefix = std::string(cwd) + "/";
    if (has_prefix(out.file, prefix)) out.file = out.file.substr(prefix.size());
  }
  return out;
}

std::string describe_call_site(const CallSite& site) {
  if (!site.captured) return "";
  if (auto resolved = resolve_call_site(site))
    return "issued at " + resolved->file + ":" + std::to_string(resolved->line) + " in " + resolved->function;
  return "issued from autograd backward or a thread without Python code";
}

namespace {
ErrorAnnotator& annotator() {
  static ErrorAnnotator a = nullptr;
  return a;
}
}  // namespace

void set_error_annotator(ErrorAnnotator a) { annotator() = a; }

void rethrow_annotated(std::exception_ptr original, const std::string& op, const CallSite& site) {
  if (annotator() != nullptr) annotator()(original, op, site);
  std::rethrow_exception(original);
}

std::uint64_t current_thread_token() {
  static std::atomic<std::uint64_t> next{1};
  thread_local const std::uint64_t token = next.fetch_add(1, std::memory_order_relaxed);
  return token;
}

}  // namespace vtpu::bridge
