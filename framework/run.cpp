// framework/run.cpp - runs a validated recipe: makes the run directory, writes the resolved
// recipe, builds the components in dependency order and drives them.
//
// A recipe with a model trains it (trainer.h). A data-only recipe streams one epoch through the
// collator and reports its statistics (useful to size tokens_per_batch).
#include "run.h"

#include "checkpoint.h"
#include "distributed.h"
#include "log_backend.h"
#include "components.h"
#include "trainer.h"

#include <qrun/sdk/data.h>
#include <qrun/sdk/kernels.h>
#include <qrun/sdk/model.h>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace qrun {
namespace {

void run_data(const Recipe& r, const Registry& reg) {
  auto tokenizer = make_component<Tokenizer>(r, reg, "data.tokenizer");
  auto chat = make_component<ChatFormat>(r, reg, "data.chat_format");
  auto dataset = make_component<Dataset>(r, reg, "data.dataset");
  auto collator = make_component<Collator>(r, reg, "data.collator");
  DataContext ctx{tokenizer.get(), chat.get(), static_cast<uint64_t>(r.section("run").get_int("seed"))};
  auto t0 = std::chrono::steady_clock::now();
  auto stream = dataset->open(ctx, 0, "");
  int64_t batches = 0, real = 0, pad = 0, loss = 0, samples = 0;
  while (auto b = collator->next(*stream)) {
    batches++;
    real += b->real_tokens;
    pad += b->padding_tokens;
    loss += b->loss_tokens;
    samples += b->num_seqs();
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_info("data: {} samples -> {} batches ({}), {} real + {} padding tokens ({:.1f}% padding), "
           "{} loss tokens, {:.0f} tokens/s loaded",
           samples, batches, r.component("data.collator")->name, real, pad,
           real + pad ? 100.0 * pad / (real + pad) : 0.0, loss, secs > 0 ? real / secs : 0.0);
  if (stream->skipped_rows() > 0) log_warn("data: {} malformed rows skipped", stream->skipped_rows());
}

}  // namespace

int run_recipe(const Recipe& r, const Registry& reg, bool resume) {
  fs::path dir = r.section("run").get_string("dir");
  std::error_code ec;
  fs::create_directories(dir, ec);
  QRUN_CHECK(!ec, "cannot create run directory {}: {}", dir.string(), ec.message());
  const DistributedEnv env = read_launch_env(environ_map());
  set_log_rank(env.rank, env.world_size);
  if (env.rank == 0) {
    write_file_atomically(dir / "recipe.resolved.yaml", r.resolved_yaml());
    log_info("run '{}': resolved recipe written to {}", r.section("run").get_string("name"),
             (dir / "recipe.resolved.yaml").string());
  }
  if (r.component("model") != nullptr) return train(r, reg, resume);
  QRUN_CHECK(!resume, "--resume needs a recipe with a model");
  // A data-only recipe: stream the data once and report what the collator made of it.
  if (r.component("data.dataset") != nullptr) run_data(r, reg);
  return 0;
}

}  // namespace qrun
