// Host side of the gated delta kernels: argument checks, workspace layout, launch sequences.
#include "gated_delta.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gdn_common.cuh"
#include "gdn_kernels.cuh"

namespace qrun::gdn {
namespace detail {
// kernels (defined in gdn_fwd.cu / gdn_bwd.cu)
__global__ void gdn_prep_kernel(KParams p);
__global__ void gdn_prep16_kernel(KParams p);
__global__ void gdn_prep16b_kernel(KParams p);
__global__ void gdn_prep_fallback_kernel(KParams p);
__global__ void gdn_state_kernel(KParams p, int mode);
__global__ void gdn_state16t_kernel(KParams p);
size_t seq_t_smem_bytes();
int seq_t_slices();
__global__ void gdn_state_dh_kernel(KParams p, int64_t nstate);
__global__ void gdn_dh16t_kernel(KParams p);
size_t dh16t_smem_bytes();
int dh16t_threads();
__global__ void gdn_rec16t_kernel(KParams p);
size_t rec16t_smem_bytes();
int rec16t_threads();
cudaError_t rec16t_built(bool& built);
__global__ void gdn_bwd_chunk_kernel(KParams p);
__global__ void gdn_bwd_chunk_beside_kernel(KParams p);
__global__ void gdn_bwd_chunk_split_kernel(KParams p);
size_t seq_smem_bytes();
size_t seq_smem_bytes_noq();
size_t prep_smem_bytes();
size_t bwd_smem_bytes();
__global__ void gdn_param_reduce_kernel(KParams p);
}  // namespace detail

namespace {
using namespace detail;


[[noreturn]] void fail(const std::string& m) { throw std::runtime_error("qrun::gdn: " + m); }

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(e));
}

size_t align_up(size_t x) { return (x + 255) & ~size_t(255); }

// bwd_chunk's grid is at most this many blocks (one per SM), each with its own slot of running
// dq/dk sums in the workspace: a fixed cap, so that the workspace size needs no device query.
constexpr int64_t kMaxBwdChunkBlocks = 256;
int64_t bwd_chunk_slots(const GdnProblem& p) {
  const int64_t groups = p.num_chunks * p.H;
  return groups < kMaxBwdChunkBlocks ? groups : kMaxBwdChunkBlocks;
}

// Note [Beside the recompute] (gdn_backward): bwd_chunk's ticket (8 bytes), the reverse pass's count
// of finished blocks (dh_done), the recompute's (ready[-1]), then its per-chunk and key head
// counts ready[NT,H]; then the split groups' counts (Note [The split tail], gdn_bwd.cu: at most
// one group per bwd_chunk block)
constexpr size_t kSyncHead = 16;
size_t ready_bytes(const GdnProblem& p) { return (size_t)p.num_chunks * p.H * sizeof(int32_t); }
size_t sync_bytes(const GdnProblem& p) {
  return kSyncHead + ready_bytes(p) + (size_t)bwd_chunk_slots(p) * sizeof(int32_t);
}

struct Layout {
  size_t rq, rk, gam, bet, Tp, Pp, kh, qh, fx, fq, dec, bad, hs, dhs, Dl, dDl, gacc, gsplit, part, sync, total_fwd, total_bwd;
};

Layout layout(const GdnProblem& p) {
  const size_t T = (size_t)p.total_tokens, NT = (size_t)p.num_chunks, H = p.H, HV = p.HV;
  const size_t KV = (size_t)DK * DV, f = sizeof(float);
  Layout l{};
  size_t off = 0;
  auto take = [&](size_t bytes) { size_t o = off; off += align_up(bytes); return o; };
  l.rq = take(T * H * f);
  l.rk = take(T * H * f);
  l.gam = take(T * HV * f);
  l.bet = take(T * HV * f);
  l.Tp = take(NT * HV * 2 * C * C * sizeof(uint16_t));
  l.Pp = take(NT * HV * 2 * C * C * sizeof(uint16_t));
  if (p.fast_forward || p.backward_path != GdnProblem::BwdPath::Bf16x2) {  // the fp16 paths' buffers
    l.kh = take(T * H * DK * sizeof(uint16_t));
    l.qh = take(T * H * DK * sizeof(uint16_t));
    l.fx = take(T * HV * f);
    l.fq = take(T * HV * f);
    l.dec = take(T * HV * f);
    l.bad = take(((size_t)p.num_seqs * HV + 1) * sizeof(int32_t));
  }
  l.total_fwd = off;  // the backward's buffers follow
  const size_t planes = 2 * sizeof(uint16_t);  // hi/lo bf16 per value
  l.hs = take(NT * HV * KV * planes);
  l.dhs = take(NT * HV * KV * planes);
  l.Dl = take(NT * HV * C * DV * planes);
  l.dDl = take(NT * HV * C * DV * planes);
  // (then each block's gram slot: K K^T and Q K^T of its current group, 2 x C x C floats)
  l.gacc = take((size_t)bwd_chunk_slots(p) * (2 * C * DK + 2 * C * C) * f);
  // (the split groups' dq/dk terms, Note [The split tail]; none with one value head per key head)
  l.gsplit = take(HV / H > 1 ? (size_t)bwd_chunk_slots(p) * (HV / H) * 2 * C * DK * f : 0);
  l.part = take(NT * HV * 2 * f);
  l.sync = take(sync_bytes(p));  // bwd_chunk's ticket, dh_done, the finished count, ready[NT,H]
  l.total_bwd = off;
  return l;
}

