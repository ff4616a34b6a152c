// Plain C++ (CPU, double precision) reference of the gated delta rule: token-loop forward, explicit
// adjoint of the token loop for the backward, and a chunked (C = 64) forward used to cross-check
// the chunk algebra. No torch, no CUDA. Layouts are the contiguous versions of gated_delta.h's.
#pragma once
#include <cstdint>
#include <vector>

namespace qrun::gdn::ref {

struct Inputs {
  int64_t T = 0;
  int H = 0, HV = 0, K = 0, V = 0;
  std::vector<int32_t> cu;         // [N+1]
  std::vector<double> q, k;        // [T,H,K] (raw: before the optional l2norm)
  std::vector<double> v;           // [T,HV,V]
  bool gate_fused = false;
  std::vector<double> g;           // [T,HV] when !gate_fused
  std::vector<double> a;           // [T,HV] when gate_fused
  std::vector<double> A_log, dt_bias;  // [HV]
  bool beta_sigmoid = false;
  std::vector<double> beta;        // [T,HV]: beta, or b when beta_sigmoid
  bool l2norm = false;
  double scale = 0;                // <= 0: K^-1/2
  std::vector<double> h0;          // [N,HV,K,V] or empty (zeros)
  int64_t N() const { return (int64_t)cu.size() - 1; }
};

struct Fwd {
  std::vector<double> o;   // [T,HV,V]
  std::vector<double> ht;  // [N,HV,K,V]
};

struct Grads {
  std::vector<double> dq, dk;   // [T,H,K] (w.r.t. raw q/k)
  std::vector<double> dv;       // [T,HV,V]
  std::vector<double> dg;       // [T,HV] d/dg, or d/da when gate_fused
  std::vector<double> dbeta;    // [T,HV] d/dbeta, or d/db when beta_sigmoid
  std::vector<double> dA_log, ddt_bias;  // [HV] (gate_fused)
  // [HV] (gate_fused): the sizes of their terms, sum over tokens of |term| (the scale a summed
  // gradient is judged against when its terms cancel; framework/check.cpp Note [Summed gradients])
  std::vector<double> dA_log_terms, ddt_bias_terms;
  std::vector<double> dh0;      // [N,HV,K,V]
};

// threads <= 0: use std::thread::hardware_concurrency().
Fwd forward(const Inputs& in, int threads = 0);
Fwd forward_chunked(const Inputs& in, int threads = 0);
// dht may be null (zero).
Grads backward(const Inputs& in, const std::vector<double>& dO, const std::vector<double>* dht,
               int threads = 0);

}  // namespace qrun::gdn::ref
