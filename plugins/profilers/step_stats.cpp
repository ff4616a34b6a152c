// plugins/profilers/step_stats.cpp - see step_stats.h.
#include "step_stats.h"

#include "kineto_session.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

namespace qrun_profilers {
namespace {

// RecordFunction callbacks are plain function pointers: the counter is global. Only one
// step-stats instance may count at a time (checked in on_run_start).
std::atomic<int64_t> g_ops{0};
std::atomic<bool> g_counting{false};
std::atomic<bool> g_instance{false};

std::unique_ptr<at::ObserverContext> count_op(const at::RecordFunction&) {
  if (g_counting.load(std::memory_order_relaxed)) g_ops.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

const double kNa = std::nan("");

std::string cell(double v, const char* spec) {
  return std::isfinite(v) ? fmt::format(fmt::runtime(spec), v) : std::string("n/a");
}

}  // namespace

StepStats::StepStats(const qrun::Config& c)
    : gpu_wanted_(c.get_bool("gpu")), kernel_table_(c.get_bool("kernel_table")) {}

StepStats::~StepStats() {
  if (tracing_step_) {
    kineto_traced_by_step_stats() = false;
    try {
      kp::disableProfiler();
    } catch (...) {
    }
  }
  stop_callback();
  if (table_) std::fclose(table_);
}

void StepStats::stop_callback() {
  if (handle_ != 0) {
    at::removeCallback(handle_);
    handle_ = 0;
    g_counting = false;
    g_instance = false;
  }
}

void StepStats::on_run_start(const std::string& run_dir) {
  QRUN_CHECK(!g_instance.exchange(true), "step-stats: the recipe names step-stats twice; once is enough");
  g_ops = 0;
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(&count_op).scopes({at::RecordScope::FUNCTION}));
  gpu_ = gpu_wanted_ && cuda_available();
  run_dir_ = run_dir;
  table_path_ = run_dir + "/step_stats.tsv";
  table_ = std::fopen(table_path_.c_str(), "a");
  QRUN_CHECK(table_ != nullptr, "step-stats: cannot write {}: {}", table_path_, std::strerror(errno));
  std::fseek(table_, 0, SEEK_END);
  if (std::ftell(table_) == 0)  // a resumed run appends to the same table
    std::fprintf(table_, "step\tstep_time_s\tcpu_ops\tgpu_kernels\tgpu_busy\n");
  QRUN_CHECK(std::fflush(table_) == 0, "step-stats: cannot write {}: {}", table_path_, std::strerror(errno));
  qrun::log_info("step-stats: counting CPU operator calls{}; per-step table in {}",
                 gpu_ ? ", GPU kernels and GPU busy time" :
                 gpu_wanted_ ? " (no CUDA device: GPU kernels and busy time are n/a)"
                             : " (gpu: false: GPU kernels and busy time are n/a)",
                 table_path_);
}

void StepStats::on_step_begin(int64_t) {
  if (in_step_) return;  // the previous step was skipped (non-finite loss): still the same step
  in_step_ = true;
  tracing_step_ = false;
  if (gpu_ && !kineto_held_by_torch_profiler() && !kp::isProfilerEnabledInMainThread()) {
    auto acts = activities(false, true);
    kp::prepareProfiler(kineto_config(false), acts);
    kp::enableProfiler(kineto_config(false), acts);
    tracing_step_ = true;
    kineto_traced_by_step_stats() = true;
  }
  // Counting starts last, so the profiler's own set-up is not counted.
  g_ops = 0;
  g_counting = true;
}

void StepStats::on_step_end(const qrun::StepRecord& record) {
  g_counting = false;
  in_step_ = false;
  cpu_ops_ = static_cast<double>(g_ops.load());
  kernels_ = busy_ = kNa;
  if (tracing_step_) {
    tracing_step_ = false;
    kineto_traced_by_step_stats() = false;
    // A profiler never ends a training run: a session that another component closed under us
    // costs this step's GPU numbers (n/a), with a warning.
    std::unique_ptr<kp::ProfilerResult> result;
    try {
      result = kp::disableProfiler();
    } catch (const c10::Error& e) {
      qrun::log_warn("step-stats: step {}: the GPU trace was lost ({}); its GPU numbers are n/a",
                     record.step, e.what_without_backtrace());
    }
    if (result) {
      std::vector<std::pair<uint64_t, uint64_t>> intervals;
      for (const auto& e : key_events(*result))
        if (e.kind == KeyEvent::Kind::GpuKernel) intervals.emplace_back(e.start_ns, e.end_ns);
      kernels_ = static_cast<double>(intervals.size());
      if (kernel_table_) write_kernel_table(record.step, *result);
      double wall_ns = record.seconds * 1e9;
      busy_ = wall_ns > 0 ? std::min(1.0, static_cast<double>(busy_ns(std::move(intervals))) / wall_ns) : kNa;
    }
  }
  all_ops_.push_back(cpu_ops_);
  if (std::isfinite(kernels_)) all_kernels_.push_back(kernels_);
  if (std::isfinite(busy_)) all_busy_.push_back(busy_);
  std::fprintf(table_, "%lld\t%.6f\t%.0f\t%s\t%s\n", static_cast<long long>(record.step), record.seconds,
               cpu_ops_, cell(kernels_, "{:.0f}").c_str(), cell(busy_, "{:.4f}").c_str());
  QRUN_CHECK(std::fflush(table_) == 0, "step-stats: cannot write {}: {}", table_path_, std::strerror(errno));
}

// <run_dir>/kernels-step-<N>.tsv: every GPU kernel of the step by name, with its launches and
// total device time, longest first (what `qrun bench --profile` groups and ranks).
void StepStats::write_kernel_table(int64_t step, const kp::ProfilerResult& result) {
  std::map<std::string, std::pair<int64_t, uint64_t>> by_name;
  for (const auto& e : key_events(result))
    if (e.kind == KeyEvent::Kind::GpuKernel) {
      auto& slot = by_name[e.name];
      slot.first++;
      slot.second += e.end_ns - e.start_ns;
    }
  std::vector<std::pair<std::string, std::pair<int64_t, uint64_t>>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  std::string path = fmt::format("{}/kernels-step-{}.tsv", run_dir_, step);
  std::FILE* f = std::fopen(path.c_str(), "w");
  QRUN_CHECK(f != nullptr, "step-stats: cannot write {}: {}", path, std::strerror(errno));
  std::fprintf(f, "calls\ttotal_ns\tname\n");
  for (const auto& [name, v] : rows)
    std::fprintf(f, "%lld\t%llu\t%s\n", static_cast<long long>(v.first),
                 static_cast<unsigned long long>(v.second), name.c_str());
  const bool ok = std::fclose(f) == 0;
  QRUN_CHECK(ok, "step-stats: cannot write {}: {}", path, std::strerror(errno));
}

std::vector<std::pair<std::string, double>> StepStats::step_metrics() {
  return {{"cpu_ops", cpu_ops_}, {"gpu_kernels", kernels_}, {"gpu_busy", busy_}};
}

void StepStats::on_run_end() {
  stop_callback();
  auto stats = [](const std::vector<double>& v, const char* spec) -> std::string {
    if (v.empty()) return "n/a";
    double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return fmt::format("mean {} (min {}, max {})", fmt::format(fmt::runtime(spec), mean),
                       fmt::format(fmt::runtime(spec), *lo), fmt::format(fmt::runtime(spec), *hi));
  };
  qrun::log_info("step-stats over {} steps: CPU operator calls per step {}; GPU kernels per step {}; "
                 "GPU busy {}; per step in {}",
                 all_ops_.size(), stats(all_ops_, "{:.0f}"), stats(all_kernels_, "{:.0f}"),
                 stats(all_busy_, "{:.3f}"), table_path_);
  if (table_) {
    std::fclose(table_);
    table_ = nullptr;
  }
}

}  // namespace qrun_profilers
