// tests/recipe - golden-message tests: every bad recipe in bad/ fails `qrun validate` with exit
// code 2 and exactly the stderr in its .expected file (optional .args: extra arguments such as
// --set). QRUN_REGEN_GOLDEN=1 rewrites the .expected files (review the diff before committing).
// Also: good recipes validate, and the resolved recipe a run writes loads back to the same one.
#include "support/run_process.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
using qrun::test::run_process;
using qrun::test::slurp;

namespace {

std::string env() {
  return std::string("QRUN_NO_DEFAULT_PLUGINS=1 QRUN_PLUGIN_PATH='") + ZOO + "'";
}

std::vector<std::string> bad_cases() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(fs::path(SRC_DIR) / "bad"))
    if (e.path().extension() == ".yaml") out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

class BadRecipe : public ::testing::TestWithParam<std::string> {};

TEST_P(BadRecipe, FailsWithExactMessage) {
  const std::string name = GetParam();
  fs::path dir = fs::path(SRC_DIR) / "bad";
  std::string args;
  if (fs::exists(dir / (fs::path(name).stem().string() + ".args")))
    args = slurp((dir / (fs::path(name).stem().string() + ".args")).string());
  args.erase(std::remove(args.begin(), args.end(), '\n'), args.end());
  auto r = run_process(std::string(QRUN_BIN) + " validate bad/" + name + " " + args, env(), SRC_DIR);
  fs::path expected = dir / (name + ".expected");
  if (std::getenv("QRUN_REGEN_GOLDEN")) {
    std::ofstream(expected) << r.err;
  }
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.out, "");
  ASSERT_TRUE(fs::exists(expected)) << "missing " << expected;
  EXPECT_EQ(r.err, slurp(expected.string())) << "for " << name;
}

INSTANTIATE_TEST_SUITE_P(Golden, BadRecipe, ::testing::ValuesIn(bad_cases()),
                         [](const auto& info) {
                           std::string s = info.param.substr(0, info.param.find('.'));
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(GoodRecipe, ValidatesAndResolvedRecipeRoundTrips) {
  fs::path work = fs::path(WORK_DIR) / "good-run";
  fs::remove_all(work);
  fs::create_directories(work);
  std::string recipe = std::string(SRC_DIR) + "/good/zoo-full.yaml";
  auto v = run_process(std::string(QRUN_BIN) + " validate " + recipe, env(), work.string());
  ASSERT_EQ(v.exit_code, 0) << v.err;
  EXPECT_EQ(v.out, recipe +
                       ": ok (data.chat_format=zoo-plain, data.collator=zoo-collator, "
                       "data.dataset=zoo-dataset, data.tokenizer=zoo-bytes, "
                       "profiler[0]=zoo-profiler)\n");
  // A run writes the resolved recipe; it validates again and resolves to the same text.
  auto run = run_process(std::string(QRUN_BIN) + " " + recipe + " --set run.dir=out --set data.collator.tokens_per_batch=32",
                         env(), work.string());
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::string resolved = slurp((work / "out" / "recipe.resolved.yaml").string());
  EXPECT_NE(resolved.find("tokens_per_batch: 32"), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("plugin: zoo-collator  # test-zoo 1.0.0 (build "), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("max_len: 64"), std::string::npos) << "defaults are filled in:\n" << resolved;
  auto again = run_process(std::string(QRUN_BIN) + " out/recipe.resolved.yaml --set run.dir=out2", env(),
                           work.string());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  std::string resolved2 = slurp((work / "out2" / "recipe.resolved.yaml").string());
  auto body = [](const std::string& s) { return s.substr(s.find('\n') + 1); };  // skip the header
  std::string a = body(resolved), b = body(resolved2);
  // Only run.dir/run.name differ.
  auto strip_run = [](std::string s) { return s.substr(s.find("data:")); };
  EXPECT_EQ(strip_run(a), strip_run(b));
  // The data path ran for real and reported its statistics.
  EXPECT_NE(run.err.find("data: 40 samples -> "), std::string::npos) << run.err;
}

TEST(GoodRecipe, SetCreatesMissingSectionsAndTurnsNamesIntoMappings) {
  std::string recipe = std::string(SRC_DIR) + "/good/zoo-full.yaml";
  auto r = run_process(std::string(QRUN_BIN) + " validate " + recipe +
                           " --set data.tokenizer.plugin=zoo-bytes --set run.seed=3"
                           " --set profiler.0.percentiles=[10,20]",
                       env());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto bad = run_process(std::string(QRUN_BIN) + " validate " + recipe + " --set profiler.3.x=1", env());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err,
            "--set profiler.3.x=1: error: '3' is not an index of the list at 'profiler' (size 1)\n"
            "1 problem in " + recipe + "\n");
}

TEST(Cli, ExplainPrintsSchemaWithDefaultsAndDocs) {
  auto r = run_process(std::string(QRUN_BIN) + " plugins explain collator/zoo-collator", env());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("  tokens_per_batch       int in [1, 1048576], default: 64\n      token budget\n"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  strategy               one of greedy|single, default: greedy"), std::string::npos);
  auto bad = run_process(std::string(QRUN_BIN) + " plugins explain collator/zoo-colator", env());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err, "qrun: unknown collator 'zoo-colator' (did you mean 'zoo-collator'?); installed: zoo-collator\n");
  auto kind = run_process(std::string(QRUN_BIN) + " plugins explain colator/zoo-collator", env());
  EXPECT_EQ(kind.exit_code, 2);
  EXPECT_NE(kind.err.find("unknown kind 'colator' (did you mean 'collator'?)"), std::string::npos) << kind.err;
}

TEST(Cli, ExitCodesAndUsage) {
  EXPECT_EQ(run_process(std::string(QRUN_BIN)).exit_code, 2);
  EXPECT_EQ(run_process(std::string(QRUN_BIN) + " --help").exit_code, 0);
  auto v = run_process(std::string(QRUN_BIN) + " --version", env());
  EXPECT_EQ(v.exit_code, 0);
  EXPECT_NE(v.out.find("LibTorch 2.11.0"), std::string::npos) << v.out;
  EXPECT_NE(v.out.find("plugin test-zoo 1.0.0 (build "), std::string::npos) << v.out;
  auto typo = run_process(std::string(QRUN_BIN) + " valdate x.yaml", env());
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_EQ(typo.err, "qrun: unknown command 'valdate'; did you mean 'validate'? see qrun --help\n");
  auto opt = run_process(std::string(QRUN_BIN) + " validate x.yaml --sett a=1", env());
  EXPECT_EQ(opt.exit_code, 2);
  EXPECT_EQ(opt.err, "qrun: validate: unknown option '--sett' (did you mean '--set'?); allowed: --set\n");
}

}  // namespace
