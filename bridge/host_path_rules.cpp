#include "host_path_rules.h"

#include <string_view>

#include <c10/util/Exception.h>

#include "env_knobs.h"

#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace vtpu::bridge {

namespace {

// embedding_bag's index results (offset2bag, bag_size, max_indices: results
// 1-3) as ATen's CPU kernel shapes them; its meta kernel follows the CUDA
// kernel's shapes on any device but the CPU. Arguments from `first`: weight,
// indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights?,
// include_last_offset, padding_idx. The CPU kernel leaves offset2bag empty on
// its "sum" fast path (float, half or bfloat16 weight with unit column
// stride, no padding index, unit-stride per-sample weights); the forward-only
// op's "sum" keeps bag_size and max_indices at offsets' length; "max" gives
// one max index per bag and column. All three have the indices' and offsets'
// promoted dtype. Measured against the CPU kernel over every mode, weight
// dtype and layout, padding index, per-sample weights, include_last_offset
// and index dtype (tests/python/test_embedding_bag.py).
HostResult embedding_bag_result(bool forward_only, std::size_t result, const Stack& stack, std::size_t first) {
  const at::Tensor& weight = stack[first].toTensor();
  const at::Tensor& indices = stack[first + 1].toTensor();
  const at::Tensor& offsets = stack[first + 2].toTensor();
  const std::int64_t mode = stack[first + 4].toInt();
  const c10::IValue& psw = stack[first + 6];
  const bool include_last_offset = stack[first + 7].toBool();
  const std::int64_t padding_idx = stack[first + 8].toInt();
  const auto wt = weight.scalar_type();
  const bool weighted = psw.isTensor() && psw.toTensor().defined();
  const bool fast_sum = (wt == at::kFloat || wt == at::kHalf || wt == at::kBFloat16) && weight.dim() == 2 &&
                        weight.stride(1) == 1 && padding_idx < 0 && (!weighted || psw.toTensor().stride(0) == 1);
  const std::int64_t bags = offsets.numel() - (include_last_offset ? 1 : 0);
  const std::int64_t bag_len = forward_only && mode == 0 ? offsets.numel() : bags;
  HostResult host{(indices.scalar_type() == at::kLong || offsets.scalar_type() == at::kLong) ? at::kLong : at::kInt,
                  false, std::nullopt, std::nullopt};
  if (result == 1) host.sizes = std::vector<std::int64_t>{mode != 0 || !fast_sum ? indices.numel() : 0};
  else if (result == 2) host.sizes = std::vector<std::int64_t>{bag_len};
  else if (mode == 2) host.sizes = std::vector<std::int64_t>{bags, weight.size(1)};
  else host.sizes = std::vector<std::int64_t>{bag_len};
  return host;
}

}  // namespace

