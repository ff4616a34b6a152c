// bench_tokenizer: tokens/s of qrun's BpeTokenizer on a corpus, 1 and 2 threads (or as given).
//
// usage: bench_tokenizer TOKENIZER_DIR CORPUS.jsonl [THREADS...]   (default threads: 1 2)
// CORPUS.jsonl holds one JSON string per line (bench_hf.py writes it and runs the HF side).
// Each thread count: one warm-up pass, then the best of 3 timed passes over the whole corpus.
// Reports wall-clock tokens/s and tokens per CPU-second (process CPU time, all threads: the
// per-core figure, less sensitive to other load on the machine).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bpe_tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_DIR CORPUS.jsonl [THREADS...]\n", argv[0]);
    return 2;
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    auto tok = qrun::tok::BpeTokenizer::from_dir(argv[1]);
    double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<std::string> texts;
    std::ifstream f(argv[2]);
    std::string line;
    size_t bytes = 0;
    while (std::getline(f, line)) {
      if (line.empty()) continue;
      texts.push_back(nlohmann::json::parse(line).get<std::string>());
      bytes += texts.back().size();
    }
    std::vector<int> threads;
    for (int i = 3; i < argc; ++i) threads.push_back(std::atoi(argv[i]));
    if (threads.empty()) threads = {1, 2};
    std::printf("qrun: loaded %s in %.2f s; corpus %zu texts, %.1f MB\n", argv[1], load_s,
                texts.size(), bytes / 1e6);
    for (int nt : threads) {
      size_t ntok = 0;
      for (const auto& ids : tok.encode_batch(texts, nt)) ntok += ids.size();  // warm-up
      double best = 1e30, best_cpu = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        auto s = std::chrono::steady_clock::now();
        std::clock_t c0 = std::clock();
        auto out = tok.encode_batch(texts, nt);
        double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
        best = std::min(best, dt);
        best_cpu = std::min(best_cpu, cpu);
      }
      std::printf(
          "qrun threads=%d tokens=%zu wall=%.3f s tokens/s=%.0f MB/s=%.2f | cpu=%.3f s "
          "tokens/cpu-s=%.0f\n",
          nt, ntok, best, ntok / best, bytes / best / 1e6, best_cpu, ntok / best_cpu);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
