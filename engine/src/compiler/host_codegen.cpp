#include "vtpu/compiler/host_codegen.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "host_codegen_internal.h"
#include "vtpu/compiler/launch_abi.h"
#include "vtpu/ir/canonical.h"
#include "vtpu/runtime/error.h"

namespace vtpu::compiler {
namespace {

using ir::DType;
using ir::OpKind;
using runtime::Error;
using runtime::ErrorKind;

using detail::storage_type;

}  // namespace

namespace detail {

void refuse(OpKind op, const std::string& why) {
  throw Error(ErrorKind::kInvalidArgument, "[host codegen] " + std::string(ir::name(op)) + ": " + why);
}

const char* const kParallelRunSource = R"RUN(
static inline void run(const VtpuLaunchArgs* args, int64_t items, int64_t cost_per_item, VtpuParallelBody body, void* c) {
  if (items <= 0) return;
  const int64_t cost = cost_per_item > 0 ? cost_per_item : 1;
  const int64_t grain = 32768 / cost > 0 ? 32768 / cost : 1;
  if (args->parallel_for != nullptr && items > grain) args->parallel_for(items, grain, body, c, args->runner);
  else body(0, items, c);
}
)RUN";

const ir::Node& single_op_node(const ir::Graph& graph, bool (*family)(OpKind), OpKind first, OpKind second,
                               const char* what) {
  const auto& outs = graph.outputs();
  if (outs.empty() || outs.size() > 2)
    throw Error(ErrorKind::kInvalidArgument, std::string("[host codegen] a ") + what + " kernel has one or two outputs");
  const ir::Node& node = graph.node(outs[0]);
  if (!family(node.op) || node.op == second) {
    for (const auto& n : graph.nodes())
      if (family(n.op)) refuse(n.op, std::string("not the first output of a ") + what + " kernel");
    throw Error(ErrorKind::kInvalidArgument, std::string("[host codegen] no ") + what + " op in the graph");
  }
  if (outs.size() == 2) {
    const ir::Node& other = graph.node(outs[1]);
    if (node.op != first || other.op != second || node.inputs != other.inputs ||
        node.attrs.entries() != other.attrs.entries())
      refuse(node.op, "the second output must be the " + std::string(ir::name(second)) +
                          " of the same operands and attributes");
  }
  if (node.inputs != graph.inputs()) refuse(node.op, "the graph's inputs must be the op's operands, in order");
  if (graph.nodes().size() != graph.inputs().size() + outs.size())
    for (const auto& n : graph.nodes())
      if (n.op != OpKind::Input && !family(n.op))
        refuse(node.op, std::string("a ") + what + " kernel is one op (" + std::string(ir::name(n.op)) + " beside it)");
  return node;
}

const char* storage_type(DType t) {
  switch (t) {
    case DType::kBool: return "bool";
    case DType::kUInt8: return "uint8_t";
    case DType::kInt8: return "int8_t";
    case DType::kInt16: return "int16_t";
    case DType::kInt32: return "int32_t";
    case DType::kInt64: return "int64_t";
    case DType::kFloat16: return "vtpu_half";
    case DType::kBFloat16: return "vtpu_bf16";
    case DType::kFloat32: return "float";
    case DType::kFloat64: return "double";
  }
  return "float";
}

}  // namespace detail

namespace {

// The type arithmetic is done in (torch's opmath type).
const char* compute_type_name(DType t) { return storage_type(ir::compute_type(t)); }

// Helpers of the host's kernels only: 16-bit float conversions with
// round-to-nearest-even, the optimisation barrier, and the lane reductions.
// The helpers every target shares follow them (kernel_helpers.cpp).
// Sixteen float16 lanes converted by the x86 conversion instructions
// (F16C/AVX-512F, one instruction per 8 or 16 lanes) where the host has them:
// GCC keeps _Float16 conversions scalar without AVX512-FP16, and the
// integer formulation of vtpu_load/vtpu_to_half costs ~20 vector operations
// per conversion (float16 kernels took 2-5x the CPU's time). Their results
// are those functions' bit for bit (every float16 and every float32 pattern
// compared, rounding to nearest even, NaNs quieted with their payload), so a
// loop's lane groups and its remainder agree. Only kernels that call these
// include <immintrin.h> (it adds ~0.3 s to a kernel's compile).
constexpr const char* kHalfLanesSource = R"HALF(
#include <immintrin.h>
static inline void vtpu_half_lanes_load(const vtpu_half* p, float* out) {
#if defined(__AVX512F__)
  _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(__F16C__)
  _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  _mm256_storeu_ps(out + 8, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8))));
#else
  for (int l = 0; l < 16; ++l) out[l] = vtpu_load(p[l]);
#endif
}
static inline void vtpu_half_lanes_store(const float* in, vtpu_half* p) {
#if defined(__AVX512F__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(_mm512_loadu_ps(in), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(_mm256_loadu_ps(in), _MM_FROUND_TO_NEAREST_INT));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), _mm256_cvtps_ph(_mm256_loadu_ps(in + 8), _MM_FROUND_TO_NEAREST_INT));
#else
  for (int l = 0; l < 16; ++l) p[l] = vtpu_to_half(in[l]);
#endif
}
// vtpu_lanes_segment and vtpu_lanes_reduce over a contiguous float16 row p
// (each value widened to T; reductions): the same order and bits, its groups
// of 16 converted by vtpu_half_lanes_load (a float16 row sum took 4x the
// time of a float32 one with vtpu_load's integer conversion).
template <typename T, typename Combine>
static inline T vtpu_half_lanes_segment(const vtpu_half* p, int64_t begin, int64_t n, T init, Combine combine) {
  T lanes[16];
  int64_t i = 0;
  bool grouped = false;
  if constexpr (vtpu_extremum_of<Combine>::value != 0)
    grouped = vtpu_extremum_groups<vtpu_extremum_of<Combine>::value>(n, init, [&](int64_t k, T* v) {
      float f[16];
      vtpu_half_lanes_load(p + begin + k, f);
      for (int l = 0; l < 16; ++l) v[l] = static_cast<T>(f[l]);
    }, lanes, &i);
  if (!grouped) {
    for (int l = 0; l < 16; ++l) lanes[l] = init;
    i = 0;
    for (; i + 16 <= n; i += 16) {
      float v[16];
      vtpu_half_lanes_load(p + begin + i, v);
#pragma GCC unroll 1
      for (int l = 0; l < 16; ++l) lanes[l] = combine(lanes[l], static_cast<T>(v[l]));
    }
  }
  if (i < n)
    for (int l = 0; l < 16; ++l) lanes[l] = combine(lanes[l], i + l < n ? static_cast<T>(vtpu_load(p[begin + i + l])) : init);
  for (int w = 8; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] = combine(lanes[l], lanes[l + w]);
  return lanes[0];
}
template <typename T, typename Combine>
static inline T vtpu_half_lanes_reduce(const vtpu_half* p, int64_t n, T init, Combine combine) {
  return vtpu_by_segments(n, init, combine,
                          [&](int64_t b, int64_t len) { return vtpu_half_lanes_segment(p, b, len, init, combine); });
}
// Each lane rounded to float16 and back (a value a later op of a fused
// kernel reads as strict mode's stored float16).
static inline void vtpu_half_lanes_round(float* v) {
  alignas(32) vtpu_half h[16];
  vtpu_half_lanes_store(v, h);
  vtpu_half_lanes_load(h, v);
}
)HALF";

constexpr const char* kPrelude = R"PRELUDE(
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
struct vtpu_half { uint16_t bits; };
struct vtpu_bf16 { uint16_t bits; };
static inline float vtpu_load(vtpu_bf16 v) { uint32_t u = (uint32_t)v.bits << 16; float f; std::memcpy(&f, &u, 4); return f; }

