// qrun gated delta rule (Gated DeltaNet) kernels: launch API.
//
// Why this header looks the way it does
// -------------------------------------
// * It is plain C++: no torch types and no CUDA headers, so the LibTorch plugin, the tests and the
//   benchmark can all include it. Streams are the CUDA runtime's `cudaStream_t`, forward-declared as
//   `struct CUstream_st*`. Every tensor is a raw device pointer plus int64 element strides.
// * Every launch is asynchronous on the given stream and performs NO host synchronisation and no
//   allocation. The caller (a) builds the chunk tables once per batch with gdn_build_chunk_tables()
//   from the host copy of cu_seqlens and uploads them, and (b) allocates a scratch buffer of
//   gdn_fwd_workspace_bytes()/gdn_bwd_workspace_bytes() bytes. Bad arguments throw std::runtime_error
//   before anything is launched; a failed launch throws with the CUDA error string.
//
// Math (one sequence, one value head; t = 1..L, state S in R^{K x V}, S_0 = initial state or 0):
//     S~_t = exp(g_t) S_{t-1}
//     delta_t = beta_t (v_t - S~_t^T k_t)           (decay applied BEFORE the prediction error)
//     S_t = S~_t + k_t delta_t^T
//     o_t = scale * S_t^T q_t                        (the token sees its own update)
// with optional in-kernel pre-processing (each independently switchable):
//     q <- q * rsqrt(sum q^2 + 1e-6), k likewise     (qk_l2norm; per key head, over K)
//     g = -exp(A_log[h]) * softplus(a + dt_bias[h])  (gate_fused; softplus(x) = x for x > 20)
//     beta = sigmoid(b)                               (beta_sigmoid)
// scale defaults to K^-1/2 (pass scale <= 0). Value head hv reads q/k head hv / (HV/H).
//
// Layouts (token-major, packed varlen batch: B = 1, T = total tokens, N sequences):
//     q, k       [T, H, K]   bf16, strides (st, sh) in elements, innermost (K) contiguous
//     v          [T, HV, V]  bf16, strides (st, sh), innermost contiguous
//     o, dO      [T, HV, V]  bf16, strides (st, sh), innermost contiguous
//     g          [T, HV]     fp32, token stride g_st (heads contiguous)
//     a, beta/b  [T, HV]     bf16 or fp32 (DType), token stride, heads contiguous
//     A_log, dt_bias [HV]    fp32
//     initial_state, final_state, d_final_state, d_initial_state  [N, HV, K, V] fp32, contiguous
//     cu_seqlens int32 [N+1] (device), cu_seqlens[0] = 0, non-decreasing, cu_seqlens[N] = T.
// Sequences of length 0 are allowed (their final state is the initial state).
// Chunks are 64 tokens and never cross a sequence boundary; the tail chunk is masked.
//
// Numerics: gamma (chunk-local cumsum of g) and the recurrent state are fp32; all matrix products
// run on tensor cores with fp32 accumulation; fp32 operands enter as bf16 hi/lo planes (16
// significant bits), raw bf16 inputs as exact operands. Measured 2e-6..4e-5 relative error vs an
// fp64 reference on H200 for the fp32 outputs; the 64x64 unit-lower-triangular inverse is fp32
// forward substitution on its 16x16 diagonal blocks and 3xTF32 block products off the diagonal.
// The FORWARD (gdn_forward) by default takes its operands as one fp16 plane each instead
// (fast_forward: 11 significant bits, half the tensor-core products; measured errors in
// docs/PERF.md). fp16's range is narrow, so every fp16 operand matrix is range-checked on the
// device as it is written; each (sequence, value head) whose operands left the safe range
// (a magnitude >= 2^15, or an operand whose largest magnitude over the sequence is below 2^-12,
// e.g. v ~ 1e-5) is recomputed on the bf16x2 path by the same launch sequence, without a host
// synchronisation (GdnFwdOut::fell_back reports it). The BACKWARD may run its reverse pass (the
// state gradient, the longest sequential pass) on fp16 operands (backward_path): it scales them
// itself, each product's gradient operand multiplied by a power of two chosen from its largest
// magnitude just before it is rounded to fp16, so gradients of any scale keep 11 significant
// bits and need no guard; only prep's fp16 q/k, T and P copies are range-checked, with the same
// bf16x2 fallback (GdnBwdIO::fell_back). The state recompute and the other backward products
// stay bf16x2: fp16 states cost the gate-parameter gradients (dA_log, ddt_bias: sums over every
// token) up to 3e-3 relative error.
// Results are bitwise deterministic for a given input and device. Decay factors
// exp(gamma_r - gamma_j) are only ever formed on the kept side (r >= j) and masking is done by
// selection, never by multiplying a possibly infinite value by 0. All offsets are int64. Grids are
// 1-D, so the number of packed sequences is unlimited.
//
// Only K = V = 128 and chunk size 64 are supported (checked; other sizes throw).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

