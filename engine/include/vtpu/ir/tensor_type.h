// The type of an IR value: dtype, sizes and strides (in elements). Strides
// are arbitrary and non-negative: 0 for a broadcast (expanded) dim, anything
// for a non-contiguous view; the storage offset is the caller's pointer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vtpu/ir/dtype.h"

namespace vtpu::ir {

struct TensorType {
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;

  // Row-major strides for `sizes`: what every IR node produces.
  static TensorType contiguous(DType dtype, std::vector<std::int64_t> sizes);

  std::int64_t rank() const { return static_cast<std::int64_t>(sizes.size()); }
  std::int64_t numel() const;
  // torch's definition: strides of size-1 dims do not matter, and a tensor
  // with no elements is contiguous.
  bool is_contiguous() const;
  // Elements the strided storage must hold: max offset + 1 (0 when empty).
  std::int64_t storage_extent() const;

  bool operator==(const TensorType&) const = default;
};

std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& sizes);

// NumPy/torch broadcasting of two shapes, right-aligned; nullopt when a pair
// of dims is neither equal nor 1.
std::optional<std::vector<std::int64_t>> broadcast_shapes(
    const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b);

// "(2, 3)": the form error messages echo shapes in.
std::string shape_string(const std::vector<std::int64_t>& sizes);
// "float32[2,3]", with "{strides=[0,1]}" appended when not contiguous.
std::string to_string(const TensorType& type);

}  // namespace vtpu::ir
