// tests/trainer - the training loop's promises (framework/trainer.h), on the test-zoo model:
// exact resume, gradient accumulation, atomic checkpoints under kill -9, SIGINT, the NaN guard.
#include "support/run_process.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace fs = std::filesystem;
using qrun::test::run_process;
using qrun::test::slurp;

namespace {

const std::string kEnv = std::string("QRUN_NO_DEFAULT_PLUGINS=1 QRUN_PLUGIN_PATH='") + ZOO + "'";

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::path(WORK_DIR) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

qrun::test::ProcessResult qrun(const fs::path& cwd, const std::string& args) {
  return run_process(std::string(QRUN_BIN) + " " + args, kEnv, cwd.string());
}

std::string fmt_step(long long s) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%08lld", s);
  return b;
}

std::string recipe() { return std::string(SRC_DIR) + "/train.yaml"; }

// step -> the whole metrics line minus timing fields.
std::map<int, std::string> losses(const fs::path& metrics) {
  std::map<int, std::string> out;
  std::istringstream in(slurp(metrics.string()));
  std::string line;
  static const std::regex re("\"step\": ([0-9]+).*\"loss\": ([^,]+), \"lr\": ([^,]+), \"grad_norm\": ([^,]+)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, re)) out[std::stoi(m[1])] = m[2].str() + " " + m[3].str() + " " + m[4].str();
  }
  return out;
}

TEST(Trainer, ResumeReproducesTheUninterruptedRun) {
  fs::path d = fresh_dir("resume");
  auto full = qrun(d, recipe() + " --set run.dir=full");
  ASSERT_EQ(full.exit_code, 0) << full.err;
  auto want = losses(d / "full" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 12u);
  // Keep only the step-5 checkpoint and the first 5 metrics lines, as if the run died after it.
  fs::copy(d / "full", d / "cut", fs::copy_options::recursive);
  fs::remove_all(d / "cut" / "checkpoints" / "step-00000010");
  fs::remove_all(d / "cut" / "checkpoints" / "step-00000012");
  std::ofstream(d / "cut" / "metrics.jsonl", std::ios::trunc);
  auto resumed = qrun(d, recipe() + " --set run.dir=cut --resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resumed from cut/checkpoints/step-00000005 (step 5, epoch"), std::string::npos)
      << resumed.err;
  auto got = losses(d / "cut" / "metrics.jsonl");
  ASSERT_EQ(got.size(), 7u);
  for (int s = 6; s <= 12; ++s) EXPECT_EQ(got[s], want[s]) << "step " << s << " (loss lr grad_norm)";
}

TEST(Trainer, GradientAccumulationEqualsOneBatch) {
  // One sample per micro-batch, 4 micro-batches per step vs. the same 4 samples packed in one
  // batch: the same update, so the same losses at every step (up to float summation order).
  fs::path d = fresh_dir("accum");
  auto a = qrun(d, recipe() + " --set run.dir=a --set data.collator.strategy=single --set train.grad_accum=4"
                   " --set data.dataset.min_len=10 --set data.dataset.max_len=10 --set data.collator.tokens_per_batch=40"
                   " --set checkpoint.every_steps=0");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  auto b = qrun(d, recipe() + " --set run.dir=b --set train.grad_accum=1"
                   " --set data.dataset.min_len=10 --set data.dataset.max_len=10 --set data.collator.tokens_per_batch=40"
                   " --set checkpoint.every_steps=0");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  auto la = losses(d / "a" / "metrics.jsonl"), lb = losses(d / "b" / "metrics.jsonl");
  ASSERT_EQ(la.size(), lb.size());
  for (auto& [step, text] : la) {
    double x = std::stod(text), y = std::stod(lb[step]);
    EXPECT_NEAR(x, y, 1e-5 * std::max(1.0, std::abs(y))) << "step " << step;
  }
}

TEST(Trainer, SigintSavesACheckpointAndExitsZero) {
  fs::path d = fresh_dir("sigint");
  auto r = run_process("timeout --preserve-status -s INT 4 " + std::string(QRUN_BIN) + " " + recipe() +
                           " --set run.dir=out --set train.max_steps=100000000 --set train.epochs=1000000"
                           " --set checkpoint.every_steps=0 --set schedule.name=constant",
                       kEnv, d.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("signal 2 received: saving a checkpoint, then stopping"), std::string::npos) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("checkpoint: step ([0-9]+) saved"))) << r.err;
  EXPECT_TRUE(fs::exists(d / "out" / "checkpoints" / fmt_step(std::stoll(m[1])) / "state.json"));
}

TEST(Trainer, KillDashNineNeverLeavesABrokenCheckpoint) {
  fs::path d = fresh_dir("kill9");
  // A checkpoint every step, killed at different moments: whatever is left must resume.
  for (int i = 0; i < 3; ++i) {
    auto r = run_process("timeout -s KILL " + std::to_string(2 + i) + " " + std::string(QRUN_BIN) + " " +
                             recipe() + " --set run.dir=out --set train.max_steps=100000000"
                             " --set train.epochs=1000000 --set checkpoint.every_steps=1 --set checkpoint.keep=2"
                             " --set schedule.name=constant --set data.dataset.count=100000 --resume",
                         kEnv, d.string());
    EXPECT_EQ(r.exit_code, 137) << r.err;
  }
  // Leftover temporary directories are ignored; the newest complete checkpoint loads.
  auto check = run_process("timeout --preserve-status -s INT 3 " + std::string(QRUN_BIN) + " " + recipe() +
                               " --set run.dir=out --set train.max_steps=100000000 --set train.epochs=1000000"
                               " --set checkpoint.every_steps=1 --set schedule.name=constant"
                               " --set data.dataset.count=100000 --set checkpoint.keep=2 --resume",
                           kEnv, d.string());
  EXPECT_EQ(check.exit_code, 0) << check.err;
  EXPECT_NE(check.err.find("resumed from out/checkpoints/step-"), std::string::npos) << check.err;
}

TEST(Trainer, NonFiniteLossHaltsWithStepSamplesAndHint) {
  fs::path d = fresh_dir("nan");
  auto r = qrun(d, recipe() + " --set run.dir=out --set optimizer.lr=1e30 --set train.clip_grad_norm=0");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("is not finite"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("samples in the batch: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Try a lower optimizer.lr"), std::string::npos) << r.err;
  auto skip = qrun(d, recipe() + " --set run.dir=skip --set optimizer.lr=1e30 --set train.clip_grad_norm=0"
                        " --set train.on_nonfinite=skip");
  EXPECT_EQ(skip.exit_code, 0) << skip.err;
  EXPECT_NE(skip.err.find("non-finite loss or gradient, step skipped"), std::string::npos) << skip.err;
}

TEST(Trainer, EvalPrintsLossAndPerplexityAsJson) {
  fs::path d = fresh_dir("eval");
  auto r = qrun(d, "eval " + recipe() + " --set run.dir=out");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(
      R"(^\{"dataset": "data.dataset", "samples": 120, "loss_tokens": [0-9]+, "loss": [0-9.]+, "perplexity": [0-9.]+\}\n$)")))
      << r.out;
}

}  // namespace
