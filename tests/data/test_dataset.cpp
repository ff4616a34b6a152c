// test_dataset.cpp - the `chat` dataset: JSONL/parquet readers, malformed rows (exact messages,
// fail and skip), HF cache lookup, deterministic shuffle, cursor resume (alone and with collators).
#include "chat_dataset.h"
#include "collators.h"
#include "data_test_util.h"
#include "hf_format.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

namespace fs = std::filesystem;
using namespace qrun;
using namespace qrun::chatdata;
using namespace qrun::testing;

namespace {

const std::string kDir = QRUN_DATA_FIXTURE_DIR;

struct Env {
  ByteTokenizer tok;
  ChatMlFormat chat;
  DataContext ctx(uint64_t seed = 0) { return DataContext{&tok, &chat, seed}; }
};

ChatDatasetOptions opts(const std::string& path, bool shuffle = false, int workers = 2) {
  ChatDatasetOptions o;
  o.path = path;
  o.shuffle = shuffle;
  o.num_workers = workers;
  return o;
}

std::vector<Example> drain(ExampleStream& s, int64_t limit = -1) {
  std::vector<Example> out;
  while (limit < 0 || static_cast<int64_t>(out.size()) < limit) {
    auto e = s.next();
    if (!e) break;
    out.push_back(std::move(*e));
  }
  return out;
}

std::vector<int64_t> ids_of(const std::vector<Example>& xs) {
  std::vector<int64_t> v;
  for (auto& x : xs) v.push_back(x.id);
  return v;
}

void expect_same(const std::vector<Example>& a, const std::vector<Example>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); i++) {
    ASSERT_EQ(a[i].id, b[i].id) << "at " << i;
    ASSERT_EQ(a[i].input_ids, b[i].input_ids) << "at " << i;
    ASSERT_EQ(a[i].labels, b[i].labels) << "at " << i;
  }
}

}  // namespace

TEST(ChatRows, ParserMessages) {
  std::vector<RowMessage> m;
  EXPECT_EQ(parse_jsonl_row(R"({"messages":[{"role":"user","content":"hi"}],"x":1})", m), std::nullopt);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].role, "user");
  EXPECT_EQ(m[0].content, "hi");
  EXPECT_EQ(*parse_jsonl_row("nope", m).value().data(), 'i');  // "invalid JSON: ..."
  EXPECT_EQ(parse_jsonl_row(R"({"messages":{}})", m), "'messages' is not a list (got object)");
  EXPECT_EQ(parse_jsonl_row(R"({"messages":[{"role":"user","content":true}]})", m),
            "message 0: 'content' is not a string (got bool)");
  EXPECT_EQ(parse_jsonl_row("\"\xc3\x28\"", m), "invalid UTF-8 at byte 1");
  EXPECT_EQ(parse_jsonl_row(R"({"messages":[{"role":"user","content":"\ud800"}]})", m).value().rfind("invalid JSON: ", 0), 0u);
  EXPECT_EQ(validate_conversation({{"user", "x"}}, false), std::nullopt);
  EXPECT_EQ(validate_conversation({{"user", "x"}}, true), "no assistant turn");
  EXPECT_EQ(validate_conversation({{"tool", "x"}, {"assistant", "y"}}, true), std::nullopt);
  EXPECT_EQ(invalid_utf8_offset("a\xed\xa0\x80"), 1u);  // surrogate
  EXPECT_EQ(invalid_utf8_offset("\xf4\x90\x80\x80"), 0u);  // > U+10FFFF
  EXPECT_EQ(invalid_utf8_offset("\xc0\xaf"), 0u);  // overlong
  EXPECT_EQ(invalid_utf8_offset("h\xc3\xa9llo \xf0\x9f\x98\x80"), std::string_view::npos);
}

