// The 2-d max pooling geometry shared by type inference and the reference
// interpreter (internal): the attributes, checked as ATen checks them, and
// ATen's output size rule.
#pragma once

#include <cstdint>

#include "vtpu/ir/attributes.h"
#include "vtpu/ir/op.h"

namespace vtpu::ir::detail {

struct Pool2d {
  std::int64_t kh, kw;  // kernel
  std::int64_t sh, sw;  // stride
  std::int64_t ph, pw;  // padding (both sides)
  std::int64_t dh, dw;  // dilation
  bool ceil_mode;
};

// The attributes of a max_pool2d node: kernel_size, stride, padding and
// dilation of two entries each (the bridge expands ATen's one-entry and empty
// forms), ceil_mode optional. Throws Error(kInvalidArgument) where ATen's
// checks fail: a non-positive kernel, stride or dilation, a negative padding,
// or one above half the kernel.
Pool2d pool2d_attributes(OpKind op, const Attributes& attrs);

// ATen's pooling_output_shape: floor (or ceil) of the window count, where a
// ceil-mode last window must start inside the input or its left padding.
std::int64_t pool_output_size(std::int64_t input, std::int64_t kernel, std::int64_t stride, std::int64_t pad,
                              std::int64_t dilation, bool ceil_mode);

}  // namespace vtpu::ir::detail
