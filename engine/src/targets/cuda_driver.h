// CUDA's driver API, loaded at run time from libcuda.so.1: the engine builds
// and runs with no CUDA toolkit, and the cuda target is simply unavailable on
// a machine without the driver. Only the few calls the cuda target makes,
// declared here with the driver's documented types and ABI names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace vtpu::targets::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;

inline constexpr int kAttributeMultiprocessorCount = 16;
inline constexpr int kAttributeComputeCapabilityMajor = 75;
inline constexpr int kAttributeComputeCapabilityMinor = 76;

// The driver library and its entry points. Loaded once per process and kept
// (the driver does not support being unloaded while contexts live).
struct Driver {
  CUresult (*init)(unsigned int flags);
  CUresult (*device_get_count)(int* count);
  CUresult (*device_get)(CUdevice* device, int ordinal);
  CUresult (*device_get_name)(char* name, int length, CUdevice device);
  CUresult (*device_get_attribute)(int* value, int attribute, CUdevice device);
  CUresult (*primary_ctx_retain)(CUcontext* context, CUdevice device);
  CUresult (*primary_ctx_release)(CUdevice device);
  CUresult (*ctx_push_current)(CUcontext context);
  CUresult (*ctx_pop_current)(CUcontext* context);
  CUresult (*ctx_synchronize)();
  CUresult (*mem_alloc)(CUdeviceptr* ptr, std::size_t bytes);
  CUresult (*mem_free)(CUdeviceptr ptr);
  CUresult (*memcpy_htod)(CUdeviceptr dst, const void* src, std::size_t bytes);
  CUresult (*memcpy_dtoh)(void* dst, CUdeviceptr src, std::size_t bytes);
  CUresult (*module_load_data)(CUmodule* module, const void* image);
  CUresult (*module_unload)(CUmodule module);
  CUresult (*module_get_function)(CUfunction* function, CUmodule module, const char* name);
  CUresult (*launch_kernel)(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                            unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream stream, void** params,
                            void** extra);
  CUresult (*get_error_string)(CUresult error, const char** text);

  // Throws Error(kRuntime) "[cuda] <what>: <driver's message>" unless ok.
  void check(CUresult result, const char* what) const;
};

// A device's primary context, retained for as long as any holder lives: the
// target and every kernel module loaded into it share one (a module must be
// unloaded before its context goes).
class PrimaryContext {
 public:
  // Throws Error(kRuntime) when the context cannot be retained.
  PrimaryContext(const Driver& driver, CUdevice device);
  ~PrimaryContext();
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  const Driver& driver() const { return driver_; }
  CUdevice device() const { return device_; }
  CUcontext context() const { return context_; }

 private:
  const Driver& driver_;
  CUdevice device_;
  CUcontext context_ = nullptr;
};

// Makes a context current on this thread for a scope and restores the
// caller's afterwards (a thread may hold another library's context).
class ScopedCurrent {
 public:
  // Throws Error(kRuntime) when the context cannot be made current.
  explicit ScopedCurrent(const PrimaryContext& context);
  ~ScopedCurrent();
  ScopedCurrent(const ScopedCurrent&) = delete;
  ScopedCurrent& operator=(const ScopedCurrent&) = delete;

 private:
  const Driver& driver_;
};

// The process's driver, initialised (cuInit); nullptr with the reason in
// `why_not` when libcuda.so.1 cannot be loaded or initialised.
const Driver* load_driver(std::string* why_not);

}  // namespace vtpu::targets::cuda