// All ones where b holds. The 16-bit conversions below choose with masks,
// not selects: a select is a branch until the vectoriser if-converts it, so
// a conversion of a loop-invariant value (a launch scalar rounded to 16
// bits) stayed in the loop and kept the whole loop scalar.
static inline uint32_t vtpu_mask(bool b) { return 0u - (uint32_t)b; }
// Rounded to nearest even; a NaN keeps its sign and leading payload bits,
// quieted.
static inline vtpu_bf16 vtpu_to_bf16(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
  const uint32_t is_nan = vtpu_mask((u & 0x7fffffffu) > 0x7f800000u);
  return vtpu_bf16{(uint16_t)((is_nan & nan) | (~is_nan & rounded))};
}
// vtpu_load(vtpu_to_bf16(f)), the same bits, without leaving 32-bit lanes
// (a float compare finds the NaNs in one instruction; ~7% of a bfloat16
// AdamW kernel against vtpu_to_bf16's integer test).
static inline float vtpu_round_bf16(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  const uint32_t is_nan = vtpu_mask(f != f);
  const uint32_t r = (((u + 0x7fffu + ((u >> 16) & 1u)) & ~is_nan) | ((u | 0x400000u) & is_nan)) & 0xffff0000u;
  float out; std::memcpy(&out, &r, 4); return out;
}
// float16 <-> float32 in integer and float arithmetic, which GCC
// vectorises; its _Float16 conversions are scalar on hosts without
// AVX512-FP16 (float16 kernels took 10-25x the CPU's time). The results are
// the x86 conversion instructions' (what ATen's CPU kernels use), NaNs too:
// quieted, sign and leading payload bits kept.
static inline float vtpu_load(vtpu_half v) {
  const uint32_t h = v.bits, sign = (h & 0x8000u) << 16, mag = h & 0x7fffu, m = h & 0x3ffu;
  const uint32_t normal = (mag << 13) + 0x38000000u;  // exponent rebiased from 15 to 127
  const uint32_t special = 0x7f800000u | (m << 13) | ((uint32_t)(m != 0) << 22);  // inf, quieted NaN
  // A subnormal is m units of 2^-24: (0.5 + m * 2^-24) - 0.5, both exact.
  const uint32_t half_plus = 0x3f000000u | m;
  float sub; std::memcpy(&sub, &half_plus, 4); sub -= 0.5f;
  uint32_t sub_bits; std::memcpy(&sub_bits, &sub, 4);
  const uint32_t is_special = vtpu_mask(mag >= 0x7c00u), is_normal = vtpu_mask(mag >= 0x0400u);
  const uint32_t u = sign | (is_special & special) | (~is_special & ((is_normal & normal) | (~is_normal & sub_bits)));
  float f; std::memcpy(&f, &u, 4); return f;
}
static inline vtpu_half vtpu_to_half(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  // Normal results: rebias the exponent, round the 13 dropped bits to
  // nearest even (a carry moves into the exponent as it should).
  const uint32_t r = a - 0x38000000u;
  const uint32_t normal = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
  // Subnormal results: adding 0.5 leaves |f| rounded to nearest even in
  // units of 2^-24 (0.5's ulp) in the low mantissa bits.
  float fa; std::memcpy(&fa, &a, 4);
  const float shifted = fa + 0.5f;
  uint32_t sb; std::memcpy(&sb, &shifted, 4);
  const uint32_t sub = sb - 0x3f000000u;
  const uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  const uint32_t is_nan = vtpu_mask(a > 0x7f800000u), is_inf = vtpu_mask(a >= 0x477ff000u),
                 is_normal = vtpu_mask(a >= 0x38800000u);
  const uint32_t h = (is_nan & nan) | (~is_nan & ((is_inf & 0x7c00u) | (~is_inf & ((is_normal & normal) | (~is_normal & sub)))));
  return vtpu_half{(uint16_t)(sign | h)};
}
template <typename T> static inline T vtpu_load(T v) { return v; }
// -v as a flip of the sign bit. Written as -v, GCC folds the negation of an
// fma (add with alpha, addcmul, lerp) into one negated multiply-subtract,
// -(a*b) - c, which is +0 where -(a*b + c) is -0 (a fused -(x + y) of -0 and
// +0 lost the sign strict mode's separate neg kernel gives).
template <typename T> static inline T vtpu_float_neg(T v) {
  if constexpr (sizeof(T) == 4) {
    uint32_t u; std::memcpy(&u, &v, 4); u ^= 0x80000000u; std::memcpy(&v, &u, 4);
  } else {
    uint64_t u; std::memcpy(&u, &v, 8); u ^= 0x8000000000000000ull; std::memcpy(&v, &u, 8);
  }
  return v;
}
// The value unchanged, its origin hidden from the optimiser (see
// cast_from_floating in host_codegen.cpp).
template <typename T> static inline T vtpu_opaque(T v) {
  __asm__("" : "+r"(v));
  return v;
}
// 1 for a max combine (vtpu_max_combine), -1 for a min, 0 for any other.
template <typename C, typename = void> struct vtpu_extremum_of : std::integral_constant<int, 0> {};
template <typename C>
struct vtpu_extremum_of<C, std::void_t<decltype(C::kVtpuExtremum)>> : std::integral_constant<int, C::kVtpuExtremum> {};
// The whole groups of 16 of a lane loop's max (kSign 1) or min (-1) of
// floats: the lanes in vectors of 64 bytes, load(k, v) giving elements
// k .. k+15. Without NaNs each lane's step, a > v ? a : v, is vtpu_max's,
// so the lanes hold vtpu_lanes_segment's values; vtpu_max's NaN tests made
// the lane loop a chain of dependent compares and blends (a float32 amax
// ran at 7 elements/ns on one thread; these loops at 22). Returns false when
// a NaN was read: the caller starts over in vtpu_max's steps, which pick
// which NaN (its payload) the result is. `done` is the number of elements
// the groups covered.
template <int kSign, typename T, typename Load>
static inline bool vtpu_extremum_groups(int64_t n, T init, Load load, T* lanes, int64_t* done) {
  constexpr int kLanes = 16, kPer = 64 / (int)sizeof(T), kParts = kLanes / kPer;
  typedef T Vec __attribute__((vector_size(64)));
  typedef decltype(Vec{} != Vec{}) Mask;
  Vec acc[kParts];
  Mask nan{};
  for (int p = 0; p < kParts; ++p)
    for (int l = 0; l < kPer; ++l) acc[p][l] = init;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    T v16[kLanes];
    load(i, v16);
#pragma GCC unroll 2
    for (int p = 0; p < kParts; ++p) {
      Vec v;
      std::memcpy(&v, v16 + p * kPer, sizeof v);
      nan |= v != v;
      if constexpr (kSign > 0) acc[p] = acc[p] > v ? acc[p] : v;
      else acc[p] = acc[p] < v ? acc[p] : v;
    }
  }
  bool any_nan = false;
  for (int l = 0; l < kPer; ++l) any_nan |= nan[l] != 0;
  for (int p = 0; p < kParts; ++p) std::memcpy(lanes + p * kPer, &acc[p], sizeof(Vec));
  *done = i;
  return !any_nan;
}
// A reduction of value(begin .. begin+n-1) in a fixed order that vectorises:
// element begin+i goes to lane i % 16, then lanes are combined pairwise.
// `init` must be the combine's identity (the partial last group is padded
// with it). One segment of vtpu_lanes_reduce.
template <typename T, typename Value, typename Combine>
static inline T vtpu_lanes_segment(int64_t begin, int64_t n, T init, Value value, Combine combine) {
  constexpr int kLanes = 16;
  T lanes[kLanes];
  int64_t i = 0;
  bool grouped = false;
  if constexpr (std::is_floating_point_v<T> && vtpu_extremum_of<Combine>::value != 0)
    grouped = vtpu_extremum_groups<vtpu_extremum_of<Combine>::value>(
        n, init, [&](int64_t k, T* v) { for (int l = 0; l < kLanes; ++l) v[l] = value(begin + k + l); }, lanes, &i);
  if (!grouped) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = init;
    i = 0;
    if constexpr (std::is_same_v<T, double>) {
      // Double lanes: the lane loop stays a loop (not unrolled into 16
      // statements before vectorisation), which GCC vectorises; unrolled, its
      // SLP pass left conversions of 16-bit loads to double scalar (bfloat16 row
      // sums took 3.5x this time). Float lanes keep the unrolled form, which
      // SLP turns into 512-bit code (the loop form gets 256-bit: softmax 1.4x).
      for (; i + kLanes <= n; i += kLanes) {
#pragma GCC unroll 1
        for (int l = 0; l < kLanes; ++l) lanes[l] = combine(lanes[l], value(begin + i + l));
      }
    } else {
      for (; i + kLanes <= n; i += kLanes)
        for (int l = 0; l < kLanes; ++l) lanes[l] = combine(lanes[l], value(begin + i + l));
    }
  }
  if (i < n)
    for (int l = 0; l < kLanes; ++l) lanes[l] = combine(lanes[l], i + l < n ? value(begin + i + l) : init);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] = combine(lanes[l], lanes[l + w]);
  return lanes[0];
}
// vtpu_lanes_segment for callers whose value(i) touches only element i of
// each tensor (fused reductions' fast rows, which also store elementwise
// results): the same order and bits, with the lane loops marked free of
// loop-carried dependences, so that GCC vectorises them without runtime
// alias checks (it gives up beyond ~10 pointer pairs).
template <typename T, typename Value, typename Combine>
static inline T vtpu_lanes_segment_ivdep(int64_t begin, int64_t n, T init, Value value, Combine combine) {
  constexpr int kLanes = 16;
  T lanes[kLanes];
  int64_t i = 0;
  bool grouped = false;
  if constexpr (std::is_floating_point_v<T> && vtpu_extremum_of<Combine>::value != 0)  // as in vtpu_lanes_segment
    grouped = vtpu_extremum_groups<vtpu_extremum_of<Combine>::value>(
        n, init, [&](int64_t k, T* v) { for (int l = 0; l < kLanes; ++l) v[l] = value(begin + k + l); }, lanes, &i);
  if (!grouped) {
    for (int l = 0; l < kLanes; ++l) lanes[l] = init;
    i = 0;
    if constexpr (std::is_same_v<T, double>) {  // as in vtpu_lanes_segment
      for (; i + kLanes <= n; i += kLanes) {
#pragma GCC ivdep
#pragma GCC unroll 1
        for (int l = 0; l < kLanes; ++l) lanes[l] = combine(lanes[l], value(begin + i + l));
      }
    } else {
      for (; i + kLanes <= n; i += kLanes) {
#pragma GCC ivdep
        for (int l = 0; l < kLanes; ++l) lanes[l] = combine(lanes[l], value(begin + i + l));
      }
    }
  }
  if (i < n) {
#pragma GCC ivdep
    for (int l = 0; l < kLanes; ++l) lanes[l] = combine(lanes[l], i + l < n ? value(begin + i + l) : init);
  }
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] = combine(lanes[l], lanes[l + w]);
  return lanes[0];
}
// A reduction of value(0..n-1) in a fixed order that depends only on n, so
// every caller and every loop shape gets the same bits: a row of up to
// kVtpuSegment elements is one vtpu_lanes_segment; a longer row is cut into
// segments of kVtpuSegment elements (the last one shorter), each reduced in
// lanes, and the segments' results are combined in order starting from
// `init`. The segments let a kernel reduce one long row on several threads
// (vtpu_segments_combine gives the same bits from per-segment results):
// a whole-tensor sum has one output, and ran on one thread.
constexpr int64_t kVtpuSegment = 32768;
// The segments of a row of n elements, segment(begin, length) reducing one.
template <typename T, typename Combine, typename Segment>
static inline T vtpu_by_segments(int64_t n, T init, Combine combine, Segment segment) {
  T acc = init;
  for (int64_t b = 0;; b += kVtpuSegment) {
    const T part = segment(b, std::min(kVtpuSegment, n - b));
    if (n <= kVtpuSegment) return part;
    acc = combine(acc, part);
    if (b + kVtpuSegment >= n) return acc;
  }
}
template <typename T, typename Value, typename Combine>
static inline T vtpu_lanes_reduce(int64_t n, T init, Value value, Combine combine) {
  return vtpu_by_segments(n, init, combine,
                          [&](int64_t b, int64_t len) { return vtpu_lanes_segment(b, len, init, value, combine); });
}
template <typename T, typename Value, typename Combine>
static inline T vtpu_lanes_reduce_ivdep(int64_t n, T init, Value value, Combine combine) {
  return vtpu_by_segments(n, init, combine,
                          [&](int64_t b, int64_t len) { return vtpu_lanes_segment_ivdep(b, len, init, value, combine); });
}
// Scratch memory of a kernel (the segments' results), freed on every path
// out of it; p is null when the allocation failed (callers then take the
// one-thread path, which gives the same bits).
template <typename T> struct vtpu_scratch {
  T* p;
  explicit vtpu_scratch(int64_t n) : p(static_cast<T*>(std::malloc(sizeof(T) * static_cast<size_t>(n)))) {}
  ~vtpu_scratch() { std::free(p); }
  vtpu_scratch(const vtpu_scratch&) = delete;
  vtpu_scratch& operator=(const vtpu_scratch&) = delete;
};
// The number of segments vtpu_lanes_reduce cuts a row of n elements into.
static inline int64_t vtpu_segments(int64_t n) { return n <= kVtpuSegment ? 1 : (n + kVtpuSegment - 1) / kVtpuSegment; }
// vtpu_lanes_reduce's result from its segments' results parts[0..segments).
template <typename T, typename Combine>
static inline T vtpu_segments_combine(const T* parts, int64_t segments, T init, Combine combine) {
  if (segments == 1) return parts[0];
  T acc = init;
  for (int64_t s = 0; s < segments; ++s) acc = combine(acc, parts[s]);
  return acc;
}
)PRELUDE";

