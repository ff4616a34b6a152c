// test_data_commands.cpp - `qrun tokenize` and `qrun data inspect` (framework/data_commands.cpp)
// driven in-process with the chat-data plugin loaded through the host's plugin loader.
#include "data_commands.h"
#include "plugin_loader.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

using namespace qrun;

namespace {

// The Qwen3 tokenizer the repository ships (a missing file fails the test, never skips it).
std::string tokenizer_dir() {
  std::string d = QRUN_REPO_TOKENIZER_DIR;
  EXPECT_TRUE(std::filesystem::exists(d + "/tokenizer.json")) << "no Qwen3 tokenizer at " << d;
  return d;
}

const Registry& registry() {
  static Registry r = [] {
    Registry reg;
    EXPECT_TRUE(load_plugin(reg, QRUN_CHAT_DATA_PLUGIN));
    return reg;
  }();
  return r;
}

std::string run_with_stdin(const std::vector<std::string>& args, const std::string& input) {
  std::istringstream in(input);
  auto* old = std::cin.rdbuf(in.rdbuf());
  ::testing::internal::CaptureStdout();
  try {
    EXPECT_EQ(run_tokenize(args, registry()), 0);
  } catch (...) {
    std::cin.rdbuf(old);
    ::testing::internal::GetCapturedStdout();
    throw;
  }
  std::cout.flush();
  std::cin.rdbuf(old);
  return ::testing::internal::GetCapturedStdout();
}

}  // namespace

TEST(DataCommands, TokenizeTextAndChat) {
  std::string dir = tokenizer_dir();
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::string out = run_with_stdin({"tokenize", "--tokenizer", dir}, "Hello world\n<|im_end|>\n");
  std::istringstream lines(out);
  std::string l1, l2;
  std::getline(lines, l1);
  std::getline(lines, l2);
  EXPECT_EQ(nlohmann::json::parse(l1)["ids"], nlohmann::json({9707, 1879}));
  EXPECT_EQ(nlohmann::json::parse(l2)["ids"], nlohmann::json({151645}));

  out = run_with_stdin({"--tokenizer", dir, "--chat"},
                       R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo"}]})" "\n");
  auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j["ids"].size(), j["labels"].size());
  ASSERT_EQ(j["ids"].size(), j["mask"].size());
  int trained = 0;
  for (size_t i = 0; i < j["mask"].size(); i++) {
    trained += j["mask"][i].get<int>();
    EXPECT_EQ(j["mask"][i].get<int>() == 1, j["labels"][i].get<int>() != -100);
  }
  EXPECT_GT(trained, 2);
  EXPECT_EQ(j["ids"].back(), 198);  // "\n" after <|im_end|>, not trained
  EXPECT_EQ(j["mask"].back(), 0);

  EXPECT_THROW(run_with_stdin({"--tokenizer", dir, "--chat"}, "{\"messages\": 3}\n"), UserError);
  EXPECT_THROW(run_with_stdin({"--tokenizer", "/nonexistent"}, ""), UserError);
  EXPECT_THROW(run_with_stdin({"--tokenizr", dir}, ""), UserError);
}

TEST(DataCommands, DataInspect) {
  std::string dir = tokenizer_dir();
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::string recipe = std::string(QRUN_DATA_FIXTURE_DIR) + "/inspect.yaml";
  std::ofstream(recipe) << "data:\n  tokenizer: {plugin: hf-tokenizer, path: " << dir
                        << "}\n  dataset: {plugin: chat, path: " << QRUN_DATA_FIXTURE_DIR
                        << "/good.jsonl}\n  collator: {plugin: packed-collator, tokens_per_batch: 4096}\n";
  ::testing::internal::CaptureStdout();
  int rc = run_data_inspect({"data", "inspect", recipe, "-n", "2", "--set",
                             "data.collator.strategy=best-fit", "--ids"},
                            registry());
  std::string out = ::testing::internal::GetCapturedStdout();
  if (std::getenv("QRUN_TEST_SHOW")) std::cerr << out;  // to look at the output by hand
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("--- example 1"), std::string::npos) << out;
  EXPECT_EQ(out.find("--- example 2"), std::string::npos);
  EXPECT_NE(out.find("[[<think>"), std::string::npos) << out;
  EXPECT_NE(out.find("batches"), std::string::npos);
  EXPECT_NE(out.find("padding fraction"), std::string::npos);
  EXPECT_NE(out.find("samples            2000"), std::string::npos) << out;
  EXPECT_THROW(run_data_inspect({recipe, "-n", "x"}, registry()), UserError);
}
