// tests/plugins/store_transport.cpp - the transport `test-store`: collectives between CPU ranks
// over c10d's TCPStore, for the multi-process tests on machines without GPUs. Test-only (part of
// the test-zoo plugin, never installed, never named by a recipe: the host picks the transport).
//
// Why not Gloo: the torch wheel ships c10d's ProcessGroupGloo header but not the gloo headers it
// includes; building against another gloo (Debian's libgloo-dev, 2022) would put two definitions of
// gloo's classes behind one header with no test that their layouts agree. NCCL stays the one
// production transport (plugins/nccl-transport).
//
// How: each collective is one round of keys in the store ("c<seq>/<rank>", the rank's bytes);
// every rank reads all ranks' keys and combines them in rank order, so every rank computes
// bit-identical results (a sum is t_0 + t_1 + ... in that order everywhere). The last reader of a
// round deletes its keys. Slow (every byte goes through rank 0's store) and fine for the test models.
#include <qrun/sdk.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstring>
#include <thread>

namespace zoo {
namespace {

class DoneWork final : public qrun::CommWork {
 public:
  void wait() override {}
};

class StoreCommunicator final : public qrun::Communicator {
 public:
  StoreCommunicator(c10::intrusive_ptr<c10d::Store> store, int rank, int world)
      : store_(std::move(store)), rank_(rank), world_(world) {}
  // Rank 0's store serves every rank: it stays up until every rank has said it is done with it.
  // A rank that died never says so: rank 0 waits at most the store's timeout.
  ~StoreCommunicator() override {
    try {
      store_->add("leaving", 1);
      const auto deadline = std::chrono::steady_clock::now() + store_->getTimeout();
      if (rank_ == 0)
        while (store_->add("leaving", 0) < world_ && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } catch (const std::exception&) {
      // The store is gone (rank 0 left first after a failure): nothing to wait for.
    }
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  std::unique_ptr<qrun::CommWork> all_reduce_sum(at::Tensor& t) override {
    auto parts = exchange(t);
    at::Tensor sum = parts[0].clone();
    for (int r = 1; r < world_; ++r) sum.add_(parts[r]);
    t.copy_(sum);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<qrun::CommWork> all_gather(at::Tensor& out, const at::Tensor& in) override {
    QRUN_CHECK(out.numel() == in.numel() * world_, "test-store all_gather: out has {} elements for {} x {}",
               out.numel(), world_, in.numel());
    auto parts = exchange(in);
    at::Tensor flat = out.view({-1});
    for (int r = 0; r < world_; ++r) flat.narrow(0, r * in.numel(), in.numel()).copy_(parts[r].view({-1}));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<qrun::CommWork> reduce_scatter_sum(at::Tensor& out, const at::Tensor& in) override {
    QRUN_CHECK(in.numel() == out.numel() * world_, "test-store reduce_scatter: in has {} elements for {} x {}",
               in.numel(), world_, out.numel());
    auto parts = exchange(in);
    at::Tensor sum = parts[0].view({-1}).narrow(0, rank_ * out.numel(), out.numel()).clone();
    for (int r = 1; r < world_; ++r) sum.add_(parts[r].view({-1}).narrow(0, rank_ * out.numel(), out.numel()));
    out.view({-1}).copy_(sum);
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<qrun::CommWork> broadcast(at::Tensor& t, int root) override {
    auto parts = exchange(t);
    t.copy_(parts[root]);
    return std::make_unique<DoneWork>();
  }
  void barrier() override {
    at::Tensor none = at::zeros({1});
    exchange(none);
  }

 private:
  // Every rank's copy of `t` (same shape and dtype), in rank order.
  std::vector<at::Tensor> exchange(const at::Tensor& t) {
    const std::string base = "c" + std::to_string(seq_++) + "/";
    at::Tensor c = t.contiguous().cpu();
    const auto* b = static_cast<const uint8_t*>(c.data_ptr());
    store_->set(base + std::to_string(rank_), std::vector<uint8_t>(b, b + c.nbytes()));
    std::vector<at::Tensor> parts;
    for (int r = 0; r < world_; ++r) {
      std::vector<uint8_t> bytes;
      try {
        bytes = store_->get(base + std::to_string(r));  // waits for the key, up to the store's timeout
      } catch (const std::exception& e) {
        throw qrun::UserError(fmt::format(
            "rank {}: rank {} did not join collective #{} in time (it died, or is stuck elsewhere): {}", rank_, r,
            seq_ - 1, std::string(e.what()).substr(0, 200)));
      }
      QRUN_CHECK(bytes.size() == c.nbytes(), "test-store: rank {} sent {} bytes for a collective of {} bytes", r,
                 bytes.size(), c.nbytes());
      at::Tensor p = at::empty_like(c);
      std::memcpy(p.data_ptr(), bytes.data(), bytes.size());
      parts.push_back(p);
    }
    if (store_->add(base + "read", 1) == world_) {
      for (int r = 0; r < world_; ++r) store_->deleteKey(base + std::to_string(r));
      store_->deleteKey(base + "read");
    }
    return parts;
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, world_;
  int64_t seq_ = 0;
};

class StoreTransport final : public qrun::Transport {
 public:
  std::string unsupported(c10::DeviceType device) const override {
    return device == c10::DeviceType::CPU ? "" : "the test transport connects CPU ranks only";
  }
  std::unique_ptr<qrun::Communicator> connect(const qrun::DistributedEnv& env, const c10::Device&,
                                              double timeout_s) override {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(env.master_port);
    o.isServer = env.rank == 0 && !env.agent_store;
    o.numWorkers = env.agent_store ? std::nullopt : std::optional<std::size_t>(env.world_size);
    o.waitWorkers = !env.agent_store;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    c10::intrusive_ptr<c10d::Store> store;
    try {
      store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("qrun/{}", env.restart_count),
                                                     c10::make_intrusive<c10d::TCPStore>(env.master_addr, o));
    } catch (const std::exception& e) {
      throw qrun::UserError(fmt::format("test-store: rendezvous at {}:{} failed: {}", env.master_addr,
                                        env.master_port, std::string(e.what()).substr(0, 300)));
    }
    return std::make_unique<StoreCommunicator>(store, env.rank, env.world_size);
  }
};

}  // namespace

void register_store_transport(qrun::Registrar& r) {
  r.add<qrun::Transport>("test-store", "CPU collectives over c10d's TCPStore (tests only)", qrun::Schema{},
                         [](const qrun::Config&) { return std::make_unique<StoreTransport>(); });
}

}  // namespace zoo