class Emitter {
 public:
  explicit Emitter(const ir::Graph& graph) : graph_(graph) {}

  GeneratedKernel emit(const std::string& symbol, bool lookup_tables) {
    validate();
    const auto& out_type = graph_.type(graph_.outputs().front());
    const int rank = static_cast<int>(out_type.rank());
    bool all_contiguous = true;
    for (ir::ValueId id : graph_.inputs())
      all_contiguous &= graph_.type(id).sizes == out_type.sizes && graph_.type(id).is_contiguous();

    std::ostringstream s;
    lookup_tables_ = lookup_tables;
    const std::vector<ir::ValueId> tables = lookup_nodes();
    // Each kernel's helpers live in a namespace of their own, so that many
    // kernels can share one translation unit (the AOT library).
    s << "namespace ns_" << symbol << " {\nstruct Context {\n";
    for (ir::ValueId id : tables) s << "  const float* lut" << id << ";\n";
    const int num_outputs = static_cast<int>(graph_.outputs().size());
    const int num_inputs = static_cast<int>(graph_.inputs().size());
    for (int t = 0; t < num_outputs + num_inputs; ++t) s << "  char* p" << t << ";\n";
    s << "  const double* scalars;\n  bool dense_outputs;\n  bool unit_rows;\n  int64_t sizes[VTPU_MAX_RANK];\n"
      << "  int64_t strides[" << (num_outputs + num_inputs) << "][VTPU_MAX_RANK];\n};\n";
    for (ir::ValueId id : tables) emit_lookup_table(s, id);

    // The element function: loads at the given element offsets, computes, stores.
    // Always inlined: GCC's heuristics kept a fused LSTM cell's element (three
    // sigmoids and two tanhs inlined into it) out of line, and the loops that
    // call it then ran one element at a time (fused 1.2-1.3x strict on RNNs,
    // 5.5x on a long sigmoid chain; found by a performance review).
    s << "__attribute__((always_inline)) inline void element(const Context& c";
    for (int t = 0; t < num_outputs + num_inputs; ++t) s << ", int64_t o" << t;
    s << ") {\n";
    emit_body(s, num_outputs);
    s << "}\n";
    const bool lanes = (all_contiguous || rank == 0) && uses_lanes();
    if (lanes || (rank > 0 && has_float16())) s << "constexpr int kLanes = 16;\n";
    if (lanes) {
      s << "inline void element_lanes(const Context& c, int64_t i) {\n";
      lanes_ = true;
      lane_base_ = [](int) { return std::string("i"); };
      emit_body(s, num_outputs, [](int) { return std::string("(i + l)"); });
      lanes_ = false;
      s << "}\n";
    }
    // The rows loop's steps per input (0: broadcast along the row, 1: unit
    // stride), fixed by the graph or checked at launch (strided inputs).
    const std::optional<std::vector<int>> steps = inner_steps();
    std::vector<int> row_steps;
    std::string unit_inner;
    if (steps) {
      row_steps = *steps;
    } else if (rank > 0) {
      for (std::size_t i = 0; i < graph_.inputs().size(); ++i) {
        const int step = inner_step(graph_.inputs()[i]);
        row_steps.push_back(step < 0 ? 1 : step);
        if (step < 0)
          unit_inner += " && c.strides[" + std::to_string(num_outputs + static_cast<int>(i)) + "][" +
                        std::to_string(rank - 1) + "] == 1";
      }
    }
    // Float16 rows (a bias added, a row scaled by a broadcast weight) convert
    // in lane groups too; a broadcast operand is one element for all lanes.
    const bool row_lanes = rank > 0 && has_float16();
    if (row_lanes) {
      const auto row_step = [&](int t) { return t < num_outputs ? 1 : row_steps[static_cast<std::size_t>(t - num_outputs)]; };
      s << "inline void element_row_lanes(const Context& c, int64_t j";
      for (int t = 0; t < num_outputs + num_inputs; ++t) s << ", int64_t b" << t;
      s << ") {\n";
      lanes_ = true;
      lane_base_ = [&](int t) { return row_step(t) == 1 ? "(b" + std::to_string(t) + " + j)" : std::string(); };
      emit_body(s, num_outputs, [&](int t) {
        return row_step(t) == 1 ? "(b" + std::to_string(t) + " + j + l)" : "b" + std::to_string(t);
      });
      lanes_ = false;
      s << "}\n";
    }

    // Flattened: every call in the loops is inlined, the math helpers (exp,
    // tanh, sigmoid...) too, or a long fused chain of them stays a series of
    // scalar calls per element (a 48-op sigmoid/tanh cluster ran 5x strict's
    // time). Only in purely elementwise kernels: forcing the helpers inline
    // everywhere made a fused GELU-backward reduction 6x slower.
    // The Context is copied: read through the launcher's pointer, GCC
    // reloaded its tensor pointers after every 16-bit store (a bfloat16 or
    // float16 element is stored as a struct, which it does not tell apart
    // from the Context's members) and left the loop scalar: a bfloat16
    // division by a broadcast gradient fused with threshold_backward ran 15x
    // slower than with the copy.
    s << "__attribute__((flatten)) void body(int64_t begin, int64_t end, void* raw) {\n"
      << "  const Context c = *static_cast<const Context*>(raw);\n";
    if (all_contiguous || rank == 0) {
      // Element i reads and writes only element i of every tensor (a tensor
      // both read and written is the same memory at the same offsets, never
      // a shifted alias: ATen's overlap checks and fused mode's window rules
      // see to that), so there is no loop-carried dependence and the loop
      // vectorises without the alias checks GCC gives up on beyond a few
      // pointers. The graph describes its inputs' layout but not where the
      // outputs go: an out= tensor may be a strided view, which takes the
      // odometer below.
      if (rank > 0) s << "  if (c.dense_outputs) {\n";
      if (lanes) s << "  for (; begin + kLanes <= end; begin += kLanes) element_lanes(c, begin);\n";
      s << "  #pragma GCC ivdep\n";
      s << "  for (int64_t i = begin; i < end; ++i) element(c";
      for (int t = 0; t < num_outputs + num_inputs; ++t) s << ", i";
      s << ");\n";
      if (rank > 0) s << "  return;\n  }\n";
    }
    // Strided inputs (a transposed view, a permuted copy) usually still have
    // unit stride along the innermost dim: checked at launch (unit_inner),
    // they then take the rows loop too, instead of an odometer step per element.
    if (rank > 0) emit_rows_loop(s, rank, num_outputs, row_steps, unit_inner, row_lanes);
    if (rank >= 2) {
      emit_columns_loop(s, rank, num_outputs);
      emit_tiles_loop(s, rank, num_outputs + num_inputs);
    }
    if (rank > 0) {
      // Odometer over the output shape, starting from `begin`'s coordinates.
      s << "  int64_t idx[VTPU_MAX_RANK];\n  int64_t rest = begin;\n"
        << "  for (int d = " << rank - 1 << "; d >= 0; --d) { idx[d] = rest % c.sizes[d]; rest /= c.sizes[d]; }\n";
      for (int t = 0; t < num_outputs + num_inputs; ++t) {
        s << "  int64_t o" << t << " = 0;\n";
        s << "  for (int d = 0; d < " << rank << "; ++d) o" << t << " += idx[d] * c.strides[" << t << "][d];\n";
      }
      s << "  for (int64_t i = begin; i < end; ++i) {\n    element(c";
      for (int t = 0; t < num_outputs + num_inputs; ++t) s << ", o" << t;
      s << ");\n    for (int d = " << rank - 1 << "; d >= 0; --d) {\n      if (++idx[d] < c.sizes[d]) {\n";
      for (int t = 0; t < num_outputs + num_inputs; ++t) s << "        o" << t << " += c.strides[" << t << "][d];\n";
      s << "        break;\n      }\n      idx[d] = 0;\n";
      for (int t = 0; t < num_outputs + num_inputs; ++t)
        s << "      o" << t << " -= (c.sizes[d] - 1) * c.strides[" << t << "][d];\n";
      s << "    }\n  }\n";
    }
    s << "}\n}  // namespace ns_" << symbol << "\n";

    s << "extern \"C\" __attribute__((visibility(\"default\"))) void " << symbol
      << "(const struct VtpuLaunchArgs* args) {\n"
      << "  using namespace ns_" << symbol << ";\n"
      << "  Context c;\n  c.scalars = args->scalars;\n  int64_t total = 1;\n"
      << "  for (int d = 0; d < args->rank; ++d) { c.sizes[d] = args->tensors[0].sizes[d]; total *= c.sizes[d]; }\n"
      ;
    for (ir::ValueId id : tables) s << "  c.lut" << id << " = lookup_table_v" << id << "();\n";
    for (int t = 0; t < num_outputs + num_inputs; ++t) {
      s << "  c.p" << t << " = static_cast<char*>(args->tensors[" << t << "].data);\n"
        << "  for (int d = 0; d < args->rank; ++d) c.strides[" << t << "][d] = args->tensors[" << t
        << "].strides[d];\n";
    }
    // Whether every output is row-major over the iteration shape (size-1
    // dims aside): then the flat loop may index it by the element number.
    s << "  c.dense_outputs = true;\n"
      << "  for (int t = 0; t < " << num_outputs << "; ++t) {\n"
      << "    int64_t expected = 1;\n"
      << "    for (int d = args->rank - 1; d >= 0; --d) {\n"
      << "      if (c.sizes[d] != 1 && c.strides[t][d] != expected) c.dense_outputs = false;\n"
      << "      expected *= c.sizes[d];\n    }\n  }\n";
    s << "  c.unit_rows = true;\n"
      << "  for (int t = 0; t < " << num_outputs << "; ++t)\n"
      << "    if (args->rank > 0 && c.sizes[args->rank - 1] != 1 && c.strides[t][args->rank - 1] != 1) c.unit_rows = false;\n";
    s << "  if (total <= 0) return;\n"
      << "  const int64_t grain = " << grain() << ";\n"
      << "  if (args->parallel_for != nullptr && total > grain) args->parallel_for(total, grain, &body, &c, args->runner);\n"
      << "  else body(0, total, &c);\n}\n";
    return {symbol, s.str()};
  }

