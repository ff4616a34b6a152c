// plugins/sharding: where parameters, gradients and optimizer state live across ranks.
//
//   none   one process: the model's parameters are what the optimizer updates.
//   ddp    every rank holds every parameter; gradients are summed over ranks in buckets
//          (bucket_mb) by all-reduce, each bucket launched as soon as the backward of the step's
//          last micro-batch has accumulated all of its gradients, so the reduction overlaps the
//          rest of the backward (Note [DDP buckets]).
//   fsdp2  each of the model's parameter units (sdk model.h, Note [Parameter units]) sharded flat
//          across ranks; gathered before use, freed after, gradients reduce-scattered as each
//          unit's backward ends (Note [FSDP units]).
//
// The host normalises the loss by the loss tokens of the whole global batch (sdk run.h, Note
// [Ranks and global batches]), so the sum over ranks is the gradient one process computes.
#include <qrun/sdk.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <c10/core/StorageImpl.h>

#include <deque>
#include <map>

namespace qrun {
namespace {

at::Tensor square_sum(const std::vector<at::Tensor>& grads, const at::Device& dev) {
  // One multi-tensor norm per dtype group, accumulated in fp64 (a sum of millions of fp32
  // squares loses ~1e-5 of itself in fp32; the norm then depends on how the tensors are grouped).
  std::map<int, std::vector<at::Tensor>> by;
  for (const auto& g : grads) by[static_cast<int>(g.scalar_type())].push_back(g);
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(dev));
  for (auto& [dt, gs] : by) total = total + at::stack(at::_foreach_norm(gs, 2, at::kDouble)).pow(2).sum();
  return total;
}

std::vector<ShardedParam> trainable(Model& model) {
  std::vector<ShardedParam> out;
  for (auto& [n, p] : model.named_parameters())
    if (p.requires_grad()) out.push_back({n, p});
  return out;
}

Sharding::Memory replicated_memory(double numel, int param_bytes, int state_bytes, bool master) {
  Sharding::Memory m;
  m.params = numel * param_bytes;
  m.grads = numel * param_bytes;
  m.optimizer = numel * (2.0 * state_bytes + (master ? 4.0 : 0.0));
  return m;
}

class NoSharding final : public Sharding {
 public:
  std::vector<ShardedParam> wrap(Model& model, Communicator* comm) override {
    QRUN_CHECK(comm == nullptr || comm->world_size() == 1,
               "sharding none runs one process, but this run has {} ranks: set sharding: ddp or fsdp2",
               comm ? comm->world_size() : 1);
    params_ = trainable(model);
    return params_;
  }
  void begin_micro_batch(bool) override {}
  void finish_gradients() override {}
  at::Tensor grad_square_sum() override {
    std::vector<at::Tensor> g;
    for (const auto& p : params_)
      if (p.tensor.grad().defined()) g.push_back(p.tensor.grad());
    return square_sum(g, params_.empty() ? at::Device(at::kCPU) : params_.front().tensor.device());
  }
  void after_optimizer_step() override {}
  void for_each_full_parameter(const std::function<void(const std::string&, const at::Tensor&)>& fn) override {
    for (const auto& p : params_) fn(p.name, p.tensor);
  }
  Memory memory_per_rank(double numel, int pb, int sb, bool master, int) const override {
    return replicated_memory(numel, pb, sb, master);
  }

 private:
  std::vector<ShardedParam> params_;
};

// Note [DDP buckets]
// Parameters are grouped, in the reverse of the model's order (roughly the order in which the
// backward produces their gradients), into buckets of about bucket_mb of one dtype. A bucket owns a
// flat gradient buffer and each parameter's .grad is a view of it, so autograd accumulates the
// micro-batches' gradients in place there. A post-accumulate-grad hook counts a bucket's
// parameters during the step's last backward; the bucket's all-reduce starts when its count is
// full. finish_gradients() starts the buckets whose parameters got no gradient (their slices are
// zero) and waits for all. Every rank launches the buckets in its own backward's order; the
// collectives match across ranks because all ranks run the same graph.
class DdpSharding final : public Sharding {
 public:
  explicit DdpSharding(const Config& c) : bucket_bytes_(static_cast<int64_t>(c.get_float("bucket_mb") * (1 << 20))) {}

