// framework/trainer.cpp - the training loop, readable top to bottom (trainer.h says what it
// promises). One optimizer step:
//   1. pull grad_accum micro-batches from the collator (CPU tensors);
//   2. forward + backward each, the loss of each scaled by 1 / (loss tokens of the whole step),
//      so N micro-batches give exactly the gradient of one batch of the same samples;
//   3. global gradient norm, clipping, a NaN/Inf guard;
//   4. AdamW with the scheduled learning rate;
//   5. metrics (metrics.jsonl and TensorBoard), progress, evaluation and a checkpoint when due
//      (or when SIGINT/SIGTERM asked to stop).
// A CUDA out-of-memory error in a step ends the run with the step, the batch size and hints; the
// last checkpoint stays as it was.
#include "trainer.h"

#include "checkpoint.h"
#include "components.h"
#include "optimizer.h"
#include "tensorboard.h"

#include <qrun/sdk/data.h>
#include <qrun/sdk/kernels.h>
#include <qrun/sdk/model.h>
#include <qrun/sdk/run.h>

#include <ATen/DeviceAccelerator.h>
#include <torch/cuda.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>

namespace fs = std::filesystem;

namespace qrun {
namespace {

std::atomic<int> g_stop_signal{0};
std::atomic<int64_t> g_stop_signal_ns{0};

// The first SIGINT/SIGTERM asks the loop to stop after the current step; a second one, a second
// or more later, ends the process the default way. Repeats within that second are the same
// request: `timeout` signals the child and then its whole process group, so one request arrives
// twice microseconds apart. Only async-signal-safe calls here.
extern "C" void on_stop_signal(int sig) {
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  int64_t now = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  if (g_stop_signal.load() == 0) {
    g_stop_signal_ns.store(now);
    g_stop_signal.store(sig);
    return;
  }
  if (now - g_stop_signal_ns.load() < 1000000000) return;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t / 60) % 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

c10::Device pick_device(const Config& run) {
  const std::string& d = run.get_string("device");
  bool cuda = torch::cuda::is_available();
  if (d == "cuda") {
    QRUN_CHECK(cuda, "{}: device is cuda, but no CUDA device is available", run.location("device"));
    return c10::Device(c10::kCUDA, 0);
  }
  if (d == "auto" && cuda) return c10::Device(c10::kCUDA, 0);
  return c10::Device(c10::kCPU);
}

c10::ScalarType dtype_of(const std::string& s) { return s == "bf16" ? c10::kBFloat16 : c10::kFloat; }

double peak_flops(const Config& train, const c10::Device& device) {
  double t = train.get_float("peak_tflops");
  if (t > 0) return t * 1e12;
  if (device.is_cuda()) return 989.4e12;  // H100/H200 dense bf16; set train.peak_tflops otherwise
  return 0;
}

// The process's peak resident set size so far (Linux reports ru_maxrss in KiB).
int64_t peak_rss_mib() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

// Peak device memory of the step through the caching allocator's statistics (the
// device-generic face of c10::cuda::CUDACachingAllocator, so CPU-only builds link too).
void reset_peak_device_memory(const c10::Device& d) {
  if (d.is_cuda()) at::accelerator::resetPeakStats(d.index());
}
std::pair<double, double> peak_device_memory_mib(const c10::Device& d) {
  auto stats = at::accelerator::getDeviceStats(d.index());
  constexpr auto kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return {static_cast<double>(stats.allocated_bytes[kAll].peak) / (1 << 20),
          static_cast<double>(stats.reserved_bytes[kAll].peak) / (1 << 20)};
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20) o += fmt::format("\\u{:04x}", c);
    else o += c;
  }
  return o;
}

