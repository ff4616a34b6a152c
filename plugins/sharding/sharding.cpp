// plugins/sharding: where parameters, gradients and optimizer state live across ranks.
//
//   none   one process: the model's parameters are what the optimizer updates.
//   ddp    every rank holds every parameter; gradients are summed over ranks in buckets
//          (bucket_mb) by all-reduce, each bucket launched as soon as the backward of the step's
//          last micro-batch has accumulated all of its gradients, so the reduction overlaps the
//          rest of the backward (Note [DDP buckets]).
//
// The host normalises the loss by the loss tokens of the whole global batch (sdk run.h, Note
// [Ranks and global batches]), so the sum over ranks is the gradient one process computes.
#include <qrun/sdk.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <map>

namespace qrun {
namespace {

at::Tensor square_sum(const std::vector<at::Tensor>& grads, const at::Device& dev) {
  // One multi-tensor norm per dtype group, squared and summed in fp32 (fp64 for fp64).
  std::map<int, std::vector<at::Tensor>> by;
  for (const auto& g : grads) by[static_cast<int>(g.scalar_type())].push_back(g);
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(dev));
  for (auto& [dt, gs] : by) {
    const auto acc = static_cast<c10::ScalarType>(dt) == at::kDouble ? at::kDouble : at::kFloat;
    total = total + at::stack(at::_foreach_norm(gs, 2, acc)).to(at::kDouble).pow(2).sum();
  }
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

void register_all(Registrar& r) {
  r.add<Sharding>("none", "one process: the optimizer updates the model's parameters", Schema{},
                  [](const Config&) { return std::make_unique<NoSharding>(); });
  r.add<Sharding>("ddp",
                  "replicated parameters; gradients summed over ranks by bucketed all-reduce "
                  "overlapped with the backward",
                  Schema{Field::number("bucket_mb", 25.0).min(1).doc("gradient bucket size in MiB")},
                  [](const Config& c) { return std::make_unique<DdpSharding>(c); });
}

}  // namespace
}  // namespace qrun

QRUN_PLUGIN("sharding", "0.1.0", qrun::register_all)