 private:
  void validate() const {
    if (graph_.outputs().empty())
      throw Error(ErrorKind::kInvalidArgument, "[host codegen] the graph has no outputs");
    const auto& out_sizes = graph_.type(graph_.outputs().front()).sizes;
    if (out_sizes.size() > static_cast<std::size_t>(kMaxRank))
      throw Error(ErrorKind::kInvalidArgument, "[host codegen] rank above " + std::to_string(kMaxRank));
    for (const auto& node : graph_.nodes()) {
      if (!host_codegen_supports(node.op) || detail::host_reduction_supports(node.op) ||
          detail::host_softmax_supports(node.op) || detail::host_reduction_stats_supports(node.op) ||
          detail::host_norm_supports(node.op) || detail::host_indexing_supports(node.op) ||
          detail::host_loss_supports(node.op) || detail::host_pooling_supports(node.op))
        throw Error(ErrorKind::kInvalidArgument,
                    "[host codegen] " + std::string(ir::name(node.op)) + " is not an elementwise op");
      if (node.op != OpKind::Input && node.op != OpKind::Constant && node.type.sizes != out_sizes)
        throw Error(ErrorKind::kInvalidArgument, "[host codegen] every value must have the output's shape");
    }
    for (ir::ValueId id : graph_.outputs())
      if (graph_.type(id).sizes != out_sizes)
        throw Error(ErrorKind::kInvalidArgument, "[host codegen] outputs of different shapes");
  }

  // Per input, the step of its offset along the innermost output dim when
  // the graph fixes it: 0 (broadcast along it) or 1 (unit stride). nullopt
  // when some input is strided there (only launch-time strides say).
  std::optional<std::vector<int>> inner_steps() const {
    const auto& out_sizes = graph_.type(graph_.outputs().front()).sizes;
    if (out_sizes.empty()) return std::nullopt;
    std::vector<int> steps;
    for (ir::ValueId id : graph_.inputs()) {
      const int step = inner_step(id);
      if (step < 0) return std::nullopt;
      steps.push_back(step);
    }
    return steps;
  }

  // One input's step along the innermost output dim (inner_steps), or -1
  // when it is strided (only its launch-time stride says).
  int inner_step(ir::ValueId id) const {
    const auto& out_sizes = graph_.type(graph_.outputs().front()).sizes;
    const ir::TensorType& t = graph_.type(id);
    if (out_sizes.back() == 1 || t.sizes.empty() || t.sizes.back() == 1)
      return 0;  // a row of one element, or the input repeats along it
    const ir::LayoutClass layout = ir::layout_class(t);
    if (layout.kind == ir::LayoutKind::kContiguous) return 1;
    if (layout.kind == ir::LayoutKind::kBroadcast) return ((layout.broadcast_mask >> (t.sizes.size() - 1)) & 1) ? 0 : 1;
    return -1;
  }

  // Rows of the innermost dim with constant offset steps (0 or 1): the inner
  // loop vectorises (broadcast operands are loop-invariant loads). Outer dims
  // advance by an odometer once per row. Taken when every output has unit
  // stride along the row (checked at launch: out= views may not) and
  // `condition` (more launch-time checks, each starting with " && ") holds.
  void emit_rows_loop(std::ostringstream& s, int rank, int num_outputs, const std::vector<int>& steps,
                      const std::string& condition, bool lanes) const {
    const int num_tensors = num_outputs + static_cast<int>(steps.size());
    auto step = [&](int t) { return t < num_outputs ? 1 : steps[static_cast<std::size_t>(t - num_outputs)]; };
    s << "  if (c.unit_rows" << condition << ") {\n"
      << "    const int64_t n = c.sizes[" << rank - 1 << "];\n"
      << "    int64_t idx[VTPU_MAX_RANK];\n"
      << "    int64_t rest = begin / n, col = begin % n;\n"
      << "    for (int d = " << rank - 2 << "; d >= 0; --d) { idx[d] = rest % c.sizes[d]; rest /= c.sizes[d]; }\n";
    for (int t = 0; t < num_tensors; ++t) {
      s << "    int64_t b" << t << " = 0;\n"
        << "    for (int d = 0; d < " << rank - 1 << "; ++d) b" << t << " += idx[d] * c.strides[" << t << "][d];\n";
    }
    s << "    for (int64_t i = begin; i < end;) {\n"
      << "      const int64_t stop = std::min<int64_t>(n, col + (end - i));\n"
      << "      int64_t j = col;\n";
    if (lanes) {
      s << "      for (; j + kLanes <= stop; j += kLanes) element_row_lanes(c, j";
      for (int t = 0; t < num_tensors; ++t) s << ", b" << t;
      s << ");\n";
    }
    s << "      #pragma GCC ivdep\n"
      << "      for (; j < stop; ++j) element(c";
    for (int t = 0; t < num_tensors; ++t) s << ", b" << t << (step(t) == 1 ? " + j" : "");
    s << ");\n"
      << "      i += stop - col;\n      col = 0;\n"
      << "      for (int d = " << rank - 2 << "; d >= 0; --d) {\n        if (++idx[d] < c.sizes[d]) {\n";
    for (int t = 0; t < num_tensors; ++t) s << "          b" << t << " += c.strides[" << t << "][d];\n";
    s << "          break;\n        }\n        idx[d] = 0;\n";
    for (int t = 0; t < num_tensors; ++t) s << "        b" << t << " -= (c.sizes[d] - 1) * c.strides[" << t << "][d];\n";
    s << "      }\n    }\n    return;\n  }\n";
  }

  // The start of each step of the columns and tiles loops over whole rows
  // (dim rank-2) of [begin, end): n and m, each tensor's offset b<t> of the
  // step's first row (a division per dim: steps are blocks of rows), and a
  // row cut by the chunk's ends done element by element (then `continue`).
  void emit_row_block_start(std::ostringstream& s, int rank, int num_tensors) const {
    const int row_dim = rank - 2, col_dim = rank - 1;
    s << "    const int64_t n = c.sizes[" << col_dim << "], m = c.sizes[" << row_dim << "];\n"
      << "    for (int64_t i = begin; i < end;) {\n"
      << "      const int64_t row = i / n, col = i % n;\n"
      << "      int64_t rest = row;\n";
    for (int t = 0; t < num_tensors; ++t) s << "      int64_t b" << t << " = 0;\n";
    s << "      for (int d = " << row_dim << "; d >= 0; --d) {\n"
      << "        const int64_t at = rest % c.sizes[d];\n        rest /= c.sizes[d];\n";
    for (int t = 0; t < num_tensors; ++t) s << "        b" << t << " += at * c.strides[" << t << "][d];\n";
    s << "      }\n"
      << "      if (col != 0 || end - i < n) {\n"
      << "        const int64_t stop = std::min<int64_t>(n, col + (end - i));\n"
      << "        for (int64_t j = col; j < stop; ++j) element(c";
    for (int t = 0; t < num_tensors; ++t) s << ", b" << t << " + j * c.strides[" << t << "][" << col_dim << "]";
    s << ");\n"
      << "        i += stop - col;\n        continue;\n      }\n";
  }

  // One input's step along the output's rows (dim rank-2), the columns
  // loop's counterpart of inner_step: 0 when the graph fixes it as a
  // broadcast there, else 1, to be checked at launch.
  int row_step(ir::ValueId id) const {
    const auto& out_sizes = graph_.type(graph_.outputs().front()).sizes;
    const ir::TensorType& t = graph_.type(id);
    const std::size_t row = out_sizes.size() - 2;
    if (out_sizes[row] == 1 || t.sizes.size() < 2 || t.sizes[t.sizes.size() - 2] == 1) return 0;
    const ir::LayoutClass layout = ir::layout_class(t);
    if (layout.kind == ir::LayoutKind::kBroadcast && ((layout.broadcast_mask >> (t.sizes.size() - 2)) & 1)) return 0;
    return 1;
  }

  // Column-major results (x.t() - y: ATen lays out the result like its
  // first operand) whose inputs are unit-stride or broadcast down the
  // columns too: the rows loop with the last two dims' roles swapped. Each
  // chunk's whole rows go column by column, the inner loop down a column
  // with constant steps (it vectorises), so memory is walked in order. In
  // 16x16 tiles such a result took a page per column per tile: x.t() - y of
  // 2048x2048 floats 9-19 ms, the flat x.t() * 2 1.7 ms.
  void emit_columns_loop(std::ostringstream& s, int rank, int num_outputs) const {
    const int row_dim = rank - 2, col_dim = rank - 1;
    const int num_inputs = static_cast<int>(graph_.inputs().size());
    const int num_tensors = num_outputs + num_inputs;
    std::vector<int> steps;
    std::string condition;
    for (int t = 0; t < num_tensors; ++t) {
      const int step = t < num_outputs ? 1 : row_step(graph_.inputs()[static_cast<std::size_t>(t - num_outputs)]);
      steps.push_back(step);
      if (step == 1) condition += " && c.strides[" + std::to_string(t) + "][" + std::to_string(row_dim) + "] == 1";
    }
    s << "  if (c.sizes[" << col_dim << "] > 1 && c.strides[0][" << col_dim << "] != 1" << condition << ") {\n";
    emit_row_block_start(s, rank, num_tensors);
    s << "      const int64_t rows = std::min<int64_t>(m - row % m, (end - i) / n);\n"
      << "      for (int64_t j = 0; j < n; ++j) {\n";
    for (int t = 0; t < num_tensors; ++t)
      s << "        const int64_t c" << t << " = b" << t << " + j * c.strides[" << t << "][" << col_dim << "];\n";
    s << "        #pragma GCC ivdep\n"
      << "        for (int64_t r = 0; r < rows; ++r) element(c";
    for (int t = 0; t < num_tensors; ++t) s << ", c" << t << (steps[static_cast<std::size_t>(t)] == 1 ? " + r" : "");
    s << ");\n      }\n      i += rows * n;\n    }\n    return;\n  }\n";
  }

