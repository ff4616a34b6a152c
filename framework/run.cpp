// framework/run.cpp - runs a validated recipe: makes the run directory, writes the resolved
// recipe, builds the components in dependency order and drives them.
//
// Until the trainer exists (issue #5) a run goes as far as real code reaches: the data path
// streams one epoch through the collator and reports its statistics, and the model is built
// and summarised. It never prints training output it did not compute.
#include "run.h"

#include <qrun/sdk/data.h>
#include <qrun/sdk/kernels.h>
#include <qrun/sdk/model.h>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace qrun {
namespace {

template <typename T>
std::unique_ptr<T> make(const Recipe& r, const Registry& reg, const std::string& path) {
  const ComponentSpec* c = r.component(path);
  QRUN_ASSERT(c != nullptr, "component '{}' was not resolved", path);
  try {
    return reg.create<T>(c->name, c->config);
  } catch (Error& e) {
    e.add_context(fmt::format("while creating {} '{}' ({})", path, c->name, r.file));
    throw;
  }
}

void write_atomically(const fs::path& file, const std::string& text) {
  fs::path tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    QRUN_CHECK(out.good(), "cannot write {}", tmp.string());
    out << text;
    out.flush();
    QRUN_CHECK(out.good(), "cannot write {} (disk full?)", tmp.string());
  }
  fs::rename(tmp, file);
}

void run_data(const Recipe& r, const Registry& reg) {
  auto tokenizer = make<Tokenizer>(r, reg, "data.tokenizer");
  auto chat = make<ChatFormat>(r, reg, "data.chat_format");
  auto dataset = make<Dataset>(r, reg, "data.dataset");
  auto collator = make<Collator>(r, reg, "data.collator");
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

int run_recipe(const Recipe& r, const Registry& reg) {
  fs::path dir = r.section("run").get_string("dir");
  std::error_code ec;
  fs::create_directories(dir, ec);
  QRUN_CHECK(!ec, "cannot create run directory {}: {}", dir.string(), ec.message());
  write_atomically(dir / "recipe.resolved.yaml", r.resolved_yaml());
  log_info("run '{}': resolved recipe written to {}", r.section("run").get_string("name"),
           (dir / "recipe.resolved.yaml").string());
  if (r.component("data.dataset") != nullptr) run_data(r, reg);
  if (r.component("model") != nullptr) {
    throw UserError("this qrun has no trainer yet, so a recipe with a model cannot run; "
                    "`qrun validate` checks it");
  }
  return 0;
}

}  // namespace qrun