// One line of metrics.jsonl: fields in order, each already rendered as JSON. The same numbers go
// to TensorBoard (parsed back from the text, so both carry exactly the same values).
class MetricLine {
 public:
  explicit MetricLine(int64_t step) : step_(step) {}
  int64_t step() const { return step_; }
  void add(const std::string& key, double v, const char* spec = "{}") {
    fields_.emplace_back(key, std::isfinite(v) ? fmt::format(fmt::runtime(spec), v) : "null");
  }
  void add_int(const std::string& key, int64_t v) { fields_.emplace_back(key, std::to_string(v)); }
  std::string json() const {
    std::string out = fmt::format("{{\"step\": {}", step_);
    for (const auto& [k, v] : fields_) out += fmt::format(", \"{}\": {}", json_escape(k), v);
    return out + "}\n";
  }
  // TensorBoard scalars "<prefix><key>" for every field with a value.
  std::vector<std::pair<std::string, double>> scalars(const std::string& prefix) const {
    std::vector<std::pair<std::string, double>> out;
    for (const auto& [k, v] : fields_)
      if (v != "null") out.emplace_back(prefix + k, std::stod(v));
    return out;
  }

 private:
  int64_t step_;
  std::vector<std::pair<std::string, std::string>> fields_;
};

// Where the per-step metrics go: metrics.jsonl always, TensorBoard when the recipe says so.
struct MetricSinks {
  std::ofstream jsonl;
  fs::path jsonl_path;
  std::unique_ptr<TensorBoardWriter> tensorboard;

  void write(const MetricLine& line, const std::string& tb_prefix) {
    jsonl << line.json();
    jsonl.flush();
    QRUN_CHECK(jsonl.good(), "cannot write {} (disk full?)", jsonl_path.string());
    if (tensorboard) tensorboard->add_scalars(line.step(), line.scalars(tb_prefix));
  }
};

// Everything the loop needs, built from the recipe in dependency order.
struct Run {
  const Recipe& recipe;
  const Registry& registry;
  fs::path run_dir;
  c10::Device device = c10::Device(c10::kCPU);
  std::unique_ptr<Attention> attention;
  std::unique_ptr<LinearAttention> linear_attention;
  std::unique_ptr<Conv1d> conv1d;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatFormat> chat;
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<Collator> collator;
  std::vector<std::unique_ptr<Profiler>> profilers;

  Run(const Recipe& r, const Registry& reg) : recipe(r), registry(reg) {
    run_dir = r.section("run").get_string("dir");
    device = pick_device(r.section("run"));
    QRUN_CHECK(r.component("model") != nullptr, "{}: a training run needs a model: section", r.file);
    QRUN_CHECK(r.component("data.dataset") != nullptr, "{}: a training run needs data.dataset", r.file);
    at::manual_seed(static_cast<uint64_t>(r.section("run").get_int("seed")));
    // Kernels the recipe resolved (named, or an installed default); the model says if it lacks one.
    if (r.component("kernels.attention")) attention = make_component<Attention>(r, reg, "kernels.attention");
    if (r.component("kernels.linear_attention"))
      linear_attention = make_component<LinearAttention>(r, reg, "kernels.linear_attention");
    if (r.component("kernels.conv1d")) conv1d = make_component<Conv1d>(r, reg, "kernels.conv1d");
    if (r.component("kernels.ops")) ops = make_component<Ops>(r, reg, "kernels.ops");
    model = make_component<Model>(r, reg, "model");
    ModelPlacement placement;
    placement.device = device;
    placement.param_dtype = dtype_of(r.section("precision").get_string("param"));
    placement.compute_dtype = dtype_of(r.section("precision").get_string("compute"));
    placement.seed = static_cast<uint64_t>(r.section("run").get_int("seed"));
    try {
      model->build({attention.get(), linear_attention.get(), conv1d.get(), ops.get()}, placement);
    } catch (Error& e) {
      e.add_context(fmt::format("while building model '{}'", r.component("model")->name));
      throw;
    }
    tokenizer = make_component<Tokenizer>(r, reg, "data.tokenizer");
    chat = make_component<ChatFormat>(r, reg, "data.chat_format");
    dataset = make_component<Dataset>(r, reg, "data.dataset");
    collator = make_component<Collator>(r, reg, "data.collator");
    for (const auto& p : r.profilers) profilers.push_back(reg.create<Profiler>(p.name, p.config));
  }

  DataContext data_context() const {
    return DataContext{tokenizer.get(), chat.get(),
                       static_cast<uint64_t>(recipe.section("run").get_int("seed"))};
  }

  // The evaluation data: data.eval_dataset, else the training data (as `qrun eval`).
  const char* eval_path() const {
    return recipe.component("data.eval_dataset") ? "data.eval_dataset" : "data.dataset";
  }
};

