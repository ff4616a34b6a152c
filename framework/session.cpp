// framework/session.cpp - see session.h.
#include "session.h"

#include "components.h"
#include "distributed.h"
#include "log_backend.h"
#include "kernel_check.h"
#include "text.h"

#include <ATen/DeviceAccelerator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <dlfcn.h>

#include <chrono>
#include <map>
#include <numeric>

namespace qrun {

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

namespace {

c10::ScalarType dtype_of(const std::string& s) { return s == "bf16" ? c10::kBFloat16 : c10::kFloat; }

// The device's name and the driver's CUDA version from the CUDA driver API, opened at run time:
// LibTorch's C++ API has no device-name query outside its CUDA headers, which CPU builds of the
// host do not have, and the driver library exists exactly where a GPU does. Five calls, no
// headers (their C signatures are stable since CUDA 2).
struct DriverFacts {
  std::string name, version;
  double total_bytes = 0;  // the device's memory
};
DriverFacts driver_facts(int index) {
  DriverFacts f;
  void* h = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (h == nullptr) return f;
  using InitFn = int (*)(unsigned);
  using GetFn = int (*)(int*, int);
  using NameFn = int (*)(char*, int, int);
  using VersionFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(::dlsym(h, "cuInit"));
  auto get = reinterpret_cast<GetFn>(::dlsym(h, "cuDeviceGet"));
  auto name = reinterpret_cast<NameFn>(::dlsym(h, "cuDeviceGetName"));
  auto version = reinterpret_cast<VersionFn>(::dlsym(h, "cuDriverGetVersion"));
  int dev = 0, v = 0;
  char buf[256] = {0};
  if (init && get && name && init(0) == 0 && get(&dev, index) == 0 && name(buf, sizeof(buf), dev) == 0)
    f.name = buf;
  if (version && version(&v) == 0) f.version = fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
  using MemFn = int (*)(size_t*, int);
  auto mem = reinterpret_cast<MemFn>(::dlsym(h, "cuDeviceTotalMem_v2"));
  size_t bytes = 0;
  if (mem && !f.name.empty() && mem(&bytes, dev) == 0) f.total_bytes = static_cast<double>(bytes);
  return f;  // the handle stays open: the CUDA runtime holds the same library
}

}  // namespace

double known_peak_tflops(const std::string& name, std::string* matched) {
  // Dense (no sparsity) bf16 tensor-core peaks from the vendors' data sheets, most specific first.
  struct Known {
    const char* pattern;
    const char* label;
    double tflops;
  };
  static const Known table[] = {
      {"H100 PCIe", "H100 PCIe", 756.0},  {"H100 NVL", "H100 NVL", 835.0},
      {"GH200", "GH200", 989.4},          {"H200", "H200", 989.4},
      {"H100", "H100 SXM", 989.4},        {"H800", "H800 SXM", 989.4},
      {"B200", "B200", 2250.0},           {"A100", "A100", 312.0},
      {"A800", "A800", 312.0},            {"L40S", "L40S", 362.05},
  };
  for (const auto& k : table)
    if (name.find(k.pattern) != std::string::npos) {
      if (matched) *matched = k.label;
      return k.tflops;
    }
  return std::nan("");
}

DeviceInfo device_info(const c10::Device& device, const Config& train) {
  DeviceInfo d;
  if (device.is_cuda()) {
    DriverFacts f = driver_facts(device.index() < 0 ? 0 : device.index());
    d.name = f.name.empty() ? "unknown CUDA device" : f.name;
    d.driver = f.version;
    d.memory_bytes = f.total_bytes;
    long rt = at::detail::getCUDAHooks().versionCUDART();
    if (rt > 0) d.cuda_runtime = fmt::format("{}.{}", rt / 1000, (rt % 1000) / 10);
  } else {
    d.name = "cpu";
  }
  const double set = train.get_float("peak_tflops");
  std::string label;
  if (set > 0) {
    d.peak_flops = set * 1e12;
    d.peak_source = "train.peak_tflops";
  } else if (device.is_cuda() && std::isfinite(known_peak_tflops(d.name, &label))) {
    d.peak_flops = known_peak_tflops(d.name) * 1e12;
    d.peak_source = fmt::format("device table ({})", label);
  } else {
    d.peak_source = device.is_cuda() ? "unknown device: set train.peak_tflops" : "cpu: no peak";
  }
  return d;
}

// Peak device memory through the caching allocator's statistics (the device-generic face of
// c10::cuda::CUDACachingAllocator, so CPU-only builds link too).
void reset_peak_device_memory(const c10::Device& d) {
  if (d.is_cuda()) at::accelerator::resetPeakStats(d.index());
}
std::pair<double, double> peak_device_memory_mib(const c10::Device& d) {
  auto stats = at::accelerator::getDeviceStats(d.index());
  constexpr auto kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return {static_cast<double>(stats.allocated_bytes[kAll].peak) / (1 << 20),
          static_cast<double>(stats.reserved_bytes[kAll].peak) / (1 << 20)};
}

namespace {

// The transport for ranks on `device`: the first installed one that connects it.
std::unique_ptr<Transport> pick_transport(const Registry& reg, c10::DeviceType device) {
  std::vector<std::string> why;
  for (const RegistryEntry* e : reg.entries()) {
    if (e->info.kind != Transport::kKind || !e->conflicts.empty()) continue;
    auto t = reg.create<Transport>(e->info.name, Config("transport", {}));
    const std::string no = t->unsupported(device);
    if (no.empty()) return t;
    why.push_back(fmt::format("{}: {}", e->info.name, no));
  }
  QRUN_CHECK(false, "no installed transport connects {} ranks{}{}", c10::DeviceTypeName(device, true),
             why.empty() ? " (none is installed: the nccl-transport plugin is built with CUDA)" : ": ",
             join(why, "; "));
  return nullptr;
}

std::string gib(double bytes) {
  return bytes >= (1ull << 30) ? fmt::format("{:.1f} GiB", bytes / (1ull << 30))
                               : fmt::format("{:.1f} MiB", bytes / (1ull << 20));
}

// Note [Memory model]: per rank, before any weight is loaded: parameters, gradients and optimizer
// state as the sharding places them, the activations the model estimates for one micro-batch, and
// on a GPU whether they fit its memory. A run that cannot fit stops here (exit 2) with the numbers
// and what would make it fit.
void print_memory_model(const Recipe& r, const Model& model, const Sharding* sharding, int world,
                        const c10::Device& device, const ModelPlacement& p) {
  const ModelSummary ms = model.summary();
  const double numel = static_cast<double>(ms.num_parameters);
  const int pb = p.param_dtype == c10::kFloat ? 4 : 2, ab = p.compute_dtype == c10::kFloat ? 4 : 2;
  const bool master = r.section("precision").get_bool("master_weights") && pb != 4;
  const int sb = master ? 4 : pb;
  Sharding::Memory m;
  if (sharding) {
    m = sharding->memory_per_rank(numel, pb, sb, master, world);
  } else {
    m.params = numel * pb;
    m.grads = numel * pb;
    m.optimizer = numel * (2.0 * sb + (master ? 4 : 0));
  }
  const ComponentSpec* coll = r.component("data.collator");
  const double tokens = coll && coll->config.has("tokens_per_batch") ? static_cast<double>(coll->config.get_int("tokens_per_batch")) : 0;
  const ComponentSpec* mc = r.component("model");
  const bool ckpt = mc && mc->config.has("activation_checkpointing") &&
                    std::get<std::string>(mc->config.values().at("activation_checkpointing")) != "none";
  const double act = tokens * model.activation_bytes_per_token(ckpt, ab);
  const double total = m.params + m.grads + m.optimizer + (std::isfinite(act) ? act : 0.0);
  log_info("memory per rank ({} rank{}, {}): parameters {}, gradients {}, optimizer {}, activations {} ({} "
           "tokens{}): about {} (not counted: gathered units and communication buffers)", world, world == 1 ? "" : "s", sharding ? r.component("sharding") ? r.component("sharding")->name : "none" : "none",
           gib(m.params), gib(m.grads), gib(m.optimizer), std::isfinite(act) ? gib(act) : "unknown",
           static_cast<int64_t>(tokens), ckpt ? ", checkpointed" : "", gib(total));
  if (!device.is_cuda()) return;
  const DeviceInfo di = device_info(device, r.section("train"));
  if (di.memory_bytes <= 0) return;
  const double usable = 0.95 * di.memory_bytes;
  if (total <= usable) return;
  std::vector<std::string> fixes;
  // The whole (unsplit) state, to be split by fsdp2.
  const double whole = numel * (2.0 * pb + 2.0 * sb + (master ? 4.0 : 0.0));
  if (std::isfinite(act) && act < usable) {
    const int need = static_cast<int>(std::ceil(whole / (usable - act)));
    fixes.push_back(fmt::format("fsdp2 over at least {} GPUs of this size (sharding: fsdp2)", need));
  }
  if (!ckpt) fixes.push_back("activation checkpointing (model.activation_checkpointing: full)");
  fixes.push_back("fewer tokens per micro-batch (data.collator.tokens_per_batch)");
  fixes.push_back(fmt::format("fewer layers (model.num_layers, now {})", ms.num_layers));
  QRUN_CHECK(false, "{}: {} needs about {} per rank but {} has {}: parameters {}, gradients {}, optimizer {}, "
             "activations {}. Try {}", r.file, ms.description.substr(0, ms.description.find(',')), gib(total), di.name,
             gib(di.memory_bytes), gib(m.params), gib(m.grads), gib(m.optimizer),
             std::isfinite(act) ? gib(act) : "unknown", join(fixes, ", or "));
}

}  // namespace

Session::Session(const Recipe& r, const Registry& reg) : recipe(r), registry(reg) {
  run_dir = r.section("run").get_string("dir");
  device = pick_device(r.section("run"));
  // Note [Ranks and global batches] (sdk run.h): where this process sits, checked before any work.
  env = read_launch_env(environ_map());
  set_log_rank(env.rank, env.world_size);
  if (r.component("sharding")) sharding = make_component<Sharding>(r, reg, "sharding");
  else if (reg.find(Sharding::kKind, "none")) sharding = reg.create<Sharding>("none", Config("sharding", {}));
  if (env.distributed()) {
    const ComponentSpec* sh = r.component("sharding");
    QRUN_CHECK(sh != nullptr && sh->name != "none",
               "{}: this run has {} ranks ({}) but {}: set sharding: ddp or fsdp2", sh ? sh->location : r.file,
               env.world_size, env.source, sh ? "sharding is none" : "the recipe names no sharding");
    const int64_t ga = r.section("train").get_int("grad_accum");
    QRUN_CHECK(ga % env.world_size == 0,
               "{}: train.grad_accum {} (micro-batches per step, over all ranks) is not a multiple of the {} "
               "ranks; set it to a multiple, e.g. {}",
               r.section("train").location("grad_accum"), ga, env.world_size, env.world_size * ((ga + env.world_size - 1) / env.world_size));
    if (device.is_cuda()) {
      // One GPU per rank: LOCAL_RANK picks it, unless the launcher shows each rank only its own
      // (SLURM's --gpus-per-task, CUDA_VISIBLE_DEVICES per rank): then it is device 0.
      const int64_t n = static_cast<int64_t>(torch::cuda::device_count());
      const int64_t index = n == 1 ? 0 : env.local_rank;
      QRUN_CHECK(index < n,
                 "launch: rank {} has LOCAL_RANK {} but this node shows {} CUDA device{}: one rank per GPU "
                 "(NCCL refuses two ranks on one GPU); start at most {} ranks per node", env.rank,
                 env.local_rank, n, n == 1 ? "" : "s", n);
      device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
      at::accelerator::setDeviceIndex(static_cast<c10::DeviceIndex>(index));
    }
  }
  // The ranks' collectives: for several ranks, and for a sharding that talks through them even
  // alone (fsdp2 gathers its shards: at world size 1 that is one rank's own).
  const ComponentSpec* sh = r.component("sharding");
  if (env.distributed() || (sh != nullptr && sh->name == "fsdp2")) {
    if (!env.distributed()) {
      env.master_addr = "127.0.0.1";
      env.master_port = free_tcp_port();
    }
    transport = pick_transport(reg, device.type());
    comm = transport->connect(env, device, r.section("run").get_float("dist_timeout_s"));
    log_info("ranks: {} of {} ({}), {} on {}", env.rank, env.world_size, env.source, sh->name, device.str());
  }
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
  print_memory_model(r, *model, sharding.get(), env.world_size, device, placement);
  // Every backend against every kernel use, before any weight is loaded (sdk kernels.h).
  check_kernel_uses(r, reg, *model,
                    {{Attention::kKind, attention.get()},
                     {LinearAttention::kKind, linear_attention.get()},
                     {Conv1d::kKind, conv1d.get()},
                     {Ops::kKind, ops.get()}},
                    device.type(), placement.compute_dtype, recipe_layouts(r, reg));
  op_table = compose_ops(r, reg, ops.get(), reference_ops);
  if (ops != nullptr && r.component("kernels.ops")->name != "reference") {
    std::map<std::string, std::vector<std::string>> by;
    for (const auto& [op, provider] : op_table.providers()) by[provider].push_back(op);
    std::vector<std::string> parts;
    for (const auto& [provider, names] : by) parts.push_back(fmt::format("{} from {}", join(names), provider));
    log_info("ops: {}", join(parts, "; "));
  }
  placement.seed = static_cast<uint64_t>(r.section("run").get_int("seed"));
  auto t0 = std::chrono::steady_clock::now();
  try {
    model->build({attention.get(), linear_attention.get(), conv1d.get(), &op_table}, placement);
  } catch (Error& e) {
    e.add_context(fmt::format("while building model '{}'", r.component("model")->name));
    throw;
  }
  if (sharding) {
    optimized = sharding->wrap(*model, comm.get());
  } else {
    for (auto& [n, p] : model->named_parameters())
      if (p.requires_grad()) optimized.push_back({n, p});
  }
  if (device.is_cuda()) torch::cuda::synchronize();
  build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  tokenizer = make_component<Tokenizer>(r, reg, "data.tokenizer");
  chat = make_component<ChatFormat>(r, reg, "data.chat_format");
  dataset = make_component<Dataset>(r, reg, "data.dataset");
  collator = make_component<Collator>(r, reg, "data.collator");
  // Profilers observe rank 0's steps (their files would collide across ranks).
  if (env.rank == 0)
    for (const auto& p : r.profilers) profilers.push_back(reg.create<Profiler>(p.name, p.config));
}

DataContext Session::data_context() const {
  return DataContext{tokenizer.get(), chat.get(),
                     static_cast<uint64_t>(recipe.section("run").get_int("seed"))};
}

const char* Session::eval_path() const {
  return recipe.component("data.eval_dataset") ? "data.eval_dataset" : "data.dataset";
}

std::vector<std::pair<std::string, at::Tensor>> Session::trainable_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : optimized) out.emplace_back(p.name, p.tensor);
  return out;
}

