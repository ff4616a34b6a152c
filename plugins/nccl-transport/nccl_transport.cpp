// plugins/nccl-transport: the `nccl` transport (sdk run.h): the ranks of a GPU run meet at rank 0's
// c10d TCPStore and talk through c10d's ProcessGroupNCCL - LibTorch's own, proven transport; qrun
// adds no protocol of its own. Collectives are asynchronous: CommWork::wait() makes the current
// stream wait for the NCCL stream (no host synchronisation), so the sharding can overlap gradient
// reduction with the backward pass.
// Each rank's device must be set (LOCAL_RANK) before connect(); the host does it.
#include <qrun/sdk.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <thread>

namespace qrun {
namespace {

class NcclWork final : public CommWork {
 public:
  explicit NcclWork(c10::intrusive_ptr<c10d::Work> w) : w_(std::move(w)) {}
  ~NcclWork() override {
    if (waited_) return;
    try {
      w_->wait();
    } catch (const std::exception&) {
      // The communicator was aborted (a peer died): the error surfaces where it was waited for.
    }
  }
  void wait() override {
    w_->wait();
    waited_ = true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> w_;
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg,
                   int rank, int world)
      : store_(std::move(store)), pg_(std::move(pg)), rank_(rank), world_(world) {}
  ~NcclCommunicator() override {
    try {
      pg_->shutdown();
    } catch (const std::exception&) {
      // Shutting down after a peer died: nothing left to tell.
    }
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::unique_ptr<CommWork> all_reduce_sum(at::Tensor& t) override {
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    return std::make_unique<NcclWork>(pg_->allreduce(v, o));
  }
  std::unique_ptr<CommWork> all_gather(at::Tensor& out, const at::Tensor& in) override {
    at::Tensor src = in;
    return std::make_unique<NcclWork>(pg_->_allgather_base(out, src));
  }
  std::unique_ptr<CommWork> reduce_scatter_sum(at::Tensor& out, const at::Tensor& in) override {
    at::Tensor src = in;
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    return std::make_unique<NcclWork>(pg_->_reduce_scatter_base(out, src, o));
  }
  std::unique_ptr<CommWork> broadcast(at::Tensor& t, int root) override {
    std::vector<at::Tensor> v{t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return std::make_unique<NcclWork>(pg_->broadcast(v, o));
  }
  // Host-side, through the store: ranks meet here around checkpoint I/O (rank 0 writing the whole
  // model can outlast the collectives' timeout), so this waits up to an hour, not NCCL's watchdog.
  void barrier() override {
    const std::string key = fmt::format("qrun/barrier/{}", barrier_seq_++);
    store_->add(key, 1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
    while (store_->add(key, 0) < world_) {
      QRUN_CHECK(std::chrono::steady_clock::now() < deadline,
                 "rank {}: not every rank reached barrier {} within an hour", rank_, barrier_seq_ - 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int64_t barrier_seq_ = 0;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  int rank_, world_;
};

class NcclTransport final : public Transport {
 public:
  std::string unsupported(c10::DeviceType device) const override {
    return device == c10::DeviceType::CUDA ? "" : "NCCL connects CUDA devices only";
  }
  std::unique_ptr<Communicator> connect(const DistributedEnv& env, const c10::Device& device,
                                        double timeout_s) override {
    QRUN_CHECK(device.is_cuda(), "nccl transport: rank {} runs on {}, not a CUDA device", env.rank, device.str());
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(env.master_port);
    // Under torchrun's agent the store exists already: every rank is a client of it.
    o.isServer = env.rank == 0 && !env.agent_store;
    o.numWorkers = env.agent_store ? std::nullopt : std::optional<std::size_t>(env.world_size);
    o.waitWorkers = !env.agent_store;
    o.timeout = timeout;
    c10::intrusive_ptr<c10d::Store> store;
    try {
      store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("qrun/{}", env.restart_count),
                                                     c10::make_intrusive<c10d::TCPStore>(env.master_addr, o));
    } catch (const std::exception& e) {
      throw UserError(fmt::format("rank {}: rendezvous at {}:{} failed ({}): {}", env.rank, env.master_addr,
                                  env.master_port, env.rank == 0 ? "is the port in use?" : "is rank 0 up?",
                                  std::string(e.what()).substr(0, 300)));
    }
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.world_size, opts);
    return std::make_unique<NcclCommunicator>(store, pg, env.rank, env.world_size);
  }
};

void register_all(Registrar& r) {
  r.add<Transport>("nccl", "c10d TCPStore rendezvous + ProcessGroupNCCL (GPU ranks)", Schema{},
                   [](const Config&) { return std::make_unique<NcclTransport>(); });
}

}  // namespace
}  // namespace qrun

QRUN_PLUGIN("nccl-transport", "0.1.0", qrun::register_all)