struct EvalResult {
  double loss = 0;
  int64_t loss_tokens = 0, samples = 0, batches = 0;
  double seconds = 0;
};

// Mean loss over the evaluation data (at most `max_batches` batches; 0 = all) without gradients.
// Uses its own dataset stream and collator, so the training data's position is untouched.
EvalResult run_eval(Run& run, int64_t max_batches) {
  auto t0 = std::chrono::steady_clock::now();
  at::NoGradGuard no_grad;
  const char* path = run.eval_path();
  auto ds = make_component<Dataset>(run.recipe, run.registry, path);
  auto collator = make_component<Collator>(run.recipe, run.registry, "data.collator");
  auto stream = ds->open(run.data_context(), 0, "");
  double loss_sum = 0;
  EvalResult r;
  while (max_batches == 0 || r.batches < max_batches) {
    auto b = collator->next(*stream);
    if (!b) break;
    ModelOutput out = run.model->forward(b->to(run.device));
    loss_sum += out.loss_sum.item<double>();
    r.loss_tokens += out.loss_tokens;
    r.samples += b->num_seqs();
    r.batches++;
  }
  QRUN_CHECK(r.loss_tokens > 0, "{}: the evaluation data has no loss tokens", path);
  r.loss = loss_sum / r.loss_tokens;
  r.seconds = seconds_since(t0);
  return r;
}

struct TrainState {
  int64_t step = 0;
  int64_t epoch = 0;
  std::string cursor;          // dataset cursor at the end of the last step
  std::string collator_state;  // examples the collator holds
  double tokens_seen = 0;
};

std::string state_json(const TrainState& s) {
  return fmt::format(
      "{{\"step\": {}, \"epoch\": {}, \"tokens_seen\": {}, \"cursor\": \"{}\", \"collator_state\": \"{}\"}}\n",
      s.step, s.epoch, s.tokens_seen, json_escape(s.cursor), json_escape(s.collator_state));
}

CheckpointRef save_checkpoint(Run& run, AdamW& opt, const TrainState& st, const fs::path& root,
                              int64_t keep) {
  auto t0 = std::chrono::steady_clock::now();
  fs::path dir = write_checkpoint(root, st.step, [&](const fs::path& tmp) {
    fs::create_directories(tmp / "model");
    run.model->save((tmp / "model").string());
    torch::serialize::OutputArchive ar;
    for (const auto& [name, p] : run.model->named_parameters()) ar.write("param." + name, p.detach());
    opt.save(ar);
    ar.write("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
    // LibTorch's zip writer streams through our checked writer (see CheckedFile::sink_write): a
    // full disk is reported with its errno text, and the process does not abort.
    CheckedFile out(tmp / "trainer.pt");
    ar.save_to([&out](const void* data, size_t n) { return out.sink_write(data, n); });
    out.close();
    write_file_checked(tmp / "recipe.resolved.yaml", run.recipe.resolved_yaml());
    write_file_checked(tmp / "state.json", state_json(st));  // last: marks the files complete
  });
  prune_checkpoints(root, keep);
  log_info("checkpoint: step {} saved to {} in {:.1f}s", st.step, dir.string(), seconds_since(t0));
  return CheckpointRef{dir, st.step};
}

// Minimal JSON field extraction for our own state.json (written above, so the format is fixed).
std::string json_field(const std::string& text, const std::string& key) {
  std::string k = "\"" + key + "\": ";
  size_t a = text.find(k);
  QRUN_CHECK(a != std::string::npos, "state.json has no '{}'", key);
  a += k.size();
  if (text[a] == '"') {
    std::string out;
    for (size_t i = a + 1; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size()) {
        char n = text[++i];
        if (n == 'u') {
          out += static_cast<char>(std::stoi(text.substr(i + 1, 4), nullptr, 16));
          i += 4;
        } else {
          out += n;
        }
      } else if (text[i] == '"') {
        return out;
      } else {
        out += text[i];
      }
    }
    throw UserError(fmt::format("state.json: unterminated string for '{}'", key));
  }
  size_t b = text.find_first_of(",}", a);
  return text.substr(a, b - a);
}