std::vector<size_t> rank_share(const std::vector<Batch>& micro, int rank, int world) {
  std::vector<size_t> order(micro.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return micro[a].real_tokens > micro[b].real_tokens; });
  const size_t cap = (micro.size() + static_cast<size_t>(world) - 1) / static_cast<size_t>(world);
  std::vector<int64_t> tokens(world, 0);
  std::vector<size_t> count(world, 0);
  std::vector<size_t> mine;
  for (size_t i : order) {
    int best = -1;
    for (int r = 0; r < world; ++r)
      if (count[r] < cap && (best < 0 || tokens[r] < tokens[best])) best = r;
    tokens[best] += micro[i].real_tokens;
    count[best]++;
    if (best == rank) mine.push_back(i);
  }
  std::sort(mine.begin(), mine.end());
  return mine;
}

AdamWOptions Session::adamw_options() const {
  const Config& optc = recipe.section("optimizer");
  AdamWOptions ao;
  ao.lr = optc.get_float("lr");
  ao.beta1 = optc.get_float_list("betas")[0];
  ao.beta2 = optc.get_float_list("betas")[1];
  ao.eps = optc.get_float("eps");
  ao.weight_decay = optc.get_float("weight_decay");
  ao.master_weights = recipe.section("precision").get_bool("master_weights");
  return ao;
}

