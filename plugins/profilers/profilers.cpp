// plugins/profilers/profilers.cpp - registration of `torch-profiler` and `step-stats`, and the
// Kineto glue both share (kineto_session.h).
#include "kineto_session.h"
#include "step_stats.h"
#include "torch_profiler.h"

#include <qrun/sdk.h>

#include <ATen/Context.h>
#include <kineto/ActivityType.h>

namespace qrun_profilers {

bool& kineto_held_by_torch_profiler() {
  static bool held = false;
  return held;
}

bool& kineto_traced_by_step_stats() {
  static bool traced = false;
  return traced;
}

bool cuda_available() { return at::hasCUDA(); }

std::set<torch::profiler::impl::ActivityType> activities(bool cpu, bool cuda) {
  std::set<torch::profiler::impl::ActivityType> a;
  if (cpu) a.insert(torch::profiler::impl::ActivityType::CPU);
  if (cuda) a.insert(torch::profiler::impl::ActivityType::CUDA);
  return a;
}

kp::ProfilerConfig kineto_config(bool record_shapes) {
  return kp::ProfilerConfig(kp::ProfilerState::KINETO, record_shapes, /*profile_memory=*/false,
                            /*with_stack=*/false, /*with_flops=*/false, /*with_modules=*/false);
}

std::vector<KeyEvent> key_events(const kp::ProfilerResult& result) {
  using libkineto::ActivityType;
  std::vector<KeyEvent> out;
  out.reserve(result.events().size());
  for (const auto& e : result.events()) {
    KeyEvent k;
    auto type = static_cast<ActivityType>(e.activityType());
    if (e.deviceType() == c10::DeviceType::CPU &&
        (type == ActivityType::CPU_OP || type == ActivityType::USER_ANNOTATION)) {
      k.kind = KeyEvent::Kind::CpuOp;
    } else if (e.deviceType() == c10::DeviceType::CUDA && type == ActivityType::CONCURRENT_KERNEL) {
      k.kind = KeyEvent::Kind::GpuKernel;
    } else if (e.deviceType() == c10::DeviceType::CUDA &&
               (type == ActivityType::GPU_MEMCPY || type == ActivityType::GPU_MEMSET)) {
      k.kind = KeyEvent::Kind::GpuOther;
    } else {
      continue;  // runtime/driver calls, instant events, overhead: not rows of the table
    }
    k.name = e.name();
    k.thread = e.startThreadId();
    k.start_ns = e.startNs();
    k.end_ns = std::max(e.endNs(), e.startNs());
    k.correlation = e.correlationId();
    k.linked = e.linkedCorrelationId();
    out.push_back(std::move(k));
  }
  return out;
}

}  // namespace qrun_profilers

namespace {

void register_profilers(qrun::Registrar& r) {
  using qrun::Field;
  r.add<qrun::Profiler>(
      "torch-profiler",
      "LibTorch's Kineto profiler on a wait/warmup/active/repeat schedule: Chrome trace + key-averages table",
      qrun::Schema{
          Field::integer("wait", 1).min(0).doc("steps to skip at the start of each cycle"),
          Field::integer("warmup", 1).min(0).doc("steps traced but discarded (profiler warm-up)"),
          Field::integer("active", 3).min(1).doc("steps recorded per cycle"),
          Field::integer("repeat", 1).min(0).doc("cycles; 0 = until the run ends"),
          Field::choice("sort_by", "self_cpu_time_total",
                        {"self_cpu_time_total", "cpu_time_total", "self_cuda_time_total",
                         "cuda_time_total", "count"})
              .doc("column the key-averages table is sorted by (largest first)"),
          Field::integer("row_limit", 20).min(1).doc("rows of the key-averages table"),
          Field::boolean("record_shapes", false).doc("record input shapes (in the trace)"),
          Field::boolean("print_table", true).doc("also print the table to the log"),
      },
      [](const qrun::Config& c) { return std::make_unique<qrun_profilers::TorchProfiler>(c); });
  r.add<qrun::Profiler>(
      "step-stats",
      "per step: CPU-side operator calls, GPU kernels launched, GPU busy fraction of the step time",
      qrun::Schema{
          Field::boolean("gpu", true).doc(
              "trace GPU kernels with Kineto on CUDA machines (off: CPU operator counts only)"),
          Field::boolean("kernel_table", false).doc(
              "also write <run.dir>/kernels-step-<N>.tsv per traced step: each kernel's launches "
              "and device time"),
      },
      [](const qrun::Config& c) { return std::make_unique<qrun_profilers::StepStats>(c); });
}

}  // namespace

QRUN_PLUGIN("profilers", "1.0.0", register_profilers)
