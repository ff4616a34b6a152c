// framework/bench.cpp - see bench.h.
#include "bench.h"

#include "components.h"
#include "host_info.h"
#include "optimizer.h"
#include "plugin_loader.h"
#include "recipe.h"
#include "registry.h"
#include "session.h"
#include "text.h"

#include <ATen/DeviceAccelerator.h>
#include <torch/cuda.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;
using nlohmann::json;

namespace qrun {
namespace {

// Seconds since this process started (from /proc: the kernel's start time of the process in
// clock ticks since boot, against the uptime), so "launch to the end of the first step" includes
// the dynamic loader, plugin loading and the recipe.
double seconds_since_launch() {
  std::ifstream stat("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::ifstream up("/proc/uptime");
  double uptime = 0;
  up >> uptime;
  size_t close = text.rfind(')');
  if (close == std::string::npos || uptime <= 0) return std::nan("");
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) return uptime - std::stod(field) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  return std::nan("");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  size_t lo = static_cast<size_t>(pos);
  size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

// `--name value` options that may repeat, and positional arguments.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> opts;
  std::string last(const std::string& k, const std::string& def = "") const {
    auto it = opts.find(k);
    return it == opts.end() || it->second.empty() ? def : it->second.back();
  }
  std::vector<std::string> all(const std::string& k) const {
    auto it = opts.find(k);
    return it == opts.end() ? std::vector<std::string>{} : it->second;
  }
  bool flag(const std::string& k) const { return opts.count(k) > 0; }
};

Args parse_args(const std::string& cmd, const std::vector<std::string>& args,
                const std::vector<std::string>& value_opts, const std::vector<std::string>& flags) {
  Args a;
  std::vector<std::string> known = value_opts;
  known.insert(known.end(), flags.begin(), flags.end());
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& s = args[i];
    if (s.rfind("--", 0) != 0) {
      a.positional.push_back(s);
      continue;
    }
    std::string name = s.substr(0, s.find('='));
    const bool takes = std::find(value_opts.begin(), value_opts.end(), name) != value_opts.end();
    const bool is_flag = std::find(flags.begin(), flags.end(), name) != flags.end();
    QRUN_CHECK(takes || is_flag, "{}: unknown option '{}'{}; allowed: {}", cmd, name,
               did_you_mean(name, known), join(known));
    if (is_flag) {
      a.opts[name].push_back("true");
    } else if (s.find('=') != std::string::npos) {
      a.opts[name].push_back(s.substr(s.find('=') + 1));
    } else {
      QRUN_CHECK(i + 1 < args.size(), "{}: {} needs a value", cmd, name);
      a.opts[name].push_back(args[++i]);
    }
  }
  return a;
}

int64_t int_option(const Args& a, const std::string& cmd, const std::string& k, int64_t def, int64_t min) {
  std::string v = a.last(k);
  if (v.empty()) return def;
  int64_t out = 0;
  QRUN_CHECK(parse_int(v, out) && out >= min, "{}: {} must be an integer >= {}, got '{}'", cmd, k, min, v);
  return out;
}

double float_option(const Args& a, const std::string& cmd, const std::string& k, double def) {
  std::string v = a.last(k);
  if (v.empty()) return def;
  try {
    size_t used = 0;
    double d = std::stod(v, &used);
    QRUN_CHECK(used == v.size() && d >= 0, "bad");
    return d;
  } catch (const std::exception&) {
    throw UserError(fmt::format("{}: {} must be a number >= 0, got '{}'", cmd, k, v));
  }
}

struct BenchOptions {
  int64_t steps = 10, warmup = 3;
  std::string synthetic;  // "" = the recipe's data
  bool profile = false;
  std::string label;
};

// The override that puts the synthetic dataset in the recipe's data.dataset.
std::string synthetic_override(const std::string& spec, const Recipe& r) {
  std::map<std::string, std::string> kv;
  const ComponentSpec* coll = r.component("data.collator");
  if (coll && coll->config.has("tokens_per_batch"))
    kv["max_len"] = std::to_string(coll->config.get_int("tokens_per_batch"));
  if (spec != "chat") {
    std::stringstream ss(spec);
    std::string item;
    while (std::getline(ss, item, ',')) {
      size_t eq = item.find('=');
      QRUN_CHECK(eq != std::string::npos && eq > 0,
                 "--synthetic: '{}' is not key=value (SPEC is `chat` or settings of "
                 "dataset/synthetic, e.g. lengths=fixed,median=8192; see qrun plugins explain "
                 "dataset/synthetic)",
                 item);
      kv[item.substr(0, eq)] = item.substr(eq + 1);
    }
  }
  std::string flow = "{plugin: synthetic";
  for (const auto& [k, v] : kv) flow += fmt::format(", {}: {}", k, v);
  return "data.dataset=" + flow + "}";
}

Recipe load_bench_recipe(const std::string& file, std::vector<std::string> overrides,
                         const std::string& synthetic, const Registry& reg) {
  Recipe r = load_recipe(file, overrides, reg);
  if (synthetic.empty()) {
    QRUN_CHECK(r.component("data.dataset") != nullptr,
               "{}: the recipe names no data.dataset; give --synthetic chat (or a SPEC)", file);
    return r;
  }
  QRUN_CHECK(reg.find("dataset", "synthetic") != nullptr,
             "--synthetic needs the dataset/synthetic plugin (libqrun-synthetic.so), which is not "
             "installed; see qrun plugins list");
  overrides.push_back(synthetic_override(synthetic, r));
  return load_recipe(file, overrides, reg);
}

json plugins_json(const Registry& reg) {
  json out = json::array();
  for (const auto& o : reg.plugins())
    out.push_back({{"name", o->name}, {"version", o->version}, {"build_id", o->build_id},
                   {"cuda_major", o->cuda_major}, {"path", o->path}});
  return out;
}

std::string component_name(const Recipe& r, const std::string& path) {
  const ComponentSpec* c = r.component(path);
  return c ? c->name : "";
}

// Reads a step-stats kernel table (calls, total_ns, name per line).
json profile_from_table(const fs::path& file, double step_seconds) {
  std::ifstream in(file);
  if (!in) return nullptr;
  std::string line;
  std::getline(in, line);  // header
  struct Row {
    std::string name, group;
    int64_t calls;
    double ms;
  };
  std::vector<Row> rows;
  while (std::getline(in, line)) {
    size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
    if (t1 == std::string::npos || t2 == std::string::npos) continue;
    Row r;
    r.calls = std::stoll(line.substr(0, t1));
    r.ms = std::stod(line.substr(t1 + 1, t2 - t1 - 1)) / 1e6;
    r.name = line.substr(t2 + 1);
    r.group = kernel_group(r.name);
    rows.push_back(std::move(r));
  }
  const double step_ms = step_seconds * 1e3;
  std::map<std::string, std::pair<double, int64_t>> groups;
  double kernel_ms = 0;
  for (const auto& r : rows) {
    groups[r.group].first += r.ms;
    groups[r.group].second += r.calls;
    kernel_ms += r.ms;
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> g(groups.begin(), groups.end());
  std::sort(g.begin(), g.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  json out;
  out["step_time_ms"] = step_ms;
  out["kernel_time_ms"] = kernel_ms;
  out["groups"] = json::array();
  for (const auto& [name, v] : g)
    out["groups"].push_back({{"group", name}, {"time_ms", v.first}, {"share", v.first / step_ms},
                             {"kernels", v.second}});
  out["top_kernels"] = json::array();
  for (size_t i = 0; i < rows.size() && i < 15; ++i)
    out["top_kernels"].push_back({{"name", rows[i].name}, {"group", rows[i].group},
                                  {"calls", rows[i].calls}, {"time_ms", rows[i].ms},
                                  {"share", rows[i].ms / step_ms}});
  return out;
}

// Runs the benchmark of one recipe; returns its report.
json bench_recipe(const Recipe& r, const Registry& reg, const BenchOptions& bo, const fs::path& work) {
  // "Launch to the end of the first step": the process's start-up before the first benchmark
  // (loader, plugins, recipe) plus this benchmark's own time to its first step, so that B of a
  // compare is not charged with A's run.
  static const double launch_overhead = seconds_since_launch();
  const auto t_begin = std::chrono::steady_clock::now();
  Session s(r, reg);
  const Config& train = r.section("train");
  const DeviceInfo dev = device_info(s.device, train);
  const auto trainable = s.trainable_parameters();
  const AdamWOptions ao = s.adamw_options();
  AdamW opt(trainable, ao);
  s.pick_step_kernels(opt);
  const int64_t grad_accum = train.get_int("grad_accum");
  const double clip = train.get_float("clip_grad_norm");
  const Config& sched = r.section("schedule");
  const std::string sn = sched.get_string("name");
  const ScheduleKind kind = sn == "constant" ? ScheduleKind::Constant
                            : sn == "linear" ? ScheduleKind::Linear
                                             : ScheduleKind::Cosine;
  const int64_t total = bo.warmup + bo.steps + 1;  // + the counting step
  ModelSummary ms = s.model->summary();
  log_info("bench: {} on {} ({}), {} warm-up + {} measured steps + 1 counting step", ms.description,
           s.device.str(), dev.name, bo.warmup, bo.steps);

  int64_t epoch = 0;
  auto stream = s.dataset->open(s.data_context(), epoch, "");
  auto next_micro = [&]() {
    std::vector<Batch> micro;
    int64_t reopened = 0;
    while (static_cast<int64_t>(micro.size()) < grad_accum) {
      auto b = s.collator->next(*stream);
      if (b) {
        if (b->loss_tokens > 0) micro.push_back(std::move(*b));
        continue;
      }
      QRUN_CHECK(++reopened < 3, "{}: the data gives no batch with loss tokens", r.file);
      stream = s.dataset->open(s.data_context(), ++epoch, "");
      s.collator->restore("{}");
    }
    return micro;
  };

  json per_step = json::array();
  std::vector<double> times, real_v, pad_v, flops_v;
  double peak_alloc = std::nan(""), peak_reserved = std::nan(""), first_step_s = std::nan("");
  for (int64_t i = 0; i < bo.warmup + bo.steps; ++i) {
    std::vector<Batch> micro = next_micro();
    reset_peak_device_memory(s.device);
    const double lr = schedule_lr(kind, ao.lr, i, sched.get_int("warmup_steps"), total,
                                  sched.get_float("min_lr_ratio"));
    auto t0 = std::chrono::steady_clock::now();
    StepOutcome so;
    try {
      so = train_step(s, opt, trainable, micro, clip, lr);
    } catch (const c10::OutOfMemoryError& e) {
      throw UserError(fmt::format("bench step {}: out of memory on {}: {}\nTry:{}", i + 1, s.device.str(),
                                  e.what_without_backtrace(), oom_hints(r)));
    }
    const double dt = seconds_since(t0);
    if (i == 0) first_step_s = launch_overhead + seconds_since(t_begin);
    if (!so.finite) {
      log_warn("bench step {}: loss or gradient not finite (loss {}, norm {})", i + 1, so.loss, so.grad_norm);
      opt.zero_grad();
    }
    const bool warm = i < bo.warmup;
    per_step.push_back({{"step", i + 1}, {"warmup", warm}, {"time_s", dt}, {"loss", num(so.loss)},
                        {"grad_norm", num(so.grad_norm)}, {"real_tokens", so.real},
                        {"padding_tokens", so.pad}, {"sequences", so.seq_lens.size()}});
    log_info("bench step {}{}: {:.4f} s, loss {:.4f}, {} real + {} padding tokens", i + 1,
             warm ? " (warm-up)" : "", dt, so.loss, so.real, so.pad);
    if (warm) continue;
    times.push_back(dt);
    real_v.push_back(static_cast<double>(so.real));
    pad_v.push_back(static_cast<double>(so.pad));
    flops_v.push_back(s.model->train_flops_per_token(so.seq_lens) * static_cast<double>(so.real));
    if (s.device.is_cuda()) {
      auto [a, b] = peak_device_memory_mib(s.device);
      peak_alloc = std::isfinite(peak_alloc) ? std::max(peak_alloc, a) : a;
      peak_reserved = std::isfinite(peak_reserved) ? std::max(peak_reserved, b) : b;
    }
  }

  // The counting step, under step-stats (its Kineto session would distort a timed step).
  double cpu_ops = std::nan(""), kernels = std::nan(""), busy = std::nan("");
  json profile = nullptr;
  std::string profile_note;
  if (reg.find("profiler", "step-stats") != nullptr) {
    fs::create_directories(work);
    auto stats = reg.create<Profiler>("step-stats", Config("bench.step-stats",
                                                           {{"gpu", true}, {"kernel_table", bo.profile}}));
    stats->on_run_start(work.string());
    std::vector<Batch> micro = next_micro();
    const int64_t step = bo.warmup + bo.steps + 1;
    stats->on_step_begin(step);
    auto t0 = std::chrono::steady_clock::now();
    StepOutcome so = train_step(s, opt, trainable, micro, clip, ao.lr);
    const double dt = seconds_since(t0);
    stats->on_step_end(StepRecord{step, dt, so.real, so.pad, so.loss_tokens, so.loss});
    for (const auto& [k, v] : stats->step_metrics()) {
      if (k == "cpu_ops") cpu_ops = v;
      if (k == "gpu_kernels") kernels = v;
      if (k == "gpu_busy") busy = v;
    }
    stats->on_run_end();
    if (bo.profile) {
      profile = profile_from_table(work / fmt::format("kernels-step-{}.tsv", step), dt);
      if (profile.is_null()) profile_note = "no GPU kernels traced (CPU run or no CUDA profiler)";
    }
  } else {
    profile_note = "the profilers plugin (step-stats) is not installed";
    log_warn("bench: {}; CPU operator calls, GPU kernels and busy time are null", profile_note);
  }

  double sum_t = 0, sum_real = 0, sum_pad = 0, sum_flops = 0;
  for (size_t i = 0; i < times.size(); ++i) {
    sum_t += times[i];
    sum_real += real_v[i];
    sum_pad += pad_v[i];
    sum_flops += flops_v[i];
  }
  const double tps = sum_t > 0 ? sum_real / sum_t : std::nan("");
  const double mfu = sum_t > 0 && std::isfinite(dev.peak_flops) ? sum_flops / sum_t / dev.peak_flops : std::nan("");
  json summary = {
      {"tokens_per_s", num(tps)},
      {"mfu", num(mfu)},
      {"step_time_median_s", num(percentile(times, 50))},
      {"step_time_p90_s", num(percentile(times, 90))},
      {"gpu_kernels_per_step", num(kernels)},
      {"cpu_ops_per_step", num(cpu_ops)},
      {"gpu_busy", num(busy)},
      {"peak_gpu_allocated_mib", num(peak_alloc)},
      {"peak_gpu_reserved_mib", num(peak_reserved)},
      {"padding_fraction", num(sum_real + sum_pad > 0 ? sum_pad / (sum_real + sum_pad) : std::nan(""))},
      {"first_step_s", num(first_step_s)},
      {"model_build_s", s.build_seconds},
      {"train_flops_per_token", num(sum_real > 0 ? sum_flops / sum_real : std::nan(""))},
  };
  json out = {
      {"kind", "bench"},
      {"recipe", r.file},
      {"label", bo.label.empty() ? fs::path(r.file).stem().string() : bo.label},
      {"qrun", {{"version", qrun_version()}, {"commit", build_id()}}},
      {"device", {{"name", dev.name}, {"driver", dev.driver.empty() ? json(nullptr) : json(dev.driver)},
                  {"cuda_runtime", dev.cuda_runtime.empty() ? json(nullptr) : json(dev.cuda_runtime)},
                  {"peak_tflops", num(dev.peak_flops / 1e12)}, {"peak_source", dev.peak_source}}},
      {"model", {{"description", ms.description}, {"num_layers", ms.num_layers},
                 {"num_parameters", ms.num_parameters}, {"vocab_size", ms.vocab_size}}},
      {"kernels", {{"attention", component_name(r, "kernels.attention")},
                   {"linear_attention", component_name(r, "kernels.linear_attention")},
                   {"conv1d", component_name(r, "kernels.conv1d")},
                   {"ops", component_name(r, "kernels.ops")},
                   {"optimizer_step", opt.kernel_name()},
                   {"grad_norm", s.square_sum_name}}},
      {"data", {{"dataset", component_name(r, "data.dataset")}, {"collator", component_name(r, "data.collator")},
                {"synthetic", bo.synthetic.empty() ? json(nullptr) : json(bo.synthetic)}}},
      {"precision", {{"param", r.section("precision").get_string("param")},
                     {"compute", r.section("precision").get_string("compute")}}},
      {"steps", bo.steps},
      {"warmup", bo.warmup},
      {"grad_accum", grad_accum},
      {"plugins", plugins_json(reg)},
      {"per_step", per_step},
      {"summary", summary},
      {"profile", profile},
  };
  if (!profile_note.empty()) out["profile_note"] = profile_note;
  return out;
}

std::string cell(const json& v, const char* spec = "{:.4g}") {
  if (v.is_null()) return "n/a";
  if (v.is_number()) return fmt::format(fmt::runtime(spec), v.get<double>());
  return v.dump();
}

struct Figure {
  const char* key;
  const char* name;
  const char* spec;
};
const std::vector<Figure> kFigures = {
    {"tokens_per_s", "real tokens/s", "{:.1f}"},
    {"mfu", "MFU", "{:.4f}"},
    {"step_time_median_s", "step time median (s)", "{:.4f}"},
    {"step_time_p90_s", "step time p90 (s)", "{:.4f}"},
    {"gpu_kernels_per_step", "GPU kernels per step", "{:.0f}"},
    {"cpu_ops_per_step", "CPU operator calls per step", "{:.0f}"},
    {"gpu_busy", "GPU busy fraction", "{:.3f}"},
    {"peak_gpu_allocated_mib", "peak GPU memory (MiB)", "{:.0f}"},
    {"padding_fraction", "padding fraction", "{:.3f}"},
    {"first_step_s", "launch to end of step 1 (s)", "{:.2f}"},
    {"model_build_s", "model build (s)", "{:.2f}"},
};

void print_bench(const json& b) {
  std::printf("bench %s: %s on %s (commit %s)\n", b["label"].get<std::string>().c_str(),
              b["model"]["description"].get<std::string>().c_str(),
              b["device"]["name"].get<std::string>().c_str(), b["qrun"]["commit"].get<std::string>().c_str());
  for (const auto& f : kFigures) std::printf("  %-32s %s\n", f.name, cell(b["summary"][f.key], f.spec).c_str());
  if (b.contains("profile") && !b["profile"].is_null()) {
    const json& p = b["profile"];
    std::printf("  one step's kernels by group (step %.1f ms, kernels %.1f ms):\n",
                p["step_time_ms"].get<double>(), p["kernel_time_ms"].get<double>());
    for (const auto& g : p["groups"])
      std::printf("    %-34s %9.2f ms %6.1f%%  %6lld kernels\n", g["group"].get<std::string>().c_str(),
                  g["time_ms"].get<double>(), 100 * g["share"].get<double>(),
                  static_cast<long long>(g["kernels"].get<int64_t>()));
    std::printf("  top kernels:\n");
    for (const auto& k : p["top_kernels"]) {
      std::string n = k["name"].get<std::string>();
      if (n.size() > 90) n = n.substr(0, 87) + "...";
      std::printf("    %9.2f ms %6.1f%% %5lld x  [%s] %s\n", k["time_ms"].get<double>(),
                  100 * k["share"].get<double>(), static_cast<long long>(k["calls"].get<int64_t>()),
                  k["group"].get<std::string>().c_str(), n.c_str());
    }
  } else if (b.contains("profile_note")) {
    std::printf("  profile: %s\n", b["profile_note"].get<std::string>().c_str());
  }
}

void write_json(const fs::path& file, const json& j) {
  if (file.has_parent_path()) fs::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::trunc);
  out << j.dump(2) << "\n";
  out.close();
  QRUN_CHECK(out.good(), "cannot write {} (disk full?)", file.string());
  std::printf("json: %s\n", file.string().c_str());
}

// The plot next to the JSON, by scripts/plot_bench.py (matplotlib). The Python: $QRUN_PYTHON,
// else the one the build found (the project's .venv), else python3. The script: next to the
// binary's install (share/qrun) or in the source tree it was built from.
void plot(const fs::path& json_file) {
  std::string py = std::getenv("QRUN_PYTHON") ? std::getenv("QRUN_PYTHON") : QRUN_BUILD_PYTHON;
  if (py.empty() || !fs::exists(py)) py = "python3";
  fs::path script = executable_path().parent_path() / ".." / "share" / "qrun" / "plot_bench.py";
  if (!fs::exists(script)) script = fs::path(QRUN_SOURCE_DIR) / "scripts" / "plot_bench.py";
  fs::path png = json_file;
  png.replace_extension(".png");
  std::string cmd = fmt::format("'{}' '{}' '{}' '{}'", py, script.string(), json_file.string(), png.string());
  if (!fs::exists(script) || std::system(cmd.c_str()) != 0)
    log_warn("no plot: `{}` failed (needs Python with matplotlib); the JSON has every number", cmd);
}

BenchOptions bench_options(const Args& a, const std::string& cmd) {
  BenchOptions bo;
  bo.steps = int_option(a, cmd, "--steps", 10, 1);
  bo.warmup = int_option(a, cmd, "--warmup", 3, 0);
  bo.synthetic = a.last("--synthetic");
  bo.profile = a.flag("--profile");
  bo.label = a.last("--label");
  return bo;
}

}  // namespace

std::string kernel_group(const std::string& n) {
  auto has = [&n](const char* s) { return n.find(s) != std::string::npos; };
  if (has("gdn_") || has("gated_delta")) return "gated delta rule";
  if (has("flash") || has("fmha") || has("attention")) return "attention (fused)";
  if (has("conv1d") || has("causal_conv")) return "conv1d";
  if (has("qrun::fops")) return "ops (fused: norms, SwiGLU, loss rows)";
  if (has("nccl") || has("ncclDevKernel")) return "communication (NCCL)";
  if (has("adam") || has("Adam")) return "optimizer (AdamW)";
  if (has("gemm") || has("Gemm") || has("cutlass") || has("xmma") || has("nvjet") || has("cublas") ||
      has("sm90_") || has("sm80_") || has("wgmma"))
    return "GEMM (cuBLAS)";
  if (has("softmax") || has("SoftMax") || has("nll_loss") || has("cross_entropy")) return "softmax / loss";
  if (has("reduce_kernel") || has("norm") || has("Reduce")) return "reductions and norms";
  if (has("elementwise") || has("vectorized") || has("unrolled") || has("CatArray") || has("copy") ||
      has("fill") || has("index") || has("scatter") || has("gather"))
    return "element-wise and copies";
  return "other";
}

int run_bench_command(const std::vector<std::string>& args) {
  const std::string cmd = "bench";
  Args a = parse_args(cmd, args, {"--set", "--steps", "--warmup", "--synthetic", "--json", "--label"},
                      {"--profile"});
  QRUN_CHECK(a.positional.size() == 1,
             "bench: expected one recipe; usage: qrun bench <recipe.yaml> [--steps N] [--warmup N] "
             "[--synthetic SPEC] [--set k=v] [--json FILE] [--profile]");
  BenchOptions bo = bench_options(a, cmd);
  Registry reg;
  load_plugins(reg);
  Recipe r = load_bench_recipe(a.positional[0], a.all("--set"), bo.synthetic, reg);
  const fs::path run_dir = r.section("run").get_string("dir");
  json b = bench_recipe(r, reg, bo, run_dir / "bench");
  print_bench(b);
  fs::path out = a.last("--json").empty() ? run_dir / "bench.json" : fs::path(a.last("--json"));
  write_json(out, b);
  plot(out);
  return 0;
}

int run_compare_command(const std::vector<std::string>& args) {
  const std::string cmd = "compare";
  Args a = parse_args(cmd, args,
                      {"--set", "--set-a", "--set-b", "--steps", "--warmup", "--synthetic", "--json",
                       "--loss-tol", "--grad-tol"},
                      {"--profile"});
  QRUN_CHECK(a.positional.size() == 1 || a.positional.size() == 2,
             "compare: expected one or two recipes; usage: qrun compare <a.yaml> [<b.yaml>] "
             "[--set-a k=v] [--set-b k=v] [--set k=v] [--steps N] [--synthetic SPEC] [--json FILE]");
  const std::string fa = a.positional[0], fb = a.positional.size() == 2 ? a.positional[1] : a.positional[0];
  QRUN_CHECK(!(fa == fb && a.all("--set-a") == a.all("--set-b")) || a.positional.size() == 1,
             "compare: A and B are the same recipe with the same settings");
  const double loss_tol = float_option(a, cmd, "--loss-tol", 1e-2);
  const double grad_tol = float_option(a, cmd, "--grad-tol", 5e-2);
  BenchOptions bo = bench_options(a, cmd);
  Registry reg;
  load_plugins(reg);
  auto with = [&](const std::vector<std::string>& side) {
    std::vector<std::string> o = a.all("--set");
    o.insert(o.end(), side.begin(), side.end());
    return o;
  };
  // Both recipes load (and validate) before either runs.
  Recipe ra = load_bench_recipe(fa, with(a.all("--set-a")), bo.synthetic, reg);
  Recipe rb = load_bench_recipe(fb, with(a.all("--set-b")), bo.synthetic, reg);
  const fs::path run_dir = ra.section("run").get_string("dir");
  BenchOptions boa = bo, bob = bo;
  boa.label = fs::path(fa).stem().string() + (a.all("--set-a").empty() ? "" : " " + join(a.all("--set-a"), " "));
  bob.label = fs::path(fb).stem().string() + (a.all("--set-b").empty() ? "" : " " + join(a.all("--set-b"), " "));
  json A = bench_recipe(ra, reg, boa, run_dir / "compare-a");
  if (torch::cuda::is_available()) at::accelerator::emptyCache();
  json B = bench_recipe(rb, reg, bob, run_dir / "compare-b");

  json ratios;
  for (const auto& f : kFigures) {
    const json &x = A["summary"][f.key], &y = B["summary"][f.key];
    ratios[f.key] = x.is_number() && y.is_number() && x.get<double>() != 0 ? json(y.get<double>() / x.get<double>())
                                                                        : json(nullptr);
  }
  json steps = json::array(), la = json::array(), lb = json::array(), ld = json::array(),
       ga = json::array(), gb = json::array(), gd = json::array();
  bool diverged = false, same_batches = true;
  json first_bad = nullptr;
  double worst_loss = 0, worst_grad = 0;
  for (size_t i = 0; i < A["per_step"].size() && i < B["per_step"].size(); ++i) {
    const json &sa = A["per_step"][i], &sb = B["per_step"][i];
    same_batches &= sa["real_tokens"] == sb["real_tokens"] && sa["padding_tokens"] == sb["padding_tokens"];
    const double xa = sa["loss"].is_number() ? sa["loss"].get<double>() : std::nan("");
    const double xb = sb["loss"].is_number() ? sb["loss"].get<double>() : std::nan("");
    const double na = sa["grad_norm"].is_number() ? sa["grad_norm"].get<double>() : std::nan("");
    const double nb = sb["grad_norm"].is_number() ? sb["grad_norm"].get<double>() : std::nan("");
    const double dl = std::abs(xa - xb);
    const double dg = std::abs(na - nb) / std::max(std::abs(na), 1e-12);
    steps.push_back(sa["step"]);
    la.push_back(num(xa));
    lb.push_back(num(xb));
    ld.push_back(num(dl));
    ga.push_back(num(na));
    gb.push_back(num(nb));
    gd.push_back(num(dg));
    const bool bad = !(dl <= loss_tol) || !(dg <= grad_tol);  // NaN counts as bad
    worst_loss = std::max(worst_loss, std::isfinite(dl) ? dl : INFINITY);
    worst_grad = std::max(worst_grad, std::isfinite(dg) ? dg : INFINITY);
    if (bad && !diverged) first_bad = sa["step"];
    diverged |= bad;
  }
  json numerics = {{"steps", steps}, {"loss_a", la}, {"loss_b", lb}, {"loss_abs_diff", ld},
                   {"grad_norm_a", ga}, {"grad_norm_b", gb}, {"grad_norm_rel_diff", gd},
                   {"max_loss_abs_diff", worst_loss}, {"max_grad_norm_rel_diff", worst_grad},
                   {"same_batches", same_batches},
                   {"tolerance", {{"loss_abs", loss_tol}, {"grad_norm_rel", grad_tol}}},
                   {"verdict", diverged ? "diverged" : "same"}, {"first_divergent_step", first_bad}};
  json out = {{"kind", "compare"}, {"a", A}, {"b", B}, {"ratios", ratios}, {"numerics", numerics}};

  std::printf("compare on %s (commit %s), %lld measured steps after %lld warm-up\n",
              A["device"]["name"].get<std::string>().c_str(), A["qrun"]["commit"].get<std::string>().c_str(),
              static_cast<long long>(bo.steps), static_cast<long long>(bo.warmup));
  std::printf("  A = %s\n  B = %s\n", boa.label.c_str(), bob.label.c_str());
  std::printf("  %-32s %14s %14s %10s\n", "", "A", "B", "B/A");
  for (const auto& f : kFigures)
    std::printf("  %-32s %14s %14s %10s\n", f.name, cell(A["summary"][f.key], f.spec).c_str(),
                cell(B["summary"][f.key], f.spec).c_str(), cell(ratios[f.key], "{:.3f}").c_str());
  std::printf("  %-6s %14s %14s %12s %12s\n", "step", "loss A", "loss B", "|dloss|", "d|g|/|g|");
  for (size_t i = 0; i < steps.size(); ++i)
    std::printf("  %-6lld %14s %14s %12s %12s\n", static_cast<long long>(steps[i].get<int64_t>()),
                cell(la[i], "{:.6f}").c_str(), cell(lb[i], "{:.6f}").c_str(), cell(ld[i], "{:.2e}").c_str(),
                cell(gd[i], "{:.2e}").c_str());
  if (!same_batches) std::printf("  note: A and B saw different batches (their data settings differ)\n");
  std::printf("numerics: %s (max |loss A - loss B| %.3g, tolerance %.3g; max gradient-norm relative "
              "difference %.3g, tolerance %.3g)%s\n",
              diverged ? "DIVERGED" : "same within tolerance", worst_loss, loss_tol, worst_grad, grad_tol,
              diverged ? fmt::format("; first at step {}", first_bad.dump()).c_str() : "");
  fs::path file = a.last("--json").empty() ? run_dir / "compare.json" : fs::path(a.last("--json"));
  write_json(file, out);
  plot(file);
  return diverged ? 3 : 0;
}

}  // namespace qrun
