// The interpreter's driver, buffers and element access.
#include "vtpu/ir/interpreter.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "interp.h"
#include "vtpu/ir/half.h"
#include "vtpu/runtime/error.h"

namespace vtpu::ir {
namespace detail {
namespace {

template <class T>
T raw(const Buffer& b, std::int64_t offset) {
  T v;
  std::memcpy(&v, b.bytes.data() + offset * static_cast<std::int64_t>(sizeof(T)), sizeof(T));
  return v;
}

template <class T>
void put(Buffer& b, std::int64_t offset, T v) {
  std::memcpy(b.bytes.data() + offset * static_cast<std::int64_t>(sizeof(T)), &v, sizeof(T));
}

std::int64_t saturating_int(double v) {
  if (std::isnan(v)) return 0;
  if (v >= 9.2233720368547758e18) return std::numeric_limits<std::int64_t>::max();
  if (v <= -9.2233720368547758e18) return std::numeric_limits<std::int64_t>::min();
  return static_cast<std::int64_t>(v);  // truncates toward zero
}

// Float -> integer is undefined in C++ out of range; torch's CPU kernels get
// what x86's truncating conversions give: NaN or out of range yields the
// "integer indefinite" (INT_MIN of the 32- or 64-bit conversion), and types
// narrower than 32 bits convert through int32 and wrap.
std::int64_t x86_float_to_int(double v, DType t) {
  if (t == DType::kInt64) {
    const bool ok = v >= -9.2233720368547758e18 && v < 9.2233720368547758e18;  // false for NaN
    return ok ? static_cast<std::int64_t>(v) : std::numeric_limits<std::int64_t>::min();
  }
  const bool ok = v > -2147483649.0 && v < 2147483648.0;
  return ok ? static_cast<std::int64_t>(v) : std::numeric_limits<std::int32_t>::min();
}

}  // namespace

void interp_fail(OpKind op, const std::string& message) {
  throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                       "[" + std::string(name(op)) + "] " + message);
}

double load_double(const Buffer& b, std::int64_t o) {
  switch (b.type.dtype) {
    case DType::kFloat16: return half_bits_to_float(raw<std::uint16_t>(b, o));
    case DType::kBFloat16: return bfloat16_bits_to_float(raw<std::uint16_t>(b, o));
    case DType::kFloat32: return raw<float>(b, o);
    case DType::kFloat64: return raw<double>(b, o);
    default: return static_cast<double>(load_int(b, o));
  }
}

std::int64_t load_int(const Buffer& b, std::int64_t o) {
  switch (b.type.dtype) {
    case DType::kBool: return raw<std::uint8_t>(b, o) != 0;
    case DType::kUInt8: return raw<std::uint8_t>(b, o);
    case DType::kInt8: return raw<std::int8_t>(b, o);
    case DType::kInt16: return raw<std::int16_t>(b, o);
    case DType::kInt32: return raw<std::int32_t>(b, o);
    case DType::kInt64: return raw<std::int64_t>(b, o);
    default: return saturating_int(load_double(b, o));
  }
}

bool load_bool(const Buffer& b, std::int64_t o) {
  return is_floating(b.type.dtype) ? load_double(b, o) != 0.0 : load_int(b, o) != 0;
}

void store_double(Buffer& b, std::int64_t o, double v) {
  switch (b.type.dtype) {
    case DType::kFloat16: put(b, o, float_to_half_bits(static_cast<float>(v))); return;
    case DType::kBFloat16: put(b, o, float_to_bfloat16_bits(static_cast<float>(v))); return;
    case DType::kFloat32: put(b, o, static_cast<float>(v)); return;
    case DType::kFloat64: put(b, o, v); return;
    case DType::kBool: put<std::uint8_t>(b, o, v != 0.0); return;
    default: store_int(b, o, x86_float_to_int(v, b.type.dtype)); return;
  }
}

void store_int(Buffer& b, std::int64_t o, std::int64_t v) {
  // Narrowing through unsigned types is the defined two's-complement wrap.
  const auto u = static_cast<std::uint64_t>(v);
  switch (b.type.dtype) {
    case DType::kBool: put<std::uint8_t>(b, o, v != 0); return;
    case DType::kUInt8: put(b, o, static_cast<std::uint8_t>(u)); return;
    case DType::kInt8: put(b, o, static_cast<std::int8_t>(static_cast<std::uint8_t>(u))); return;
    case DType::kInt16: put(b, o, static_cast<std::int16_t>(static_cast<std::uint16_t>(u))); return;
    case DType::kInt32: put(b, o, static_cast<std::int32_t>(static_cast<std::uint32_t>(u))); return;
    case DType::kInt64: put(b, o, v); return;
    case DType::kFloat64: put(b, o, static_cast<double>(v)); return;
    default:  // float32 and the 16-bit floats: int -> float, then round
      store_double(b, o, static_cast<double>(static_cast<float>(v)));
      return;
  }
}

double round_to_compute(DType t, double v) {
  return compute_type(t) == DType::kFloat64 ? v : static_cast<double>(static_cast<float>(v));
}

double round_to_16_bits(DType t, double v) {
  const float f = static_cast<float>(v);
  if (t == DType::kFloat16) return half_bits_to_float(float_to_half_bits(f));
  if (t == DType::kBFloat16) return bfloat16_bits_to_float(float_to_bfloat16_bits(f));
  return v;
}

std::vector<std::int64_t> unravel(std::int64_t linear, const std::vector<std::int64_t>& sizes) {
  std::vector<std::int64_t> index(sizes.size());
  for (std::size_t i = sizes.size(); i-- > 0;) {
    index[i] = sizes[i] == 0 ? 0 : linear % sizes[i];
    if (sizes[i] != 0) linear /= sizes[i];
  }
  return index;
}

std::int64_t broadcast_offset(const TensorType& t, const std::vector<std::int64_t>& index) {
  std::int64_t off = 0;
  const std::size_t skip = index.size() - t.sizes.size();
  for (std::size_t i = 0; i < t.sizes.size(); ++i) {
    if (t.sizes[i] != 1) off += index[skip + i] * t.strides[i];
  }
  return off;
}

std::vector<std::vector<std::int64_t>> lanes(const TensorType& t, const std::vector<bool>& grouped) {
  std::vector<std::int64_t> outer_sizes, inner_sizes;
  for (std::size_t d = 0; d < t.sizes.size(); ++d) {
    (grouped[d] ? inner_sizes : outer_sizes).push_back(t.sizes[d]);
  }
  const TensorType outer = TensorType::contiguous(t.dtype, outer_sizes);
  const TensorType inner = TensorType::contiguous(t.dtype, inner_sizes);
  std::vector<std::vector<std::int64_t>> result(static_cast<std::size_t>(outer.numel()));
  for (std::int64_t o = 0; o < outer.numel(); ++o) {
    const auto oi = unravel(o, outer_sizes);
    auto& lane = result[static_cast<std::size_t>(o)];
    lane.reserve(static_cast<std::size_t>(inner.numel()));
    for (std::int64_t k = 0; k < inner.numel(); ++k) {
      const auto ki = unravel(k, inner_sizes);
      std::int64_t off = 0;
      std::size_t a = 0, b = 0;
      for (std::size_t d = 0; d < t.sizes.size(); ++d) {
        off += (grouped[d] ? ki[b++] : oi[a++]) * t.strides[d];
      }
      lane.push_back(off);
    }
  }
  return result;
}

}  // namespace detail