// Where ATen's meta and CPU kernels disagree about a result, the device must
// give what the CPU kernel gives:
// - the normalisation ops return their statistics (results after the first)
//   in the input's reduced precision on the CPU when the parameters share
//   it, in float32 for float32 parameters; their meta kernels say float32
//   (what CUDA returns), group norm's the input's type;
// - batch norm in evaluation mode returns empty statistics on the CPU; its
//   meta kernel gives them the channel count.
HostResult host_result(const c10::OperatorHandle& op, std::size_t result, const at::Tensor& meta_out,
                       const Stack& stack, std::size_t first) {
  static const std::unordered_set<std::string> norms = {
      "aten::native_layer_norm", "aten::native_batch_norm", "aten::_native_batch_norm_legit",
      "aten::_batch_norm_with_update", "aten::native_group_norm"};
  HostResult host{meta_out.scalar_type(), false, std::nullopt, std::nullopt};
  const std::string& name = op.operator_name().name;
  // Backward ops take a mask of the gradients wanted (`output_mask`,
  // `grad_input_mask`: batch/layer/group norm, convolution); the CPU kernels
  // return no tensor for one not wanted, where some meta kernels give an
  // empty one (batch norm's input gradient when the input needs none).
  const auto& arguments = op.schema().arguments();
  for (std::size_t i = 0; i < arguments.size() && first + i < stack.size(); ++i) {
    const std::string& arg = arguments[i].name();
    if ((arg != "output_mask" && arg != "grad_input_mask") || !stack[first + i].isBoolList()) continue;
    const c10::List<bool> mask = stack[first + i].toBoolList();
    if (result < mask.size() && !mask.get(result)) {
      host.undefined = true;
      return host;
    }
  }
  // convolution(input, weight, ...): the CPU kernels (oneDNN and the slow
  // ones alike) return channels-last (channels-last-3d for 3-d convolutions
  // and their transposes) when the input or the weight is; the meta kernel
  // does so only for CPU and CUDA tensors.
  if (result == 0 && name == "aten::convolution" && stack.size() > first + 1 && stack[first].isTensor() &&
      stack[first + 1].isTensor() && (meta_out.dim() == 4 || meta_out.dim() == 5)) {
    const at::Tensor& input = stack[first].toTensor();
    const at::Tensor& weight = stack[first + 1].toTensor();
    const at::MemoryFormat format =
        meta_out.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d;
    const auto channels_last = [&](const at::Tensor& t) {
      return t.dim() == meta_out.dim() && t.suggest_memory_format() == format;
    };
    if (channels_last(input) || channels_last(weight)) host.memory_format = format;
    return host;
  }
  // Padding by reflection or replication, pixel (un)shuffle and 2-d max
  // unpooling: the CPU kernels give the result the input's suggested memory
  // format (channels-last in, channels-last out); the meta kernels say
  // contiguous.
  static const std::unordered_set<std::string> keeps_input_layout = {
      "aten::reflection_pad2d", "aten::reflection_pad3d", "aten::replication_pad2d", "aten::replication_pad3d",
      "aten::pixel_shuffle",    "aten::pixel_unshuffle",  "aten::max_unpool2d"};
  if (result == 0 && keeps_input_layout.count(name) && stack.size() > first && stack[first].isTensor() &&
      stack[first].toTensor().dim() == meta_out.dim()) {
    const at::MemoryFormat format = stack[first].toTensor().suggest_memory_format();
    if (format != at::MemoryFormat::Contiguous) host.memory_format = format;
    return host;
  }
  // Group and layer norm backward (grad_out, input, ...): the CPU gives the
  // input gradient the input's type and the parameter gradients the
  // weight's; group norm's meta kernel says float32 for all three, which
  // for a bf16/half input the CPU kernel refused as out tensor.
  if ((name == "aten::native_group_norm_backward" || name == "aten::native_layer_norm_backward") &&
      stack.size() > first + 1 && stack[first + 1].isTensor()) {
    const std::size_t weight_at = first + (name == "aten::native_group_norm_backward" ? 4 : 5);
    if (result == 0) {
      host.dtype = stack[first + 1].toTensor().scalar_type();
    } else if (weight_at < stack.size() && stack[weight_at].isTensor() && stack[weight_at].toTensor().defined()) {
      host.dtype = stack[weight_at].toTensor().scalar_type();
    }
    return host;
  }
  if (result == 0 || !stack[first].isTensor()) return host;
  // _native_multi_head_attention(..., need_weights, ...): without weights the
  // CPU kernel returns an undefined second result (MultiheadAttention's None),
  // where the meta kernel's is an empty tensor.
  if (name == "aten::_native_multi_head_attention" && result == 1 && stack.size() > first + 10 &&
      stack[first + 10].isBool() && !stack[first + 10].toBool()) {
    host.undefined = true;
    return host;
  }
  // _weight_norm_interface(v, g, dim): the CPU keeps the norms of a float16 or
  // bfloat16 v in float32, where the meta kernel says v's type (the out=
  // kernel refused its outputs on every call with float16; found by review).
  if (name == "aten::_weight_norm_interface" && result == 1) {
    const auto v_dtype = stack[first].toTensor().scalar_type();
    if (v_dtype == at::kHalf || v_dtype == at::kBFloat16) host.dtype = at::kFloat;
    return host;
  }
  if ((name == "aten::_embedding_bag" || name == "aten::_embedding_bag_forward_only") && result <= 3 &&
      stack.size() >= first + 9)
    return embedding_bag_result(name == "aten::_embedding_bag_forward_only", result, stack, first);
  if (!norms.count(name)) return host;
  const auto input_dtype = stack[first].toTensor().scalar_type();
  // Mixed precision (a bf16/half input with float32 weight, bias or running
  // statistics, as autocast leaves a BatchNorm after a convolution): the CPU
  // keeps float32 statistics, as the meta kernel says (its kernels take the
  // parameters' type); only an input and parameters of one reduced type give
  // reduced statistics. Making them reduced there too made the CPU kernel
  // refuse its outputs.
  bool float_parameters = false;
  const std::size_t num_arguments = op.schema().arguments().size();
  for (std::size_t i = first + 1; i < first + num_arguments && i < stack.size(); ++i)
    if (stack[i].isTensor() && stack[i].toTensor().defined() && stack[i].toTensor().scalar_type() == at::kFloat)
      float_parameters = true;
  // (Group norm's meta kernel says the input's type even for float32
  // parameters; only floating statistics are touched, not batch norm's
  // byte-typed reserve.)
  const auto meta_dtype = meta_out.scalar_type();
  if ((input_dtype == at::kBFloat16 || input_dtype == at::kHalf) &&
      (meta_dtype == at::kFloat || meta_dtype == input_dtype))
    host.dtype = float_parameters ? at::kFloat : input_dtype;
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

bool op_may_resize_self(const std::string& name) {
  static const std::unordered_set<std::string> ops = {"aten::resize_", "aten::resize_as_", "aten::set_",
                                                      "aten::addbmm_", "aten::_resize_output_"};
  return ops.count(name) != 0;
}

bool out_variant_is_no_drop_in(const std::string& name) {
  static const std::unordered_set<std::string> ops = {"aten::max",       "aten::min",
                                                      "aten::mse_loss",  "aten::smooth_l1_loss",
                                                      "aten::huber_loss", "aten::binary_cross_entropy"};
  return ops.count(name) != 0;
}

// Ops found at run time to give other result shapes than their meta kernel
// promised (see check_fresh_geometry): they run synchronously from then on,
// with the CPU's shapes. (embedding_bag, whose meta kernel follows CUDA's
// shapes, gets the CPU's from host_result instead.)
OpSet& meta_disagrees_with_cpu() {
  static OpSet ops;
  return ops;
}

// A queued kernel must produce exactly the geometry promised to Python at
// dispatch. If it did not, the op is wrong on this path: say so (never a
// silent wrong result) and run it synchronously from now on.
void check_fresh_geometry(const c10::OperatorHandle& op, const at::Tensor& promised, const at::Tensor& produced,
                          const std::string& name) {
  if (promised.sizes() == produced.sizes() && promised.scalar_type() == produced.scalar_type()) return;
  meta_disagrees_with_cpu().add(op);
  // A dtype the meta (or a custom op's fake) kernel got wrong would otherwise
  // be a silent cast of the CPU's values into the promised buffer.
  TORCH_CHECK(false, "[vtpu] ", name, ": the CPU kernel produced a result of shape ", produced.sizes(), " and dtype ",
              produced.scalar_type(), " where its meta kernel promised shape ", promised.sizes(), " and dtype ",
              promised.scalar_type(),
              "; the result is invalid. Later calls of this op run synchronously with the CPU's results.");
}

bool cpu_layout_unknown_to_meta(const std::string& name) {
  // Found by a stride sweep over torch.linalg (2026-12-06): lstsq's solution
  // is the first n rows of a column-major m x k buffer, eig's eigenvectors
  // are column-major; both metas say row-major. The rest of torch.linalg
  // matches.
  return name == "aten::linalg_lstsq" || name == "aten::linalg_eig";
}

namespace {
bool registered_in_python(const c10::OperatorHandle& op) {
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::CPU)) return false;
  // "registered at <file>:<line>": a C++ registration (ATen's, an extension's)
  // names its source file; torch.library names the Python file that made the
  // Library, whatever its name ("train" with a #! line, "<stdin>", a name
  // given to compile()). So anything but C/C++ source is Python. (All 1,178
  // CPU kernels of ATen name .cpp files.)
  const std::string debug = op.getComputedKernelForDispatchKey(c10::DispatchKey::CPU).debug();
  const std::size_t colon = debug.rfind(':');
  const std::string where = debug.substr(0, colon == std::string::npos ? debug.size() : colon);
  const std::size_t at = where.rfind("registered at ");
  const std::string file = at == std::string::npos ? where : where.substr(at + 14);
  if (file.empty()) return false;  // no location recorded (a stripped build): C++
  auto ends_with = [&](const char* suffix) {
    const std::size_t n = std::char_traits<char>::length(suffix);
    return file.size() >= n && file.compare(file.size() - n, n, suffix) == 0;
  };
  for (const char* cpp : {".cpp", ".cc", ".cxx", ".c", ".cu", ".cuh", ".h", ".hpp", ".hh", ".hxx", ".inl", ".hip", ".mm"})
    if (ends_with(cpp)) return false;
  return true;
}
}  // namespace

