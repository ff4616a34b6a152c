// test_collators.cpp - exact Batch contents on hand-built examples, budgets, overlong handling,
// best-fit vs greedy on a chat-like length mix, state/restore.
#include "collators.h"
#include "data_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace qrun;
using namespace qrun::chatdata;
using namespace qrun::testing;

namespace {

template <typename T>
std::vector<T> vec(const at::Tensor& t) {
  auto c = t.contiguous();
  const T* p = c.data_ptr<T>();
  return std::vector<T>(p, p + c.numel());
}

std::vector<Batch> all_batches(Collator& c, const std::vector<Example>& xs) {
  VectorStream s(xs);
  std::vector<Batch> out;
  while (auto b = c.next(s)) out.push_back(std::move(*b));
  return out;
}

constexpr int64_t X = -100;

}  // namespace

TEST(PackedCollator, GreedyExactBatch) {
  // lengths 4, 3, 5, 2 with budget 10 -> [4, 3] and [5, 2]
  std::vector<Example> xs = {make_example(0, 4, 2), make_example(1, 3, 0), make_example(2, 5, 5),
                             make_example(3, 2, 1)};
  CollatorOptions o;
  o.tokens_per_batch = 10;
  PackedCollator c(o);
  auto bs = all_batches(c, xs);
  ASSERT_EQ(bs.size(), 2u);
  const Batch& b = bs[0];
  EXPECT_EQ(b.layout, Layout::Packed);
  EXPECT_EQ(b.input_ids.dim(), 1);
  EXPECT_EQ(b.input_ids.scalar_type(), at::kLong);
  EXPECT_EQ(b.labels.scalar_type(), at::kLong);
  EXPECT_EQ(b.position_ids.scalar_type(), at::kLong);
  EXPECT_EQ(b.seq.cu_seqlens.scalar_type(), at::kInt);
  EXPECT_EQ(b.seq.seq_idx.scalar_type(), at::kInt);
  EXPECT_FALSE(b.seq.attention_mask.defined());
  EXPECT_EQ(vec<int64_t>(b.input_ids), (std::vector<int64_t>{1000, 1001, 1002, 1003, 2000, 2001, 2002}));
  EXPECT_EQ(vec<int64_t>(b.labels), (std::vector<int64_t>{X, X, 1002, 1003, 2000, 2001, 2002}));
  EXPECT_EQ(vec<int64_t>(b.position_ids), (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2}));
  EXPECT_EQ(vec<int32_t>(b.seq.cu_seqlens), (std::vector<int32_t>{0, 4, 7}));
  EXPECT_EQ(b.seq.cu_seqlens_host, (std::vector<int64_t>{0, 4, 7}));
  EXPECT_EQ(vec<int32_t>(b.seq.seq_idx), (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(b.seq.max_seqlen, 4);
  EXPECT_EQ(b.num_seqs(), 2);
  EXPECT_EQ(b.real_tokens, 7);
  EXPECT_EQ(b.padding_tokens, 0);
  EXPECT_EQ(b.loss_tokens, 2 + 2);  // sample 0: t=2,3; sample 1: t=1,2 (t=0 is never a target)
  EXPECT_EQ(b.sample_ids, (std::vector<int64_t>{0, 1}));
  const Batch& b2 = bs[1];
  EXPECT_EQ(vec<int32_t>(b2.seq.cu_seqlens), (std::vector<int32_t>{0, 5, 7}));
  EXPECT_EQ(b2.loss_tokens, 0 + 1);
  EXPECT_EQ(b2.sample_ids, (std::vector<int64_t>{2, 3}));
}

TEST(PackedCollator, PadToMultipleAddsATail) {
  std::vector<Example> xs = {make_example(0, 5, 0)};
  CollatorOptions o;
  o.tokens_per_batch = 16;
  o.pad_to_multiple = 8;
  o.pad_id = 7;
  PackedCollator c(o);
  auto bs = all_batches(c, xs);
  ASSERT_EQ(bs.size(), 1u);
  EXPECT_EQ(vec<int64_t>(bs[0].input_ids), (std::vector<int64_t>{1000, 1001, 1002, 1003, 1004, 7, 7, 7}));
  EXPECT_EQ(vec<int64_t>(bs[0].labels), (std::vector<int64_t>{1000, 1001, 1002, 1003, 1004, X, X, X}));
  EXPECT_EQ(vec<int64_t>(bs[0].position_ids), (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 0, 0}));
  EXPECT_EQ(vec<int32_t>(bs[0].seq.seq_idx), (std::vector<int32_t>{0, 0, 0, 0, 0, -1, -1, -1}));
  EXPECT_EQ(vec<int32_t>(bs[0].seq.cu_seqlens), (std::vector<int32_t>{0, 5}));
  EXPECT_EQ(bs[0].real_tokens, 5);
  EXPECT_EQ(bs[0].padding_tokens, 3);
  EXPECT_EQ(bs[0].loss_tokens, 4);
}

