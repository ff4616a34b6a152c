// Kernel parameter block and kernel declarations shared by the gated delta launch code.
#pragma once
#include <cstdint>

#include "gdn_common.cuh"
#include "gdn_mma16.cuh"

namespace qrun::gdn::detail {

struct KParams {
  int64_t T, N, NT;
  int H, HV, G;
  const int32_t* cu;
  const int32_t* ctab;
  const int32_t* coff;
  const void* q; int64_t q_st, q_sh;
  const void* k; int64_t k_st, k_sh;
  const void* v; int64_t v_st, v_sh;
  int gate_fused;
  const float* g; int64_t g_st;
  const void* a; int a_dt; int64_t a_st;
  const float* A_log;
  const float* dt_bias;
  const void* beta; int beta_dt; int64_t beta_st;
  int beta_sigmoid;
  int l2norm;
  float scale;
  const float* h0;
  // workspace
  float* rq; float* rk;      // [T,H]
  float* gam; float* bet;    // [T,HV]
  __nv_bfloat16* Tp; __nv_bfloat16* Pp;  // [NT,HV,2,64,64] bf16 hi/lo planes of T and P
                                         // (f16 forward: [NT,HV,64,64], one fp16 plane)
  __nv_bfloat16* T16; __nv_bfloat16* P16;  // fp16 paths: the one-plane fp16 T and P of item
  int64_t tp16_st;                          // (chunk c, value head hv) at (c*HV+hv)*tp16_st: the
                                            // forward's Tp/Pp (stride C*C); the fast backward's
                                            // Pp as [NT,HV,{T,P},64,64] (stride 2*C*C), Tp
                                            // keeping the hi/lo T planes bwd_chunk multiplies
  void* kh; void* qh;        // fp16 paths: [T,H,K] raw fp16 copies of k, q
  float* fx; float* fq; float* dec;  // fp16 paths: [T,HV] row factors of the register-state kernels
                             // (beta e^gam rsK, e^gam rsQ, e^{gam_L - gam} rsK; written by prep16)
  int* f16_bad;              // fp16 paths: [N*HV] 1 where a sequence's fp16 operands of value
                             // head hv were out of range; [N*HV] (one past) 1 if any was
  const int* run_if;         // fallback launches: only the (sequence, value head) pairs flagged here
  // backward workspace, written by the state recompute and the dh pass, read by bwd_chunk: the
  // bf16 hi/lo planes (the split its products use) of each 32-wide V slice, laid out
  // [NT,HV,NVS,2,rows,BV] so that bwd_chunk copies them into shared memory with cp.async
  __nv_bfloat16* hs; __nv_bfloat16* dhs;  // rows = K: S entering / dS leaving each chunk
  __nv_bfloat16* Dl; __nv_bfloat16* dDl;  // rows = C: Delta, dDelta (rows >= L zero)
  float* gacc;               // [bwd_chunk blocks][2][C*K]: each block's running dq, dk sums over
                             // a key head's value-head group (fragment order, see bwd_chunk_item),
                             // then [blocks][2][C*C]: its group's K K^T and Q K^T fragments
  float* part;               // [NT,HV,2]
  // Note [The split tail] (gdn_bwd.cu): bwd_chunk's last split_groups groups run as single items;
  // gsplit [split_groups][G][2][C*K] their dq, dk terms (fragment order), gcnt [split_groups] how
  // many of a group's items have kept theirs (zero before bwd_chunk)
  float* gsplit;
  int* gcnt;
  int64_t split_groups;
  // bwd_chunk beside the recompute (Note [Beside the recompute], gated_delta.cu); null: off
  int* ready;                // [NT,H] gdn_rec16t_kernel blocks of key head h's value heads that
                             // have published through chunk c (counted at every 8th chunk of a
                             // sequence and at its last); ready[-1]: the blocks that have finished
  unsigned long long* ticket;  // bwd_chunk's next group
  int ready_full;            // p.ready[c*H+h] when published: blocks per key head (G * slices)
  int ready_blocks;          // p.ready[-1] when every block has finished
  const int* skip_if;        // gdn_rec16t_kernel (and gdn_dh16t_kernel when the recompute starts
                             // beside it): pairs flagged here were redone by the fallback before
  // Note [The recompute beside the reverse pass] (gated_delta.cu): bwd_chunk's groups of key
  // heads 0..early_heads-1 come first (all their chunks), and it starts only once every reverse
  // pass block has finished (dh_done counts them, up to dh_blocks); dh_done null: not counted
  int* dh_done;
  int dh_blocks;
  int early_heads;
  // forward outputs
  void* o; int64_t o_st, o_sh;
  float* ht;
  // backward
  const void* dO; int64_t do_st, do_sh;
  const float* dht;
  int gdt;
  void* dq; int64_t dq_st, dq_sh;
  void* dk; int64_t dk_st, dk_sh;
  void* dv; int64_t dv_st, dv_sh;
  float* dg; float* dbeta; float* dA_log; float* ddt; float* dh0;
  // 16-byte vector loads allowed (pointer and strides aligned)
  int vec_q, vec_k, vec_v, vec_do;
  // dv, dq, dk rows may be written as element pairs (4 or 8 bytes; pointer and strides allow it)
  int pair_dv, pair_dq, pair_dk;
  int pair_o;   // o rows may be written as bf16 pairs (4 bytes)
  int vec_o;    // o rows may be written as 16-byte pieces (pointer and strides aligned)
};

__device__ __forceinline__ const __nv_bfloat16* bf16_at(const void* p, int64_t off) {
  return static_cast<const __nv_bfloat16*>(p) + off;
}

// Element offset of the plane pair of V slice vs of (chunk c, value head hv) in the backward's
// hs/dhs (rows = DK) and Dl/dDl (rows = C) buffers.
__host__ __device__ constexpr int64_t slice_planes(int64_t c, int HV, int hv, int vs, int rows) {
  return ((c * HV + hv) * NVS + vs) * (int64_t)(2 * rows * BV);
}

// Chunk c of a sequence whose chunks are c_beg.. and tokens bos..eos-1 (the sequential kernels):
// its global index, first token and length L <= C.
struct ChunkGeo {
  int64_t c, t0;
  int L;
};
__device__ __forceinline__ ChunkGeo chunk_geo(int64_t c, int64_t c_beg, int64_t bos, int64_t eos) {
  ChunkGeo g;
  g.c = c;
  g.t0 = bos + (c - c_beg) * C;
  g.L = (int)((eos - g.t0) < C ? (eos - g.t0) : C);
  return g;
}

// Block bid of a sequential kernel with `slices` blocks (V slices) per (sequence, value head): its
// slice, value head, key head and sequence.
struct SeqBlock {
  int vs, hv, h;
  int64_t n;
};
__device__ __forceinline__ SeqBlock seq_block(const KParams& p, int64_t bid, int slices) {
  SeqBlock b;
  b.vs = (int)(bid % slices);
  const int64_t rest = bid / slices;
  b.hv = (int)(rest % p.HV);
  b.n = rest / p.HV;
  b.h = b.hv / p.G;
  return b;
}

constexpr int LDKB = DK + 8;  // row stride (bf16) of the raw q/k tiles of prep and bwd_chunk

// Raw bf16 q and k rows of the chunk at token t0 (key head h) into [C][DK] tiles of layout
// el(row, column) (element offsets, 16-byte pieces of 8 columns contiguous: [C][LDKB] rows by
// default), rows >= L zero (cp.async when both are 16-byte aligned, plain stores otherwise), and
// their l2norm row scales (cp.async from p.rk / p.rq, which prep writes; 1 without the norm, 0
// beyond L; kLoadRs = false: the caller forms them, qk_row_scales). One committed cp.async
// group: complete after cp_async_wait_all() (or a wait that covers it) + __syncthreads(). Called
// by all NT threads.
struct QkRows {
  __device__ __forceinline__ int operator()(int r, int c) const { return r * LDKB + c; }
};
template <int NT, class El = QkRows, bool kLoadRs = true>
__device__ __forceinline__ void load_qk_tiles(const KParams& p, __nv_bfloat16* Kb, __nv_bfloat16* Qb,
                                              float* rsK, float* rsQ, int64_t t0, int h, int L, El el = {}) {
  const int tid = threadIdx.x;
  const __nv_bfloat16* kbase = bf16_at(p.k, t0 * p.k_st + (int64_t)h * p.k_sh);
  const __nv_bfloat16* qbase = bf16_at(p.q, t0 * p.q_st + (int64_t)h * p.q_sh);
  if (p.vec_k && p.vec_q) {
    for (int v = tid; v < C * DK / 8; v += NT) {
      const int r = v >> 4, c8 = (v & 15) * 8;
      const int rr = r < L ? r : 0;
      cp_async16(Kb + el(r, c8), kbase + rr * p.k_st + c8, r < L ? 16 : 0);
      cp_async16(Qb + el(r, c8), qbase + rr * p.q_st + c8, r < L ? 16 : 0);
    }
  } else {
    const __nv_bfloat16 z = __float2bfloat16_rn(0.f);
    for (int i = tid; i < C * DK; i += NT) {
      const int r = i / DK, cc = i % DK;
      Kb[el(r, cc)] = r < L ? kbase[r * p.k_st + cc] : z;
      Qb[el(r, cc)] = r < L ? qbase[r * p.q_st + cc] : z;
    }
  }
  if (kLoadRs && tid < C) {  // (asynchronous: a plain load here stalled these warps' part of the loads after it)
    const bool ok = tid < L;
    if (p.l2norm) {
      const int64_t i = (t0 + (ok ? tid : 0)) * p.H + h;
      cp_async4(rsK + tid, p.rk + i, ok ? 4 : 0);
      cp_async4(rsQ + tid, p.rq + i, ok ? 4 : 0);
    } else {
      rsK[tid] = ok ? 1.f : 0.f;
      rsQ[tid] = ok ? 1.f : 0.f;
    }
  }
  cp_async_commit();
}

// The l2norm row scales of the q/k tiles that load_qk_tiles put in shared memory (its default
// layout, after the wait and the barrier), into rsK / rsQ (1 without the norm, 0 beyond L), and,
// with the norm, into p.rk / p.rq for the kernels after prep (not in a fallback launch: the fast
// path's prep wrote the same values). rsqrt(sum x^2 + 1e-6) over one 16-byte piece per lane, 16
// lanes per row (2 * C * DK / 8 pieces: q's rows after k's), then a butterfly over the 16 lanes
// whose first lane writes: a fixed order. prep forms them here: the tiles are in shared memory
// anyway, and a separate pass over q and k took 0.035 ms at 1x8192 in the forward and again in
// the backward. The fast preps take the sums from the reads of their fp16 copies
// (row_scale_piece in prep_group); without the norm nothing is summed (summing the rows there
// too, for scales of 1, cost 0.006 ms of the 1x8192 forward). Visible after a barrier.
constexpr int kQkPieces = 2 * C * DK / 8;
static_assert(DK / 8 == 16, "16 pieces per row: qk_piece and the 16-lane butterfly");
__device__ __forceinline__ const __nv_bfloat16* qk_piece(const __nv_bfloat16* Kb, const __nv_bfloat16* Qb, int v,
                                                         int& isq, int& r, int& c8) {
  isq = v >= kQkPieces / 2;
  const int w = v - isq * (kQkPieces / 2);
  r = w >> 4;
  c8 = (w & 15) * 8;
  return (isq ? Qb : Kb) + r * LDKB + c8;
}
// Piece v's part of its row's scale. All 32 lanes of the warp call it together, with consecutive
// pieces v in consecutive lanes, so that a row's 16 pieces sit in 16 aligned lanes.
__device__ __forceinline__ void row_scale_piece(const KParams& p, uint4 u, int isq, int r, float* rsK, float* rsQ,
                                                int64_t t0, int h, int L) {
  float s = 0.f;
  for (uint32_t w : {u.x, u.y, u.z, u.w}) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
    s += f.x * f.x + f.y * f.y;
  }
#pragma unroll
  for (int o = 8; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 15) == 0) {
    const float rs = r < L ? rsqrtf(s + 1e-6f) : 0.f;
    (isq ? rsQ : rsK)[r] = rs;
    if (!p.run_if && r < L) (isq ? p.rq : p.rk)[(t0 + r) * p.H + h] = rs;
  }
}
template <int NT>
__device__ __forceinline__ void qk_row_scales(const KParams& p, const __nv_bfloat16* Kb, const __nv_bfloat16* Qb,
                                              float* rsK, float* rsQ, int64_t t0, int h, int L) {
  static_assert(kQkPieces % NT == 0 && NT % 32 == 0, "every lane of every warp takes a piece each round");
  if (!p.l2norm) {  // (uniform over the block)
    for (int v = threadIdx.x; v < 2 * C; v += NT) {
      const int isq = v >= C, r = v - isq * C;
      (isq ? rsQ : rsK)[r] = r < L ? 1.f : 0.f;
    }
    return;
  }
#pragma unroll 1  // (unrolled, the fallback prep spills: it holds the walk over groups as well)
  for (int v = threadIdx.x; v < kQkPieces; v += NT) {
    int isq, r, c8;
    const uint4 u = *reinterpret_cast<const uint4*>(qk_piece(Kb, Qb, v, isq, r, c8));
    row_scale_piece(p, u, isq, r, rsK, rsQ, t0, h, L);
  }
}

}  // namespace qrun::gdn::detail