  std::vector<ShardedParam> wrap(Model& model, Communicator* comm) override {
    comm_ = comm;
    params_ = trainable(model);
    QRUN_CHECK(!params_.empty(), "ddp: the model has no trainable parameters");
    // Same starting point on every rank (rank 0's parameters).
    if (comm_ != nullptr && comm_->world_size() > 1) {
      at::NoGradGuard ng;
      for (auto& p : params_) {
        at::Tensor t = p.tensor.detach();
        comm_->broadcast(t, 0)->wait();
      }
    }
    for (int64_t i = static_cast<int64_t>(params_.size()) - 1; i >= 0; --i) {
      const at::Tensor& p = params_[i].tensor;
      if (buckets_.empty() || buckets_.back().dtype != p.scalar_type() ||
          buckets_.back().bytes + p.numel() * p.element_size() > bucket_bytes_) {
        buckets_.push_back({});
        buckets_.back().dtype = p.scalar_type();
      }
      Bucket& b = buckets_.back();
      slot_.push_back({static_cast<int>(buckets_.size()) - 1, b.numel});
      b.members.push_back(i);
      b.numel += p.numel();
      b.bytes += p.numel() * p.element_size();
    }
    std::reverse(slot_.begin(), slot_.end());  // slot_[i] belongs to params_[i]
    for (auto& b : buckets_)
      b.buffer = at::zeros({b.numel}, params_.front().tensor.options().dtype(b.dtype).requires_grad(false));
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::autograd::impl::set_post_acc_grad_hooks(params_[i].tensor,
                                                      std::make_unique<ReadyHook>(this, static_cast<int>(i)));
    }
    attach_grads();
    return params_;
  }

  void begin_micro_batch(bool last) override {
    if (fresh_step_) attach_grads();
    fresh_step_ = false;
    reducing_ = last && comm_ != nullptr && comm_->world_size() > 1;
  }

  void finish_gradients() override {
    if (reducing_)
      for (size_t b = 0; b < buckets_.size(); ++b)
        if (!buckets_[b].work) launch(b);
    for (auto& b : buckets_) {
      if (b.work) b.work->wait();
      b.work.reset();
      b.ready = 0;
    }
    reducing_ = false;
    fresh_step_ = true;
  }

  at::Tensor grad_square_sum() override {
    // Every rank holds the same summed gradients: rank 0 contributes them, the others nothing.
    std::vector<at::Tensor> g;
    for (const auto& b : buckets_) g.push_back(b.buffer);
    at::Tensor s = square_sum(g, params_.front().tensor.device());
    return comm_ == nullptr || comm_->rank() == 0 ? s : s.zero_();
  }

  void after_optimizer_step() override {}

  void for_each_full_parameter(const std::function<void(const std::string&, const at::Tensor&)>& fn) override {
    const bool mine = comm_ == nullptr || comm_->rank() == 0;
    for (const auto& p : params_) fn(p.name, mine ? p.tensor : at::Tensor());
  }

  Memory memory_per_rank(double numel, int pb, int sb, bool master, int) const override {
    return replicated_memory(numel, pb, sb, master);
  }

 private:
  struct Bucket {
    c10::ScalarType dtype = at::kFloat;
    std::vector<int64_t> members;
    int64_t numel = 0, bytes = 0;
    at::Tensor buffer;
    size_t ready = 0;
    std::unique_ptr<CommWork> work;
  };
  struct Slot {
    int bucket;
    int64_t offset;
  };

  struct ReadyHook final : public torch::autograd::PostAccumulateGradHook {
    ReadyHook(DdpSharding* s, int i) : s(s), i(i) {}
    void operator()(const torch::autograd::Variable&) override { s->on_ready(i); }
    DdpSharding* s;
    int i;
  };