TEST(ChatDataset, JsonlAndParquetGiveTheSameExamples) {
  Env env;
  ChatDataset j(opts(kDir + "/good.jsonl")), p(opts(kDir + "/good.parquet"));
  auto sj = j.open(env.ctx(), 0, ""), sp = p.open(env.ctx(), 0, "");
  auto a = drain(*sj), b = drain(*sp);
  ASSERT_EQ(a.size(), 2000u);
  expect_same(a, b);
  for (size_t i = 0; i < a.size(); i++) ASSERT_EQ(a[i].id, static_cast<int64_t>(i));
  // The ChatML rendering: first row starts with <|im_start|>system, labels only on assistant.
  EXPECT_EQ(env.tok.decode(a[0].input_ids).rfind("<|im_start|>system\nYou are helpful.<|im_end|>\n", 0), 0u);
  std::vector<int32_t> trained;
  for (size_t t = 0; t < a[1].labels.size(); t++)
    if (a[1].labels[t] != -100) trained.push_back(a[1].input_ids[t]);
  std::string tr = env.tok.decode(trained);
  EXPECT_EQ(tr.rfind("<think>\n\n</think>\n\na1 ", 0), 0u) << tr;
  EXPECT_EQ(tr.substr(tr.size() - 10), "<|im_end|>");
}

TEST(ChatDataset, MalformedJsonlRowsFailWithFileAndRow) {
  Env env;
  auto expected = read_json(kDir + "/expected.json");
  for (auto& [name, msg] : expected["jsonl"].items()) {
    std::string file = kDir + "/bad_" + name + ".jsonl";
    for (int workers : {0, 3}) {
      ChatDataset d(opts(file, false, workers));
      auto s = d.open(env.ctx(), 0, "");
      ASSERT_TRUE(s->next().has_value()) << name;
      try {
        s->next();
        FAIL() << name << ": no error";
      } catch (const UserError& e) {
        std::string want = file + ":row 2: " + msg.get<std::string>();
        if (name == "invalid_json")
          EXPECT_EQ(e.message().rfind(want, 0), 0u) << e.message();
        else
          EXPECT_EQ(e.message(), want);
        EXPECT_NE(std::string(e.what()).find("on_error: skip"), std::string::npos);
      }
      // The error sticks: the stream does not continue past it.
      EXPECT_THROW(s->next(), UserError);
    }
  }
}

TEST(ChatDataset, MalformedParquetRowsFailWithFileAndRow) {
  Env env;
  auto expected = read_json(kDir + "/expected.json");
  for (auto& [name, msg] : expected["parquet"].items()) {
    std::string file = kDir + "/bad_" + name + ".parquet";
    ChatDataset d(opts(file));
    auto s = d.open(env.ctx(), 0, "");
    int row = name == "invalid_utf8" ? 1 : 2;
    if (row == 2) ASSERT_TRUE(s->next().has_value()) << name;
    try {
      s->next();
      FAIL() << name << ": no error";
    } catch (const UserError& e) {
      EXPECT_EQ(e.message(), file + ":row " + std::to_string(row) + ": " + msg.get<std::string>());
    }
  }
}

TEST(ChatDataset, SkipCountsMalformedRows) {
  Env env;
  auto expected = read_json(kDir + "/expected.json");
  for (int workers : {0, 2}) {
    auto o = opts(kDir + "/mixed_bad.jsonl", false, workers);
    o.skip_errors = true;
    ChatDataset d(o);
    auto s = d.open(env.ctx(), 0, "");
    auto xs = drain(*s);
    EXPECT_EQ(static_cast<int64_t>(xs.size()), expected["mixed_valid"].get<int64_t>());
    EXPECT_EQ(s->skipped_rows(), expected["mixed_bad"].get<int64_t>());
    // Resume in the middle keeps the count.
    auto s2 = d.open(env.ctx(), 0, "");
    drain(*s2, 5);
    auto c = s2->cursor();
    auto s3 = d.open(env.ctx(), 0, c);
    EXPECT_EQ(s3->skipped_rows(), s2->skipped_rows());
    drain(*s3);
    EXPECT_EQ(s3->skipped_rows(), expected["mixed_bad"].get<int64_t>());
  }
}

