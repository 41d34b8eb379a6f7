#include "host_path_rules.h"

#include <c10/util/Exception.h>

namespace vtpu::bridge {

// Where ATen's meta and CPU kernels disagree about a result, the device must
// give what the CPU kernel gives:
// - the normalisation ops return their statistics (results after the first)
//   in the input's reduced precision on the CPU; their meta kernels say
//   float32 (what CUDA returns);
// - batch norm in evaluation mode returns empty statistics on the CPU; its
//   meta kernel gives them the channel count.
HostResult host_result(const c10::OperatorHandle& op, std::size_t result, const at::Tensor& meta_out,
                       const Stack& stack, std::size_t first) {
  static const std::unordered_set<std::string> norms = {
      "aten::native_layer_norm", "aten::native_batch_norm", "aten::_native_batch_norm_legit",
      "aten::_batch_norm_with_update", "aten::native_group_norm"};
  HostResult host{meta_out.scalar_type(), false};
  if (result == 0 || !stack[first].isTensor()) return host;
  const std::string& name = op.operator_name().name;
  if (!norms.count(name)) return host;
  const auto input_dtype = stack[first].toTensor().scalar_type();
  if (meta_out.scalar_type() == at::kFloat && (input_dtype == at::kBFloat16 || input_dtype == at::kHalf))
    host.dtype = input_dtype;
  const bool batch_norm_with_stats = (name == "aten::native_batch_norm" ||
                                      (name == "aten::_native_batch_norm_legit" &&
                                       op.operator_name().overload_name.empty()));
  if (batch_norm_with_stats && stack.size() > first + 5 && stack[first + 5].isBool() &&
      !stack[first + 5].toBool())
    host.empty = true;
  return host;
}

bool OpSet::contains(const c10::OperatorHandle& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  return ops_.count(&op.schema()) != 0;
}

void OpSet::add(const c10::OperatorHandle& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  ops_.insert(&op.schema());
}

// Ops known to lack a meta kernel: remembered so they skip straight to the
// synchronous path instead of raising and catching every time.
OpSet& no_meta_ops() {
  static OpSet ops;
  return ops;
}

// Ops whose out= overload turned out not to be a drop-in for the functional
// op (its CPU kernel resizes the out tensor to an intermediate shape first,
// as binary_cross_entropy's does): they compute into temporaries instead.
OpSet& unusable_out_variants() {
  static OpSet ops;
  return ops;
}

// Ops whose meta kernel gives other result shapes than their CPU kernel
// (embedding_bag's offset2bag/bag_size depend on the mode in ways the meta
// kernel does not follow): they run synchronously, with the CPU's shapes.
// Ops found to disagree at run time join them (see check_fresh_geometry).
OpSet& meta_disagrees_with_cpu() {
  static OpSet* ops = [] {
    auto* set = new OpSet();
    for (const char* name : {"aten::_embedding_bag", "aten::_embedding_bag_forward_only"}) {
      if (auto op = c10::Dispatcher::singleton().findSchema({name, ""})) set->add(*op);
    }
    return set;
  }();
  return *ops;
}

// A queued kernel must produce exactly the geometry promised to Python at
// dispatch. If it did not, the op is wrong on this path: say so (never a
// silent wrong result) and run it synchronously from now on.
void check_fresh_geometry(const c10::OperatorHandle& op, const at::Tensor& promised, const at::Tensor& produced,
                          const std::string& name) {
  if (promised.sizes() == produced.sizes()) return;
  meta_disagrees_with_cpu().add(op);
  TORCH_CHECK(false, "[vtpu] ", name, ": the CPU kernel produced a result of shape ", produced.sizes(),
              " where its meta kernel promised ", promised.sizes(),
              "; the result is invalid. Later calls of this op run synchronously with the CPU's shapes.");
}

bool is_resize_refusal(const c10::Error& error) {
  return error.msg().find("not resizable") != std::string::npos;
}

}  // namespace vtpu::bridge
