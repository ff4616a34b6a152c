// bench_collate.cpp - not a test: prints what the collators and the loader cost.
//
//   bench_collate [TOKENIZER_DIR] [DATA.jsonl|parquet|folder]
//
// 1. Collator statistics on a chat-like length mix (lognormal, median ~1.05k tokens, clipped to
//    [24, 12000]; UltraChat-like) at an 8,192-token budget: batches needed by padded (pad to a
//    multiple of 8) vs packed greedy vs packed best-fit (window 256), padding fraction, real
//    tokens per batch.
// 2. Loader throughput: the `chat` dataset with hf-tokenizer + chatml, reading, parsing, rendering
//    and tokenizing on 2 worker threads (and 1 for comparison), then packing: tokens/s over 3
//    epochs (the tokenizer's word cache is warm after the first; the demo text is repetitive, so
//    this is an upper bound for real chat text).
#include "chat_dataset.h"
#include "collators.h"
#include "data_test_util.h"
#include "hf_format.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

using namespace qrun;
using namespace qrun::chatdata;

namespace {

void collator_stats() {
  const int64_t n = 20000, budget = 8192;
  auto lens = qrun::testing::chat_like_lengths(n, 42);
  std::vector<Example> xs;
  int64_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    xs.push_back(qrun::testing::make_example(i, std::min<int64_t>(lens[i], budget), 8));
    total += xs.back().input_ids.size();
  }
  std::vector<int64_t> sorted(lens);
  std::sort(sorted.begin(), sorted.end());
  std::printf("length mix: %lld samples, %lld tokens, median %lld, p90 %lld, max %lld (clipped to %lld)\n",
              (long long)n, (long long)total, (long long)sorted[n / 2], (long long)sorted[n * 9 / 10],
              (long long)sorted.back(), (long long)budget);
  std::printf("%-26s %8s %10s %14s %10s\n", "collator @8192 tokens", "batches", "padding", "real tok/batch", "ms");
  struct Case {
    const char* name;
    bool packed, best;
  } cases[] = {{"padded (multiple 8)", false, false},
               {"packed greedy", true, false},
               {"packed best-fit (w=256)", true, true}};
  for (auto& c : cases) {
    CollatorOptions o;
    o.tokens_per_batch = budget;
    o.pad_to_multiple = c.packed ? 1 : 8;
    o.best_fit = c.best;
    o.window = 256;
    std::unique_ptr<Collator> col;
    if (c.packed) col = std::make_unique<PackedCollator>(o);
    else col = std::make_unique<PaddedCollator>(o);
    qrun::testing::VectorStream s(xs);
    int64_t batches = 0, real = 0, pad = 0;
    auto t0 = std::chrono::steady_clock::now();
    while (auto b = col->next(s)) {
      batches++;
      real += b->real_tokens;
      pad += b->padding_tokens;
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // Padding fraction of the budget actually paid for: padded = B*S - real; packed = the unused
    // part of each 8,192-token batch (what a fixed-shape step would pad).
    double paid = c.packed ? double(batches * budget) : double(real + pad);
    std::printf("%-26s %8lld %9.1f%% %14.0f %10.1f\n", c.name, (long long)batches,
                100.0 * (paid - real) / paid, double(real) / batches, ms);
  }
  std::printf("(packed padding column: unused share of batches x 8192; the packed batches themselves "
              "carry no padding)\n");
  // The trainer saves the collator state after every step: its cost with a full best-fit window.
  CollatorOptions o;
  o.tokens_per_batch = budget;
  o.best_fit = true;
  o.window = 256;
  PackedCollator c(o);
  qrun::testing::VectorStream s(xs);
  std::string st;
  double ms = 0;
  const int steps = 50;
  for (int i = 0; i < steps; i++) {  // as the trainer does: one batch, then the state
    c.next(s);
    auto t = std::chrono::steady_clock::now();
    st = c.state();
    ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  }
  ms /= steps;
  auto t0 = std::chrono::steady_clock::now();
  PackedCollator r(o);
  r.restore(st);
  double rms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("best-fit state() after each batch: %zu buffered examples, %.2f MB, %.2f ms per call (mean of 50); "
              "restore %.2f ms\n",
              static_cast<size_t>(o.window - 1), st.size() / 1e6, ms, rms);
}

void loader_throughput(const std::string& tok_dir, const std::string& data) {
  ChatMlFormat chat;
  for (int workers : {1, 2}) {
    HfTokenizer tok(tok_dir);  // fresh: no word cache carried over from the previous run
    ChatDatasetOptions o;
    o.path = data;
    o.num_workers = workers;
    o.prefetch = 1024;
    ChatDataset d(o);
    d.index();
    DataContext ctx{&tok, &chat, 0};
    CollatorOptions co;
    co.tokens_per_batch = 8192;
    PackedCollator col(co);
    int64_t tokens = 0, rows = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int epoch = 0; epoch < 3; epoch++) {
      auto s = d.open(ctx, epoch, "");
      while (auto b = col.next(*s)) {
        tokens += b->real_tokens;
        rows += b->num_seqs();
      }
    }
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("loader (%d worker thread%s + reader + packing): %lld rows, %lld tokens in %.2f s = "
                "%.0f tokens/s, %.0f rows/s\n",
                workers, workers > 1 ? "s" : "", (long long)rows, (long long)tokens, sec,
                tokens / sec, rows / sec);
  }
}

}  // namespace

int main(int argc, char** argv) {
  collator_stats();
  std::string tok_dir = argc > 1 ? argv[1] : QRUN_TEST_TOKENIZER_DIR;
  std::string data = argc > 2 ? argv[2] : QRUN_DEMO_DATA;
  if (!std::filesystem::exists(tok_dir + "/tokenizer.json") || !std::filesystem::exists(data)) {
    std::printf("loader throughput skipped: no tokenizer at %s or no data at %s\n", tok_dir.c_str(),
                data.c_str());
    return 0;
  }
  try {
    loader_throughput(tok_dir, data);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