  // What the rows loop does not take (rank >= 2): an input that is not
  // unit-stride along the output's rows (x.t().contiguous(), a transposed
  // K), or an output that is not (x.t() + y: ATen lays the result out like
  // its first operand, column-major). Element by element in the order of
  // the shape, each element of such a tensor is on a cache line (with long
  // strides a page) of its own, and the loop comes back for the line's
  // neighbour a whole row later, by when it is gone (a 4096x1024 float32
  // transposed copy took 2.2-2.4x ATen's time, `a.t() + b` 1.3x). Instead
  // rows go in blocks of up to kTile, each block in tiles of kTile columns,
  // the tile visited along the first output's unit-stride dim: a tile
  // touches kTile lines of each tensor, all resident until it is done (16:
  // 32 lines 8 KB apart, a 2048-float row, share one set of an 8-way L1).
  // Only the visiting order changes: each element is the same function of
  // the same inputs. Rows cut by the chunk's ends go element by element.
  // Tiles of fewer than 32 elements (trailing dims of 2x2, 3x2) stay on the
  // odometer: a tile's start costs a division per dim, which made a
  // permuted copy of 64x64x64x2x2 floats 2.6x slower.
  void emit_tiles_loop(std::ostringstream& s, int rank, int num_tensors) const {
    const int row_dim = rank - 2, col_dim = rank - 1;
    s << "  if (c.sizes[" << col_dim << "] * std::min<int64_t>(c.sizes[" << row_dim << "], 16) >= 32) {\n"
      << "    constexpr int64_t kTile = 16;\n"
      << "    const bool rows_inner = c.strides[0][" << row_dim << "] == 1 && c.strides[0][" << col_dim << "] != 1;\n";
    emit_row_block_start(s, rank, num_tensors);
    s << "      const int64_t rows = std::min<int64_t>(std::min<int64_t>(kTile, m - row % m), (end - i) / n);\n"
      << "      for (int64_t j0 = 0; j0 < n; j0 += kTile) {\n"
      << "        const int64_t j1 = std::min<int64_t>(n, j0 + kTile);\n";
    std::string at;
    for (int t = 0; t < num_tensors; ++t)
      at += ", b" + std::to_string(t) + " + r * c.strides[" + std::to_string(t) + "][" + std::to_string(row_dim) +
            "] + j * c.strides[" + std::to_string(t) + "][" + std::to_string(col_dim) + "]";
    s << "        if (rows_inner) {\n"
      << "          for (int64_t j = j0; j < j1; ++j)\n"
      << "            for (int64_t r = 0; r < rows; ++r) element(c" << at << ");\n"
      << "        } else {\n"
      << "          for (int64_t r = 0; r < rows; ++r)\n"
      << "            for (int64_t j = j0; j < j1; ++j) element(c" << at << ");\n"
      << "        }\n"
      << "      }\n      i += rows * n;\n    }\n    return;\n  }\n";
  }

  // Elements per parallel chunk: about the same work per chunk whatever the
  // kernel, so a fused kernel of many ops spreads over the cores at sizes
  // where a single add would not be worth splitting.
  std::int64_t grain() const {
    std::int64_t ops = 0;
    for (const auto& node : graph_.nodes()) ops += node.op != OpKind::Input && node.op != OpKind::Constant;
    return std::max<std::int64_t>(2048, 32768 / std::max<std::int64_t>(1, ops));
  }

  static bool has_runtime_scalar(const ir::Node& node) {
    const char* attr = ir::runtime_scalar_attribute(node.op);
    return attr != nullptr && node.attrs.has(attr);
  }
  // The launch-scalar variable holding node `id`'s run-time attribute.
  static std::string runtime_scalar(ir::ValueId id) { return "a" + std::to_string(id); }

  // Value names: v<id>, each in the compute type of its node's dtype; in
  // lane mode (below) arrays of kLanes elements, read at lane l.
  std::string value(ir::ValueId id) const { return "v" + std::to_string(id) + (lanes_ ? "[l]" : ""); }

  // In lane mode, tensor t's first float16 element of the lane group (its
  // element offset lane_base_(t)); lane_base_ is empty for a tensor
  // broadcast along the lanes.
  std::string lane_pointer(int t) const {
    return "reinterpret_cast<vtpu_half*>(c.p" + std::to_string(t) + " + " + lane_base_(t) + " * 2)";
  }
  int num_outputs() const { return static_cast<int>(graph_.outputs().size()); }

  // Defines v<id> = rhs: one constant, or in lane mode one loop over the lanes.
  void define(std::ostringstream& s, const char* type, ir::ValueId id, const std::string& rhs) const {
    if (lanes_) {
      s << "  " << type << " v" << id << "[kLanes];\n  for (int l = 0; l < kLanes; ++l) v" << id << "[l] = " << rhs
        << ";\n";
    } else {
      s << "  const " << type << " " << value(id) << " = " << rhs << ";\n";
    }
  }

  // Ops whose float code is a call into the C library (double-precision
  // transcendentals all are): opaque to the vectoriser, and tens of cycles of
  // latency each.
  static bool calls_libm(const ir::Node& node) {
    switch (node.op) {
      case OpKind::Log10: case OpKind::Tan: case OpKind::Asin:
      case OpKind::Acos: case OpKind::Sinh: case OpKind::Cosh:
        return ir::is_floating(node.common_dtype);
      case OpKind::Exp: case OpKind::Log: case OpKind::Tanh: case OpKind::Erf: case OpKind::Sigmoid:
      case OpKind::Silu: case OpKind::Gelu: case OpKind::Exp2: case OpKind::Log2: case OpKind::Log1p:
      case OpKind::Expm1: case OpKind::Atan: case OpKind::Atan2: case OpKind::Sin: case OpKind::Cos:
        return node.common_dtype == DType::kFloat64;
      default:
        return false;
    }
  }

  // Lane mode: a kernel with two or more library calls per element computes
  // kLanes neighbouring elements side by side, each statement a loop over the
  // lanes. One element's calls form a dependency chain (sin(x * a + b) twice:
  // each call waits for the last), which the core cannot overlap with the
  // next element's chain beyond its reorder window: a fused chain of 16 sins
  // ran 2.4x slower per sin than the 16 single-op kernels, whose calls are
  // independent. Each lane computes exactly what element() computes, so the
  // bits are the same.
  //
  // Float sin and cos take lane mode too: their vectorised path covers
  // |x| <= 2^24 only, so each group of lanes is tested first and takes the
  // C library (element by element) when any lane is beyond it
  // (emit_values); a scalar loop calling vtpu_sin, which may call the
  // library, is not vectorised.
  // A float16 value the kernel converts. Not when every output moves an
  // input's stored bits (copied_input: a float16 .contiguous() of a permuted
  // tensor): its lane groups converted values nothing read, and kept the
  // bit copy scalar (an attention head split 6x the CPU's time, bfloat16's
  // plain loop 1.4x).
  bool has_float16() const {
    bool only_bit_copies = true;
    for (ir::ValueId id : graph_.outputs()) only_bit_copies &= copied_input(id).position >= 0;
    if (only_bit_copies) return false;
    for (const auto& node : graph_.nodes())
      if (node.type.dtype == DType::kFloat16) return true;
    return false;
  }

  bool uses_lanes() const {
    if (has_float16()) return true;
    int calls = 0;
    for (const auto& node : graph_.nodes()) {
      if (is_float_trig(node) && !uses_lookup_table(node)) return true;
      calls += calls_libm(node);
    }
    return calls >= 2;
  }

  // Lookup tables. A transcendental op of one float16/bfloat16 operand
  // whose result is rounded to the same type is a function of 65536 bit
  // patterns: a kernel fills a table of its 16-bit results (as floats) on
  // its first launch, evaluating the very expression it would compute per
  // element, and then reads the table. The same bits by construction (an
  // element's value never depends on where it is computed); a bfloat16 GELU
  // read from a table took 0.26 against 0.89 ns an element on one thread.
  // The table is 256 KiB, L2-resident, read with vector gathers.
  static bool is_lookup_op(OpKind op) {
    switch (op) {
      case OpKind::Exp: case OpKind::Exp2: case OpKind::Log: case OpKind::Log2: case OpKind::Log10:
      case OpKind::Log1p: case OpKind::Expm1: case OpKind::Sin: case OpKind::Cos: case OpKind::Tan:
      case OpKind::Asin: case OpKind::Acos: case OpKind::Atan: case OpKind::Sinh: case OpKind::Cosh:
      case OpKind::Tanh: case OpKind::Sigmoid: case OpKind::Silu: case OpKind::Erf: case OpKind::Gelu:
        return true;
      default:
        return false;
    }
  }

  // The table's index is the operand's 16 bits: a bfloat16 value is exact in
  // the top half of its float (an input's, or a node's rounded result:
  // emit_values rounds every 16-bit value it passes on), a float16 input's
  // is its stored element (a float16 result passed on as a float has no
  // cheap exact way back, so such nodes compute).
  bool uses_lookup_table(const ir::Node& node) const {
    return is_lookup_op(node.op) && node.inputs.size() == 1 && !has_runtime_scalar(node) && indexable_operand(node, 0);
  }

  // GELU's backward, grad * G(x), multiplies the gradient by a function of
  // x alone: its table holds G(x) as a float (not rounded), and the kernel
  // computes grad * table[x], the same product.
  bool uses_factor_table(const ir::Node& node) const {
    return node.op == OpKind::GeluBackward && node.attrs.get_string("approximate", "none") == "none" &&
           indexable_operand(node, 1);
  }