TEST(PaddedCollator, ExactBatch) {
  // budget 16, multiple 4: [3, 5] -> S = 8 (2 x 8 = 16); then [2] -> S = 4
  std::vector<Example> xs = {make_example(0, 3, 1), make_example(1, 5, 2), make_example(2, 2, 0)};
  CollatorOptions o;
  o.tokens_per_batch = 16;
  o.pad_to_multiple = 4;
  PaddedCollator c(o);
  auto bs = all_batches(c, xs);
  ASSERT_EQ(bs.size(), 2u);
  const Batch& b = bs[0];
  EXPECT_EQ(b.layout, Layout::Padded);
  EXPECT_EQ(b.input_ids.sizes(), (at::IntArrayRef{2, 8}));
  EXPECT_EQ(vec<int64_t>(b.input_ids),
            (std::vector<int64_t>{1000, 1001, 1002, 0, 0, 0, 0, 0, 2000, 2001, 2002, 2003, 2004, 0, 0, 0}));
  EXPECT_EQ(vec<int64_t>(b.labels),
            (std::vector<int64_t>{X, 1001, 1002, X, X, X, X, X, X, X, 2002, 2003, 2004, X, X, X}));
  EXPECT_EQ(vec<int64_t>(b.position_ids),
            (std::vector<int64_t>{0, 1, 2, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0}));
  EXPECT_EQ(vec<int32_t>(b.seq.seq_idx),
            (std::vector<int32_t>{0, 0, 0, -1, -1, -1, -1, -1, 1, 1, 1, 1, 1, -1, -1, -1}));
  EXPECT_EQ(vec<bool>(b.seq.attention_mask),
            (std::vector<bool>{1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(vec<int32_t>(b.seq.cu_seqlens), (std::vector<int32_t>{0, 3, 8}));
  EXPECT_EQ(b.seq.cu_seqlens_host, (std::vector<int64_t>{0, 3, 8}));
  EXPECT_EQ(b.seq.max_seqlen, 5);
  EXPECT_EQ(b.real_tokens, 8);
  EXPECT_EQ(b.padding_tokens, 8);
  EXPECT_EQ(b.loss_tokens, 2 + 3);
  EXPECT_EQ(bs[1].input_ids.sizes(), (at::IntArrayRef{1, 4}));
  EXPECT_EQ(bs[1].padding_tokens, 2);
  EXPECT_EQ(bs[1].loss_tokens, 1);
  for (auto& x : bs) EXPECT_LE(x.input_ids.numel(), 16);
}

TEST(Collators, OverlongTruncateOrDrop) {
  std::vector<Example> xs = {make_example(0, 3), make_example(1, 9), make_example(2, 2)};
  for (bool drop : {false, true}) {
    CollatorOptions o;
    o.tokens_per_batch = 4;
    o.overlong_drop = drop;
    PackedCollator c(o);
    auto bs = all_batches(c, xs);
    std::vector<int64_t> ids, lens;
    for (auto& b : bs)
      for (int64_t i = 0; i < b.num_seqs(); i++) {
        ids.push_back(b.sample_ids[i]);
        lens.push_back(b.seq.seq_len(i));
      }
    if (drop) {
      EXPECT_EQ(ids, (std::vector<int64_t>{0, 2}));
      EXPECT_EQ(c.dropped(), 1);
    } else {
      EXPECT_EQ(ids, (std::vector<int64_t>{0, 1, 2}));
      EXPECT_EQ(lens, (std::vector<int64_t>{3, 4, 2}));
      EXPECT_EQ(c.truncated(), 1);
      EXPECT_EQ(vec<int64_t>(bs[1].input_ids), (std::vector<int64_t>{2000, 2001, 2002, 2003}));
    }
    PaddedCollator p(o);
    auto pb = all_batches(p, xs);
    for (auto& b : pb) EXPECT_LE(b.input_ids.numel(), 4);
    EXPECT_EQ(drop ? p.dropped() : p.truncated(), 1);
  }
}

TEST(PackedCollator, BestFitPacksFewerBatchesThanGreedy) {
  std::vector<Example> xs;
  auto lens = chat_like_lengths(3000, 5);
  for (size_t i = 0; i < lens.size(); i++) xs.push_back(make_example(static_cast<int64_t>(i), lens[i], 3));
  CollatorOptions o;
  o.tokens_per_batch = 8192;
  PackedCollator greedy(o);
  o.best_fit = true;
  o.window = 256;
  PackedCollator best(o);
  auto g = all_batches(greedy, xs), b = all_batches(best, xs);
  EXPECT_LT(b.size(), g.size());
  for (auto* bs : {&g, &b}) {
    std::vector<int64_t> seen;
    for (auto& x : *bs) {
      EXPECT_LE(x.real_tokens, 8192);
      seen.insert(seen.end(), x.sample_ids.begin(), x.sample_ids.end());
    }
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(seen.size(), xs.size());
    for (size_t i = 0; i < seen.size(); i++) ASSERT_EQ(seen[i], static_cast<int64_t>(i));
  }
  std::printf("chat-like mix, 3000 samples, 8192 budget: greedy %zu batches, best-fit %zu\n",
              g.size(), b.size());
}

TEST(Collators, StateRestoreIsExact) {
  std::vector<Example> xs;
  auto lens = chat_like_lengths(600, 9);
  for (size_t i = 0; i < lens.size(); i++) xs.push_back(make_example(static_cast<int64_t>(i), lens[i] / 4, 2));
  for (int kind = 0; kind < 3; kind++) {
    CollatorOptions o;
    o.tokens_per_batch = 4096;
    o.best_fit = kind == 1;
    o.window = 32;
    o.pad_to_multiple = kind == 2 ? 16 : 1;
    auto make = [&]() -> std::unique_ptr<CollatorBase> {
      if (kind == 2) return std::make_unique<PaddedCollator>(o);
      return std::make_unique<PackedCollator>(o);
    };
    auto full_c = make();
    auto full = all_batches(*full_c, xs);
    for (size_t cut : {size_t(1), size_t(5), full.size() / 2}) {
      VectorStream s(xs);
      auto c = make();
      for (size_t i = 0; i < cut; i++) c->next(s);
      size_t cursor = std::stoul(s.cursor());
      std::string st = c->state();
      VectorStream s2(xs, cursor);
      auto c2 = make();
      c2->restore(st);
      size_t i = cut;
      while (auto b = c2->next(s2)) {
        ASSERT_LT(i, full.size());
        ASSERT_TRUE(b->input_ids.equal(full[i].input_ids)) << kind << " " << cut << " " << i;
        ASSERT_EQ(b->sample_ids, full[i].sample_ids);
        i++;
      }
      EXPECT_EQ(i, full.size());
    }
  }
}

TEST(Collators, StateRoundTripsArbitraryLabels) {
  std::vector<Example> xs = {make_example(0, 3), make_example(1, 5, 2), make_example(2, 4)};
  xs[0].labels = {5, -100, 70000};  // not the token ids: stored as int32, not as a mask
  xs[2].input_ids[1] = -7;          // odd values survive too
  CollatorOptions o;
  o.tokens_per_batch = 100;
  o.best_fit = true;
  o.window = 3;
  std::string st = [&] {
    PackedCollator c(o);
    nlohmann::json j{{"v", 1}, {"buffer", nlohmann::json::array()}, {"arrived", 0}, {"dropped", 0},
                     {"truncated", 0}};
    c.restore(j.dump());
    return c.state();
  }();
  EXPECT_EQ(st, R"({"arrived":0,"dropped":0,"truncated":0,"v":1,"buffer":[]})");
  // Round trip through a best-fit collator that holds all three examples in its buffer.
  o.tokens_per_batch = 9;  // [5,4] fits; 3 waits in the buffer
  PackedCollator d(o);
  VectorStream s4(xs);
  auto first = d.next(s4);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->sample_ids, (std::vector<int64_t>{1, 2}));
  std::string saved = d.state();
  PackedCollator e(o);
  e.restore(saved);
  EXPECT_EQ(e.state(), saved);
  auto rest = e.next(s4);
  ASSERT_TRUE(rest.has_value());
  EXPECT_EQ(rest->sample_ids, (std::vector<int64_t>{0}));
  EXPECT_EQ(vec<int64_t>(rest->labels), (std::vector<int64_t>{5, -100, 70000}));
  EXPECT_THROW(e.restore("{\"v\":1,\"buffer\":[{\"id\":1,\"arrival\":0,\"ids\":\"@@@@\",\"mask\":\"\"}],"
                         "\"arrived\":1,\"dropped\":0,\"truncated\":0}"),
               UserError);
}