struct CUstream_st;

namespace qrun::gdn {

using Stream = CUstream_st*;

enum class DType : int32_t { F32 = 0, BF16 = 1 };

constexpr int kChunk = 64;

// Chunk tables, built on the host from the HOST copy of cu_seqlens (no device sync needed).
//   chunk_table   int32 [num_chunks * 2]: (sequence id, chunk index inside the sequence)
//   chunk_offsets int32 [N + 1]: first global chunk of each sequence (exclusive prefix sum of
//                 ceil(L_n / 64)); chunk_offsets[N] = num_chunks.
// Upload both to the device and pass the device pointers in GdnProblem.
struct ChunkTables {
  std::vector<int32_t> chunk_table;
  std::vector<int32_t> chunk_offsets;
  int64_t num_chunks = 0;
};
ChunkTables gdn_build_chunk_tables(const int32_t* cu_seqlens_host, int64_t num_seqs);

// Shared problem description (inputs) for forward and backward.
struct GdnProblem {
  int64_t total_tokens = 0;  // T
  int64_t num_seqs = 0;      // N
  int64_t num_chunks = 0;    // from gdn_build_chunk_tables
  int H = 0, HV = 0, K = 128, V = 128;

  const int32_t* cu_seqlens = nullptr;     // device [N+1]
  const int32_t* chunk_table = nullptr;    // device [num_chunks*2]
  const int32_t* chunk_offsets = nullptr;  // device [N+1]

  const void* q = nullptr; int64_t q_st = 0, q_sh = 0;  // bf16 [T,H,K]
  const void* k = nullptr; int64_t k_st = 0, k_sh = 0;  // bf16 [T,H,K]
  const void* v = nullptr; int64_t v_st = 0, v_sh = 0;  // bf16 [T,HV,V]

  // Gate: either g (fp32 log-decay, gate_fused = false) or a/A_log/dt_bias (gate_fused = true).
  bool gate_fused = false;
  const float* g = nullptr; int64_t g_st = 0;
  const void* a = nullptr; DType a_dtype = DType::BF16; int64_t a_st = 0;
  const float* A_log = nullptr;
  const float* dt_bias = nullptr;

  // Beta: the write strength, or b with beta = sigmoid(b) when beta_sigmoid.
  const void* beta = nullptr; DType beta_dtype = DType::BF16; int64_t beta_st = 0;
  bool beta_sigmoid = false;

  bool qk_l2norm = false;
  float scale = -1.f;  // <= 0: K^-1/2

  const float* initial_state = nullptr;  // optional [N,HV,K,V]