bool aligned16(const void* ptr, int64_t st, int64_t sh) {
  return ptr && (reinterpret_cast<uintptr_t>(ptr) % 16 == 0) && st % 8 == 0 && sh % 8 == 0;
}

// Which launch sequence the parameters serve: the forward, the forward that keeps its prep for the
// backward (kFwdKeep: the fp16 T and P in the backward's places, T's hi/lo planes too), or the
// backward.
enum class Role { kFwd, kFwdKeep, kBwd };

// The buffers before layout(p).total_fwd (prep's outputs) lie at `pre`; the backward's own ones
// (from total_fwd on) at `post`, offset by total_fwd: one workspace is pre = ws, post = ws +
// total_fwd; a kept forward workspace is pre (GdnBwdIO::forward_workspace).
KParams make_params(const GdnProblem& p, void* pre, void* post, Role role) {
  const Layout l = layout(p);
  const bool bwd = role == Role::kBwd, bwd_planes = role != Role::kFwd;
  char* w = static_cast<char*>(pre);
  KParams k{};
  k.T = p.total_tokens; k.N = p.num_seqs; k.NT = p.num_chunks;
  k.H = p.H; k.HV = p.HV; k.G = p.HV / p.H;
  k.cu = p.cu_seqlens; k.ctab = p.chunk_table; k.coff = p.chunk_offsets;
  k.q = p.q; k.q_st = p.q_st; k.q_sh = p.q_sh;
  k.k = p.k; k.k_st = p.k_st; k.k_sh = p.k_sh;
  k.v = p.v; k.v_st = p.v_st; k.v_sh = p.v_sh;
  k.gate_fused = p.gate_fused;
  k.g = p.g; k.g_st = p.g_st;
  k.a = p.a; k.a_dt = (int)p.a_dtype; k.a_st = p.a_st;
  k.A_log = p.A_log; k.dt_bias = p.dt_bias;
  k.beta = p.beta; k.beta_dt = (int)p.beta_dtype; k.beta_st = p.beta_st;
  k.beta_sigmoid = p.beta_sigmoid;
  k.l2norm = p.qk_l2norm;
  k.scale = p.scale > 0.f ? p.scale : 1.0f / sqrtf((float)p.K);
  k.h0 = p.initial_state;
  k.vec_q = aligned16(p.q, p.q_st, p.q_sh);
  k.vec_k = aligned16(p.k, p.k_st, p.k_sh);
  k.vec_v = aligned16(p.v, p.v_st, p.v_sh);
  k.rq = reinterpret_cast<float*>(w + l.rq);
  k.rk = reinterpret_cast<float*>(w + l.rk);
  k.gam = reinterpret_cast<float*>(w + l.gam);
  k.bet = reinterpret_cast<float*>(w + l.bet);
  k.Tp = reinterpret_cast<__nv_bfloat16*>(w + l.Tp);
  k.Pp = reinterpret_cast<__nv_bfloat16*>(w + l.Pp);
  if (bwd ? p.backward_path != GdnProblem::BwdPath::Bf16x2 : p.fast_forward) {
    k.kh = w + l.kh;
    k.qh = w + l.qh;
    k.fx = reinterpret_cast<float*>(w + l.fx);
    k.fq = reinterpret_cast<float*>(w + l.fq);
    k.dec = reinterpret_cast<float*>(w + l.dec);
    k.f16_bad = reinterpret_cast<int*>(w + l.bad);
    // the fp16 T and P planes: the forward's Tp and Pp; the backward's (and the kept forward's) Pp
    // as [NT,HV,{T,P},64,64] (its Tp keeps the hi/lo T planes that bwd_chunk multiplies)
    k.T16 = bwd_planes ? k.Pp : k.Tp;
    k.P16 = bwd_planes ? k.Pp + C * C : k.Pp;
    k.tp16_st = bwd_planes ? 2 * C * C : C * C;
  }
  if (bwd) {
    const auto at = [&](size_t off) { return static_cast<char*>(post) + (off - l.total_fwd); };
    k.hs = reinterpret_cast<__nv_bfloat16*>(at(l.hs));
    k.dhs = reinterpret_cast<__nv_bfloat16*>(at(l.dhs));
    k.Dl = reinterpret_cast<__nv_bfloat16*>(at(l.Dl));
    k.dDl = reinterpret_cast<__nv_bfloat16*>(at(l.dDl));
    k.gacc = reinterpret_cast<float*>(at(l.gacc));
    k.part = reinterpret_cast<float*>(at(l.part));
    k.gsplit = reinterpret_cast<float*>(at(l.gsplit));
    k.gcnt = reinterpret_cast<int*>(at(l.sync) + kSyncHead + ready_bytes(p));
  }
  return k;
}

