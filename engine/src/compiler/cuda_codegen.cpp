#include "vtpu/compiler/cuda_codegen.h"

#include <cstddef>
#include <sstream>

#include "host_codegen_internal.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {
namespace {

using ir::DType;
using ir::OpKind;
using runtime::Error;
using runtime::ErrorKind;

// The launch ABI as the kernel sees it; the layout is checked against the
// engine's struct by the static_assert the generator emits beside it.
std::string launch_abi_source() {
  std::ostringstream s;
  s << "#include <stdint.h>\n#define VTPU_MAX_RANK " << kMaxRank << "\n"
    << "struct VtpuCudaLaunchArgs { int64_t total; int32_t rank; int32_t dense; char* data[" << kCudaMaxTensors
    << "]; int64_t sizes[VTPU_MAX_RANK]; int64_t strides[" << kCudaMaxTensors << "][VTPU_MAX_RANK]; double scalars["
    << kCudaMaxScalars << "]; };\n"
    << "#include <stddef.h>\n";
  auto check = [&](const char* what, std::size_t value) {
    s << "static_assert(" << what << " == " << value << ", \"the engine's VtpuCudaLaunchArgs has another layout\");\n";
  };
  check("sizeof(VtpuCudaLaunchArgs)", sizeof(VtpuCudaLaunchArgs));
  check("offsetof(VtpuCudaLaunchArgs, data)", offsetof(VtpuCudaLaunchArgs, data));
  check("offsetof(VtpuCudaLaunchArgs, sizes)", offsetof(VtpuCudaLaunchArgs, sizes));
  check("offsetof(VtpuCudaLaunchArgs, strides)", offsetof(VtpuCudaLaunchArgs, strides));
  check("offsetof(VtpuCudaLaunchArgs, scalars)", offsetof(VtpuCudaLaunchArgs, scalars));
  return s.str();
}

// The device's 16-bit float types and conversions (the host prelude's, with
// CUDA's intrinsics: __float2half_rn rounds to nearest even as the host's
// _Float16 conversion does), and the optimisation barrier.
constexpr const char* kCudaPrelude = R"PRELUDE(
#define VTPU_KERNEL_FN __device__
#include <cmath>
#include <type_traits>
#include <cuda_fp16.h>
struct vtpu_half { uint16_t bits; };
struct vtpu_bf16 { uint16_t bits; };
static inline __device__ float vtpu_load(vtpu_bf16 v) { return __uint_as_float((uint32_t)v.bits << 16); }
static inline __device__ vtpu_bf16 vtpu_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if (f != f) return vtpu_bf16{(uint16_t)((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return vtpu_bf16{(uint16_t)(u >> 16)};
}
static inline __device__ float vtpu_round_bf16(float f) { return vtpu_load(vtpu_to_bf16(f)); }
static inline __device__ float vtpu_load(vtpu_half v) { return __half2float(__ushort_as_half(v.bits)); }
static inline __device__ vtpu_half vtpu_to_half(float f) { return vtpu_half{__half_as_ushort(__float2half_rn(f))}; }
template <typename T> static inline __device__ T vtpu_load(T v) { return v; }
// -v as a flip of the sign bit (the host's reason: vtpu_float_neg there).
static inline __device__ float vtpu_float_neg(float v) { return __uint_as_float(__float_as_uint(v) ^ 0x80000000u); }
static inline __device__ double vtpu_float_neg(double v) {
  return __longlong_as_double(__double_as_longlong(v) ^ (long long)0x8000000000000000ull);
}
// The value unchanged, its origin hidden from the optimiser (the host's
// reason: cast_from_floating in host_codegen.cpp).
template <typename T> static inline __device__ T vtpu_opaque(T v) {
  volatile T kept = v;
  return kept;
}
)PRELUDE";

}  // namespace

bool cuda_codegen_supports(const ir::Graph& graph, std::string* why_not) {
  auto refuse = [&](const std::string& why) {
    if (why_not != nullptr) *why_not = why;
    return false;
  };
  if (graph.outputs().empty()) return refuse("the graph has no outputs");
  const auto& out_sizes = graph.type(graph.outputs().front()).sizes;
  if (out_sizes.size() > static_cast<std::size_t>(kMaxRank)) return refuse("rank above " + std::to_string(kMaxRank));
  const std::size_t tensors = graph.outputs().size() + graph.inputs().size();
  if (tensors > static_cast<std::size_t>(kCudaMaxTensors))
    return refuse(std::to_string(tensors) + " tensors, above the launch ABI's " + std::to_string(kCudaMaxTensors));
  if (launch_scalars(graph).size() > static_cast<std::size_t>(kCudaMaxScalars))
    return refuse("more than " + std::to_string(kCudaMaxScalars) + " launch scalars");
  for (const auto& node : graph.nodes()) {
    if (node.op == OpKind::Input || node.op == OpKind::Constant) continue;
    if (!ir::is_elementwise(node.op))
      return refuse(std::string(ir::name(node.op)) + " is not an elementwise op (the cuda target compiles those only)");
    if (node.op == OpKind::GeluBackward && node.attrs.get_string("approximate", "none") != "none")
      return refuse("gelu_backward with tanh approximation");
    if (node.type.sizes != out_sizes) return refuse("every value must have the output's shape");
  }
  for (ir::ValueId id : graph.outputs())
    if (graph.type(id).sizes != out_sizes) return refuse("outputs of different shapes");
  return true;
}

GeneratedKernel generate_cuda_kernel(const ir::Graph& graph, const std::string& symbol) {
  std::string why;
  if (!cuda_codegen_supports(graph, &why)) throw Error(ErrorKind::kInvalidArgument, "[cuda codegen] " + why);
  const int rank = static_cast<int>(graph.type(graph.outputs().front()).rank());
  const int num_outputs = static_cast<int>(graph.outputs().size());
  const int num_tensors = num_outputs + static_cast<int>(graph.inputs().size());

  std::ostringstream s;
  s << "namespace ns_" << symbol << " {\n"
    << "static __device__ __forceinline__ void element(const VtpuCudaLaunchArgs& c";
  for (int t = 0; t < num_tensors; ++t) s << ", int64_t o" << t;
  s << ") {\n";
  detail::emit_elementwise_values(
      s, graph,
      [&](int position, DType dtype) {
        const int t = num_outputs + position;
        return "*reinterpret_cast<const " + std::string(detail::storage_type(dtype)) + "*>(c.data[" +
               std::to_string(t) + "] + o" + std::to_string(t) + " * " + std::to_string(ir::itemsize(dtype)) + ")";
      },
      [](const ir::Node&) { return false; });
  for (int k = 0; k < num_outputs; ++k) {
    const ir::ValueId id = graph.outputs()[static_cast<std::size_t>(k)];
    const char* st = detail::storage_type(graph.type(id).dtype);
    s << "  *reinterpret_cast<" << st << "*>(c.data[" << k << "] + o" << k << " * "
      << ir::itemsize(graph.type(id).dtype) << ") = vtpu_store_t<" << st << ">::of(v" << id << ");\n";
  }
  s << "}\n}  // namespace ns_" << symbol << "\n";

  // A grid-stride loop: any grid size covers any element count. Dense
  // launches index every tensor by the element number; others turn it into
  // coordinates (the rank is fixed, so the loop unrolls) and per-tensor offsets.
  s << "extern \"C\" __global__ void __launch_bounds__(" << kCudaBlockSize << ") " << symbol
    << "(const VtpuCudaLaunchArgs c) {\n"
    << "  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;\n"
    << "  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < c.total; i += step) {\n"
    << "    if (c.dense) {\n      ns_" << symbol << "::element(c";
  for (int t = 0; t < num_tensors; ++t) s << ", i";
  s << ");\n      continue;\n    }\n    int64_t rest = i;\n";
  for (int t = 0; t < num_tensors; ++t) s << "    int64_t o" << t << " = 0;\n";
  if (rank > 0) {
    s << "#pragma unroll\n    for (int d = " << rank - 1 << "; d >= 0; --d) {\n"
      << "      const int64_t idx = rest % c.sizes[d];\n      rest /= c.sizes[d];\n";
    for (int t = 0; t < num_tensors; ++t) s << "      o" << t << " += idx * c.strides[" << t << "][d];\n";
    s << "    }\n";
  }
  s << "    ns_" << symbol << "::element(c";
  for (int t = 0; t < num_tensors; ++t) s << ", o" << t;
  s << ");\n  }\n}\n";
  return {symbol, s.str()};
}

std::string cuda_translation_unit(const std::vector<GeneratedKernel>& kernels) {
  std::string source = launch_abi_source() + kCudaPrelude + detail::kKernelMathSource + detail::kPortableHelpersSource;
  for (const auto& kernel : kernels) source += kernel.source;
  return source;
}

}  // namespace vtpu::compiler