bool cpu_kernel_is_python(const c10::OperatorHandle& op) {
  // Asked once per op and remembered: getComputedKernelForDispatchKey hands
  // out a kernel handle that registers itself with the kernel unguarded, so
  // calls from several threads corrupted the heap (a review: 4 threads of
  // host-path ops aborted 10 of 10 runs), and each call left its registration
  // behind (memory grew with every host-path op). A kernel registered after
  // an op's first vtpu call is not seen.
  static std::mutex mutex;
  static std::unordered_map<const c10::FunctionSchema*, bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(&op.schema());
  if (found == known.end()) found = known.emplace(&op.schema(), registered_in_python(op)).first;
  return found->second;
}

namespace {
constexpr std::size_t kDefaultSerialHostOpBytes = std::size_t{1} << 20;

std::size_t serial_host_op_bytes() {
  static const std::size_t bound = static_cast<std::size_t>(
      env_non_negative("VTPU_SERIAL_HOST_OP_BYTES", static_cast<std::int64_t>(kDefaultSerialHostOpBytes)));
  return bound;
}

// ATen ops whose CPU kernels do work in proportion to the data they touch
// (searches, concatenation, indexing, scatter/gather, bags, cumulative and
// plain reductions, the log-sigmoid loss): for them a small input means
// little work. A list, not a rule on names: an op whose work outgrows its
// data (a product, attention, a fused transformer layer, an op on packed
// weights) must keep ATen's threads, and a name does not tell.
bool work_linear_in_data(const std::string& name) {
  static const std::unordered_set<std::string> ops = {
      "searchsorted", "bucketize", "cat", "stack", "index", "index_put", "_index_put_impl", "index_add",
      "index_copy", "index_fill", "scatter", "scatter_add", "scatter_reduce", "gather", "take", "put",
      "masked_fill", "masked_scatter", "_embedding_bag", "_embedding_bag_forward_only", "cumsum", "cumprod",
      "sum", "mean", "log_sigmoid_forward", "log_sigmoid_backward"};
  constexpr const char* kPrefix = "aten::";
  if (name.rfind(kPrefix, 0) != 0) return false;
  std::string base = name.substr(std::char_traits<char>::length(kPrefix));
  base = base.substr(0, base.find('.'));
  if (!base.empty() && base.back() == '_') base.pop_back();  // in-place forms
  return ops.count(base) != 0;
}
}  // namespace

