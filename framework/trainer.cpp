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
#include "session.h"
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
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

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

// The process's peak resident set size so far (Linux reports ru_maxrss in KiB).
int64_t peak_rss_mib() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
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
    if (!jsonl.is_open()) return;  // a rank other than 0
    jsonl << line.json();
    jsonl.flush();
    QRUN_CHECK(jsonl.good(), "cannot write {} (disk full?)", jsonl_path.string());
    if (tensorboard) tensorboard->add_scalars(line.step(), line.scalars(tb_prefix));
  }
};

struct EvalResult {
  double loss = 0;
  int64_t loss_tokens = 0, samples = 0, batches = 0;
  double seconds = 0;
};

// Mean loss over the evaluation data (at most `max_batches` batches; 0 = all) without gradients.
// Uses its own dataset stream and collator, so the training data's position is untouched.
EvalResult run_eval(Session& run, int64_t max_batches) {
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

// Fault injection for the multi-rank tests (tests/sharding): QRUN_FAULT_EXIT=<rank>:<where>:<step>
// makes that rank exit at once (code 17) at `where` ("step": before the step's forward;
// "checkpoint": halfway through writing its checkpoint shard) of optimizer step <step>.
void fault_point(const Session& run, const char* where, int64_t step) {
  static const std::string spec = [] {
    const char* v = std::getenv("QRUN_FAULT_EXIT");
    return std::string(v ? v : "");
  }();
  if (spec.empty()) return;
  int rank = -1;
  long long at = -1;
  char w[32] = {0};
  if (std::sscanf(spec.c_str(), "%d:%31[a-z]:%lld", &rank, w, &at) == 3 && rank == run.env.rank &&
      std::string(w) == where && at == step) {
    std::fprintf(stderr, "QRUN_FAULT_EXIT: rank %d exits at %s %lld\n", rank, where, at);
    std::_Exit(17);
  }
}

bool sharded_state(const Session& run) {
  for (const auto& p : run.optimized)
    if (p.full_numel > 0) return true;
  return false;
}

// Note [Sharded checkpoints]: with a sharding that splits parameters (fsdp2) each rank writes its
// own shards and their optimizer state to <root>/.shards-step-N/rank-R-of-W.pt (temp file, fsync,
// rename); after a barrier, rank 0 publishes the checkpoint atomically with the shard files moved
// into its shards/ folder, the consolidated Hugging Face model/ (gathered one unit at a time
// before) and state.json last. A rank that dies while writing never reaches the barrier: nothing
// is published and the previous checkpoint stays the newest. load_checkpoint() reads the shards
// back on any number of ranks (Note [Resharding]).
CheckpointRef save_sharded_checkpoint(Session& run, AdamW& opt, const TrainState& st, const fs::path& root,
                                      int64_t keep) {
  auto t0 = std::chrono::steady_clock::now();
  const int rank = run.env.rank, world = run.comm->world_size();
  std::map<std::string, at::Tensor> full;  // rank 0: every parameter's value, on the CPU
  run.sharding->for_each_full_parameter([&](const std::string& name, const at::Tensor& t) {
    if (t.defined()) full[name] = t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  });
  const fs::path staging = root / fmt::format(".shards-step-{:08d}", st.step);
  const std::string file = fmt::format("rank-{}-of-{}.pt", rank, world);
  std::error_code ec;
  fs::create_directories(staging, ec);
  QRUN_CHECK(!ec, "cannot create {}: {}", staging.string(), ec.message());
  {
    torch::serialize::OutputArchive ar;
    for (const auto& p : run.optimized) {
      ar.write("shard." + p.name, p.tensor.detach().cpu());
      ar.write("layout." + p.name, at::tensor({p.full_numel, p.tensor.numel(), static_cast<int64_t>(world),
                                               static_cast<int64_t>(rank)}, at::kLong));
    }
    opt.save(ar);
    ar.write("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
    CheckedFile out(staging / (file + ".tmp"));
    ar.save_to([&out](const void* data, size_t n) { return out.sink_write(data, n); });
    fault_point(run, "checkpoint", st.step);  // (tests) a rank that dies with its shard half-written
    out.close();
    fs::rename(staging / (file + ".tmp"), staging / file);
  }
  run.comm->barrier();  // every rank's shard is complete
  fs::path dir;
  if (rank == 0) {
    // Staging folders of earlier saves that failed (a rank died) are never a checkpoint: gone.
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.path().filename().string().rfind(".shards-step-", 0) == 0 && e.path() != staging)
        fs::remove_all(e.path(), ec);
    dir = write_checkpoint(root, st.step, [&](const fs::path& tmp) {
      fs::create_directories(tmp / "model");
      run.model->save((tmp / "model").string(), full);
      fs::create_directories(tmp / "shards");
      for (int r = 0; r < world; ++r) {
        const std::string f = fmt::format("rank-{}-of-{}.pt", r, world);
        fs::rename(staging / f, tmp / "shards" / f);
      }
      write_file_checked(tmp / "recipe.resolved.yaml", run.recipe.resolved_yaml(run.op_table.providers()));
      write_file_checked(tmp / "state.json", state_json(st));  // last: marks the files complete
    });
    fs::remove_all(staging, ec);
    prune_checkpoints(root, keep);
    log_info("checkpoint: step {} saved to {} ({} shards) in {:.1f}s", st.step, dir.string(), world,
             seconds_since(t0));
  }
  run.comm->barrier();  // published
  return CheckpointRef{root / fmt::format("step-{:08d}", st.step), st.step};
}

CheckpointRef save_checkpoint(Session& run, AdamW& opt, const TrainState& st, const fs::path& root,
                              int64_t keep) {
  if (sharded_state(run)) return save_sharded_checkpoint(run, opt, st, root, keep);
  // Replicated parameters and optimizer state: rank 0 writes, the other ranks wait for it.
  if (!run.is_rank0()) {
    run.comm->barrier();
    return CheckpointRef{root / fmt::format("step-{:08d}", st.step), st.step};
  }
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
    write_file_checked(tmp / "recipe.resolved.yaml", run.recipe.resolved_yaml(run.op_table.providers()));
    write_file_checked(tmp / "state.json", state_json(st));  // last: marks the files complete
  });
  prune_checkpoints(root, keep);
  log_info("checkpoint: step {} saved to {} in {:.1f}s", st.step, dir.string(), seconds_since(t0));
  if (run.comm) run.comm->barrier();
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

