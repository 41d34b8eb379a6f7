#include "iterator_layout.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace vtpu::bridge {
namespace {

std::vector<std::int64_t> contiguous_strides(c10::IntArrayRef sizes) {
  std::vector<std::int64_t> strides(sizes.size());
  std::int64_t next = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    strides[i] = next;
    next *= std::max<std::int64_t>(sizes[i], 1);
  }
  return strides;
}

// TensorIterator's fast setup: operands all of the result's shape and all
// contiguous, all channels-last, or all dense with one set of strides.
std::optional<std::vector<std::int64_t>> fast_setup_strides(const std::vector<at::Tensor>& operands,
                                                            c10::IntArrayRef sizes) {
  if (operands.empty()) return std::nullopt;
  bool contiguous = true, channels_last = true, dense = true;
  for (const at::Tensor& t : operands) {
    if (!t.defined()) continue;
    if (!t.sizes().equals(sizes)) return std::nullopt;
    contiguous &= t.is_contiguous();
    channels_last &= t.is_contiguous(at::MemoryFormat::ChannelsLast);
    dense &= t.is_non_overlapping_and_dense();
  }
  if (contiguous) return contiguous_strides(sizes);
  if (channels_last) return c10::get_channels_last_strides_2d(sizes);
  if (!dense) return std::nullopt;
  const at::Tensor* last = nullptr;
  for (const at::Tensor& t : operands) {
    if (!t.defined()) continue;
    if (last != nullptr && !last->strides().equals(t.strides())) return std::nullopt;
    last = &t;
  }
  return last->strides().vec();
}

}  // namespace

std::vector<std::int64_t> iterator_output_strides(const std::vector<at::Tensor>& operands, c10::IntArrayRef sizes) {
  if (auto strides = fast_setup_strides(operands, sizes)) return *strides;
  const std::size_t ndim = sizes.size();
  if (ndim <= 1) return contiguous_strides(sizes);
  // Each operand's strides over the result's dimensions, 0 where it is broadcast.
  std::vector<std::vector<std::int64_t>> strides;
  for (const at::Tensor& t : operands) {
    if (!t.defined()) continue;
    std::vector<std::int64_t> s(ndim, 0);
    const std::size_t offset = ndim - static_cast<std::size_t>(t.dim());
    for (std::size_t i = 0; i < static_cast<std::size_t>(t.dim()); ++i)
      if (!(t.size(static_cast<std::int64_t>(i)) == 1 && sizes[offset + i] != 1))
        s[offset + i] = t.stride(static_cast<std::int64_t>(i));
    strides.push_back(std::move(s));
  }
  // ATen's reorder_dimensions: the operands are asked in turn whether dim a
  // is slower than dim b; one broadcast in either dimension has no say, and
  // equal strides put the smaller dimension first.
  auto should_swap = [&](std::size_t a, std::size_t b) {
    for (const auto& s : strides) {
      if (s[a] == 0 || s[b] == 0) continue;
      if (s[a] < s[b]) return -1;
      if (s[a] > s[b]) return 1;
      if (sizes[a] > sizes[b]) return 1;
    }
    return 0;
  };
  std::vector<std::size_t> perm(ndim);  // fastest dimension first
  for (std::size_t i = 0; i < ndim; ++i) perm[i] = ndim - 1 - i;
  for (std::size_t i = 1; i < ndim; ++i) {
    std::size_t dim1 = i;
    for (std::size_t dim0 = i; dim0-- > 0;) {
      const int comparison = should_swap(perm[dim0], perm[dim1]);
      if (comparison > 0) {
        std::swap(perm[dim0], perm[dim1]);
        dim1 = dim0;
      } else if (comparison < 0) {
        break;
      }
    }
  }
  bool row_major = true;
  for (std::size_t i = 0; i < ndim; ++i) row_major &= perm[i] == ndim - 1 - i;
  if (row_major) return contiguous_strides(sizes);  // as ATen, which allocates it contiguous
  std::vector<std::int64_t> result(ndim);
  std::int64_t next = 1;
  for (std::size_t dim : perm) {
    result[dim] = next;
    next *= sizes[dim];
  }
  return result;
}

}  // namespace vtpu::bridge