void Session::pick_step_kernels(AdamW& opt) {
  // The provider of `Op` when it is the recipe's backend (not the reference's formula) on CUDA.
  auto backend_of = [&]<class Op>() -> std::string {
    if (!device.is_cuda() || !op_table.has<Op>()) return {};
    for (const auto& [op, provider] : op_table.providers())
      if (op == Op::kName && provider != "reference") return provider;
    return {};
  };
  if (const std::string step = backend_of.operator()<op::AdamWStep>(); !step.empty())
    opt.use_kernel(op_table.get<op::AdamWStep>(), fmt::format("{} {}", step, op::AdamWStep::kName));
  if (const std::string norm = backend_of.operator()<op::SquareSum>(); !norm.empty()) {
    square_sum = op_table.get<op::SquareSum>();
    square_sum_name = fmt::format("{} {}", norm, op::SquareSum::kName);
  }
  log_info("optimizer: AdamW, step kernel {}; gradient norm {}", opt.kernel_name(), square_sum_name);
}

StepOutcome train_step(Session& s, AdamW& opt,
                       const std::vector<std::pair<std::string, at::Tensor>>& trainable,
                       const std::vector<Batch>& micro, double clip, double lr, bool stop_requested) {
  (void)trainable;
  StepOutcome o;
  for (const auto& b : micro) {
    o.loss_tokens += b.loss_tokens;
    o.real += b.real_tokens;
    o.pad += b.padding_tokens;
    for (int64_t i = 0; i < b.num_seqs(); ++i) o.seq_lens.push_back(b.seq.seq_len(i));
    o.sample_ids.insert(o.sample_ids.end(), b.sample_ids.begin(), b.sample_ids.end());
  }
  const int world = s.comm ? s.comm->world_size() : 1;
  // Equal shares (the trainer keeps a step's micro-batches a multiple of the ranks): every rank
  // runs the same number of forwards and backwards, so the shardings' collectives line up.
  QRUN_ASSERT(micro.size() % static_cast<size_t>(world) == 0, "{} micro-batches for {} ranks", micro.size(), world);
  const std::vector<size_t> mine = rank_share(micro, s.env.rank, world);
  // Forward + backward of this rank's micro-batches, each loss scaled by 1 / (loss tokens of the
  // whole global batch); the loss sums stay on the device (fp64) until the one read below.
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(s.device));
  if (o.loss_tokens > 0) {
    for (size_t k = 0; k < mine.size(); ++k) {
      if (s.sharding) s.sharding->begin_micro_batch(k + 1 == mine.size());
      ModelOutput out = s.model->forward(micro[mine[k]].to(s.device));
      (out.loss_sum / static_cast<double>(o.loss_tokens)).backward();
      loss_sum = loss_sum + out.loss_sum.detach().to(at::kDouble);
    }
  }
  if (s.sharding) {
    if (mine.empty()) s.sharding->begin_micro_batch(true);  // a step with no loss tokens
    s.sharding->finish_gradients();
  }
  // The global gradient norm: each rank's share of the sum of squares (multi-tensor kernels), and
  // the loss and the stop request, summed over ranks in one collective; one host read per step.
  at::Tensor gsq;
  if (s.sharding) {
    gsq = s.sharding->grad_square_sum().to(loss_sum.device()).to(at::kDouble);
  } else {
    std::map<std::pair<int, int>, std::vector<at::Tensor>> groups;
    for (const auto& p : s.optimized)
      if (p.tensor.grad().defined())
        groups[{static_cast<int>(p.tensor.grad().scalar_type()), 0}].push_back(p.tensor.grad());
    gsq = at::zeros({}, loss_sum.options());
    for (auto& [key, gs] : groups) {
      if (s.square_sum && gs.front().is_cuda()) {
        for (auto& g : gs) g = g.contiguous();
        gsq = gsq + s.square_sum(gs).to(loss_sum.device());
      } else {
        gsq = gsq + at::stack(at::_foreach_norm(gs, 2, at::kDouble)).to(loss_sum.device()).pow(2).sum();
      }
    }
  }
  at::Tensor stats = at::stack({loss_sum, gsq, at::full({}, stop_requested ? 1.0 : 0.0, loss_sum.options())});
  if (s.comm) s.comm->all_reduce_sum(stats)->wait();
  // Clipping and the non-finite guard stay on the device: the fused AdamW kernel divides the
  // gradients by max(1, (norm + 1e-6) / clip) (torch's clip_grad_norm_ coefficient) and skips the
  // update where the loss or the norm is not finite. The step's one host read follows the
  // optimizer's launch, so the GPU runs from the backward into the update without a gap.
  if (o.loss_tokens > 0) {
    at::Tensor found_inf = at::logical_not(at::isfinite(stats.narrow(0, 0, 2)).all()).to(at::kFloat);
    at::Tensor grad_scale;
    if (clip > 0) grad_scale = at::clamp_min((stats[1].sqrt() + 1e-6) / clip, 1.0).to(at::kFloat);
    opt.step(lr, grad_scale, found_inf);
    if (s.sharding) s.sharding->after_optimizer_step();
  }
  at::Tensor host = stats.cpu();
  const double* h = host.data_ptr<double>();
  o.loss = o.loss_tokens > 0 ? h[0] / static_cast<double>(o.loss_tokens) : std::nan("");
  o.grad_norm = std::sqrt(h[1]);
  o.stop = h[2] > 0;
  o.finite = std::isfinite(o.grad_norm) && (o.loss_tokens == 0 || std::isfinite(o.loss));
  opt.zero_grad();
  if (s.device.is_cuda()) torch::cuda::synchronize();
  return o;
}

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

}  // namespace qrun
