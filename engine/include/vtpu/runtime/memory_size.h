// Parsing of human memory sizes ("8GiB", "512MB", "1024") and the host's
// physical memory, used for the device capacity (VTPU_MEMORY_LIMIT).
#pragma once

#include <cstddef>
#include <string>

namespace vtpu::runtime {

// Throws Error(kInvalidArgument) on malformed text, naming the text.
std::size_t parse_memory_size(const std::string& text);

std::size_t physical_memory_bytes();

// The capacity the device starts with: VTPU_MEMORY_LIMIT when set, else
// `default_fraction` of physical memory. A malformed VTPU_MEMORY_LIMIT gives
// the default and the reason in *ignored_setting when that is non-null (the
// device is set up while `import torch` autoloads the backend: a typo there
// must not break every PyTorch program), else Error(kInvalidArgument) naming
// the variable.
std::size_t default_device_capacity(double default_fraction = 0.8, std::string* ignored_setting = nullptr);

}  // namespace vtpu::runtime