void check_launch(const char* name) { check_cuda(cudaGetLastError(), name); }

// Raises a kernel's dynamic shared-memory limit once per (kernel, device).
template <class K>
void set_smem(K kernel, size_t bytes, int slot) {
  static std::atomic<uint64_t> done[16][64];  // [slot: one per kernel][device]
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  auto& flag = done[slot][dev & 63];
  if (flag.load(std::memory_order_acquire) == (uint64_t)bytes) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes), "cudaFuncSetAttribute");
  flag.store((uint64_t)bytes, std::memory_order_release);
}

// Multiprocessor count of the current device (cached per device).
int sm_count() {
  static std::atomic<int> cache[64];
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  int n = cache[dev & 63].load(std::memory_order_relaxed);
  if (n == 0) {
    check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    cache[dev & 63].store(n, std::memory_order_relaxed);
  }
  return n;
}

// Launches kernel<<<grid, threads, smem, s>>>(args...) as the programmatic dependent of the kernel
// before it on s (it may start once every block of that one has run griddepcontrol.launch_dependents).
template <class... KArgs, class... Args>
void launch_dependent(cudaStream_t s, unsigned grid, unsigned threads, size_t smem, void (*kernel)(KArgs...),
                      const char* name, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, args...), name);
}

// Whether the backward's register-state recompute (gdn_rec16t_kernel, wgmma only) runs on the
// current device: whether the image loaded for it has the kernel's body (sm_90a; rec16t_built in
// gdn_seq_t.cu reads the device pass's flag), cached per device. Elsewhere the body traps, and the
// bf16x2 gdn_state_kernel recomputes instead.
bool rec16t_runs() {
  static std::atomic<int> cache[64];  // 0 unknown, 1 no, 2 yes
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  int v = cache[dev & 63].load(std::memory_order_relaxed);
  if (v == 0) {
    bool built = false;
    check_cuda(rec16t_built(built), "cudaMemcpyFromSymbol (gdn_rec16t_built)");
    v = built ? 2 : 1;
    cache[dev & 63].store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

// Debug aid: QRUN_GDN_PROFILE=1 times every launch with events and prints the split to stderr
// (synchronises the stream; never use it in production).
struct Prof {
  bool on = std::getenv("QRUN_GDN_PROFILE") != nullptr;
  cudaStream_t s{};
  std::vector<std::pair<const char*, cudaEvent_t>> ev;
  explicit Prof(cudaStream_t st) : s(st) { mark("start"); }
  void mark(const char* name) {
    if (!on) return;
    cudaEvent_t e;
    cudaEventCreate(&e);
    cudaEventRecord(e, s);
    ev.emplace_back(name, e);
  }
  ~Prof() {
    if (!on) return;
    cudaEventSynchronize(ev.back().second);
    for (size_t i = 1; i < ev.size(); ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, ev[i - 1].second, ev[i].second);
      std::fprintf(stderr, "  [gdn] %-22s %8.3f ms\n", ev[i].first, ms);
    }
    for (auto& e : ev) cudaEventDestroy(e.second);
  }
};


unsigned grid1d(int64_t blocks, const char* what) {
  if (blocks <= 0 || blocks > 0x7fffffffLL) fail(std::string("grid size out of range for ") + what);
  return (unsigned)blocks;
}

// prep (with the l2norm scales: qk_row_scales). Kinds: the bf16x2 prep (kPrepHL), the fast
// forward's (kPrepF16), the fast backward's (kPrepB16). A fallback launch (k.run_if set) forms the
// scales again for its own use but leaves p.rk / p.rq as the fast path's prep wrote them.
enum PrepKind { kPrepHL, kPrepF16, kPrepB16 };
void launch_common_fwd(const KParams& k, const GdnProblem& p, cudaStream_t s, Prof& pr, PrepKind kind) {
  if (p.num_chunks > 0) {
    // one block per (chunk, key head) group; the fallback launch (k.run_if) walks the groups on a
    // small grid (gdn_prep_fallback_kernel)
    struct Prep { void (*kern)(KParams); int slot; const char* name; };
    const Prep pk = kind == kPrepF16   ? Prep{gdn_prep16_kernel, 5, "gdn_prep16_kernel"}
                    : kind == kPrepB16 ? Prep{gdn_prep16b_kernel, 7, "gdn_prep16b_kernel"}
                    : k.run_if         ? Prep{gdn_prep_fallback_kernel, 6, "gdn_prep_fallback_kernel"}
                                       : Prep{gdn_prep_kernel, 0, "gdn_prep_kernel"};
    set_smem(pk.kern, prep_smem_bytes(), pk.slot);
    const int64_t items = p.num_chunks * p.H, fb = 3 * (int64_t)sm_count();
    pk.kern<<<grid1d(k.run_if && items > fb ? fb : items, "prep"), 256, prep_smem_bytes(), s>>>(k);
    check_launch(pk.name);
    pr.mark(kind == kPrepF16 ? "prep(fp16)" : kind == kPrepB16 ? "prep(fp16, bwd)" : k.run_if ? "prep fallback" : "prep");
  }
}

// The optional fell_back flag of a launch sequence: the fp16 path's "any pair flagged" word (one
// past the per-pair flags) when it ran (k.run_if set), else 0.
void report_fallback(int32_t* dst, const KParams& k, const GdnProblem& p, cudaStream_t s) {
  if (!dst) return;
  if (k.run_if)
    check_cuda(cudaMemcpyAsync(dst, k.f16_bad + p.num_seqs * p.HV, sizeof(int32_t), cudaMemcpyDeviceToDevice, s),
               "cudaMemcpyAsync");
  else
    check_cuda(cudaMemsetAsync(dst, 0, sizeof(int32_t), s), "cudaMemsetAsync");
}

}  // namespace