TEST(ChatDataset, SkipWorksForParquetRows) {
  Env env;
  auto expected = read_json(kDir + "/expected.json");
  for (auto& [name, msg] : expected["parquet"].items()) {
    auto o = opts(kDir + "/bad_" + name + ".parquet");
    o.skip_errors = true;
    ChatDataset d(o);
    auto s = d.open(env.ctx(), 0, "");
    EXPECT_EQ(drain(*s).size(), name == "invalid_utf8" ? 0u : 1u) << name;
    EXPECT_EQ(s->skipped_rows(), 1) << name;
  }
}

TEST(ChatDataset, UnreadableParquetNamesTheFile) {
  Env env;
  for (std::string f : {"truncated.parquet", "notparquet.parquet", "nomessages.parquet"}) {
    ChatDataset d(opts(kDir + "/" + f));
    try {
      d.open(env.ctx(), 0, "");
      FAIL() << f;
    } catch (const UserError& e) {
      EXPECT_NE(e.message().find(kDir + "/" + f), std::string::npos) << e.message();
    }
  }
}

TEST(ChatDataset, PathsFoldersGlobsAndTheHubCache) {
  Env env;
  ChatDataset folder(opts(kDir + "/big"));
  EXPECT_EQ(folder.index()->num_rows(), 3200);  // blank lines are not rows
  ChatDataset glob(opts(kDir + "/big/part-*.jsonl"));
  EXPECT_EQ(glob.index()->files().size(), 2u);
  EXPECT_EQ(glob.index()->num_rows(), 3200);
  // Line numbers count blank lines: row 12 of part-1 is followed by a blank line.
  auto s = folder.open(env.ctx(), 0, "");
  EXPECT_EQ(drain(*s).size(), 3200u);

  setenv("HF_HUB_CACHE", (kDir + "/hub").c_str(), 1);
  auto o = opts("acme/chat");
  o.split = "train";
  ChatDataset train(o);
  EXPECT_EQ(train.index()->num_rows(), 300);
  o.split = "test";
  ChatDataset test(o);
  EXPECT_EQ(test.index()->num_rows(), 50);
  ChatDataset missing(opts("acme/nothing"));
  try {
    missing.index();
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(e.message().find(kDir + "/hub/datasets--acme--nothing"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("hf download --repo-type dataset acme/nothing"),
              std::string::npos);
  }
  auto g = opts(kDir + "/hub/datasets--acme--chat/snapshots/*/data/*.parquet");
  g.split = "test";  // a glob: the split filters file names
  ChatDataset globbed(g);
  EXPECT_EQ(globbed.index()->files().size(), 1u);
  EXPECT_EQ(globbed.index()->num_rows(), 50);
  auto f = opts(kDir + "/good.jsonl");
  f.split = "train";
  EXPECT_THROW(ChatDataset(f).index(), UserError);
  o.split = "validation";
  ChatDataset nosplit(o);
  EXPECT_THROW(nosplit.index(), UserError);
  unsetenv("HF_HUB_CACHE");
  EXPECT_THROW(ChatDataset(opts(kDir + "/nope.jsonl")).index(), UserError);
}

TEST(ChatDataset, ShuffleIsDeterministicAndIndependentOfThreads) {
  Env env;
  auto o = opts(kDir + "/big", true, 0);
  o.shuffle_window = 1000;
  ChatDataset d0(o);
  o.num_workers = 4;
  o.prefetch = 3;
  ChatDataset d4(o);
  auto a = drain(*d0.open(env.ctx(7), 0, ""));
  auto b = drain(*d4.open(env.ctx(7), 0, ""));
  expect_same(a, b);
  auto ids = ids_of(a);
  auto sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); i++) ASSERT_EQ(sorted[i], static_cast<int64_t>(i));
  EXPECT_NE(ids, sorted);
  EXPECT_NE(ids_of(drain(*d4.open(env.ctx(7), 1, ""))), ids);  // another epoch
  EXPECT_NE(ids_of(drain(*d4.open(env.ctx(8), 0, ""))), ids);  // another seed
  EXPECT_EQ(ids_of(drain(*d4.open(env.ctx(7), 0, ""))), ids);  // same again
}