  // Each parameter's .grad: a view of its bucket's buffer, zeroed (a new step).
  void attach_grads() {
    for (auto& b : buckets_) b.buffer.zero_();
    for (size_t i = 0; i < params_.size(); ++i) {
      const Slot& s = slot_[i];
      at::Tensor& p = params_[i].tensor;
      p.mutable_grad() = buckets_[s.bucket].buffer.narrow(0, s.offset, p.numel()).view(p.sizes());
    }
  }

  void on_ready(int i) {
    if (!reducing_) return;
    Bucket& b = buckets_[slot_[i].bucket];
    if (++b.ready == b.members.size() && !b.work) launch(slot_[i].bucket);
  }

  void launch(size_t b) { buckets_[b].work = comm_->all_reduce_sum(buckets_[b].buffer); }

  int64_t bucket_bytes_;
  Communicator* comm_ = nullptr;
  std::vector<ShardedParam> params_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slot_;
  bool reducing_ = false, fresh_step_ = true;
};

// Note [FSDP units]
// Each unit's parameters, grouped by dtype (a bf16 layer holds fp32 A_log and gated-norm weights),
// live in one flat buffer per group, padded to a multiple of the world size W and split into W
// equal shards; rank r keeps shard r as a leaf tensor (what its optimizer updates, with its own
// .grad). The model's parameters become views of the flat buffer: when the unit is not in use its
// buffer's storage is emptied (resized to 0 bytes, the tensors keep their shapes), and it is
// refilled by an all-gather of the shards before use. Saved activations that view a parameter
// (a linear's weight) keep pointing at the same storage, so the backward sees the refilled values.
//   forward:  before_forward(u) gathers u (waiting for its prefetch) and starts gathering u + 1;
//             the units used before are freed then (reshard_after_forward), so the last unit of
//             the forward, whose backward comes first, is never freed in between.
//   backward: before_backward(u) gathers u again and starts u - 1, and points each parameter's
//             .grad at a zeroed flat gradient buffer; when every parameter of a group has
//             accumulated (post-accumulate-grad hooks), the group's gradients are reduce-scattered
//             in reduce_dtype into the shard's .grad and the unit's buffers are freed.
// Every micro-batch reduce-scatters, so all ranks must run the same number of micro-batches per
// step (the host splits global batches evenly) and the units in the same order.
class Fsdp2Sharding final : public Sharding, public UnitHooks {
 public:
  explicit Fsdp2Sharding(const Config& c)
      : reshard_(c.get_bool("reshard_after_forward")),
        reduce_fp32_(c.get_string("reduce_dtype") == "fp32") {}

