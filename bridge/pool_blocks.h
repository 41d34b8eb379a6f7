// Helpers shared by the host-kernel path's pool blocks (extern_blocks.cpp,
// norm_blocks.cpp): an op cut into independent blocks, each one
// single-threaded ATen/MKL call, claimed from the work-sharing pool.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "env_knobs.h"

namespace vtpu::bridge::pool_blocks {

// MKL's per-thread thread count, C interface (mkl_service.h maps
// mkl_set_num_threads_local to it; the lower-case symbol itself is the
// Fortran one, which takes a pointer). Exported by torch's MKL builds; absent
// in builds on other BLAS libraries, where GEMMs keep ATen's own threading.
using SetLocalThreads = int (*)(int);
inline SetLocalThreads mkl_set_local_threads() {
  static const SetLocalThreads fn =
      reinterpret_cast<SetLocalThreads>(dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"));
  return fn;
}

// OpenMP's per-thread team size, from torch's own libgomp.
using OmpSetThreads = void (*)(int);
using OmpGetThreads = int (*)();
inline OmpSetThreads omp_set_threads() {
  static const OmpSetThreads fn = reinterpret_cast<OmpSetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  return fn;
}
inline OmpGetThreads omp_get_threads() {
  static const OmpGetThreads fn = reinterpret_cast<OmpGetThreads>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  return fn;
}

// On unless the environment variable is "0".
inline bool env_flag_on(const char* name) { return env_switch(name, true); }

// The first exception of a call's blocks: pool threads must not see one, so
// it is kept and rethrown by the caller once every block has run.
class FirstError {
 public:
  template <typename Fn>
  void run(Fn&& fn) noexcept {
    try {
      c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
      fn();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
};

// MKL runs on the calling thread only, for the lifetime of the guard.
class SingleThreadedMkl {
 public:
  SingleThreadedMkl() : previous_(mkl_set_local_threads()(1)) {}
  ~SingleThreadedMkl() { mkl_set_local_threads()(previous_); }
  SingleThreadedMkl(const SingleThreadedMkl&) = delete;
  SingleThreadedMkl& operator=(const SingleThreadedMkl&) = delete;

 private:
  int previous_;
};

// ATen's parallel_for and MKL run on the calling thread only, for the
// lifetime of the guard (both are per-thread settings).
class SingleThreadedAten {
 public:
  static bool available() {
    return mkl_set_local_threads() != nullptr && omp_set_threads() != nullptr && omp_get_threads() != nullptr;
  }
  SingleThreadedAten() : previous_omp_(omp_get_threads()()) { omp_set_threads()(1); }
  ~SingleThreadedAten() { omp_set_threads()(previous_omp_); }
  SingleThreadedAten(const SingleThreadedAten&) = delete;
  SingleThreadedAten& operator=(const SingleThreadedAten&) = delete;

 private:
  // ATen's per-thread lazy set-up runs first (members initialise in
  // declaration order): on a thread's first ATen call it sets OpenMP's and
  // MKL's thread counts, which would undo both guards below.
  int aten_threads_ = at::get_num_threads();
  SingleThreadedMkl mkl_;
  int previous_omp_;
};

// fn(begin, count) for blocks [first, last) of `size` elements along a
// dimension of `total` (the last block may be shorter).
template <typename Fn>
inline void for_blocks(std::int64_t first, std::int64_t last, std::int64_t size, std::int64_t total, Fn fn) {
  for (std::int64_t block = first; block < last; ++block) {
    const std::int64_t begin = block * size;
    fn(begin, std::min(size, total - begin));
  }
}

// out = parts[0] + parts[1] + ... in block order: blocks' partial sums (a
// weight gradient summed over a batch) added the same way on every run. On
// the calling thread alone: the sums are small, and an OpenMP fork for them
// left the team's worker busy-waiting (libgomp spins for milliseconds after a
// parallel region) on one of the two cores while the next call's blocks ran
// on the pool: backward of a 32x64x16x16 convolution in a loop, 10.7-11.1
// ms per call, 6.9 without the fork (`/tmp` probe, per-thread CPU times).
inline void sum_in_order(at::Tensor out, const std::vector<at::Tensor>& parts) {
  std::optional<SingleThreadedAten> single;
  if (SingleThreadedAten::available()) single.emplace();
  out.copy_(parts[0].view_as(out));
  for (std::size_t i = 1; i < parts.size(); ++i) out.add_(parts[i].view_as(out));
}

}  // namespace vtpu::bridge::pool_blocks