// Note [Resharding]: a flat group of L elements written by W ranks is W pieces of S = ceil(L/W)
// (rank q holds [q S, (q + 1) S)); read by W' ranks, rank r needs [r S', (r + 1) S') of the same
// group, assembled from the pieces it overlaps (zeros past L). The same for every tensor of the
// group's shard: its values and each optimizer state.
void load_sharded(Session& run, AdamW& opt, const fs::path& dir) {
  std::map<int, fs::path> files;  // old rank -> file
  int old_world = 0;
  for (const auto& e : fs::directory_iterator(dir / "shards")) {
    int r = 0, w = 0;
    if (std::sscanf(e.path().filename().string().c_str(), "rank-%d-of-%d.pt", &r, &w) == 2) {
      files[r] = e.path();
      old_world = w;
    }
  }
  QRUN_CHECK(old_world > 0 && static_cast<int>(files.size()) == old_world,
             "checkpoint {}: {} of {} rank shards present", dir.string(), files.size(), old_world);
  const int rank = run.env.rank, world = run.comm ? run.comm->world_size() : 1;
  // Only the old ranks whose pieces overlap this rank's (each file holds a few GB at scale):
  // rank q of W held [q S, (q+1) S) of a group of L elements, S = ceil(L / W).
  std::set<int> needed;
  for (const auto& p : run.optimized) {
    const int64_t S_old = (p.full_numel + old_world - 1) / old_world, S_new = p.tensor.numel();
    const int64_t lo = rank * S_new, hi = std::min((rank + 1) * S_new, p.full_numel);
    for (int q = 0; q < old_world; ++q)
      if (std::max(lo, q * S_old) < std::min(hi, (q + 1) * S_old)) needed.insert(q);
  }
  if (old_world == world) needed = {rank};
  if (needed.empty()) needed.insert(0);
  std::map<int, torch::serialize::InputArchive> old;
  for (int q : needed) old[q].load_from(files.at(q).string());
  const int first = *needed.begin();
  std::map<std::string, int64_t> full_numel;  // slot -> L
  for (const auto& p : run.optimized) {
    at::Tensor lay;
    QRUN_CHECK(old[first].try_read("layout." + p.name, lay),
               "checkpoint {} has no shard '{}' (written by another sharding or model?)", dir.string(), p.name);
    QRUN_CHECK(lay[0].item<int64_t>() == p.full_numel,
               "checkpoint {}: shard '{}' covers {} elements, this model's {}", dir.string(), p.name,
               lay[0].item<int64_t>(), p.full_numel);
    full_numel[p.name] = p.full_numel;
  }
  // The piece [r S', (r+1) S') of the flat tensor that `key` names in every old file.
  auto reshard = [&](const std::string& key, int64_t L, int64_t S_new, c10::ScalarType dt) {
    at::Tensor out = at::zeros({S_new}, at::TensorOptions().dtype(dt));
    const int64_t lo = rank * S_new, hi = std::min((rank + 1) * S_new, L);
    for (int q : needed) {
      at::Tensor piece;
      if (!old[q].try_read(key, piece)) return at::Tensor();
      const int64_t S_old = piece.numel(), plo = q * S_old, phi = std::min((q + 1) * S_old, L);
      const int64_t a = std::max(lo, plo), b = std::min(hi, phi);
      if (a < b) out.narrow(0, a - lo, b - a).copy_(piece.reshape({-1}).narrow(0, a - plo, b - a));
    }
    return out;
  };
  at::NoGradGuard no_grad;
  for (const auto& p : run.optimized) {
    at::Tensor v = old_world == world ? at::Tensor() : reshard("shard." + p.name, p.full_numel, p.tensor.numel(),
                                                                p.tensor.scalar_type());
    if (!v.defined()) QRUN_CHECK(old[rank].try_read("shard." + p.name, v), "checkpoint: no shard {}", p.name);
    p.tensor.detach().copy_(v);
  }
  opt.load([&](const std::string& key, at::IntArrayRef shape) {
    at::Tensor t;
    if (old_world == world) return old[rank].try_read(key, t) ? t : at::Tensor();
    // A per-slot state: resharded when it is a flat [S] tensor, else (a step count) as written.
    for (const auto& [slot, L] : full_numel)
      if (key.size() > slot.size() && key.compare(key.size() - slot.size(), slot.size(), slot) == 0 &&
          shape.size() == 1 && key.rfind("adamw.step.", 0) != 0) {
        at::Tensor any;
        if (!old[first].try_read(key, any)) return at::Tensor();
        return reshard(key, L, shape[0], any.scalar_type());
      }
    return old[first].try_read(key, t) ? t : at::Tensor();
  });
  at::Tensor rng;
  if (old[first].try_read("rng.cpu", rng)) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(rng);
  }
}