  std::vector<ShardedParam> wrap(Model& model, Communicator* comm) override {
    QRUN_CHECK(comm != nullptr, "fsdp2 needs the ranks' communicator (the host connects one for fsdp2, even for one rank)");
    comm_ = comm;
    W_ = comm->world_size();
    R_ = comm->rank();
    const std::vector<ParamUnit> spec = model.units();
    QRUN_CHECK(!spec.empty(), "fsdp2: the model '{}' does not group its parameters into units; use ddp",
               model.summary().family);
    std::map<std::string, at::Tensor> by_name;
    for (auto& [n, p] : model.named_parameters()) by_name[n] = p;
    std::map<std::string, int> owner;
    at::NoGradGuard ng;
    for (size_t u = 0; u < spec.size(); ++u) {
      Unit unit;
      unit.name = spec[u].name;
      std::map<int, size_t> group_of;  // dtype -> group
      for (const auto& name : spec[u].params) {
        auto it = by_name.find(name);
        QRUN_CHECK(it != by_name.end(), "fsdp2: unit {} names parameter {}, which the model does not have", unit.name, name);
        QRUN_CHECK(owner.emplace(name, static_cast<int>(u)).second, "fsdp2: parameter {} is in two units", name);
        if (!it->second.requires_grad()) continue;
        const int dt = static_cast<int>(it->second.scalar_type());
        if (!group_of.count(dt)) {
          group_of[dt] = unit.groups.size();
          unit.groups.push_back({});
        }
        Group& g = unit.groups[group_of[dt]];
        g.params.push_back({name, it->second, g.numel});
        g.numel += it->second.numel();
      }
      units_.push_back(std::move(unit));
    }
    for (const auto& [n, p] : by_name) {
      QRUN_CHECK(!p.requires_grad() || owner.count(n), "fsdp2: trainable parameter {} is in no unit of the model", n);
      if (!p.requires_grad()) frozen_.emplace_back(n, p);  // replicated as the model holds it
    }
    std::vector<ShardedParam> out;
    for (size_t u = 0; u < units_.size(); ++u) {
      for (size_t gi = 0; gi < units_[u].groups.size(); ++gi) {
        Group& g = units_[u].groups[gi];
        const at::Tensor& first = g.params.front().tensor;
        g.shard_numel = (g.numel + W_ - 1) / W_;
        g.full = at::zeros({g.shard_numel * W_}, first.options().requires_grad(false));
        for (auto& p : g.params) g.full.narrow(0, p.offset, p.tensor.numel()).copy_(p.tensor.detach().reshape({-1}));
        // Rank 0's values everywhere (the ranks built the same model, but a checkpoint read on one
        // machine and not another must not split the run).
        comm_->broadcast(g.full, 0)->wait();
        for (auto& p : g.params) p.tensor.set_data(g.full.narrow(0, p.offset, p.tensor.numel()).view(p.tensor.sizes()));
        g.shard = g.full.narrow(0, R_ * g.shard_numel, g.shard_numel).clone().requires_grad_(true);
        for (size_t pi = 0; pi < g.params.size(); ++pi)
          torch::autograd::impl::set_post_acc_grad_hooks(
              g.params[pi].tensor, std::make_unique<ReadyHook>(this, u, gi));
        out.push_back({fmt::format("{}/{}/shard", units_[u].name, c10::toString(first.scalar_type())), g.shard, g.numel});
      }
      release(u);
    }
    model.set_unit_hooks(this);
    return out;
  }

  void before_forward(size_t u) override {
    if (u == 0) forward_order_.clear();
    free_finished_forward(u);
    gather(u, /*wait=*/true);
    if (u + 1 < units_.size()) gather(u + 1, /*wait=*/false);
  }
  void after_forward(size_t u) override {
    forward_order_.push_back(u);
    if (reshard_) done_forward_.push_back(u);
  }
  void before_backward(size_t u) override {
    free_finished_forward(u);
    gather(u, /*wait=*/true);
    // The backward visits the units in the reverse of their last use in the forward (with tied
    // embeddings unit 0 comes first, as the head): prefetch the one after u in that order.
    for (size_t k = forward_order_.size(); k-- > 1;)
      if (forward_order_[k] == u) {
        gather(forward_order_[k - 1], /*wait=*/false);
        break;
      }
    for (auto& g : units_[u].groups) {
      if (g.grad_full.defined()) continue;  // already pointed (a unit used twice)
      g.grad_full = at::zeros({g.shard_numel * W_}, g.full.options());
      g.ready = 0;
      for (auto& p : g.params) p.tensor.mutable_grad() = g.grad_full.narrow(0, p.offset, p.tensor.numel()).view(p.tensor.sizes());
    }
  }
  void begin_micro_batch(bool) override {}

  void finish_gradients() override {
    // Groups whose parameters got no gradient in a backward of this step still take part (their
    // gradient is zero), in the backward's unit order, so that the ranks' collectives match.
    for (size_t u = units_.size(); u-- > 0;)
      for (size_t gi = 0; gi < units_[u].groups.size(); ++gi)
        if (units_[u].groups[gi].grad_full.defined()) reduce(u, gi);
    for (auto& unit : units_)
      for (auto& g : unit.groups) finish_reduce(g);
    in_flight_.clear();
    for (size_t u = 0; u < units_.size(); ++u) release(u);
  }

