// tests/trainer - the training loop's promises (framework/trainer.h), on the test-zoo model:
// exact resume, gradient accumulation, atomic checkpoints under kill -9, SIGINT, the NaN guard,
// TensorBoard events (read back by tensorboard itself), evaluation every N steps, CUDA
// out-of-memory reporting (a test knob of zoo-bigram) and a full disk while checkpointing
// (RLIMIT_FSIZE on the real write path).
#include "support/run_process.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cmath>
#include <map>
#include <regex>
#include <sstream>

namespace fs = std::filesystem;
using qrun::test::run_process;
using qrun::test::slurp;

namespace {

const std::string kEnv = std::string("QRUN_NO_DEFAULT_PLUGINS=1 QRUN_PLUGIN_PATH='") + ZOO + "'";

fs::path fresh_dir(const std::string& name) { return qrun::test::fresh_dir(WORK_DIR, name); }

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

// Eval lines of metrics.jsonl: step -> (eval_loss, eval_loss_tokens).
std::map<int, std::pair<double, long>> eval_lines(const fs::path& metrics) {
  std::map<int, std::pair<double, long>> out;
  std::istringstream in(slurp(metrics.string()));
  std::string line;
  static const std::regex re(
      R"(^\{"step": ([0-9]+), "eval_loss": ([0-9.]+), "eval_perplexity": ([0-9.]+), "eval_loss_tokens": ([0-9]+), "eval_time_s": [0-9.]+\}$)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (line.find("eval_") == std::string::npos) continue;
    EXPECT_TRUE(std::regex_match(line, m, re)) << line;
    if (m.empty()) continue;
    double loss = std::stod(m[2]), ppl = std::stod(m[3]);
    EXPECT_NEAR(ppl, std::exp(loss), 1e-3 * ppl) << line;
    out[std::stoi(m[1])] = {loss, std::stol(m[4])};
  }
  return out;
}

const std::string kEvalData = " --set data.eval_dataset.plugin=zoo-dataset --set data.eval_dataset.count=30";

TEST(Trainer, EvaluatesEveryNStepsAndAtTheEnd) {
  fs::path d = fresh_dir("eval-every");
  // lr 0: the model never changes, so every evaluation must equal `qrun eval` of the fresh model.
  std::string common = kEvalData + " --set optimizer.lr=0 --set checkpoint.every_steps=0";
  auto ref = qrun(d, "eval " + recipe() + common);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(ref.out, m, std::regex(R"("dataset": "data.eval_dataset", "samples": 30, "loss_tokens": ([0-9]+), "loss": ([0-9.]+))")))
      << ref.out;
  long ref_tokens = std::stol(m[1]);
  double ref_loss = std::stod(m[2]);

  auto r = qrun(d, recipe() + " --set run.dir=out --set train.eval_every=5" + common);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto evals = eval_lines(d / "out" / "metrics.jsonl");
  ASSERT_EQ(evals.size(), 3u) << slurp((d / "out" / "metrics.jsonl").string());
  for (int step : {5, 10, 12}) {
    ASSERT_EQ(evals.count(step), 1u) << "no evaluation at step " << step;
    EXPECT_NEAR(evals[step].first, ref_loss, 2e-6) << "step " << step;
    EXPECT_EQ(evals[step].second, ref_tokens) << "step " << step;
  }
  EXPECT_NE(r.err.find("eval at step 5: loss "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("loss tokens of data.eval_dataset"), std::string::npos) << r.err;

  // A real run: the evaluation follows the model (the loss changes), and eval_batches caps it.
  auto t = qrun(d, recipe() + " --set run.dir=trained --set train.eval_every=6 --set train.eval_batches=2" +
                       kEvalData + " --set checkpoint.every_steps=0");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  auto te = eval_lines(d / "trained" / "metrics.jsonl");
  ASSERT_EQ(te.size(), 2u);  // steps 6 and 12 (the end is step 12: not evaluated twice)
  EXPECT_NE(te[6].first, te[12].first);
  EXPECT_LT(te[6].second, ref_tokens);
  EXPECT_EQ(te[6].second, te[12].second);
}

TEST(Trainer, TensorBoardEventsHoldTheMetrics) {
  if (std::string(PYTHON).empty()) GTEST_SKIP() << "no QRUN_PYTHON configured: tensorboard's reader is not available";
  fs::path d = fresh_dir("tensorboard");
  auto r = qrun(d, recipe() + " --set run.dir=out --set train.eval_every=4" + kEvalData);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("tensorboard: events in out/events.out.tfevents."), std::string::npos) << r.err;
  // Read back with tensorboard's EventAccumulator: same tags, steps and values as metrics.jsonl.
  auto check = run_process(std::string(PYTHON) + " " + SRC_DIR + "/check_tensorboard.py out --expect-eval", "",
                           d.string());
  EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  // 10 step series (mfu is null on CPU) x 12 steps + 4 eval series x 3 evaluations (4, 8, 12).
  EXPECT_NE(check.out.find("tensorboard: 14 tags, 132 points equal metrics.jsonl"), std::string::npos) << check.out;