  // Operand k of a 16-bit node can index a table (see above).
  bool indexable_operand(const ir::Node& node, std::size_t k) const {
    const DType dtype = node.type.dtype;
    if (!lookup_tables_ || !operand_overrides_.empty()) return false;
    if ((dtype != DType::kBFloat16 && dtype != DType::kFloat16) || node.common_dtype != dtype) return false;
    const ir::Node& in = graph_.nodes()[static_cast<std::size_t>(node.inputs[k])];
    if (in.type.dtype != dtype || in.op == OpKind::Constant) return false;  // a launch scalar is not rounded
    return dtype == DType::kBFloat16 || in.op == OpKind::Input;
  }

  std::vector<ir::ValueId> lookup_nodes() const {
    std::vector<ir::ValueId> ids;
    for (std::size_t i = 0; i < graph_.nodes().size(); ++i)
      if (uses_lookup_table(graph_.nodes()[i]) || uses_factor_table(graph_.nodes()[i]))
        ids.push_back(static_cast<ir::ValueId>(i));
    return ids;
  }

  // Node `id`'s table: a namespace-scope function returning it, filled once
  // (thread-safely) on its first call; the launcher passes it in the Context.
  void emit_lookup_table(std::ostringstream& s, ir::ValueId id) const {
    const ir::Node& node = graph_.nodes()[static_cast<std::size_t>(id)];
    const std::string st = storage_type(node.type.dtype);
    const bool factor = uses_factor_table(node);
    // A factor table's gradient is 1: 1 * G(x) is G(x) exactly.
    operand_overrides_ = factor ? std::vector<std::string>{"float(1)", "x"} : std::vector<std::string>{"x"};
    const std::string computed = "static_cast<float>(" + expression(node, id) + ")";
    operand_overrides_.clear();
    const std::string result = factor ? computed : "vtpu_round_t<" + st + ">::of(" + computed + ")";
    s << "static const float* lookup_table_v" << id << "() {\n"
      << "  static float table[65536];\n"
      << "  static const bool filled = [] {\n"
      << "    for (uint32_t b = 0; b < 65536; ++b) {\n"
      << "      const float x = vtpu_load(" << st << "{static_cast<uint16_t>(b)});\n"
      << "      table[b] = " << result << ";\n"
      << "    }\n    return true;\n  }();\n"
      << "  (void)filled;\n  return table;\n}\n";
  }

  // Node `id`'s table read at operand k's bits (`load` as in emit_values).
  std::string lookup(const ir::Node& node, ir::ValueId id, std::size_t k,
                     const std::function<std::string(int, DType)>& load) const {
    const ir::ValueId in = node.inputs[k];
    std::string index;
    if (node.type.dtype == DType::kBFloat16) {
      index = "(vtpu_f32_bits(" + value(in) + ") >> 16)";
    } else {
      const auto& inputs = graph_.inputs();
      int position = 0;
      while (inputs[static_cast<std::size_t>(position)] != in) ++position;
      const int t = num_outputs() + position;
      // In lane groups as uint16_t: GCC gathers from a struct's member one lane at a time.
      index = lanes_ && !lane_base_(t).empty()
                  ? "reinterpret_cast<const uint16_t*>(c.p" + std::to_string(t) + " + " + lane_base_(t) + " * 2)[l]"
                  : "(" + load(position, DType::kFloat16) + ").bits";
    }
    return "c.lut" + std::to_string(id) + "[" + index + "]";
  }

  // sin/cos computed in float (float, bfloat16 and float16 tensors).
  static bool is_float_trig(const ir::Node& node) {
    return (node.op == OpKind::Sin || node.op == OpKind::Cos) && ir::is_floating(node.common_dtype) &&
           node.common_dtype != DType::kFloat64;
  }

  // `id` converted to the compute type `type`.
  std::string as(ir::ValueId id, const char* type) const {
    const std::string t = type;
    if ((t == "float" || t == "double") && cast_from_floating(id))
      return "static_cast<" + t + ">(vtpu_opaque(" + value(id) + "))";
    return "static_cast<" + t + ">(" + value(id) + ")";
  }

  // An integer this kernel made from a floating value. Converted back to a
  // floating type in the same kernel, GCC (with -fno-trapping-math) folds the
  // round trip into a truncation in its scalar loop, which keeps the sign of
  // zero: -0.75 -> int64 -> float gave -0.0 (the CPU and strict +0.0: an
  // integer has no -0; found by fuzzing fused mode). vtpu_opaque hides where
  // the integer came from; only such kernels lose the vector loop.
  bool cast_from_floating(ir::ValueId id) const {
    const ir::Node& node = graph_.nodes()[static_cast<std::size_t>(id)];
    return node.op == OpKind::Cast && ir::is_floating(node.common_dtype) && ir::is_integral(node.type.dtype);
  }

  // The element function's statements; tensor t's element offset is
  // `offset(t)` ("o<t>"; in lane mode "(i + l)", the dense loop's index).
  void emit_body(std::ostringstream& s, int num_outputs,
                 const std::function<std::string(int)>& offset = [](int t) { return "o" + std::to_string(t); }) {
    emit_values(
        s,
        [&](int position, DType dtype) {
          const int t = num_outputs + position;
          return "*reinterpret_cast<const " + std::string(storage_type(dtype)) + "*>(c.p" + std::to_string(t) +
                 " + " + offset(t) + " * " + std::to_string(ir::itemsize(dtype)) + ")";
        },
        [](const ir::Node&) { return false; });
    for (int k = 0; k < num_outputs; ++k) {
      const ir::ValueId id = graph_.outputs()[static_cast<std::size_t>(k)];
      const DType dt = graph_.type(id).dtype;
      const SignBitCopy source = copied_input(id);
      if (lanes_ && dt == DType::kFloat16 && source.position < 0) {
        // The lanes' float values, rounded by the conversion instruction.
        s << "  vtpu_half_lanes_store(v" << id << ", " << lane_pointer(k) << ");\n";
        continue;
      }
      if (lanes_) s << "  for (int l = 0; l < kLanes; ++l)\n";
      if (source.position >= 0) {
        // As uint16_t: GCC does not vectorise a loop copying a struct.
        const int t = num_outputs + source.position;
        s << "  *reinterpret_cast<uint16_t*>(c.p" << k << " + " << offset(k) << " * 2) = (uint16_t)((*reinterpret_cast<"
          << "const uint16_t*>(c.p" << t << " + " << offset(t) << " * 2) & " << source.keep << "u) ^ " << source.flip
          << "u);\n";
        continue;
      }
      s << "  *reinterpret_cast<" << storage_type(dt) << "*>(c.p" << k << " + " << offset(k) << " * "
        << ir::itemsize(dt) << ") = vtpu_store_t<" << storage_type(dt) << ">::of(" << value(id) << ");\n";
    }
  }

  // An output that stores an input's 16-bit float element unchanged or with
  // only its sign changed: (bits & keep) ^ flip.
  struct SignBitCopy {
    int position = -1;  // the input's, or -1: not such an output
    unsigned keep = 0xffffu;
    unsigned flip = 0;
  };
  // A 16-bit float output computed from one input of its dtype by same-dtype
  // casts (.contiguous(), clone, copy_), neg and abs only moves the stored
  // bits: the conversions to float and back cost 2-10x ATen's copy of a
  // permuted float16/bfloat16 tensor, and quiet a signalling NaN, which
  // ATen's copy, neg and abs keep. Consumers inside the kernel still read
  // the float value; a NaN they compute with is quiet either way.
  SignBitCopy copied_input(ir::ValueId id) const {
    const DType dtype = graph_.type(id).dtype;
    if (dtype != DType::kFloat16 && dtype != DType::kBFloat16) return {};
    // Walked from the output back to the input: an abs clears the sign of
    // whatever the ops before it did, a neg flips it.
    std::vector<OpKind> ops;
    const ir::Node* node = &graph_.nodes()[static_cast<std::size_t>(id)];
    while ((node->op == OpKind::Cast || node->op == OpKind::Neg || node->op == OpKind::Abs) &&
           node->inputs.size() == 1 && node->type.dtype == dtype && graph_.type(node->inputs[0]).dtype == dtype) {
      ops.push_back(node->op);
      id = node->inputs[0];
      node = &graph_.nodes()[static_cast<std::size_t>(id)];
    }
    if (node->op != OpKind::Input || node->type.dtype != dtype) return {};
    SignBitCopy copy;
    for (auto op = ops.rbegin(); op != ops.rend(); ++op) {  // in program order
      if (*op == OpKind::Neg) copy.flip ^= 0x8000u;
      if (*op == OpKind::Abs) {
        copy.keep &= 0x7fffu;
        copy.flip &= 0x7fffu;
      }
    }
    const auto& inputs = graph_.inputs();
    for (std::size_t position = 0; position < inputs.size(); ++position)
      if (inputs[position] == id) copy.position = static_cast<int>(position);
    return copy;
  }