TrainState load_checkpoint(Run& run, AdamW& opt, const CheckpointRef& ck) {
  std::ifstream in(ck.dir / "state.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TrainState st;
  try {
    st.step = std::stoll(json_field(text, "step"));
    st.epoch = std::stoll(json_field(text, "epoch"));
    st.tokens_seen = std::stod(json_field(text, "tokens_seen"));
    st.cursor = json_field(text, "cursor");
    st.collator_state = json_field(text, "collator_state");
    torch::serialize::InputArchive ar;
    ar.load_from((ck.dir / "trainer.pt").string());
    at::NoGradGuard no_grad;
    for (auto& [name, p] : run.model->named_parameters()) {
      at::Tensor t;
      QRUN_CHECK(ar.try_read("param." + name, t), "checkpoint has no parameter '{}'", name);
      QRUN_CHECK(t.sizes() == p.sizes(), "parameter '{}' has another shape in the checkpoint", name);
      p.copy_(t);
    }
    opt.load(ar);
    at::Tensor rng;
    if (ar.try_read("rng.cpu", rng)) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();
      gen.set_state(rng);
    }
  } catch (Error& e) {
    e.add_context(fmt::format("while resuming from checkpoint {}", ck.dir.string()));
    throw;
  } catch (const c10::Error& e) {
    throw UserError(fmt::format("cannot resume from checkpoint {}: {}", ck.dir.string(),
                                e.what_without_backtrace()));
  }
  return st;
}

// Counts the optimizer steps of one epoch by streaming it through the collator once.
int64_t steps_per_epoch(Run& run, int64_t grad_accum) {
  auto stream = run.dataset->open(run.data_context(), 0, "");
  auto collator = make_component<Collator>(run.recipe, run.registry, "data.collator");
  int64_t batches = 0;
  while (collator->next(*stream)) batches++;
  return (batches + grad_accum - 1) / grad_accum;
}

// The hints of a CUDA out-of-memory error, naming the recipe's own settings where it has them.
std::string oom_hints(const Recipe& r) {
  std::vector<std::string> hints;
  const ComponentSpec* coll = r.component("data.collator");
  if (coll && coll->config.has("tokens_per_batch"))
    hints.push_back(fmt::format("lower data.collator.tokens_per_batch (now {}; {}) and raise "
                                "train.grad_accum to keep the batch",
                                coll->config.get_int("tokens_per_batch"),
                                coll->config.location("tokens_per_batch")));
  else
    hints.push_back("make the batches smaller (data.collator) and raise train.grad_accum");
  const ComponentSpec* model = r.component("model");
  if (model && model->config.has("activation_checkpointing"))
    hints.push_back(fmt::format("turn on activation checkpointing (model.activation_checkpointing: "
                                "full; now {})",
                                format_value(model->config.values().at("activation_checkpointing"))));
  else
    hints.push_back("turn on activation checkpointing if the model has it");
  if (r.section("precision").get_string("param") != "bf16" ||
      r.section("precision").get_string("compute") != "bf16")
    hints.push_back("use bf16 (precision.param: bf16, precision.compute: bf16, with "
                    "precision.master_weights: true)");
  std::string out;
  for (const auto& h : hints) out += "\n  - " + h;
  return out;
}

}  // namespace