Buffer Buffer::zeros(TensorType type) {
  Buffer b;
  b.bytes.assign(static_cast<std::size_t>(type.storage_extent()) * itemsize(type.dtype), 0);
  b.type = std::move(type);
  return b;
}

Buffer make_buffer(DType dtype, std::vector<std::int64_t> sizes, const std::vector<double>& values) {
  Buffer b = Buffer::zeros(TensorType::contiguous(dtype, std::move(sizes)));
  if (static_cast<std::int64_t>(values.size()) != b.type.numel()) {
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                         "[make_buffer] " + std::to_string(values.size()) +
                             " values for shape " + shape_string(b.type.sizes));
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    detail::store_double(b, static_cast<std::int64_t>(i), values[i]);
  }
  return b;
}

Buffer make_int_buffer(DType dtype, std::vector<std::int64_t> sizes,
                       const std::vector<std::int64_t>& values) {
  Buffer b = Buffer::zeros(TensorType::contiguous(dtype, std::move(sizes)));
  if (static_cast<std::int64_t>(values.size()) != b.type.numel()) {
    throw runtime::Error(runtime::ErrorKind::kInvalidArgument,
                         "[make_int_buffer] " + std::to_string(values.size()) +
                             " values for shape " + shape_string(b.type.sizes));
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    detail::store_int(b, static_cast<std::int64_t>(i), values[i]);
  }
  return b;
}

