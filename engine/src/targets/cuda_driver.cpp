#include "cuda_driver.h"

#include <dlfcn.h>


#include "vtpu/runtime/error.h"

namespace vtpu::targets::cuda {
namespace {

using runtime::Error;
using runtime::ErrorKind;

// Resolves `name` into `slot`; false when the library lacks it.
template <typename Fn>
bool resolve(void* library, const char* name, Fn& slot) {
  slot = reinterpret_cast<Fn>(dlsym(library, name));
  return slot != nullptr;
}

struct Loaded {
  Driver driver{};
  std::string why_not;  // empty when loaded
};

Loaded load_once() {
  Loaded loaded;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    loaded.why_not = std::string("the CUDA driver library libcuda.so.1 cannot be loaded (") +
                     (error != nullptr ? error : "unknown reason") + ")";
    return loaded;
  }
  Driver& d = loaded.driver;
  // The ABI names behind cuda.h's macros (cuMemAlloc is cuMemAlloc_v2, ...).
  std::string missing;
  auto need = [&](const char* name, auto& slot) {
    if (!resolve(library, name, slot) && missing.empty()) missing = name;
  };
  need("cuInit", d.init);
  need("cuDeviceGetCount", d.device_get_count);
  need("cuDeviceGet", d.device_get);
  need("cuDeviceGetName", d.device_get_name);
  need("cuDeviceGetAttribute", d.device_get_attribute);
  need("cuDevicePrimaryCtxRetain", d.primary_ctx_retain);
  need("cuDevicePrimaryCtxRelease_v2", d.primary_ctx_release);
  need("cuCtxPushCurrent_v2", d.ctx_push_current);
  need("cuCtxPopCurrent_v2", d.ctx_pop_current);
  need("cuCtxSynchronize", d.ctx_synchronize);
  need("cuMemAlloc_v2", d.mem_alloc);
  need("cuMemFree_v2", d.mem_free);
  need("cuMemcpyHtoD_v2", d.memcpy_htod);
  need("cuMemcpyDtoH_v2", d.memcpy_dtoh);
  need("cuModuleLoadData", d.module_load_data);
  need("cuModuleUnload", d.module_unload);
  need("cuModuleGetFunction", d.module_get_function);
  need("cuLaunchKernel", d.launch_kernel);
  need("cuGetErrorString", d.get_error_string);
  if (!missing.empty()) {
    loaded.why_not = "libcuda.so.1 lacks " + missing + ", which the cuda target needs (driver too old?)";
    return loaded;
  }
  if (const CUresult r = d.init(0); r != 0) {
    const char* text = nullptr;
    d.get_error_string(r, &text);
    loaded.why_not = std::string("cuInit failed: ") + (text != nullptr ? text : "error " + std::to_string(r));
  }
  return loaded;
}

}  // namespace

void Driver::check(CUresult result, const char* what) const {
  if (result == 0) return;
  const char* text = nullptr;
  get_error_string(result, &text);
  const std::string message =
      std::string("[cuda] ") + what + ": " + (text != nullptr ? text : "error " + std::to_string(result));
  // CUDA_ERROR_OUT_OF_MEMORY (2) is the engine's out-of-memory error.
  if (result == 2) throw runtime::OutOfMemoryError(message);
  throw Error(ErrorKind::kRuntime, message);
}

PrimaryContext::PrimaryContext(const Driver& driver, CUdevice device) : driver_(driver), device_(device) {
  driver_.check(driver_.primary_ctx_retain(&context_, device_), "retaining the device's primary context");
}

PrimaryContext::~PrimaryContext() { driver_.primary_ctx_release(device_); }

ScopedCurrent::ScopedCurrent(const PrimaryContext& context) : driver_(context.driver()) {
  driver_.check(driver_.ctx_push_current(context.context()), "making the device's context current");
}

ScopedCurrent::~ScopedCurrent() {
  CUcontext popped = nullptr;
  driver_.ctx_pop_current(&popped);
}

const Driver* load_driver(std::string* why_not) {
  static const Loaded loaded = load_once();
  if (!loaded.why_not.empty()) {
    if (why_not != nullptr) *why_not = loaded.why_not;
    return nullptr;
  }
  return &loaded.driver;
}

}  // namespace vtpu::targets::cuda