 public:
  // The statements that compute every node except those `skip` names into
  // v<id> (compute type): Inputs from `load(position, dtype)` (an lvalue of
  // the input's storage type), Constants and run-time attributes from
  // c.scalars in launch_scalars() order.
  void emit_values(std::ostringstream& s, const std::function<std::string(int, DType)>& load,
                   const std::function<bool(const ir::Node&)>& skip) const {
    load_ = &load;
    struct ForgetLoad {
      const std::function<std::string(int, DType)>*& load;
      ~ForgetLoad() { load = nullptr; }
    } forget{load_};
    int scalar_index = 0;
    const auto& inputs = graph_.inputs();
    std::vector<bool> consumed(graph_.nodes().size(), false);
    for (const ir::Node& node : graph_.nodes())
      for (ir::ValueId in : node.inputs) consumed[static_cast<std::size_t>(in)] = true;
    for (std::size_t i = 0; i < graph_.nodes().size(); ++i) {
      const auto id = static_cast<ir::ValueId>(i);
      const ir::Node& node = graph_.nodes()[i];
      if (skip(node)) continue;
      const char* out_ct = compute_type_name(node.type.dtype);
      if (node.op == OpKind::Input) {
        int position = 0;
        while (inputs[static_cast<std::size_t>(position)] != id) ++position;
        if (lanes_ && node.type.dtype == DType::kFloat16 && !lane_base_(num_outputs() + position).empty()) {
          s << "  float v" << id << "[kLanes];\n  vtpu_half_lanes_load(" << lane_pointer(num_outputs() + position)
            << ", v" << id << ");\n";
          continue;
        }
        define(s, out_ct, id,
               "static_cast<" + std::string(out_ct) + ">(vtpu_load(" + load(position, node.type.dtype) + "))");
        continue;
      }
      if (node.op == OpKind::Constant) {
        define(s, out_ct, id, "static_cast<" + std::string(out_ct) + ">(c.scalars[" +
                                  std::to_string(scalar_index++) + "])");
        continue;
      }
      if (uses_lookup_table(node)) {  // an exact 16-bit value: passed on as it is
        define(s, out_ct, id, lookup(node, id, 0, load));
        continue;
      }
      if (has_runtime_scalar(node))  // its attribute value arrives as the next launch scalar
        s << "  const double a" << id << " = c.scalars[" << scalar_index++ << "];\n";
      // A half/bf16 value read by a later node is first rounded to its
      // storage type, exactly as when it went through memory between two
      // single-op kernels: fused and strict give the same bits.
      const bool reduced = node.type.dtype == DType::kBFloat16 || node.type.dtype == DType::kFloat16;
      auto rhs = [&] {
        if (reduced && consumed[i]) {
          const std::string st = storage_type(node.type.dtype);
          return "static_cast<" + std::string(out_ct) + ">(vtpu_round_t<" + st + ">::of(" + expression(node, id) + "))";
        }
        return "static_cast<" + std::string(out_ct) + ">(" + expression(node, id) + ")";
      };
      if (lanes_ && node.type.dtype == DType::kFloat16 && consumed[i] && !is_float_trig(node)) {
        define(s, out_ct, id, "static_cast<" + std::string(out_ct) + ">(" + expression(node, id) + ")");
        s << "  vtpu_half_lanes_round(v" << id << ");\n";
        continue;
      }
      if (lanes_ && is_float_trig(node)) {
        // One test over the group's lanes (an OR reduction, vectorised),
        // then every lane on the vectorised path, or every lane through
        // vtpu_sin/vtpu_cos (the library beyond 2^24). Both give each
        // element the bits element() gives it.
        const std::string with_library = rhs();
        reduced_trig_ = true;
        const std::string reduced_only = rhs();
        reduced_trig_ = false;
        s << "  " << out_ct << " v" << id << "[kLanes];\n  {\n    bool library = false;\n"
          << "    for (int l = 0; l < kLanes; ++l) library |= vtpu_trig_needs_library(" << operand(node, 0) << ");\n"
          << "    if (library) {\n      for (int l = 0; l < kLanes; ++l) v" << id << "[l] = " << with_library << ";\n"
          << "    } else {\n      for (int l = 0; l < kLanes; ++l) v" << id << "[l] = " << reduced_only
          << ";\n    }\n  }\n";
        continue;
      }
      define(s, out_ct, id, rhs());
    }
  }

 private:
  // Input k of `node` in the node's compute type. An operand of another
  // dtype than a 16-bit common dtype goes through the 16-bit type first, as
  // in ATen's CPU kernels (ir::rounds_operand_to_16_bits).
  std::string operand(const ir::Node& node, int k) const {
    if (!operand_overrides_.empty()) return operand_overrides_[static_cast<std::size_t>(k)];
    const std::string x = as(node.inputs[static_cast<std::size_t>(k)], compute_type_name(node.common_dtype));
    return ir::rounds_operand_to_16_bits(graph_, node, static_cast<std::size_t>(k)) ? to_16_bits(node, x) : x;
  }
  // `x` rounded to the node's 16-bit common dtype, in its compute type.
  std::string to_16_bits(const ir::Node& node, const std::string& x) const {
    return "static_cast<" + std::string(compute_type_name(node.common_dtype)) + ">(vtpu_round_t<" +
           storage_type(node.common_dtype) + ">::of(static_cast<float>(" + x + ")))";
  }

  std::string expression(const ir::Node& node, ir::ValueId id) const {
    const char* ct = compute_type_name(node.common_dtype);
    auto in = [&](int k) { return operand(node, k); };
    const std::string a = node.inputs.size() > 0 ? in(0) : "";
    const std::string b = node.inputs.size() > 1 ? in(1) : "";
    const std::string c = node.inputs.size() > 2 ? in(2) : "";
    const bool floating = ir::is_floating(node.common_dtype);
    const std::string T = ct;
    switch (node.op) {
      case OpKind::Cast:
        if (floating && ir::is_integral(node.type.dtype))
          return "vtpu_float_to_int<" + std::string(storage_type(node.type.dtype)) + ">(" + a + ")";
        if (!floating && ir::is_floating(node.type.dtype) && cast_from_floating(node.inputs[0]))
          return "vtpu_opaque(" + a + ")";
        return a;
      case OpKind::Neg: return floating ? "vtpu_float_neg(" + T + "(" + a + "))" : "vtpu_wrap_neg(" + a + ")";
      case OpKind::Abs: return floating ? "std::fabs(" + a + ")" : "(" + a + " < 0 ? vtpu_wrap_neg(" + a + ") : " + a + ")";
      case OpKind::Exp: return "vtpu_exp(" + a + ")";
      case OpKind::Exp2: return "vtpu_exp2(" + a + ")";
      case OpKind::Log: return "vtpu_log(" + a + ")";
      case OpKind::Log2: return "vtpu_log2(" + a + ")";
      case OpKind::Log10: return "std::log10(" + a + ")";
      case OpKind::Log1p: return "vtpu_log1p(" + a + ")";
      case OpKind::Expm1: return "vtpu_expm1(" + a + ")";
      case OpKind::Sqrt: return "std::sqrt(" + a + ")";
      case OpKind::Rsqrt: return T + "(1) / std::sqrt(" + a + ")";
      case OpKind::Reciprocal: return T + "(1) / " + a;
      case OpKind::Sin: return std::string(reduced_trig_ ? "vtpu_sin_reduced(" : "vtpu_sin(") + a + ")";
      case OpKind::Cos: return std::string(reduced_trig_ ? "vtpu_cos_reduced(" : "vtpu_cos(") + a + ")";
      case OpKind::Tan: return "std::tan(" + a + ")";
      case OpKind::Asin: return "std::asin(" + a + ")";
      case OpKind::Acos: return "std::acos(" + a + ")";
      case OpKind::Atan: return "vtpu_atan(" + a + ")";
      case OpKind::Sinh: return "std::sinh(" + a + ")";
      case OpKind::Cosh: return "std::cosh(" + a + ")";
      case OpKind::Tanh: return "vtpu_tanh(" + a + ")";
      case OpKind::Sigmoid: return "vtpu_sigmoid(" + a + ")";
      case OpKind::Relu: return "vtpu_relu(" + a + ")";
      case OpKind::Silu: return a + " * vtpu_sigmoid(" + a + ")";
      case OpKind::Erf: return "vtpu_erf(" + a + ")";
      case OpKind::Gelu:
        if (node.attrs.get_string("approximate", "none") == "tanh")
          return T + "(0.5) * " + a + " * (" + T + "(1) + vtpu_tanh(" + T + "(0.7978845608028654) * (" + a + " + " +
                 T + "(0.044715) * " + a + " * " + a + " * " + a + ")))";
        return a + " * " + T + "(0.5) * (" + T + "(1) + vtpu_erf(" + a + " * " + T + "(0.7071067811865476)))";
      case OpKind::Floor: return floating ? "std::floor(" + a + ")" : a;
      case OpKind::Ceil: return floating ? "std::ceil(" + a + ")" : a;
      case OpKind::Round: return floating ? "std::nearbyint(" + a + ")" : a;
      case OpKind::Trunc: return floating ? "std::trunc(" + a + ")" : a;
      case OpKind::Sign: return "vtpu_sign(" + a + ")";
      case OpKind::LogicalNot: return "!(" + a + " != " + T + "(0))";
      case OpKind::BitwiseNot: return node.common_dtype == DType::kBool ? "!" + a : "~" + a;
      case OpKind::IsNan: return "(" + a + " != " + a + ")";
      case OpKind::IsInf: return floating ? "std::isinf(" + a + ")" : "false";
      case OpKind::IsFinite: return floating ? "std::isfinite(" + a + ")" : "true";
      case OpKind::Add:
      case OpKind::Sub: {
        // a + alpha * b as ATen computes it (alpha = 1 gives the same bits as a + b).
        std::string alpha = T + "(" + runtime_scalar(id) + ")";
        if (ir::rounds_runtime_scalar_to_16_bits(node)) alpha = to_16_bits(node, alpha);
        // float32/float64: ATen's kernel is fmadd(b, alpha, a), one rounding,
        // also in its scalar remainder (two roundings left 26% of a float32
        // SGD step's elements an ulp off the CPU's).
        const bool single_rounding = node.common_dtype == DType::kFloat32 || node.common_dtype == DType::kFloat64;
        if (has_runtime_scalar(node) && single_rounding)
          return "std::fma(" + std::string(node.op == OpKind::Add ? "" : "-") + alpha + ", " + b + ", " + a + ")";
        if (!floating) {  // integers wrap (vtpu_wrap_add in kernel_helpers.cpp)
          const std::string scaled = has_runtime_scalar(node) ? "vtpu_wrap_mul(" + alpha + ", " + b + ")" : b;
          return std::string(node.op == OpKind::Add ? "vtpu_wrap_add(" : "vtpu_wrap_sub(") + a + ", " + scaled + ")";
        }
        const std::string scaled = has_runtime_scalar(node) ? "(" + alpha + " * " + b + ")" : b;
        return a + (node.op == OpKind::Add ? " + " : " - ") + scaled;
      }
      case OpKind::Mul: return floating ? a + " * " + b : "vtpu_wrap_mul(" + a + ", " + b + ")";
      case OpKind::Div: {
        const std::string mode = node.attrs.get_string("rounding_mode", "");
        if (mode == "trunc") return floating ? "std::trunc(" + a + " / " + b + ")" : a + " / " + b;
        if (mode == "floor") return "vtpu_floor_div(" + a + ", " + b + ")";
        return a + " / " + b;
      }
      case OpKind::Pow: {
        // ATen's shortcuts (sqrt for 0.5, ...) are those of pow(Tensor, Scalar);
        // a tensor exponent takes pow itself (pow(-inf, 0.5) is inf, sqrt's NaN).
        const bool scalar_exponent =
            graph_.nodes()[static_cast<std::size_t>(node.inputs[1])].op == OpKind::Constant;
        if (!scalar_exponent) return "vtpu_pow_tensor(" + a + ", " + b + ")";
        if (node.common_dtype == DType::kBFloat16) return "vtpu_pow_bf16(" + a + ", " + b + ")";
        if (node.common_dtype == DType::kFloat16) return "vtpu_pow_half(" + a + ", " + b + ")";
        return "vtpu_pow(" + a + ", " + b + ")";
      }
      case OpKind::Maximum: return "vtpu_max(" + a + ", " + b + ")";
      case OpKind::Minimum: return "vtpu_min(" + a + ", " + b + ")";
      case OpKind::Eq: return a + " == " + b;
      case OpKind::Ne: return a + " != " + b;
      case OpKind::Lt: return a + " < " + b;
      case OpKind::Le: return a + " <= " + b;
      case OpKind::Gt: return a + " > " + b;
      case OpKind::Ge: return a + " >= " + b;
      case OpKind::LogicalAnd: return "(" + a + " != " + T + "(0)) && (" + b + " != " + T + "(0))";
      case OpKind::LogicalOr: return "(" + a + " != " + T + "(0)) || (" + b + " != " + T + "(0))";
      case OpKind::LogicalXor: return "(" + a + " != " + T + "(0)) != (" + b + " != " + T + "(0))";
      case OpKind::BitwiseAnd: return a + " & " + b;
      case OpKind::BitwiseOr: return a + " | " + b;
      case OpKind::BitwiseXor: return a + " ^ " + b;
      case OpKind::Fmod: return "vtpu_fmod(" + a + ", " + b + ")";
      case OpKind::Remainder: return "vtpu_remainder(" + a + ", " + b + ")";
      case OpKind::Atan2: return "vtpu_atan2(" + a + ", " + b + ")";
      case OpKind::ThresholdBackward: {
        const std::string threshold = has_runtime_scalar(node) ? runtime_scalar(id) : "0.0";
        return "(" + b + " <= " + T + "(" + threshold + ") ? " + T + "(0) : " + a + ")";
      }
      case OpKind::GeluBackward:
        if (node.attrs.get_string("approximate", "none") != "none")
          throw Error(ErrorKind::kInvalidArgument, "[host codegen] gelu_backward with tanh approximation");
        // d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
        if (load_ != nullptr && uses_factor_table(node)) return a + " * " + lookup(node, id, 1, *load_);
        return a + " * (" + T + "(0.5) * (" + T + "(1) + vtpu_erf(" + b + " * " + T + "(0.7071067811865476))) + " + b +
               " * " + T + "(0.3989422804014327) * vtpu_exp(" + T + "(-0.5) * " + b + " * " + b + "))";
      case OpKind::SigmoidBackward:
        // ATen's float16 kernel computes in float16 arithmetic: each of
        // 1 - y and g * (1 - y) is rounded to float16 (bfloat16's computes
        // in float, rounding once).
        if (node.common_dtype == DType::kFloat16) {
          auto half = [](const std::string& x) { return "vtpu_load(vtpu_store_t<vtpu_half>::of(" + x + "))"; };
          return half(a + " * " + half(T + "(1) - " + b)) + " * " + b;
        }
        return a + " * (" + T + "(1) - " + b + ") * " + b;
      // ATen's CPU kernel rounds 1 - y * y once (a fused multiply-add, vector
      // body and scalar remainder alike, float32 and float64).
      case OpKind::TanhBackward:
        return floating ? a + " * std::fma(-" + b + ", " + b + ", " + T + "(1))" : a + " * (" + T + "(1) - " + b + " * " + b + ")";
      case OpKind::SiluBackward:
        return a + " * vtpu_sigmoid(" + b + ") * (" + T + "(1) + " + b + " * (" + T + "(1) - vtpu_sigmoid(" + b +
               ")))";
      case OpKind::Where: return "(" + as(node.inputs[0], "bool") + " ? " + b + " : " + c + ")";
      case OpKind::Lerp:
        // ATen: one fused multiply-add, weight * (end - start) + start for a
        // weight below 0.5 in magnitude, (weight - 1) * (end - start) + end
        // otherwise (its lerp_vec; the scalar remainder rounds the same).
        return "(std::fabs(" + c + ") < " + T + "(0.5) ? std::fma(" + c + ", " + b + " - " + a + ", " + a + ") : std::fma(" +
               c + " - " + T + "(1), " + b + " - " + a + ", " + b + "))";
      case OpKind::Addcmul:
      case OpKind::Addcdiv: {
        const std::string v = has_runtime_scalar(node) ? runtime_scalar(id) : "1.0";
        if (!floating && node.op == OpKind::Addcmul)
          return "vtpu_wrap_add(" + a + ", vtpu_wrap_mul(vtpu_wrap_mul(" + T + "(" + v + "), " + b + "), " + c + "))";
        // addcmul: ATen rounds (value * t1) * t2 + self once (a fused
        // multiply-add); addcdiv's division cannot fuse.
        if (node.op == OpKind::Addcmul) return "std::fma(" + T + "(" + v + ") * " + b + ", " + c + ", " + a + ")";
        return a + " + " + T + "(" + v + ") * " + b + " / " + c;
      }
      case OpKind::MaskedFill: return "(" + as(node.inputs[1], "bool") + " ? " + c + " : " + a + ")";
      case OpKind::Clamp: {
        std::string x = a;
        std::size_t next = 1;
        if (node.attrs.get_bool("has_min", false)) x = "vtpu_max(" + x + ", " + in(static_cast<int>(next++)) + ")";
        if (node.attrs.get_bool("has_max", false)) x = "vtpu_min(" + x + ", " + in(static_cast<int>(next++)) + ")";
        return x;
      }
      default:
        throw Error(ErrorKind::kInvalidArgument,
                    "[host codegen] no elementwise expression for " + std::string(ir::name(node.op)));
    }
  }