  auto off = qrun(d, recipe() + " --set run.dir=off --set train.tensorboard=false");
  ASSERT_EQ(off.exit_code, 0) << off.err;
  for (const auto& e : fs::directory_iterator(d / "off"))
    EXPECT_EQ(e.path().filename().string().find("events.out.tfevents"), std::string::npos) << e.path();
}

TEST(Trainer, OutOfMemoryEndsWithStepBatchAndHints) {
  fs::path d = fresh_dir("oom");
  // grad_accum 2: forward call 7 is the first micro-batch of step 4; a checkpoint every step.
  auto r = qrun(d, recipe() + " --set run.dir=out --set model.oom_at_forward=7 --set checkpoint.every_steps=1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(
      R"(qrun: step 4: out of memory on cpu with [0-9]+ tokens in the batch \([0-9]+ real \+ 0 padding, 2 micro-batches, [0-9]+ sequences, longest [0-9]+\): CUDA out of memory\. Tried to allocate 20\.00 GiB)")))
      << r.err;
  EXPECT_NE(r.err.find("lower data.collator.tokens_per_batch (now 96; "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("activation checkpointing"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("use bf16 (precision.param: bf16"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("The last checkpoint, out/checkpoints/step-00000003 (step 3), is intact"), std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::exists(d / "out" / "checkpoints" / "step-00000003" / "state.json"));
  EXPECT_FALSE(fs::exists(d / "out" / "checkpoints" / "step-00000004"));
  // The same inside an evaluation (forward call 4 with grad_accum 1 is the evaluation at step 3).
  auto ev = qrun(d, recipe() + " --set run.dir=eval-oom --set train.grad_accum=1 --set train.eval_every=3"
                       " --set model.oom_at_forward=4");
  EXPECT_EQ(ev.exit_code, 2) << ev.err;
  EXPECT_NE(ev.err.find("qrun: evaluation at step 3: out of memory on cpu: CUDA out of memory."), std::string::npos)
      << ev.err;
  EXPECT_NE(ev.err.find("lower data.collator.tokens_per_batch"), std::string::npos) << ev.err;
  // Nothing was broken: the run resumes from step 3.
  auto again = qrun(d, recipe() + " --set run.dir=out --set checkpoint.every_steps=1 --resume");
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("resumed from out/checkpoints/step-00000003 (step 3,"), std::string::npos) << again.err;
}

TEST(Trainer, FullDiskWhileCheckpointingKeepsThePreviousCheckpoint) {
  fs::path d = fresh_dir("fulldisk");
  auto first = qrun(d, recipe() + " --set run.dir=out --set train.max_steps=5 --set checkpoint.every_steps=0");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_TRUE(fs::exists(d / "out" / "checkpoints" / "step-00000005" / "state.json"));
  // RLIMIT_FSIZE of 100 KiB with SIGXFSZ ignored: write(2) fails with EFBIG once a file would
  // pass it. The model file (~50 KB) fits, trainer.pt (~150 KB) does not: the failure happens in
  // the middle of the real checkpoint write.
  auto full = run_process("bash -c \"ulimit -f 100; trap '' XFSZ; exec " + std::string(QRUN_BIN) + " " + recipe() +
                              " --set run.dir=out --set train.max_steps=10 --set checkpoint.every_steps=0 --resume\"",
                          kEnv, d.string());
  EXPECT_EQ(full.exit_code, 2) << full.err;
  EXPECT_TRUE(std::regex_search(full.err, std::regex(
      R"(qrun: cannot write checkpoint out/checkpoints/step-00000010: cannot write out/checkpoints/\.step-00000010\.tmp-[0-9]+/trainer\.pt: File too large; [0-9.]+ MiB free on the file system of out/checkpoints; a checkpoint needs about 0\.2 MiB \(the size of step-00000005\); the partial \.step-00000010\.tmp-[0-9]+ was removed and the previous checkpoint out/checkpoints/step-00000005 is intact \(resume with --resume\))")))
      << full.err;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(d / "out" / "checkpoints")) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"step-00000005"});
  // The previous checkpoint loads and training continues from it.
  auto resumed = qrun(d, recipe() + " --set run.dir=out --set train.max_steps=7 --set checkpoint.every_steps=0 --resume");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resumed from out/checkpoints/step-00000005 (step 5,"), std::string::npos) << resumed.err;
}

}  // namespace