namespace {

template <typename Index>
void check_offsets_in_order(const at::Tensor& offsets, std::int64_t index_count) {
  const at::Tensor contiguous = offsets.contiguous();
  const Index* data = contiguous.const_data_ptr<Index>();
  const std::int64_t n = contiguous.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(i == 0 || data[i] >= data[i - 1], "embedding_bag: offsets must be non-decreasing, but offsets[", i,
                "] = ", static_cast<std::int64_t>(data[i]), " is less than offsets[", i - 1, "] = ",
                static_cast<std::int64_t>(data[i - 1]));
    TORCH_CHECK(data[i] >= 0 && data[i] <= index_count, "embedding_bag: offsets[", i, "] = ",
                static_cast<std::int64_t>(data[i]), " is outside the ", index_count, " indices");
  }
}

}  // namespace

void check_host_arguments(const std::string& name, const Stack& host) {
  if (name != "aten::_embedding_bag" && name != "aten::_embedding_bag_forward_only") return;
  if (host.size() < 3 || !host[1].isTensor() || !host[2].isTensor()) return;
  const at::Tensor& indices = host[1].toTensor();
  const at::Tensor& offsets = host[2].toTensor();
  if (!offsets.defined() || offsets.dim() != 1 || !indices.defined()) return;
  if (offsets.scalar_type() == at::kLong) check_offsets_in_order<std::int64_t>(offsets, indices.numel());
  else if (offsets.scalar_type() == at::kInt) check_offsets_in_order<std::int32_t>(offsets, indices.numel());
}

bool makes_quantized_tensors(const std::string& name) {
  std::string_view op(name);
  if (op.rfind("aten::", 0) == 0) op.remove_prefix(6);
  if (op.find("fake_quantize") != std::string_view::npos) return false;
  return op.rfind("quantize_per", 0) == 0 || op.rfind("_make_per_", 0) == 0 ||
         op.find("quantized") != std::string_view::npos;
}

bool runs_serially(const std::string& name, std::size_t tensor_bytes) {
  const std::size_t bound = serial_host_op_bytes();
  return bound != 0 && tensor_bytes <= bound && work_linear_in_data(name);
}

bool is_resize_refusal(const c10::Error& error) {
  return error.msg().find("not resizable") != std::string::npos;
}

bool is_undefined_result_refusal(const c10::Error& error) {
  return error.msg().find("Expected out tensor to have dtype nullptr") != std::string::npos;
}

}  // namespace vtpu::bridge
