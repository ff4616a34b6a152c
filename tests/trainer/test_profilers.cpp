// tests/trainer/test_profilers.cpp - the profilers plugin (plugins/profilers): its tables against
// simple references, and both components in real (CPU) training runs of the test-zoo recipe:
// torch-profiler's schedule, trace and sorted key-averages table, step-stats' per-step counts in
// metrics.jsonl. The GPU test needs a CUDA device and skips with the reason otherwise.
#include "support/run_process.h"

#include "../../plugins/profilers/kineto_tables.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>

namespace fs = std::filesystem;
using qrun::test::run_process;
using qrun::test::slurp;
using namespace qrun_profilers;

namespace {

const std::string kEnv = std::string("QRUN_NO_DEFAULT_PLUGINS=1 QRUN_PLUGIN_PATH='") + ZOO + ":" + PROFILERS + "'";

fs::path fresh_dir(const std::string& name) { return qrun::test::fresh_dir(WORK_DIR, name); }

qrun::test::ProcessResult qrun(const fs::path& cwd, const std::string& args) {
  return run_process(std::string(QRUN_BIN) + " " + std::string(SRC_DIR) + "/train.yaml " + args, kEnv, cwd.string());
}

std::vector<nlohmann::json> metrics(const fs::path& file) {
  std::vector<nlohmann::json> out;
  std::istringstream in(slurp(file.string()));
  std::string line;
  while (std::getline(in, line))
    if (line.find("\"loss\"") != std::string::npos) out.push_back(nlohmann::json::parse(line));
  return out;
}

// --- the tables, on synthetic events ---

KeyEvent op(const std::string& name, uint64_t thread, uint64_t s, uint64_t e, uint64_t corr = 0) {
  KeyEvent k;
  k.kind = KeyEvent::Kind::CpuOp;
  k.name = name, k.thread = thread, k.start_ns = s, k.end_ns = e, k.correlation = corr;
  return k;
}
KeyEvent kernel(const std::string& name, uint64_t s, uint64_t e, uint64_t linked) {
  KeyEvent k;
  k.kind = KeyEvent::Kind::GpuKernel;
  k.name = name, k.start_ns = s, k.end_ns = e, k.linked = linked;
  return k;
}

TEST(ProfilerTables, KeyAveragesNestSelfTimesAndAttributeKernels) {
  // thread 1: linear [0,100) > matmul [10,60) > mm [20,50); add [70,90); thread 2: mm [0,40)
  std::vector<KeyEvent> ev = {op("linear", 1, 0, 100'000), op("matmul", 1, 10'000, 60'000),
                              op("mm", 1, 20'000, 50'000, 7), op("add", 1, 70'000, 90'000, 8),
                              op("mm", 2, 0, 40'000, 9),
                              kernel("gemm", 1'000'000, 1'030'000, 7), kernel("gemm", 1'100'000, 1'105'000, 9),
                              kernel("add_kernel", 1'200'000, 1'202'000, 8)};
  std::map<std::string, KeyAverage> rows;
  for (auto& r : key_averages(ev)) rows[r.name] = r;
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows["mm"].calls, 2);
  EXPECT_DOUBLE_EQ(rows["mm"].cpu_total_us, 30 + 40);
  EXPECT_DOUBLE_EQ(rows["mm"].self_cpu_us, 70);
  EXPECT_DOUBLE_EQ(rows["matmul"].self_cpu_us, 50 - 30);
  EXPECT_DOUBLE_EQ(rows["linear"].self_cpu_us, 100 - 50 - 20);
  EXPECT_DOUBLE_EQ(rows["linear"].cpu_total_us, 100);
  EXPECT_DOUBLE_EQ(rows["mm"].self_cuda_us, 30 + 5);
  EXPECT_DOUBLE_EQ(rows["matmul"].self_cuda_us, 0);
  EXPECT_DOUBLE_EQ(rows["matmul"].cuda_total_us, 30);
  EXPECT_DOUBLE_EQ(rows["linear"].cuda_total_us, 32);  // gemm 30 + add_kernel 2
  EXPECT_EQ(rows["gemm"].calls, 2);
  EXPECT_DOUBLE_EQ(rows["gemm"].self_cuda_us, 35);
}

TEST(ProfilerTables, TableIsSortedAndLimited) {
  std::vector<KeyAverage> rows;
  for (int i = 0; i < 10; ++i) {
    KeyAverage r;
    r.name = "op" + std::to_string(i);
    r.calls = 10 - i;
    r.self_cpu_us = (i * 7) % 10;
    r.cpu_total_us = 100 + i;
    rows.push_back(r);
  }
  std::string t = format_table(rows, SortKey::CpuTotal, 3, false);
  EXPECT_LT(t.find("op9 "), t.find("op8 "));
  EXPECT_LT(t.find("op8 "), t.find("op7 "));
  EXPECT_EQ(t.find("op6 "), std::string::npos) << t;
  EXPECT_EQ(t.find("CUDA"), std::string::npos) << t;
  std::string c = format_table(rows, SortKey::Calls, 2, true);
  EXPECT_LT(c.find("op0 "), c.find("op1 "));
  EXPECT_NE(c.find("Self CUDA"), std::string::npos);
}

TEST(ProfilerTables, BusyTimeIsTheUnionOfIntervals) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::pair<uint64_t, uint64_t>> iv;
    std::vector<bool> covered(300, false);
    int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      uint64_t s = rng() % 280, e = s + rng() % 20;
      iv.emplace_back(s, e);
      for (uint64_t t = s; t < e; ++t) covered[t] = true;
    }
    uint64_t want = static_cast<uint64_t>(std::count(covered.begin(), covered.end(), true));
    EXPECT_EQ(busy_ns(iv), want) << "trial " << trial;
  }
}