  const ir::Graph& graph_;
  bool lanes_ = false;  // lane mode of emit_values (uses_lanes)
  std::function<std::string(int)> lane_base_;  // lane mode: see lane_pointer
  // While set, float sin/cos are spelled as their vectorised path alone
  // (emit_values' lane groups with no argument beyond 2^24).
  mutable bool reduced_trig_ = false;
  // emit() sets it: 16-bit transcendental nodes read lookup tables
  // (uses_lookup_table). Off for the generators that share emit_values (the
  // cuda target, fused reductions): they compute the same bits.
  bool lookup_tables_ = false;
  // While set, the spelling of each operand: a lookup table's fill loop
  // evaluates its node's expression of its loop variable.
  mutable std::vector<std::string> operand_overrides_;
  // emit_values' `load` while it runs (a factor table's index reads it).
  mutable const std::function<std::string(int, DType)>* load_ = nullptr;
};

}  // namespace

bool host_codegen_supports(ir::OpKind op) {
  if (detail::host_reduction_supports(op) || detail::host_softmax_supports(op) ||
      detail::host_reduction_stats_supports(op) || detail::host_norm_supports(op) ||
      detail::host_indexing_supports(op) || detail::host_loss_supports(op) || detail::host_pooling_supports(op))
    return true;
  switch (op) {
    case OpKind::Input:
    case OpKind::Constant:
      return true;
    default:
      return ir::is_elementwise(op);
  }
}

std::vector<double> launch_scalars(const ir::Graph& graph) {
  std::vector<double> scalars;
  auto as_double = [](const ir::AttrValue& v) {
    if (const auto* d = std::get_if<double>(&v)) return *d;
    if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
    if (const auto* b = std::get_if<bool>(&v)) return *b ? 1.0 : 0.0;
    throw Error(ErrorKind::kInvalidArgument, "[host codegen] a launch scalar that is not a number");
  };
  for (const ir::Node& node : graph.nodes()) {
    if (node.op == OpKind::Constant) {
      scalars.push_back(as_double(*node.attrs.find("value")));
    } else if (const char* attr = ir::runtime_scalar_attribute(node.op); attr != nullptr && node.attrs.has(attr)) {
      scalars.push_back(as_double(*node.attrs.find(attr)));
    }
  }
  return scalars;
}

namespace detail {

void emit_elementwise_values(std::ostringstream& s, const ir::Graph& graph,
                             const std::function<std::string(int, ir::DType)>& load,
                             const std::function<bool(const ir::Node&)>& skip) {
  Emitter(graph).emit_values(s, load, skip);
}

}  // namespace detail

GeneratedKernel generate_host_kernel(const ir::Graph& graph, const std::string& symbol, LookupTables tables) {
  for (const auto& node : graph.nodes()) {
    if (detail::host_reduction_supports(node.op)) return detail::emit_reduction(graph, symbol);
    if (detail::host_softmax_supports(node.op)) return detail::emit_softmax(graph, symbol);
    if (detail::host_reduction_stats_supports(node.op)) return detail::emit_reduction_stats(graph, symbol);
    if (detail::host_norm_supports(node.op)) return detail::emit_norm(graph, symbol);
    if (detail::host_indexing_supports(node.op)) return detail::emit_indexing(graph, symbol);
    if (detail::host_loss_supports(node.op)) return detail::emit_loss(graph, symbol);
    if (detail::host_pooling_supports(node.op)) return detail::emit_pooling(graph, symbol);
  }
  return Emitter(graph).emit(symbol, tables == LookupTables::kUsed);
}

GeneratedKernel generate_norm_param_grad_kernel(const ir::Graph& graph, const std::string& symbol) {
  return detail::emit_norm_param_grads(graph, symbol);
}

namespace detail {
std::string lane_combine(const std::string& acc, const std::string& expr) {
  if (expr == "vtpu_max(a, b)") return "vtpu_max_combine{}";
  if (expr == "vtpu_min(a, b)") return "vtpu_min_combine{}";
  return "[](" + acc + " a, " + acc + " b) { return " + expr + "; }";
}
}  // namespace detail

std::string host_translation_unit(const std::vector<GeneratedKernel>& kernels) {
  std::string source =
      std::string(kLaunchAbiSource) + detail::kKernelMathSource + kPrelude + detail::kPortableHelpersSource;
  for (const auto& kernel : kernels)
    if (kernel.source.find("vtpu_half_lanes_") != std::string::npos) {
      source += kHalfLanesSource;
      break;
    }
  for (const auto& kernel : kernels) source += kernel.source;
  return source;
}

}  // namespace vtpu::compiler
