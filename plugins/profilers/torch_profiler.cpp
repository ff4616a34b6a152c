// plugins/profilers/torch_profiler.cpp - see torch_profiler.h.
#include "torch_profiler.h"

#include "kineto_session.h"

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace qrun_profilers {

TorchProfiler::TorchProfiler(const qrun::Config& c)
    : wait_(c.get_int("wait")),
      warmup_(c.get_int("warmup")),
      active_(c.get_int("active")),
      repeat_(c.get_int("repeat")),
      row_limit_(c.get_int("row_limit")),
      sort_(parse_sort_key(c.get_string("sort_by"))),
      record_shapes_(c.get_bool("record_shapes")),
      print_table_(c.get_bool("print_table")) {}

TorchProfiler::~TorchProfiler() {
  // A run that failed mid-window: close the Kineto session quietly (nothing is saved).
  if (prepared_ || recording_) {
    step_range_.reset();
    try {
      kp::disableProfiler();
    } catch (...) {
    }
    kineto_held_by_torch_profiler() = false;
  }
}

TorchProfiler::Phase TorchProfiler::phase(int64_t n) const {
  int64_t span = wait_ + warmup_ + active_;
  if (repeat_ > 0 && n / span >= repeat_) return Phase::None;
  int64_t pos = n % span;
  if (pos < wait_) return Phase::None;
  if (pos < wait_ + warmup_) return Phase::Warmup;
  return pos == span - 1 ? Phase::RecordLast : Phase::Record;
}

void TorchProfiler::on_run_start(const std::string& run_dir) {
  dir_ = (fs::path(run_dir) / "profiler").string();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  QRUN_CHECK(!ec, "torch-profiler: cannot create {}: {}", dir_, ec.message());
  qrun::log_info("torch-profiler: wait {}, warmup {}, active {}, repeat {}{}; traces and tables in {}",
                 wait_, warmup_, active_, repeat_, repeat_ == 0 ? " (until the end)" : "", dir_);
}

void TorchProfiler::start_recording() {
  QRUN_CHECK((!kp::isProfilerEnabledInMainThread() && !kineto_traced_by_step_stats()) || prepared_,
             "torch-profiler: another profiler session is already running in this process");
  auto acts = activities(true, cuda_available());
  if (!prepared_) kp::prepareProfiler(kineto_config(record_shapes_), acts);
  kp::enableProfiler(kineto_config(record_shapes_), acts);
  prepared_ = false;
  recording_ = true;
  kineto_held_by_torch_profiler() = true;
}

void TorchProfiler::on_step_begin(int64_t step) {
  if (in_step_) return;  // the previous step was skipped (non-finite loss): still the same step
  in_step_ = true;
  Phase p = phase(steps_done_);
  if (p == Phase::Warmup && !prepared_ && !recording_) {
    // Kineto holds one session per process. When another profiler has one open in this step
    // (step-stats listed before torch-profiler traces each step), preparing now would be undone
    // when that session closes; then only claim the next step, and start_recording() prepares.
    if (!kp::isProfilerEnabledInMainThread() && !kineto_traced_by_step_stats()) {
      kp::prepareProfiler(kineto_config(record_shapes_), activities(true, cuda_available()));
      prepared_ = true;
    }
    kineto_held_by_torch_profiler() = true;
  } else if ((p == Phase::Record || p == Phase::RecordLast) && !recording_) {
    start_recording();
    first_step_ = step + 1;
  }
  if (recording_) {
    step_range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (step_range_->isActive()) step_range_->before(fmt::format("ProfilerStep#{}", step + 1));
  }
}

void TorchProfiler::on_step_end(const qrun::StepRecord& record) {
  in_step_ = false;
  step_range_.reset();  // ends the step's range
  last_step_ = record.step;
  Phase p = phase(steps_done_);
  steps_done_++;
  if (recording_ && p == Phase::RecordLast) stop_and_save();
}

void TorchProfiler::stop_and_save() {
  step_range_.reset();
  std::unique_ptr<kp::ProfilerResult> result = kp::disableProfiler();
  recording_ = false;
  kineto_held_by_torch_profiler() = false;
  if (!result) return;
  std::string trace = fmt::format("{}/trace-{}.json", dir_, cycle_);
  std::string table_file = fmt::format("{}/key_averages-{}.txt", dir_, cycle_);
  result->save(trace);
  std::vector<KeyEvent> events = key_events(*result);
  bool with_cuda = false;
  for (const auto& e : events) with_cuda |= e.kind != KeyEvent::Kind::CpuOp;
  SortKey key = sort_;
  if (!with_cuda && (key == SortKey::SelfCuda || key == SortKey::CudaTotal)) {
    qrun::log_warn("torch-profiler: no GPU work was recorded; the table is sorted by self CPU time instead");
    key = SortKey::SelfCpu;
  }
  std::string table = format_table(key_averages(events), key, row_limit_, with_cuda);
  std::string head = fmt::format("torch-profiler: steps {}-{}, {} events, sorted by {}, top {} rows\n",
                                 first_step_, last_step_, events.size(),
                                 key == SortKey::SelfCpu     ? "self_cpu_time_total"
                                 : key == SortKey::CpuTotal  ? "cpu_time_total"
                                 : key == SortKey::SelfCuda  ? "self_cuda_time_total"
                                 : key == SortKey::CudaTotal ? "cuda_time_total"
                                                             : "count",
                                 row_limit_);
  {
    std::ofstream out(table_file, std::ios::trunc);
    out << head << table;
    out.flush();
    QRUN_CHECK(out.good(), "torch-profiler: cannot write {} (disk full?)", table_file);
  }
  qrun::log_info("torch-profiler: trace {} (open in ui.perfetto.dev), table {}", trace, table_file);
  if (print_table_) qrun::log_info("{}{}", head, table);
  cycle_++;
}

void TorchProfiler::on_run_end() {
  if (recording_) stop_and_save();  // the run ended inside an active window
  if (prepared_) {
    kp::disableProfiler();
    prepared_ = false;
    kineto_held_by_torch_profiler() = false;
  }
}

}  // namespace qrun_profilers
