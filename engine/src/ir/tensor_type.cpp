#include "vtpu/ir/tensor_type.h"

#include <algorithm>

namespace vtpu::ir {

TensorType TensorType::contiguous(DType dtype, std::vector<std::int64_t> sizes) {
  TensorType t;
  t.dtype = dtype;
  t.strides = contiguous_strides(sizes);
  t.sizes = std::move(sizes);
  return t;
}

std::int64_t TensorType::numel() const {
  std::int64_t n = 1;
  for (std::int64_t s : sizes) n *= s;
  return n;
}

// By strides even without elements (torch calls every empty tensor
// contiguous): an empty operand expanded from a 0-dim tensor (strides 0, the
// gradient of an empty tensor's sum) read as contiguous gave a generated kernel
// that the pattern key files under "broadcast", and later non-empty launches
// of the pattern read that operand as a dense buffer.
bool TensorType::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

std::int64_t TensorType::storage_extent() const {
  if (numel() == 0) return 0;
  std::int64_t last = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) last += (sizes[i] - 1) * strides[i];
  return last + 1;
}

std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& sizes) {
  std::vector<std::int64_t> strides(sizes.size());
  std::int64_t s = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<std::int64_t>(sizes[i], 1);  // torch keeps strides >= 1 past a 0 dim
  }
  return strides;
}

std::optional<std::vector<std::int64_t>> broadcast_shapes(
    const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
  const std::size_t n = std::max(a.size(), b.size());
  std::vector<std::int64_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const std::int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[n - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

std::string shape_string(const std::vector<std::int64_t>& sizes) {
  std::string s = "(";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(sizes[i]);
  }
  return s + ")";
}

std::string to_string(const TensorType& type) {
  auto list = [](const std::vector<std::int64_t>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) s += ",";
      s += std::to_string(v[i]);
    }
    return s + "]";
  };
  std::string s = std::string(name(type.dtype)) + list(type.sizes);
  if (type.strides != contiguous_strides(type.sizes)) s += "{strides=" + list(type.strides) + "}";
  return s;
}

}  // namespace vtpu::ir