TEST(ChatDataset, CursorResumesExactly) {
  Env env;
  auto o = opts(kDir + "/big", true, 2);
  o.shuffle_window = 700;
  o.prefetch = 17;
  ChatDataset d(o);
  auto full = drain(*d.open(env.ctx(3), 2, ""));
  ASSERT_EQ(full.size(), 3200u);
  for (int64_t k : {0, 1, 17, 699, 700, 1024, 2500, 3199, 3200}) {
    auto s = d.open(env.ctx(3), 2, "");
    auto head = drain(*s, k);
    auto tail = drain(*d.open(env.ctx(3), 2, s->cursor()));
    head.insert(head.end(), tail.begin(), tail.end());
    expect_same(head, full);
  }
  auto s = d.open(env.ctx(3), 2, "");
  drain(*s, 10);
  EXPECT_THROW(d.open(env.ctx(3), 1, s->cursor()), UserError);  // another epoch
  EXPECT_THROW(d.open(env.ctx(4), 2, s->cursor()), UserError);  // another seed
  EXPECT_THROW(d.open(env.ctx(3), 2, "{bad"), UserError);
}

TEST(ChatDataset, MaxLengthTruncates) {
  Env env;
  auto o = opts(kDir + "/good.jsonl");
  o.max_length = 64;
  ChatDataset d(o);
  for (auto& x : drain(*d.open(env.ctx(), 0, ""))) {
    ASSERT_LE(x.input_ids.size(), 64u);
    ASSERT_EQ(x.labels.size(), x.input_ids.size());
  }
}

namespace {
struct BatchSig {
  std::vector<int64_t> ids, sample_ids;
  int64_t real, pad, loss;
  bool operator==(const BatchSig& o) const {
    return ids == o.ids && sample_ids == o.sample_ids && real == o.real && pad == o.pad && loss == o.loss;
  }
};
BatchSig sig(const Batch& b) {
  auto t = b.input_ids.contiguous();
  const int64_t* p = t.data_ptr<int64_t>();
  return BatchSig{std::vector<int64_t>(p, p + t.numel()), b.sample_ids, b.real_tokens,
                  b.padding_tokens, b.loss_tokens};
}
}  // namespace

TEST(ChatDataset, DatasetAndCollatorResumeEqualsUninterrupted) {
  Env env;
  auto o = opts(kDir + "/big", true, 2);
  o.shuffle_window = 900;
  ChatDataset d(o);
  for (int kind = 0; kind < 3; kind++) {
    CollatorOptions co;
    co.tokens_per_batch = 2048;
    co.best_fit = kind == 1;
    co.window = 64;
    co.pad_to_multiple = kind == 2 ? 8 : 1;
    auto make = [&]() -> std::unique_ptr<CollatorBase> {
      if (kind == 2) return std::make_unique<PaddedCollator>(co);
      return std::make_unique<PackedCollator>(co);
    };
    std::vector<BatchSig> full;
    {
      auto s = d.open(env.ctx(11), 0, "");
      auto c = make();
      while (auto b = c->next(*s)) full.push_back(sig(*b));
    }
    ASSERT_GT(full.size(), 20u);
    for (size_t cut : {size_t(1), size_t(7), full.size() / 2, full.size() - 1}) {
      std::vector<BatchSig> got;
      std::string cursor, state;
      {
        auto s = d.open(env.ctx(11), 0, "");
        auto c = make();
        for (size_t i = 0; i < cut; i++) got.push_back(sig(*c->next(*s)));
        cursor = s->cursor();
        state = c->state();
      }
      auto s = d.open(env.ctx(11), 0, cursor);
      auto c = make();
      c->restore(state);
      while (auto b = c->next(*s)) got.push_back(sig(*b));
      ASSERT_EQ(got.size(), full.size()) << "kind " << kind << " cut " << cut;
      for (size_t i = 0; i < got.size(); i++) ASSERT_TRUE(got[i] == full[i]) << "batch " << i;
    }
  }
}
