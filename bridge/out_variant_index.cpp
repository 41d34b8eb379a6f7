#include "out_variant_index.h"

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace vtpu::bridge {
namespace {

bool is_matching_out_variant(const c10::FunctionSchema& functional, const c10::FunctionSchema& candidate) {
  const auto& f_args = functional.arguments();
  const auto& c_args = candidate.arguments();
  const std::size_t outs = functional.returns().size();
  if (c_args.size() != f_args.size() + outs || candidate.returns().size() != outs) return false;
  for (std::size_t i = 0; i < f_args.size(); ++i) {
    if (c_args[i].name() != f_args[i].name() || *c_args[i].type() != *f_args[i].type()) return false;
  }
  for (std::size_t i = 0; i < outs; ++i) {
    const auto& out = c_args[f_args.size() + i];
    if (!out.is_out() || *out.type() != *functional.returns()[i].type()) return false;
  }
  return true;
}

class OutVariantIndex {
 public:
  std::optional<c10::OperatorHandle> find(const c10::OperatorHandle& functional) {
    const c10::FunctionSchema& schema = functional.schema();
    std::lock_guard<std::mutex> lock(mutex_);
    auto cached = cache_.find(&schema);
    if (cached != cache_.end()) return cached->second;
    std::optional<c10::OperatorHandle> found;
    for (const auto& overload : overloads_locked(schema.name())) {
      auto candidate = c10::Dispatcher::singleton().findSchema({schema.name(), overload});
      if (candidate && is_matching_out_variant(schema, candidate->schema())) {
        found = candidate;
        break;
      }
    }
    cache_.emplace(&schema, found);
    return found;
  }

 private:
  const std::vector<std::string>& overloads_locked(const std::string& name) {
    // Ops can be registered after the index is built (libraries loaded
    // later), so an unknown name triggers a rebuild once.
    if (!by_name_.count(name) && built_for_ops_ != c10::Dispatcher::singleton().getAllOpNames().size()) {
      by_name_.clear();
      const auto names = c10::Dispatcher::singleton().getAllOpNames();
      built_for_ops_ = names.size();
      for (const auto& op : names) by_name_[op.name].push_back(op.overload_name);
    }
    static const std::vector<std::string> none;
    auto it = by_name_.find(name);
    return it == by_name_.end() ? none : it->second;
  }

  std::mutex mutex_;
  std::size_t built_for_ops_ = 0;
  std::unordered_map<std::string, std::vector<std::string>> by_name_;
  std::unordered_map<const c10::FunctionSchema*, std::optional<c10::OperatorHandle>> cache_;
};

}  // namespace

std::optional<c10::OperatorHandle> find_out_variant(const c10::OperatorHandle& functional) {
  static OutVariantIndex index;
  return index.find(functional);
}

}  // namespace vtpu::bridge
