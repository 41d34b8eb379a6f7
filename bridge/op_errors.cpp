// Errors of device kernels, named: "[index_select] index out of range in
// self (issued at train.py:42 in step)". The exception keeps its type, so
// Python sees the same IndexError/ValueError/TypeError that torch raises for
// the same bad input on CPU.
#include <c10/util/Exception.h>

#include <string>

#include "call_site.h"

namespace vtpu::bridge {
namespace {

// "aten::index_select.out" -> "index_select": the name users know.
std::string short_op_name(const std::string& op) {
  std::string name = op;
  if (auto ns = name.find("::"); ns != std::string::npos) name = name.substr(ns + 2);
  if (auto dot = name.find('.'); dot != std::string::npos) name = name.substr(0, dot);
  return name;
}

std::string annotated_message(const std::string& message, const std::string& op, const CallSite& site) {
  std::string text = op.empty() ? message : "[" + short_op_name(op) + "] " + message;
  const std::string where = describe_call_site(site);
  if (!where.empty()) text += " (" + where + ")";
  return text;
}

// Rebuilds `error` as its own dynamic type with a new message (c10::Error
// has no setter); the most derived known types first.
template <typename T>
bool rethrow_as(const c10::Error& error, const std::string& message) {
  if (dynamic_cast<const T*>(&error) == nullptr) return false;
  throw T(message, error.backtrace(), error.caller());
}

[[noreturn]] void annotate(std::exception_ptr original, const std::string& op, const CallSite& site) {
  try {
    std::rethrow_exception(original);
  } catch (const c10::Error& error) {
    std::string message = error.msg();
    for (const std::string& context : error.context()) message += "\n  " + context;
    const std::string text = annotated_message(message, op, site);
    rethrow_as<c10::OutOfMemoryError>(error, text);
    rethrow_as<c10::IndexError>(error, text);
    rethrow_as<c10::ValueError>(error, text);
    rethrow_as<c10::TypeError>(error, text);
    rethrow_as<c10::NotImplementedError>(error, text);
    rethrow_as<c10::LinAlgError>(error, text);
    rethrow_as<c10::EnforceFiniteError>(error, text);
    throw c10::Error(text, error.backtrace(), error.caller());
  }
  // Anything else (a Python error from a Python kernel) passes unchanged.
}

const bool installed = [] {
  set_error_annotator(&annotate);
  return true;
}();

}  // namespace
}  // namespace vtpu::bridge
