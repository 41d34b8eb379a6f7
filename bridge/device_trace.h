// Device activities for torch.profiler: while a profiler session asks for
// PrivateUse1 (vtpu) activities, every stream task is recorded with the
// time it ran and the profiler's correlation id of the op that issued it,
// so torch.profiler's tables show each op's device time and its Chrome trace
// the device timeline. Kineto stays out of this header: device_context.cpp
// only sees these functions.
#pragma once

#include <cstdint>
#include <string>

namespace vtpu::bridge {

// True while a session collects device activities (a relaxed atomic load).
bool device_trace_active();

// The correlation id of the profiled op being issued on this thread (0: none).
std::uint64_t device_trace_correlation();

// Wall-clock nanoseconds, the clock of the profiler's CPU events.
std::int64_t device_trace_now_ns();

// Records one stream task named `op` that ran from start_ns to end_ns,
// issued under `correlation`. Dropped if the session ended meanwhile.
void record_device_activity(const std::string& op, std::int64_t start_ns, std::int64_t end_ns,
                            std::uint64_t correlation);

// Registers vtpu's device-activity profiler with Kineto (at module import).
void register_device_trace();

}  // namespace vtpu::bridge