  at::Tensor grad_square_sum() override {
    std::vector<at::Tensor> g;
    for (auto& unit : units_)
      for (auto& gr : unit.groups)
        if (gr.shard.grad().defined()) g.push_back(gr.shard.grad());
    return square_sum(g, comm_device());
  }

  void after_optimizer_step() override {}

  void for_each_full_parameter(const std::function<void(const std::string&, const at::Tensor&)>& fn) override {
    for (size_t u = 0; u < units_.size(); ++u) {
      gather(u, true);
      for (auto& g : units_[u].groups)
        for (auto& p : g.params) fn(p.name, R_ == 0 ? p.tensor.detach() : at::Tensor());
      release(u);
    }
    for (const auto& [n, p] : frozen_) fn(n, R_ == 0 ? p.detach() : at::Tensor());
  }

  Memory memory_per_rank(double numel, int pb, int sb, bool master, int world) const override {
    Memory m = replicated_memory(numel, pb, sb, master);
    m.params /= world;
    m.grads /= world;
    m.optimizer /= world;
    return m;
  }

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;  // the model's parameter: a view of its group's flat buffer
    int64_t offset;     // in the flat buffer
  };
  struct Group {
    std::vector<Param> params;
    int64_t numel = 0, shard_numel = 0;
    at::Tensor full;       // [W * shard_numel]; storage empty while released
    at::Tensor shard;      // [shard_numel] leaf: this rank's part, what the optimizer updates
    at::Tensor grad_full;  // during a backward: the parameters' .grad live here
    at::Tensor reduce_in, reduce_out;
    std::unique_ptr<CommWork> reduce_work;
    size_t ready = 0;
  };
  struct Unit {
    std::string name;
    std::vector<Group> groups;
    bool gathered = false;
    std::vector<std::unique_ptr<CommWork>> gather_work;  // a prefetch in flight
  };
  struct ReadyHook final : public torch::autograd::PostAccumulateGradHook {
    ReadyHook(Fsdp2Sharding* s, size_t u, size_t g) : s(s), u(u), g(g) {}
    void operator()(const torch::autograd::Variable&) override { s->on_ready(u, g); }
    Fsdp2Sharding* s;
    size_t u, g;
  };

  at::Device comm_device() const {
    return units_.empty() || units_.front().groups.empty() ? at::Device(at::kCPU)
                                                           : units_.front().groups.front().shard.device();
  }

  static void empty_storage(const at::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }
  static void fill_storage(const at::Tensor& t, size_t bytes) {
    c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    if (s->nbytes() == bytes) return;
    s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
    s->set_nbytes(bytes);
  }

  // Starts (or, with wait, completes) the all-gather of unit u's shards into its flat buffers.
  void gather(size_t u, bool wait) {
    Unit& unit = units_[u];
    if (!unit.gathered) {
      at::NoGradGuard ng;
      for (auto& g : unit.groups) {
        fill_storage(g.full, static_cast<size_t>(g.full.numel() * g.full.element_size()));
        at::Tensor src = g.shard.detach();
        unit.gather_work.push_back(comm_->all_gather(g.full, src));
      }
      unit.gathered = true;
    }
    if (wait) {
      for (auto& w : unit.gather_work) w->wait();
      unit.gather_work.clear();
    }
  }

  void release(size_t u) {
    Unit& unit = units_[u];
    for (auto& w : unit.gather_work) w->wait();
    unit.gather_work.clear();
    for (auto& g : unit.groups) empty_storage(g.full);
    unit.gathered = false;
  }

  void free_finished_forward(size_t current) {
    for (size_t d : done_forward_)
      if (d != current) release(d);
    done_forward_.clear();
  }

  void on_ready(size_t u, size_t gi) {
    Group& g = units_[u].groups[gi];
    if (!g.grad_full.defined()) {
      // A gradient outside a unit's backward hook (not made by the model's units): drop it
      // rather than keep a full-size .grad around.
      for (auto& p : g.params) p.tensor.mutable_grad() = at::Tensor();
      return;
    }
    if (++g.ready == g.params.size()) {
      reduce(u, gi);
      bool all = true;
      for (auto& other : units_[u].groups) all = all && !other.grad_full.defined();
      if (all) release(u);
    }
  }

  // Reduce-scatters group gi of unit u into its shard's gradient (asynchronously) and drops the
  // full gradient buffer. At most kInFlight reductions are pending: the oldest is finished (and
  // its full-size input freed) before a new one starts, so a backward holds a couple of units'
  // gradients, not all of them.
  static constexpr size_t kInFlight = 2;
  void reduce(size_t u, size_t gi) {
    Group& g = units_[u].groups[gi];
    if (g.reduce_work) finish_reduce(g);  // a previous micro-batch's reduction of this group
    while (in_flight_.size() >= kInFlight) finish_reduce(*in_flight_.front());  // erases it
    g.reduce_in = reduce_fp32_ && g.grad_full.scalar_type() != at::kDouble ? g.grad_full.to(at::kFloat) : g.grad_full;
    g.reduce_out = at::empty({g.shard_numel}, g.reduce_in.options());
    g.reduce_work = comm_->reduce_scatter_sum(g.reduce_out, g.reduce_in);
    in_flight_.push_back(&g);
    for (auto& p : g.params) p.tensor.mutable_grad() = at::Tensor();
    g.grad_full = at::Tensor();
  }

  void finish_reduce(Group& g) {
    if (!g.reduce_work) return;
    g.reduce_work->wait();
    g.reduce_work.reset();
    accumulate_shard_grad(g);
    std::erase(in_flight_, &g);
  }

  void accumulate_shard_grad(Group& g) {
    at::Tensor add = g.reduce_out.to(g.shard.scalar_type());
    if (g.shard.grad().defined()) g.shard.mutable_grad().add_(add);
    else g.shard.mutable_grad() = add;
    g.reduce_in = at::Tensor();
    g.reduce_out = at::Tensor();
  }

  bool reshard_, reduce_fp32_;
  Communicator* comm_ = nullptr;
  int W_ = 1, R_ = 0;
  std::vector<Unit> units_;
  std::vector<size_t> done_forward_;
  std::vector<size_t> forward_order_;   // units in the order of their last use in this forward
  std::deque<Group*> in_flight_;        // pending reduce-scatters, oldest first
  std::vector<std::pair<std::string, at::Tensor>> frozen_;  // parameters no unit shards
};

void register_all(Registrar& r) {
  r.add<Sharding>("none", "one process: the optimizer updates the model's parameters", Schema{},
                  [](const Config&) { return std::make_unique<NoSharding>(); });
  r.add<Sharding>("ddp",
                  "replicated parameters; gradients summed over ranks by bucketed all-reduce "
                  "overlapped with the backward",
                  Schema{Field::number("bucket_mb", 25.0).min(1).doc("gradient bucket size in MiB")},
                  [](const Config& c) { return std::make_unique<DdpSharding>(c); });
  r.add<Sharding>("fsdp2",
                  "each parameter unit sharded flat across ranks: gathered before use, freed after, "
                  "gradients reduce-scattered as each unit's backward ends",
                  Schema{Field::boolean("reshard_after_forward", true)
                             .doc("free a unit's gathered parameters after its forward (gathered again "
                                  "for its backward)"),
                         Field::choice("reduce_dtype", "fp32", {"fp32", "param"})
                             .doc("dtype of the gradient reduce-scatter: fp32, or the parameters' own")},
                  [](const Config& c) { return std::make_unique<Fsdp2Sharding>(c); });
}

}  // namespace
}  // namespace qrun

QRUN_PLUGIN("sharding", "0.1.0", qrun::register_all)