TrainState load_checkpoint(Session& run, AdamW& opt, const CheckpointRef& ck) {
  std::ifstream in(ck.dir / "state.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TrainState st;
  try {
    st.step = std::stoll(json_field(text, "step"));
    st.epoch = std::stoll(json_field(text, "epoch"));
    st.tokens_seen = std::stod(json_field(text, "tokens_seen"));
    st.cursor = json_field(text, "cursor");
    st.collator_state = json_field(text, "collator_state");
    if (sharded_state(run)) {
      QRUN_CHECK(fs::exists(ck.dir / "shards"),
                 "checkpoint {} holds whole parameters (a none or ddp run); this run shards them (fsdp2): "
                 "resume it with the sharding that wrote it", ck.dir.string());
      load_sharded(run, opt, ck.dir);
      return st;
    }
    QRUN_CHECK(!fs::exists(ck.dir / "shards"),
               "checkpoint {} holds sharded parameters (an fsdp2 run); resume it with sharding: fsdp2 (on any "
               "number of ranks)", ck.dir.string());
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
int64_t steps_per_epoch(Session& run, int64_t grad_accum) {
  auto stream = run.dataset->open(run.data_context(), 0, "");
  auto collator = make_component<Collator>(run.recipe, run.registry, "data.collator");
  int64_t batches = 0;
  while (collator->next(*stream)) batches++;
  // With several ranks the last short step keeps a multiple of the world size, or vanishes.
  const int64_t world = run.env.world_size, rest = batches % grad_accum;
  return batches / grad_accum + (rest / world > 0 ? 1 : 0);
}

}  // namespace

int train(const Recipe& r, const Registry& reg, bool resume) {
  Session run(r, reg);
  const bool rank0 = run.is_rank0();
  const int world = run.env.world_size;
  // The resolved recipe again, now with the backend of each operation (known once built).
  if (rank0) write_file_atomically(run.run_dir / "recipe.resolved.yaml", r.resolved_yaml(run.op_table.providers()));
  const Config& train = r.section("train");
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

  const auto trainable = run.trainable_parameters();
  const AdamWOptions ao = run.adamw_options();
  AdamW opt(trainable, ao);
  run.pick_step_kernels(opt);

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
  // Rank 0 alone writes metrics and TensorBoard and prints the progress line.
  MetricSinks sinks;
  sinks.jsonl_path = run.run_dir / "metrics.jsonl";
  if (rank0) {
    sinks.jsonl.open(sinks.jsonl_path, std::ios::app);
    QRUN_CHECK(sinks.jsonl.good(), "cannot write {}", sinks.jsonl_path.string());
  }
  if (rank0 && train.get_bool("tensorboard")) {
    sinks.tensorboard = std::make_unique<TensorBoardWriter>(run.run_dir);
    log_info("tensorboard: events in {} (tensorboard --logdir {})", sinks.tensorboard->path().string(),
             run.run_dir.string());
  }
  const DeviceInfo dev = device_info(run.device, train);
  const double peak = dev.peak_flops;
  const bool tty = rank0 && ::isatty(STDERR_FILENO) != 0;
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
  int64_t empty_batches = 0, dropped_micro = 0;

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
    // Several ranks run equal shares: an epoch's last, short global batch keeps a multiple of the
    // world size (sdk run.h, Note [Ranks and global batches]).
    if (world > 1 && micro.size() % static_cast<size_t>(world) != 0) {
      const size_t keep_n = micro.size() / static_cast<size_t>(world) * static_cast<size_t>(world);
      dropped_micro += static_cast<int64_t>(micro.size() - keep_n);
      micro.resize(keep_n);
      if (micro.empty()) continue;
    }
    if (micro.empty()) break;
    auto t0 = std::chrono::steady_clock::now();
    reset_peak_device_memory(run.device);
    for (auto& p : run.profilers) p->on_step_begin(st.step);
    const double lr = schedule_lr(kind, ao.lr, st.step, sched.get_int("warmup_steps"), total_steps,
                                  sched.get_float("min_lr_ratio"));
    StepOutcome so;
    fault_point(run, "step", st.step + 1);
    try {
      so = train_step(run, opt, trainable, micro, clip, lr, g_stop_signal.load() != 0);
    } catch (const c10::OutOfMemoryError& e) {
      int64_t real = 0, pad = 0, seqs = 0, longest = 0;
      for (const auto& b : micro) {
        real += b.real_tokens;
        pad += b.padding_tokens;
        seqs += b.num_seqs();
        for (int64_t i = 0; i < b.num_seqs(); ++i) longest = std::max(longest, b.seq.seq_len(i));
      }
      if (tty) std::fprintf(stderr, "\n");
      throw UserError(fmt::format(
          "step {}: out of memory on {} with {} tokens in the batch ({} real + {} padding, {} "
          "micro-batch{}, {} sequences, longest {}): {}\nTry:{}\n{}",
          st.step + 1, run.device.str(), real + pad, real, pad, micro.size(),
          micro.size() == 1 ? "" : "es", seqs, longest, e.what_without_backtrace(), oom_hints(r),
          last_ckpt ? fmt::format("The last checkpoint, {} (step {}), is intact: rerun with --resume "
                                  "to continue from it.",
                                  last_ckpt->dir.string(), last_ckpt->step)
                    : std::string("No checkpoint was written yet.")));
    }
    const double loss = so.loss, gnorm = so.grad_norm;
    const int64_t loss_tokens = so.loss_tokens, real = so.real, pad = so.pad;
    const bool finite = so.finite;
    const auto& seq_lens = so.seq_lens;
    const auto& sample_ids = so.sample_ids;
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
      if (so.stop) {
        stopped = true;
        break;
      }
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
    double mfu = std::isfinite(peak) ? tps * flops / (peak * world) : std::nan("");  // global tokens, all GPUs
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
    if (so.stop) {  // a signal on any rank: every rank stops after this same step
      if (tty) std::fprintf(stderr, "\n");
      log_info("signal {} received: saving a checkpoint, then stopping", g_stop_signal.load());
      stopped = true;
      break;
    }
    if (every > 0 && st.step % every == 0 && st.step < total_steps)
      last_ckpt = save_checkpoint(run, opt, st, ckpt_root, keep);
  }
  if (eval_every > 0 && !stopped && last_eval_step != st.step) evaluate_now();
  if (ckc.get_bool("save_final") || stopped) last_ckpt = save_checkpoint(run, opt, st, ckpt_root, keep);
  for (auto& p : run.profilers) p->on_run_end();
  if (empty_batches > 0)
    log_info("{} batches had no loss tokens (nothing to train on) and were skipped", empty_batches);
  if (dropped_micro > 0)
    log_info("{} micro-batches at epoch ends were left out to keep the {} ranks' shares equal", dropped_micro, world);
  double secs = seconds_since(t_start);
  log_info("{}: {} steps in {}, {:.0f} tokens, {:.0f} tokens/s, last loss {:.4f}; metrics in {}",
           stopped ? "stopped" : "done", st.step - start_step, human_duration(secs),
           st.tokens_seen, st.tokens_seen / std::max(secs, 1e-9), last_loss,
           sinks.jsonl_path.string());
  return 0;
}

int evaluate(const Recipe& r, const Registry& reg) {
  Session run(r, reg);
  EvalResult e = run_eval(run, 0);
  std::printf("{\"dataset\": \"%s\", \"samples\": %lld, \"loss_tokens\": %lld, \"loss\": %.6f, \"perplexity\": %.4f}\n",
              run.eval_path(), static_cast<long long>(e.samples), static_cast<long long>(e.loss_tokens),
              e.loss, std::exp(e.loss));
  return 0;
}

}  // namespace qrun