ChunkTables gdn_build_chunk_tables(const int32_t* cu, int64_t N) {
  if (N < 0 || (N > 0 && !cu)) fail("gdn_build_chunk_tables: bad cu_seqlens");
  ChunkTables t;
  t.chunk_offsets.resize(N + 1);
  int64_t nt = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t L = (int64_t)cu[n + 1] - cu[n];
    if (L < 0) fail("cu_seqlens must be non-decreasing");
    if (nt > 0x7fffffffLL) fail("too many chunks");
    t.chunk_offsets[n] = (int32_t)nt;
    const int64_t nc = (L + C - 1) / C;
    for (int64_t i = 0; i < nc; ++i) {
      t.chunk_table.push_back((int32_t)n);
      t.chunk_table.push_back((int32_t)i);
    }
    nt += nc;
  }
  t.chunk_offsets[N] = (int32_t)nt;
  t.num_chunks = nt;
  return t;
}

void gdn_check_problem(const GdnProblem& p) {
  if (p.K != 128 || p.V != 128)
    fail("only K = V = 128 is supported (got K = " + std::to_string(p.K) + ", V = " + std::to_string(p.V) + ")");
  if (p.H <= 0 || p.HV <= 0 || p.HV % p.H != 0) fail("HV must be a positive multiple of H");
  if (p.H > 32767) fail("too many key heads (H must be at most 32767)");  // (grid.y = 2H of the l2norm kernel)
  if ((int64_t)p.HV * DV * C > 0x7fffffffLL) fail("too many value heads (HV * 128 * 64 must fit int32)");
  if (p.total_tokens < 0 || p.num_seqs < 0 || p.num_chunks < 0) fail("negative sizes");
  if (p.total_tokens > 0x7fffffffLL) fail("total_tokens must fit int32 (cu_seqlens is int32)");
  if (p.num_seqs > 0 && (!p.cu_seqlens || !p.chunk_offsets)) fail("cu_seqlens and chunk_offsets are required");
  if (p.num_chunks > 0 && !p.chunk_table) fail("chunk_table is required");
  if (p.num_chunks < (p.total_tokens + C - 1) / C) fail("num_chunks is inconsistent with total_tokens");
  if (p.total_tokens > 0) {
    if (!p.q || !p.k || !p.v) fail("q, k, v are required");
    if (p.gate_fused) {
      if (!p.a || !p.A_log || !p.dt_bias) fail("gate_fused needs a, A_log and dt_bias");
    } else if (!p.g) {
      fail("g is required (or set gate_fused)");
    }
    if (!p.beta) fail("beta (or b) is required");
  }
  auto dt_ok = [](DType d) { return d == DType::F32 || d == DType::BF16; };
  if (!dt_ok(p.a_dtype) || !dt_ok(p.beta_dtype)) fail("bad dtype");
}

