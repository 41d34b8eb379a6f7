// Matrix products of the host-kernel path (mm and addmm, out= form) split
// into row blocks on the work-sharing pool, each block one single-threaded
// MKL call.
//
// Why: MKL threads its GEMM with OpenMP, whose fork-join waits for every
// thread of the stream thread's team to wake and finish. On this 2-core VM
// that wait was ~9 of ~36 ms of GEMM time in a fused Qwen3-style training
// step (the stream thread's CPU time 27 ms). Row blocks claimed from the
// pool start at once on the stream thread; a helper joins when it wakes.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/stack.h>

namespace vtpu::bridge {

// Runs the out= call `out_stack` of op `name` ("aten::mm.out",
// "aten::addmm.out") as row blocks on the pool. Returns false, having done
// nothing, when the op, dtypes or layout are not handled (or MKL's per-thread
// control is missing from this torch build): the caller runs ATen's kernel.
bool run_gemm_in_row_blocks(const std::string& name, torch::jit::Stack& out_stack);

// Products run in row blocks so far (one per call, inline or shared).
std::uint64_t gemm_row_block_runs();

}  // namespace vtpu::bridge