// --- the components in training runs ---

TEST(Profilers, TorchProfilerWritesTracesAndSortedTablesOnItsSchedule) {
  fs::path d = fresh_dir("torch-profiler");
  auto r = qrun(d, "--set run.dir=out --set checkpoint.every_steps=0 --set 'profiler=[{plugin: torch-profiler, "
                   "wait: 1, warmup: 1, active: 2, repeat: 2, sort_by: cpu_time_total, row_limit: 6}]'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // wait step 1, warm-up step 2, record 3-4; again: 5, 6, record 7-8; then nothing.
  EXPECT_NE(r.err.find("torch-profiler: steps 3-4, "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("torch-profiler: steps 7-8, "), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(d / "out" / "profiler" / "trace-2.json"));
  for (int cycle : {0, 1}) {
    fs::path trace = d / "out" / "profiler" / ("trace-" + std::to_string(cycle) + ".json");
    nlohmann::json j = nlohmann::json::parse(slurp(trace.string()));  // throws if not valid JSON
    ASSERT_TRUE(j.contains("traceEvents"));
    std::set<std::string> names;
    for (const auto& e : j["traceEvents"])
      if (e.contains("name")) names.insert(e["name"].get<std::string>());
    EXPECT_GT(j["traceEvents"].size(), 100u);
    EXPECT_TRUE(names.count("aten::mm")) << trace;
    EXPECT_TRUE(names.count(cycle == 0 ? "ProfilerStep#3" : "ProfilerStep#7")) << trace;
    // The table: rows sorted by CPU total, largest first, 6 rows.
    std::string table = slurp((d / "out" / "profiler" / ("key_averages-" + std::to_string(cycle) + ".txt")).string());
    std::istringstream in(table);
    std::string line;
    std::vector<double> totals;
    static const std::regex row(R"(^(\S.*?)\s+([0-9.]+)(us|ms|s)\s+[0-9.]+%\s+([0-9.]+)(us|ms|s)\s+[0-9.]+(us|ms|s)\s+([0-9]+)$)");
    while (std::getline(in, line)) {
      std::smatch m;
      if (!std::regex_match(line, m, row)) continue;
      double scale = m[5] == "us" ? 1 : m[5] == "ms" ? 1e3 : 1e6;
      totals.push_back(std::stod(m[4]) * scale);
    }
    ASSERT_EQ(totals.size(), 6u) << table;
    for (size_t i = 1; i < totals.size(); ++i) EXPECT_GE(totals[i - 1], totals[i]) << table;
    EXPECT_NE(table.find("sorted by cpu_time_total, top 6 rows"), std::string::npos) << table;
  }
}

TEST(Profilers, StepStatsCountsOperatorCallsEveryStep) {
  fs::path d = fresh_dir("step-stats");
  // With torch-profiler alongside: both run, step-stats keeps counting while a window records.
  auto r = qrun(d, "--set run.dir=out --set checkpoint.every_steps=0 --set 'profiler=[{plugin: torch-profiler, "
                   "wait: 0, warmup: 0, active: 2, repeat: 1, print_table: false}, step-stats]'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto m = metrics(d / "out" / "metrics.jsonl");
  ASSERT_EQ(m.size(), 12u);
  for (const auto& line : m) {
    ASSERT_TRUE(line.contains("cpu_ops")) << line;
    EXPECT_GT(line["cpu_ops"].get<double>(), 20) << line;  // forward + backward + AdamW: dozens of ops
    if (!torch::cuda::is_available()) {
      EXPECT_TRUE(line["gpu_kernels"].is_null()) << line;  // n/a, not a fake zero
      EXPECT_TRUE(line["gpu_busy"].is_null()) << line;
    }
  }
  // The same batch shapes give the same count (grad_accum 2 with the same two-batch structure).
  std::string tsv = slurp((d / "out" / "step_stats.tsv").string());
  EXPECT_EQ(tsv.rfind("step\tstep_time_s\tcpu_ops\tgpu_kernels\tgpu_busy\n", 0), 0u) << tsv;
  EXPECT_EQ(std::count(tsv.begin(), tsv.end(), '\n'), 13);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(step-stats over 12 steps: CPU operator calls per step mean [0-9]+)")))
      << r.err;
  // The counts follow the work: each micro-batch adds the same forward + backward operators and
  // the optimizer adds a fixed number, so calls(4) - calls(2) == 2 * (calls(2) - calls(1)).
  std::map<int, double> calls;
  for (int accum : {1, 2, 4}) {
    std::string dir = "accum" + std::to_string(accum);
    auto ra = qrun(d, "--set run.dir=" + dir + " --set train.grad_accum=" + std::to_string(accum) +
                          " --set train.max_steps=2 --set checkpoint.every_steps=0 --set 'profiler=[step-stats]'");
    ASSERT_EQ(ra.exit_code, 0) << ra.err;
    auto ma = metrics(d / dir / "metrics.jsonl");
    ASSERT_EQ(ma.size(), 2u);
    EXPECT_EQ(ma[0]["cpu_ops"], ma[1]["cpu_ops"]);  // same work, same count, every step
    calls[accum] = ma[0]["cpu_ops"].get<double>();
  }
  EXPECT_GT(calls[2], calls[1]);
  EXPECT_EQ(calls[4] - calls[2], 2 * (calls[2] - calls[1])) << calls[1] << " " << calls[2] << " " << calls[4];
}

TEST(Profilers, BothOnTheTinyQwenHybrid) {
  if (std::string(QWEN_PLUGINS).empty()) GTEST_SKIP() << "the qwen and reference-kernels plugins are not built";
  fs::path d = fresh_dir("tiny-qwen");
  // The installed plugins (qwen, reference-kernels, profilers) plus the test zoo's data components.
  auto r = run_process(std::string(QRUN_BIN) + " " + SRC_DIR + "/tiny_qwen.yaml --set run.dir=out",
                       std::string("QRUN_PLUGIN_PATH='") + ZOO + "'", d.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("torch-profiler: steps 3-3, "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sorted by count, top 8 rows"), std::string::npos) << r.err;
  nlohmann::json trace = nlohmann::json::parse(slurp((d / "out" / "profiler" / "trace-0.json").string()));
  EXPECT_GT(trace["traceEvents"].size(), 1000u);
  // Sorted by calls: the "# of Calls" column (the last) never grows down the table.
  std::istringstream in(slurp((d / "out" / "profiler" / "key_averages-0.txt").string()));
  std::string line;
  std::vector<long> counts;
  static const std::regex row(R"(^\S.*\s([0-9.]+)%\s.*\s([0-9]+)$)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, row)) counts.push_back(std::stol(m[2]));
  }
  ASSERT_EQ(counts.size(), 8u);
  for (size_t i = 1; i < counts.size(); ++i) EXPECT_GE(counts[i - 1], counts[i]);
  auto m = metrics(d / "out" / "metrics.jsonl");
  ASSERT_EQ(m.size(), 4u);
  for (const auto& l : m) EXPECT_GT(l["cpu_ops"].get<double>(), 1000) << l;  // thousands of small ops per step
}

TEST(Profilers, StepStatsOnGpuCountsKernelsAndBusyTime) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device on this machine: kernels per step and GPU busy time need one "
                    "(run this test on the GPU machine)";
  fs::path d = fresh_dir("step-stats-gpu");
  auto r = qrun(d, "--set run.dir=out --set run.device=cuda --set checkpoint.every_steps=0 --set 'profiler=[step-stats]'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto m = metrics(d / "out" / "metrics.jsonl");
  ASSERT_EQ(m.size(), 12u);
  for (const auto& line : m) {
    ASSERT_TRUE(line["gpu_kernels"].is_number()) << line;
    EXPECT_GT(line["gpu_kernels"].get<double>(), 0) << line;
    double busy = line["gpu_busy"].get<double>();
    EXPECT_GT(busy, 0) << line;
    EXPECT_LE(busy, 1) << line;
    EXPECT_GT(line["peak_gpu_allocated_mib"].get<double>(), 0) << line;
    EXPECT_GE(line["peak_gpu_reserved_mib"].get<double>(), line["peak_gpu_allocated_mib"].get<double>()) << line;
  }
}

}  // namespace