size_t gdn_fwd_workspace_bytes(const GdnProblem& p) {
  gdn_check_problem(p);
  return layout(p).total_fwd;
}
size_t gdn_bwd_workspace_bytes(const GdnProblem& p, bool with_forward_workspace) {
  gdn_check_problem(p);
  const Layout l = layout(p);
  return with_forward_workspace ? l.total_bwd - l.total_fwd : l.total_bwd;
}

void gdn_forward(const GdnProblem& p, const GdnFwdOut& out, void* ws, size_t ws_bytes, Stream stream) {
  gdn_check_problem(p);
  if (ws_bytes < layout(p).total_fwd || (!ws && layout(p).total_fwd > 0)) fail("forward workspace too small");
  if (p.total_tokens > 0 && !out.o) fail("o is required");
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  // Note [Kept prep]: with keep_for_backward the fast forward's prep is the backward's (kPrepB16:
  // the fp16 T and P where the backward reads them, T's hi/lo planes too), and the caller keeps the
  // workspace for gdn_backward (GdnBwdIO::forward_workspace), which then launches no prep of its
  // own and inherits the forward's fp16-range flags: a pair the forward redid in bf16x2 is redone
  // by the backward's bf16x2 launches too (conservative; the forward's state checks flag it as
  // well). The backward's fallback launches rewrite only flagged pairs' prep, with the same
  // values (T, gamma, beta) or in the bf16x2 form those pairs then keep (P): a second backward
  // from the same workspace (retain_graph) sees the same flags and computes the same.
  const bool keep = out.keep_for_backward && p.fast_forward;
  KParams k = make_params(p, ws, nullptr, keep ? Role::kFwdKeep : Role::kFwd);
  k.o = out.o; k.o_st = out.o_st; k.o_sh = out.o_sh;
  k.pair_o = out.o && reinterpret_cast<uintptr_t>(out.o) % 4 == 0 && out.o_st % 2 == 0 && out.o_sh % 2 == 0;
  k.vec_o = aligned16(out.o, out.o_st, out.o_sh);
  k.ht = out.final_state;
  Prof pr(s);
  if (p.fast_forward && p.total_tokens > 0) {
    // Note [f16 guard]: the fp16 kernels flag each (sequence, value head) whose fp16 operands
    // left fp16's safe range (gdn_mma16.cuh f16_range_ok); the bf16x2 kernels launched after them
    // (run_if) redo the forward (o, final state) of exactly those pairs, and return at once
    // everywhere else. No host synchronisation either way.
    check_cuda(cudaMemsetAsync(k.f16_bad, 0, ((size_t)p.num_seqs * p.HV + 1) * sizeof(int32_t), s), "cudaMemsetAsync");
    launch_common_fwd(k, p, s, pr, keep ? kPrepB16 : kPrepF16);
    if (p.num_seqs > 0) {
      const int64_t blocks = p.num_seqs * p.HV * seq_t_slices();
      set_smem(gdn_state16t_kernel, seq_t_smem_bytes(), 4);
      gdn_state16t_kernel<<<grid1d(blocks, "state"), 256, seq_t_smem_bytes(), s>>>(k);
      check_launch("gdn_state16t_kernel");
      pr.mark("state(fwd, fp16)");
    }
    k.run_if = k.f16_bad;
  }
  launch_common_fwd(k, p, s, pr, kPrepHL);
  if (p.num_seqs > 0) {
    set_smem(gdn_state_kernel, seq_smem_bytes(), 1);
    gdn_state_kernel<<<grid1d(p.num_seqs * p.HV * NVS, "state"), 256, seq_smem_bytes(), s>>>(k, 1);
    check_launch("gdn_state_kernel");
    pr.mark(k.run_if ? "fallback (not taken: returns)" : "state(fwd)");
  }
  report_fallback(out.fell_back, k, p, s);
}

