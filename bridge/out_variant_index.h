// Finds the out= overload of a functional ATen op (add.Tensor -> add.out), so
// the host-kernel path can let ATen's CPU kernel write straight into the
// device buffer allocated at dispatch, instead of computing into a temporary
// and copying it over.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace vtpu::bridge {

// The out overload whose leading arguments are exactly the functional op's
// arguments (same names and types, same order) followed by one out tensor per
// return. nullopt when the op has none. Thread-safe; results are cached.
std::optional<c10::OperatorHandle> find_out_variant(const c10::OperatorHandle& functional);

}  // namespace vtpu::bridge