std::vector<double> to_doubles(const Buffer& buffer) {
  std::vector<double> out(static_cast<std::size_t>(buffer.type.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto idx = detail::unravel(static_cast<std::int64_t>(i), buffer.type.sizes);
    out[i] = detail::load_double(buffer, detail::broadcast_offset(buffer.type, idx));
  }
  return out;
}

std::vector<std::int64_t> to_int64s(const Buffer& buffer) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(buffer.type.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto idx = detail::unravel(static_cast<std::int64_t>(i), buffer.type.sizes);
    out[i] = detail::load_int(buffer, detail::broadcast_offset(buffer.type, idx));
  }
  return out;
}

std::vector<Buffer> interpret(const Graph& graph, const std::vector<Buffer>& inputs) {
  using runtime::Error;
  using runtime::ErrorKind;
  if (inputs.size() != graph.inputs().size()) {
    throw Error(ErrorKind::kInvalidArgument,
                "[interpret] graph has " + std::to_string(graph.inputs().size()) +
                    " inputs, got " + std::to_string(inputs.size()) + " buffers");
  }
  std::vector<Buffer> values(static_cast<std::size_t>(graph.size()));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& want = graph.type(graph.inputs()[i]);
    if (!(inputs[i].type == want) ||
        inputs[i].bytes.size() < static_cast<std::size_t>(want.storage_extent()) * itemsize(want.dtype)) {
      throw Error(ErrorKind::kInvalidArgument,
                  "[interpret] input " + std::to_string(i) + " is " + to_string(inputs[i].type) +
                      " (" + std::to_string(inputs[i].bytes.size()) + " bytes), the graph expects " +
                      to_string(want));
    }
    values[static_cast<std::size_t>(graph.inputs()[i])] = inputs[i];
  }
  for (ValueId id = 0; id < graph.size(); ++id) {
    const Node& node = graph.node(id);
    if (node.op == OpKind::Input) continue;
    std::vector<const Buffer*> in;
    for (ValueId v : node.inputs) in.push_back(&values[static_cast<std::size_t>(v)]);
    Buffer out;
    switch (category(node.op)) {
      case OpCategory::kSource: out = detail::eval_source(node, in); break;
      case OpCategory::kUnary:
      case OpCategory::kBinary:
      case OpCategory::kTernary: {
        std::vector<bool> to_16_bits(node.inputs.size());
        for (std::size_t k = 0; k < node.inputs.size(); ++k) to_16_bits[k] = rounds_operand_to_16_bits(graph, node, k);
        out = detail::eval_elementwise(node, in, to_16_bits);
        break;
      }
      case OpCategory::kReduction: out = detail::eval_reduction(node, in); break;
      case OpCategory::kNormalization: out = detail::eval_normalization(node, in); break;
      case OpCategory::kIndexing: out = detail::eval_indexing(node, in); break;
      case OpCategory::kExtern: out = detail::eval_extern(node, in); break;
    }
    values[static_cast<std::size_t>(id)] = std::move(out);
  }
  std::vector<Buffer> outputs;
  for (ValueId o : graph.outputs()) {
    // Outputs are contiguous even when an input is returned as is.
    const Buffer& v = values[static_cast<std::size_t>(o)];
    if (v.type.strides == contiguous_strides(v.type.sizes)) {
      outputs.push_back(v);
      continue;
    }
    Buffer c = Buffer::zeros(TensorType::contiguous(v.type.dtype, v.type.sizes));
    for (std::int64_t i = 0; i < c.type.numel(); ++i) {
      const std::int64_t src = detail::broadcast_offset(v.type, detail::unravel(i, v.type.sizes));
      if (is_floating(v.type.dtype)) detail::store_double(c, i, detail::load_double(v, src));
      else detail::store_int(c, i, detail::load_int(v, src));
    }
    outputs.push_back(std::move(c));
  }
  return outputs;
}

}  // namespace vtpu::ir