GdnDeviceInfo gdn_device_info() {
  int dev = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute");
  GdnDeviceInfo d;
  d.sm = 10 * major + minor;
  d.wgmma = rec16t_runs();
  return d;
}

void gdn_backward(const GdnProblem& p, const GdnBwdIO& io, void* ws, size_t ws_bytes, Stream stream) {
  gdn_check_problem(p);
  const Layout l = layout(p);
  void* const fws = io.forward_workspace;
  if (fws) {
    if (ws_bytes < l.total_bwd - l.total_fwd || (!ws && l.total_bwd > l.total_fwd))
      fail("backward workspace too small (with a forward workspace: gdn_bwd_workspace_bytes(p, true))");
  } else if (ws_bytes < l.total_bwd || (!ws && l.total_bwd > 0)) {
    fail("backward workspace too small");
  }
  if (p.total_tokens > 0 && (!io.dO || !io.dq || !io.dk || !io.dv || !io.dg || !io.dbeta))
    fail("backward needs dO, dq, dk, dv, dg and dbeta");
  if (io.grad_dtype != DType::F32 && io.grad_dtype != DType::BF16) fail("bad grad dtype");
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  char* const post = fws ? static_cast<char*>(ws) : static_cast<char*>(ws) + l.total_fwd;
  KParams k = make_params(p, fws ? fws : ws, post, Role::kBwd);
  k.dO = io.dO; k.do_st = io.do_st; k.do_sh = io.do_sh;
  k.dht = io.d_final_state;
  k.gdt = (int)io.grad_dtype;
  k.dq = io.dq; k.dq_st = io.dq_st; k.dq_sh = io.dq_sh;
  k.dk = io.dk; k.dk_st = io.dk_st; k.dk_sh = io.dk_sh;
  k.dv = io.dv; k.dv_st = io.dv_st; k.dv_sh = io.dv_sh;
  k.dg = io.dg; k.dbeta = io.dbeta; k.dA_log = io.dA_log; k.ddt = io.ddt_bias; k.dh0 = io.d_initial_state;
  k.vec_do = aligned16(io.dO, io.do_st, io.do_sh);
  const size_t pair_bytes = io.grad_dtype == DType::F32 ? 8 : 4;
  const auto pairs_ok = [&](const void* ptr, int64_t st, int64_t sh) {
    return ptr && reinterpret_cast<uintptr_t>(ptr) % pair_bytes == 0 && st % 2 == 0 && sh % 2 == 0;
  };
  k.pair_dv = pairs_ok(io.dv, io.dv_st, io.dv_sh);
  k.pair_dq = pairs_ok(io.dq, io.dq_st, io.dq_sh);
  k.pair_dk = pairs_ok(io.dk, io.dk_st, io.dk_sh);
  Prof pr(s);
  using Path = GdnProblem::BwdPath;
  // Auto: fp16 wherever the register-state recompute runs (sm_90a: faster at every batch shape
  // measured); elsewhere when the batch fills the GPU (see GdnProblem::backward_path)
  const bool fast = p.total_tokens > 0 &&
                    (p.backward_path == Path::Fp16 ||
                     (p.backward_path == Path::Auto &&
                      (rec16t_runs() || p.num_seqs * p.HV * seq_t_slices() >= sm_count())));
  // The bf16x2 state recompute and reverse pass (gdn_state_dh_kernel): the whole backward's on the
  // bf16x2 path; the fast path's fallback for the flagged (sequence, value head)s (k.run_if set:
  // everything else returns at once).
  bool fallbacks_done = false;
  const auto fallbacks = [&] {
    launch_common_fwd(k, p, s, pr, kPrepHL);
    if (p.num_seqs > 0) {
      const int64_t nseq = p.num_seqs * p.HV * NVS;
      set_smem(gdn_state_dh_kernel, seq_smem_bytes(), 2);
      gdn_state_dh_kernel<<<grid1d(2 * nseq, "state+dh"), 256, seq_smem_bytes(), s>>>(k, nseq);
      check_launch("gdn_state_dh_kernel");
      pr.mark(k.run_if ? "fallback (not taken: returns)" : "state(recompute h) + dh");
    }
  };
  if (fast) {
    // The fast backward: the reverse pass (the state gradient, the longest sequential pass) on fp16
    // operands that it scales itself (gdn_dh16t_kernel), and the state recompute in bf16x2
    // precision (fp16 states cost the gate gradients' sums, dA_log and ddt_bias, up to 3e-3
    // relative error): gdn_rec16t_kernel on sm_90a, else gdn_state_kernel mode 2. The two passes
    // are independent; bwd_chunk needs both.
    // Note [f16 guard] (gdn_forward): prep's fp16 q/k, T and P are range-checked as in the fast
    // forward; flagged (sequence, value head)s are redone by the bf16x2 launches below, which
    // return at once everywhere else. With a kept forward workspace (Note [Kept prep], gdn_forward)
    // prep and its flags are the forward's.
    if (!(fws && p.fast_forward)) {
      check_cuda(cudaMemsetAsync(k.f16_bad, 0, ((size_t)p.num_seqs * p.HV + 1) * sizeof(int32_t), s), "cudaMemsetAsync");
      launch_common_fwd(k, p, s, pr, kPrepB16);
    }
    if (p.num_seqs > 0) {
      const int64_t blocks = p.num_seqs * p.HV * seq_t_slices();
      // sm_90a: the recompute in the register-state form, one block per 64-wide slice like
      // the reverse pass, launched after it. Not beside it in general: the two share SMs badly. At
      // 1x8192 (96 + 96 blocks) the pair took 1.08 ms when the recompute was the reverse pass's
      // programmatic dependent (0.89 ms the other way round) and 0.85 ms one after the other,
      // against 0.46 + 0.40 ms alone (the recompute's blocks then shared SMs two by two).
      //
      // Note [Beside the recompute]: where the recompute leaves SMs idle (fewer blocks than SMs:
      // 96 of 132 at 1x8192), bwd_chunk is its programmatic dependent. Its blocks start on the idle
      // SMs as soon as every recompute block has started, take the groups by ticket in chunk
      // order, and run each once the recompute has published its chunk for the group's key head
      // (every block of the key head's value heads has stored the chunk's planes: p.ready,
      // counted at every 8th chunk). No deadlock: every block they wait for is already running.
      // The flagged pairs' fallback runs first, and the two passes skip those pairs, so that
      // nothing runs between them and bwd_chunk. (With no idle SM, 4x2048's 384 blocks, tickets
      // gain nothing.)
      //
      // Note [The recompute beside the reverse pass]: at one sequence, the recompute is also the
      // reverse pass's programmatic dependent: its first blocks, whole key heads' groups of value
      // heads, run two per SM on the SMs the reverse pass leaves (12 key heads at 1x8192: 72
      // blocks on 36 SMs), the rest as the reverse pass's blocks finish. bwd_chunk takes those
      // early key heads' groups first (nothing to wait for once the reverse pass is done: it
      // waits for every reverse pass block to count itself finished, p.dh_done), then the others
      // in chunk order as above; so the SMs idle during the reverse pass do the recompute's work,
      // and the recompute's late blocks leave more SMs to bwd_chunk. H200, 1x8192, kept prep:
      // backward 1.76 ms against 1.85 without the early key heads (one block per idle SM, 6 early
      // key heads: 1.80; the early heads' groups head by head instead of in chunk order: 1.78).
      const bool beside = rec16t_runs() && blocks < sm_count() && p.num_chunks > 0;
      const int64_t per_head = (int64_t)(p.HV / p.H) * seq_t_slices();  // recompute blocks per key head
      // (bwd_chunk maps tickets to groups in 32-bit arithmetic then: at most 2^30 groups)
      const int early = beside && p.num_seqs == 1 && p.num_chunks * p.H < (int64_t(1) << 30)
                            ? (int)std::min<int64_t>(2 * (sm_count() - blocks) / per_head, p.H - 1)
                            : 0;
      if (beside) {
        k.run_if = k.f16_bad;
        fallbacks();
        report_fallback(io.fell_back, k, p, s);
        fallbacks_done = true;
        char* const sync = post + (l.sync - l.total_fwd);
        check_cuda(cudaMemsetAsync(sync, 0, sync_bytes(p), s), "cudaMemsetAsync");
        k.ticket = reinterpret_cast<unsigned long long*>(sync);
        k.ready = reinterpret_cast<int*>(sync + kSyncHead);
        k.ready_full = (int)per_head;
        k.ready_blocks = (int)blocks;
        k.skip_if = k.f16_bad;
        k.early_heads = early;
        if (early > 0) {
          k.dh_done = reinterpret_cast<int*>(sync + 8);
          k.dh_blocks = (int)blocks;
        }
      }
      set_smem(gdn_dh16t_kernel, dh16t_smem_bytes(), 8);
      gdn_dh16t_kernel<<<grid1d(blocks, "dh"), dh16t_threads(), dh16t_smem_bytes(), s>>>(k);
      check_launch("gdn_dh16t_kernel");
      if (rec16t_runs()) {
        set_smem(gdn_rec16t_kernel, rec16t_smem_bytes(), 9);
        if (early > 0) {
          launch_dependent(s, grid1d(blocks, "state"), rec16t_threads(), rec16t_smem_bytes(), gdn_rec16t_kernel,
                           "gdn_rec16t_kernel", k);
        } else {
          gdn_rec16t_kernel<<<grid1d(blocks, "state"), rec16t_threads(), rec16t_smem_bytes(), s>>>(k);
          check_launch("gdn_rec16t_kernel");
        }
      } else {
        // The bf16x2 recompute (256 threads per 32-wide slice) as the reverse pass's programmatic
        // dependent: its blocks fill the SM room the reverse pass leaves (H200, measured with a
        // reverse pass without producer warps: 4x2048 0.80 ms against 0.36 + 0.47 alone; at 1x8192
        // the sum), and it waits for the reverse pass before it exits (griddepcontrol.wait), so that
        // bwd_chunk, launched after it, sees both.
        set_smem(gdn_state_kernel, seq_smem_bytes(), 1);
        launch_dependent(s, grid1d(p.num_seqs * p.HV * NVS, "state"), 256, seq_smem_bytes_noq(),  // (mode 2: no q tile)
                         gdn_state_kernel, "gdn_state_kernel (recompute)", k, 2);
      }
      pr.mark("dh (fp16) + state(recompute h)");
    }
    k.run_if = k.f16_bad;
  }
  if (!fallbacks_done) {
    fallbacks();
    report_fallback(io.fell_back, k, p, s);
  }
  if (p.num_chunks > 0) {
    set_smem(gdn_bwd_chunk_kernel, bwd_smem_bytes(), 3);
    // persistent: one block per SM (shared memory allows no second), groups in launch order, or
    // by ticket beside the recompute (Note [Beside the recompute])
    const int64_t slots = bwd_chunk_slots(p);
    const unsigned blocks = grid1d(slots < sm_count() ? slots : sm_count(), "bwd_chunk");
    // Note [The split tail] (gdn_bwd.cu): in launch order the last, partial round of groups runs
    // as single items (all groups when there are fewer than SMs), where their rounds of items,
    // each about 1.25 items long (every split item forms the group's q/k tiles and grams), end
    // before a group of G items would
    const int64_t groups = p.num_chunks * p.H, G = p.HV / p.H;
    if (!k.ticket && G > 1) {
      const int64_t r = groups < sm_count() ? groups : groups % blocks;
      const int64_t rounds = (r * G + sm_count() - 1) / sm_count();
      k.split_groups = 5 * rounds < 4 * G ? r : 0;
      if (k.split_groups > 0)
        check_cuda(cudaMemsetAsync(k.gcnt, 0, (size_t)k.split_groups * sizeof(int32_t), s), "cudaMemsetAsync");
    }
    if (k.ticket) {
      set_smem(gdn_bwd_chunk_beside_kernel, bwd_smem_bytes(), 10);
      launch_dependent(s, blocks, 512, bwd_smem_bytes(), gdn_bwd_chunk_beside_kernel, "gdn_bwd_chunk_beside_kernel", k);
    } else {
      gdn_bwd_chunk_kernel<<<blocks, 512, bwd_smem_bytes(), s>>>(k);
      check_launch("gdn_bwd_chunk_kernel");
      if (k.split_groups > 0) {
        set_smem(gdn_bwd_chunk_split_kernel, bwd_smem_bytes(), 11);
        const int64_t items = k.split_groups * G;
        launch_dependent(s, (unsigned)std::min<int64_t>(items, sm_count()), 512, bwd_smem_bytes(),
                         gdn_bwd_chunk_split_kernel, "gdn_bwd_chunk_split_kernel", k);
      }
    }
    pr.mark("bwd_chunk");
  }
  if (p.gate_fused && (io.dA_log || io.ddt_bias)) {
    gdn_param_reduce_kernel<<<grid1d(p.HV, "param_reduce"), 256, 0, s>>>(k);
    check_launch("gdn_param_reduce_kernel");
    pr.mark("param_reduce");
  }
}

}  // namespace qrun::gdn
