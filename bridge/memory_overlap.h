// Whether tensors' elements share memory, by address rather than by
// storage: the host-kernel path's CPU aliases and the device tensors they
// mirror are different storages over the same bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace vtpu::bridge {

// The bytes from a tensor's first element to just past its farthest one
// (empty for a tensor without elements). Strides are never negative.
inline std::pair<const char*, const char*> element_span(const at::Tensor& t) {
  const auto* first = static_cast<const char*>(t.const_data_ptr());
  std::int64_t farthest = 0;
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) return {first, first};
    farthest += (t.size(d) - 1) * t.stride(d);
  }
  return {first, first + (farthest + 1) * static_cast<std::int64_t>(t.element_size())};
}

inline bool spans_intersect(const at::Tensor& a, const at::Tensor& b) {
  const auto [a_begin, a_end] = element_span(a);
  const auto [b_begin, b_end] = element_span(b);
  return a_begin < a_end && b_begin < b_end && a_begin < b_end && b_begin < a_end;
}

// The very same elements: an in-place op's output and its self.
inline bool same_elements(const at::Tensor& a, const at::Tensor& b) {
  return a.const_data_ptr() == b.const_data_ptr() && a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.element_size() == b.element_size();
}

// An output some of whose elements are one memory location (a dim of
// stride 0, as expand gives): the CPU refuses to write it.
inline bool writes_a_location_twice(const at::Tensor& out) {
  for (std::int64_t d = 0; d < out.dim(); ++d)
    if (out.stride(d) == 0 && out.size(d) > 1) return true;
  return false;
}

// ATen's refusal (assert_no_partial_overlap): both tensors dense, their
// memory intersecting, and not the same elements walked alike. Overlaps of
// tensors that are not dense are allowed there (computed in its order).
inline bool aten_refuses_overlap(const at::Tensor& out, const at::Tensor& input) {
  return out.is_non_overlapping_and_dense() && input.is_non_overlapping_and_dense() &&
         spans_intersect(out, input) && !same_elements(out, input);
}

// A tensor some of whose elements may be one memory location: a dim of
// stride 0, or dims whose strides do not step over the dims inside them
// (unfold's overlapping windows). False for every tensor with distinct
// elements; a generated kernel's chunks writing such an output would race.
inline bool may_overlap_itself(const at::Tensor& t) {
  if (t.is_non_overlapping_and_dense()) return false;
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, size) of dims with size > 1
  for (std::int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  std::int64_t span = 1;  // elements the inner dims cover
  for (const auto& [stride, size] : dims) {
    if (stride < span) return true;
    span = stride * size;
  }
  return false;
}

// An output that shares memory with an input without being that input
// (x[1:].add_(x[:-1]), out= a shifted view): the CPU raises for dense
// tensors, and computes in its own element order otherwise, so such calls
// are left to ATen's kernel.
inline bool partly_overlaps(const at::Tensor& out, const at::Tensor& input) {
  return spans_intersect(out, input) && !same_elements(out, input);
}

}  // namespace vtpu::bridge