int train(const Recipe& r, const Registry& reg, bool resume) {
  Run run(r, reg);
  const Config& train = r.section("train");
  const Config& optc = r.section("optimizer");
  const Config& sched = r.section("schedule");
  const Config& ckc = r.section("checkpoint");
  const int64_t grad_accum = train.get_int("grad_accum");
  const int64_t epochs = train.get_int("epochs");
  const double clip = train.get_float("clip_grad_norm");
  const bool skip_nonfinite = train.get_string("on_nonfinite") == "skip";
  const int64_t log_every = train.get_int("log_every");
  const int64_t eval_every = train.get_int("eval_every");
  const int64_t eval_batches = train.get_int("eval_batches");
  const fs::path ckpt_root = ckc.has("dir") ? fs::path(ckc.get_string("dir")) : run.run_dir / "checkpoints";
  const int64_t every = ckc.get_int("every_steps"), keep = ckc.get_int("keep");
  resume = resume || ckc.get_string("resume") == "auto";

  auto params = run.model->named_parameters();
  std::vector<std::pair<std::string, at::Tensor>> trainable;
  for (auto& [n, p] : params)
    if (p.requires_grad()) trainable.emplace_back(n, p);
  AdamWOptions ao;
  ao.lr = optc.get_float("lr");
  ao.beta1 = optc.get_float_list("betas")[0];
  ao.beta2 = optc.get_float_list("betas")[1];
  ao.eps = optc.get_float("eps");
  ao.weight_decay = optc.get_float("weight_decay");
  ao.master_weights = r.section("precision").get_bool("master_weights");
  AdamW opt(trainable, ao);

  ModelSummary ms = run.model->summary();
  log_info("model: {} on {}", ms.description, run.device.str());

  int64_t total_steps = train.get_int("max_steps");
  const std::string sched_name = sched.get_string("name");
  ScheduleKind kind = sched_name == "constant" ? ScheduleKind::Constant
                      : sched_name == "linear" ? ScheduleKind::Linear
                                               : ScheduleKind::Cosine;
  if (total_steps == 0) {
    int64_t per_epoch = steps_per_epoch(run, grad_accum);
    total_steps = per_epoch * epochs;
    log_info("data: {} optimizer steps per epoch, {} in total", per_epoch, total_steps);
  }

  TrainState st;
  std::optional<CheckpointRef> last_ckpt;
  if (resume) {
    if (auto ck = newest_checkpoint(ckpt_root)) {
      st = load_checkpoint(run, opt, *ck);
      last_ckpt = ck;
      log_info("resumed from {} (step {}, epoch {})", ck->dir.string(), st.step, st.epoch);
    } else {
      log_info("resume: no checkpoint under {}, starting fresh", ckpt_root.string());
    }
  }

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  MetricSinks sinks;
  sinks.jsonl_path = run.run_dir / "metrics.jsonl";
  sinks.jsonl.open(sinks.jsonl_path, std::ios::app);
  QRUN_CHECK(sinks.jsonl.good(), "cannot write {}", sinks.jsonl_path.string());
  if (train.get_bool("tensorboard")) {
    sinks.tensorboard = std::make_unique<TensorBoardWriter>(run.run_dir);
    log_info("tensorboard: events in {} (tensorboard --logdir {})", sinks.tensorboard->path().string(),
             run.run_dir.string());
  }
  const double peak = peak_flops(train, run.device);
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  for (auto& p : run.profilers) p->on_run_start(run.run_dir.string());

  auto evaluate_now = [&]() {
    EvalResult e;
    try {
      e = run_eval(run, eval_batches);
    } catch (const c10::OutOfMemoryError& oom) {
      if (tty) std::fprintf(stderr, "\n");
      throw UserError(fmt::format(
          "evaluation at step {}: out of memory on {}: {}\nTry:{}\n{}", st.step, run.device.str(),
          oom.what_without_backtrace(), oom_hints(r),
          last_ckpt ? fmt::format("The last checkpoint, {} (step {}), is intact.", last_ckpt->dir.string(),
                                  last_ckpt->step)
                    : std::string("No checkpoint was written yet.")));
    }
    MetricLine line(st.step);
    line.add("eval_loss", e.loss, "{:.6f}");
    line.add("eval_perplexity", std::exp(e.loss), "{:.4f}");
    line.add_int("eval_loss_tokens", e.loss_tokens);
    line.add("eval_time_s", e.seconds, "{:.3f}");
    sinks.write(line, "eval/");
    if (tty) std::fprintf(stderr, "\n");
    log_info("eval at step {}: loss {:.4f}, perplexity {:.2f} ({} loss tokens of {}, {:.1f}s)", st.step,
             e.loss, std::exp(e.loss), e.loss_tokens, run.eval_path(), e.seconds);
  };

  auto stream = run.dataset->open(run.data_context(), st.epoch, st.cursor);
  run.collator->restore(st.collator_state.empty() ? "{}" : st.collator_state);
  auto t_start = std::chrono::steady_clock::now();
  int64_t start_step = st.step;
  int64_t last_eval_step = -1;
  double last_loss = std::nan("");
  bool stopped = false;
  int64_t empty_batches = 0;

  while (st.step < total_steps) {
    // 1. micro-batches of this step
    std::vector<Batch> micro;
    while (static_cast<int64_t>(micro.size()) < grad_accum) {
      auto b = run.collator->next(*stream);
      if (b && b->loss_tokens == 0) {  // nothing to learn from (e.g. prompts cut by truncation)
        empty_batches++;
        continue;
      }
      if (b) {
        micro.push_back(std::move(*b));
        continue;
      }
      if (!micro.empty()) break;  // a short last step of the epoch
      if (++st.epoch >= epochs) break;
      stream = run.dataset->open(run.data_context(), st.epoch, "");
      run.collator->restore("{}");
    }
    if (micro.empty()) break;
    auto t0 = std::chrono::steady_clock::now();
    reset_peak_device_memory(run.device);
    for (auto& p : run.profilers) p->on_step_begin(st.step);
    int64_t loss_tokens = 0, real = 0, pad = 0;
    std::vector<int64_t> seq_lens, sample_ids;
    for (const auto& b : micro) {
      loss_tokens += b.loss_tokens;
      real += b.real_tokens;
      pad += b.padding_tokens;
      for (int64_t i = 0; i < b.num_seqs(); ++i) seq_lens.push_back(b.seq.seq_len(i));
      sample_ids.insert(sample_ids.end(), b.sample_ids.begin(), b.sample_ids.end());
    }
    double loss = std::nan(""), gnorm = 0, lr = 0;
    bool finite = true;
    try {
      // 2. forward + backward
      double loss_sum = 0;
      if (loss_tokens > 0) {
        for (const auto& b : micro) {
          ModelOutput out = run.model->forward(b.to(run.device));
          (out.loss_sum / static_cast<double>(loss_tokens)).backward();
          loss_sum += out.loss_sum.detach().item<double>();
        }
      }
      loss = loss_tokens > 0 ? loss_sum / loss_tokens : std::nan("");
      // 3. gradient norm, clipping, guard
      std::vector<at::Tensor> grads;
      for (auto& [n, p] : trainable)
        if (p.grad().defined()) grads.push_back(p.grad());
      if (!grads.empty()) {
        std::vector<at::Tensor> norms;
        for (auto& g : grads) norms.push_back(g.detach().to(at::kFloat).norm());
        gnorm = at::stack(norms).norm().item<double>();
        if (clip > 0 && gnorm > clip)
          for (auto& g : grads) g.mul_(clip / (gnorm + 1e-6));
      }
      finite = std::isfinite(gnorm) && (loss_tokens == 0 || std::isfinite(loss));
      // 4. the update
      if (finite) {
        lr = schedule_lr(kind, ao.lr, st.step, sched.get_int("warmup_steps"), total_steps,
                         sched.get_float("min_lr_ratio"));
        if (loss_tokens > 0) opt.step(lr);
        opt.zero_grad();
        if (run.device.is_cuda()) torch::cuda::synchronize();
      }
    } catch (const c10::OutOfMemoryError& e) {
      if (tty) std::fprintf(stderr, "\n");
      throw UserError(fmt::format(
          "step {}: out of memory on {} with {} tokens in the batch ({} real + {} padding, {} "
          "micro-batch{}, {} sequences, longest {}): {}\nTry:{}\n{}",
          st.step + 1, run.device.str(), real + pad, real, pad, micro.size(),
          micro.size() == 1 ? "" : "es", seq_lens.size(),
          seq_lens.empty() ? 0 : *std::max_element(seq_lens.begin(), seq_lens.end()),
          e.what_without_backtrace(), oom_hints(r),
          last_ckpt ? fmt::format("The last checkpoint, {} (step {}), is intact: rerun with --resume "
                                  "to continue from it.",
                                  last_ckpt->dir.string(), last_ckpt->step)
                    : std::string("No checkpoint was written yet.")));
    }
    if (!finite) {
      std::string ids = fmt::format("{}", fmt::join(sample_ids, ", "));
      if (!skip_nonfinite)
        throw UserError(fmt::format(
            "step {}: the {} is not finite (loss {}, gradient norm {}); samples in the batch: {}. "
            "Try a lower optimizer.lr, clip_grad_norm, precision.master_weights: true, or "
            "train.on_nonfinite: skip",
            st.step + 1, std::isfinite(loss) ? "gradient" : "loss", loss, gnorm, ids));
      log_warn("step {}: non-finite loss or gradient, step skipped (samples {})", st.step + 1, ids);
      opt.zero_grad();
      continue;
    }
    st.step++;
    st.cursor = stream->cursor();
    st.collator_state = run.collator->state();
    st.tokens_seen += real;
    last_loss = loss;
    // 5. metrics, progress, evaluation, checkpoints
    double dt = seconds_since(t0);
    double tps = real / std::max(dt, 1e-9);
    double flops = run.model->train_flops_per_token(seq_lens);
    double mfu = peak > 0 ? tps * flops / peak : std::nan("");
    StepRecord rec{st.step, dt, real, pad, loss_tokens, loss};
    for (auto& p : run.profilers) p->on_step_end(rec);
    MetricLine line(st.step);
    line.add_int("epoch", st.epoch);
    line.add("loss", loss, "{:.6f}");
    line.add("lr", lr);
    line.add("grad_norm", gnorm);
    line.add_int("real_tokens", real);
    line.add_int("padding_tokens", pad);
    line.add_int("loss_tokens", loss_tokens);
    line.add("tokens_per_s", tps, "{:.1f}");
    line.add("mfu", mfu, "{:.4f}");
    line.add("step_time_s", dt, "{:.4f}");
    line.add_int("peak_rss_mib", peak_rss_mib());
    if (run.device.is_cuda()) {
      auto [alloc, reserved] = peak_device_memory_mib(run.device);
      line.add("peak_gpu_allocated_mib", alloc, "{:.1f}");
      line.add("peak_gpu_reserved_mib", reserved, "{:.1f}");
    }
    for (auto& p : run.profilers)
      for (const auto& [name, value] : p->step_metrics()) line.add(name, value, "{:.6g}");
    sinks.write(line, "train/");
    double elapsed = seconds_since(t_start);
    double eta = elapsed / static_cast<double>(st.step - start_step) * (total_steps - st.step);
    std::string progress = fmt::format("step {}/{} | epoch {} | loss {:.4f} | lr {:.2e} | {:.0f} tok/s | ETA {}",
                                       st.step, total_steps, st.epoch + 1, loss, lr, tps, human_duration(eta));
    if (tty) {
      std::fprintf(stderr, "\r%-100s", progress.c_str());
      if (st.step == total_steps) std::fprintf(stderr, "\n");
    } else if (st.step % log_every == 0 || st.step == total_steps) {
      log_info("{}", progress);
    }
    if (eval_every > 0 && st.step % eval_every == 0) {
      evaluate_now();
      last_eval_step = st.step;
    }
    if (g_stop_signal.load() != 0) {
      if (tty) std::fprintf(stderr, "\n");
      log_info("signal {} received: saving a checkpoint, then stopping", g_stop_signal.load());
      stopped = true;
      break;
    }
    if (every > 0 && st.step % every == 0 && st.step < total_steps)
      last_ckpt = save_checkpoint(run, opt, st, ckpt_root, keep);
  }
  if (eval_every > 0 && !stopped && last_eval_step != st.step) evaluate_now();
  last_ckpt = save_checkpoint(run, opt, st, ckpt_root, keep);
  for (auto& p : run.profilers) p->on_run_end();
  if (empty_batches > 0)
    log_info("{} batches had no loss tokens (nothing to train on) and were skipped", empty_batches);
  double secs = seconds_since(t_start);
  log_info("{}: {} steps in {}, {:.0f} tokens, {:.0f} tokens/s, last loss {:.4f}; metrics in {}",
           stopped ? "stopped" : "done", st.step - start_step, human_duration(secs),
           st.tokens_seen, st.tokens_seen / std::max(secs, 1e-9), last_loss,
           sinks.jsonl_path.string());
  return 0;
}

int evaluate(const Recipe& r, const Registry& reg) {
  Run run(r, reg);
  EvalResult e = run_eval(run, 0);
  std::printf("{\"dataset\": \"%s\", \"samples\": %lld, \"loss_tokens\": %lld, \"loss\": %.6f, \"perplexity\": %.4f}\n",
              run.eval_path(), static_cast<long long>(e.samples), static_cast<long long>(e.loss_tokens),
              e.loss, std::exp(e.loss));
  return 0;
}

}  // namespace qrun