  // Forward: fp16 operands with a range-checked bf16x2 fallback (see Numerics above); false:
  // always the bf16x2 path.
  bool fast_forward = true;
  // Backward: the reverse pass on fp16 operands (Fp16), on bf16x2 (Bf16x2), or Auto. Fp16 runs the
  // reverse pass (gdn_dh16t_kernel) and then a separate bf16x2 state recompute. On sm_90a (H100,
  // H200) that recompute is gdn_rec16t_kernel and Auto always takes Fp16: faster at every batch
  // shape measured (docs/PERF.md has the numbers). Elsewhere the recompute is gdn_state_kernel, and Auto takes Fp16
  // when the batch has at least as many (sequence, value head, 64-wide V slice) items as the GPU
  // has SMs: with fewer, the pair kernel of Bf16x2 was as fast or faster (H200).
  enum class BwdPath : int32_t { Auto = 0, Fp16 = 1, Bf16x2 = 2 };
  BwdPath backward_path = BwdPath::Auto;
};

struct GdnFwdOut {
  void* o = nullptr; int64_t o_st = 0, o_sh = 0;  // bf16 [T,HV,V]
  float* final_state = nullptr;                   // optional [N,HV,K,V]
  // optional device int32: set to 1 when the fast forward had to fall back to bf16x2, else 0
  int32_t* fell_back = nullptr;
  // Keep prep for the backward (fast_forward only): prep writes the backward's layout and T's
  // bf16 hi/lo planes as well (H200, 1x8192 at the 27B heads: about +0.01 ms), and a caller that
  // keeps the workspace unchanged until the backward passes it as GdnBwdIO::forward_workspace;
  // the backward then launches no prep (about -0.17 ms). The kept workspace is
  // gdn_fwd_workspace_bytes(p): 277 MB at 8192 tokens with 16 key and 48 value heads.
  bool keep_for_backward = false;
};

// Gradients. dq/dk/dv are written in grad_dtype (fp32 recommended; bf16 allowed). dq/dk are
// w.r.t. the UN-normalised q/k when qk_l2norm is on, and summed over each value-head group.
// dg is w.r.t. g when !gate_fused; when gate_fused it is w.r.t. a (da) and dA_log/ddt_bias are
// also written. dbeta is w.r.t. beta, or w.r.t. b when beta_sigmoid. Scalar grads are fp32,
// contiguous [T,HV]. Every pointer except dq/dk/dv/dg/dbeta may be null (not computed).
struct GdnBwdIO {
  const void* dO = nullptr; int64_t do_st = 0, do_sh = 0;  // bf16 [T,HV,V]
  const float* d_final_state = nullptr;                   // optional [N,HV,K,V]
  DType grad_dtype = DType::F32;
  void* dq = nullptr; int64_t dq_st = 0, dq_sh = 0;  // [T,H,K]
  void* dk = nullptr; int64_t dk_st = 0, dk_sh = 0;  // [T,H,K]
  void* dv = nullptr; int64_t dv_st = 0, dv_sh = 0;  // [T,HV,V]
  float* dg = nullptr;      // [T,HV] d/dg, or d/da when gate_fused
  float* dbeta = nullptr;   // [T,HV] d/dbeta, or d/db when beta_sigmoid
  float* dA_log = nullptr;  // [HV] (gate_fused only)
  float* ddt_bias = nullptr;// [HV] (gate_fused only)
  float* d_initial_state = nullptr;  // optional [N,HV,K,V]
  // optional device int32: set to 1 when the fast backward had to fall back to bf16x2, else 0
  int32_t* fell_back = nullptr;
  // optional: the workspace of a gdn_forward of the same problem with keep_for_backward set,
  // unchanged since. The backward takes prep's outputs from it instead of computing them (on the
  // fast path; otherwise it uses it as scratch for its own prep), and its own workspace is then
  // gdn_bwd_workspace_bytes(p, true) bytes. It may be used again (retain_graph): the backward
  // changes only what every later backward from it computes the same way.
  void* forward_workspace = nullptr;
};

// Scratch sizes in bytes (256-byte aligned base expected; cudaMalloc memory is).
size_t gdn_fwd_workspace_bytes(const GdnProblem& p);
// with_forward_workspace: the backward's own part when GdnBwdIO::forward_workspace is given.
size_t gdn_bwd_workspace_bytes(const GdnProblem& p, bool with_forward_workspace = false);

// The current device and the code these kernels run on it: sm = major * 10 + minor; wgmma: the
// sm_90a forms (wgmma products, the register-state recompute), which need a build for sm_90a
// (CMakeLists.txt makes 90 mean 90a). On an sm_90 device without them everything still runs, on
// the slower mma.sync forms.
struct GdnDeviceInfo {
  int sm = 0;
  bool wgmma = false;
};
GdnDeviceInfo gdn_device_info();

// Validates p (throws std::runtime_error with a clear message). Called by the launchers.
void gdn_check_problem(const GdnProblem& p);

void gdn_forward(const GdnProblem& p, const GdnFwdOut& out, void* workspace,
                 size_t workspace_bytes, Stream stream);

// Backward recomputes everything it needs from the inputs and, with a kept forward workspace
// (GdnFwdOut::keep_for_backward, GdnBwdIO::forward_workspace), from prep's outputs; the states are
// always recomputed.
void gdn_backward(const GdnProblem& p, const GdnBwdIO& io, void* workspace,
                  size_t workspace_bytes, Stream stream);

}  // namespace qrun::gdn
