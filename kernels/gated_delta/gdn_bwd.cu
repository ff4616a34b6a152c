// Backward kernels of the chunked gated delta rule:
//   (the reverse sequential pass, dh_body of gdn_state_dh_kernel, is in gdn_seq.cu)
//   gdn_bwd_chunk_kernel  persistent, one (chunk, key head) group at a time, its value heads in
//                         order: dv, dbeta, dgamma -> dg (chunk-local reverse cumsum), fused
//                         gate/beta grads per value head; dq/dk summed over the group and the
//                         l2norm backward after the last value head.
//   gdn_param_reduce_kernel  per value head: dA_log, ddt_bias from per-chunk partials.
#include "gdn_common.cuh"
#include "gdn_kernels.cuh"
#include "gdn_mma16.cuh"
#include "gdn_wgmma.cuh"

// The V loop's and the WY part's products on wgmma (sm_90a); other architectures build the
// mma.sync form over the same layout.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GDN_BWD_WGMMA 1
#else
#define GDN_BWD_WGMMA 0
#endif

namespace qrun::gdn::detail {
GDN_PH_DECL
GDN_PH_HOST(gdn_debug_phases_bwd)

constexpr int kBwdThreads = 512;
constexpr int SPL = DK * BV;  // one [128][BV] plane
constexpr int CPL = C * BV;   // one [64][BV] plane
// One V-slice buffer (bf16): S0 and dS_C planes [2][128][BV], Delta planes [2][64][BV], raw dO
// and v slices [64][BV], each 64-byte swizzled (wg::sw64, the layout of the wgmma operands). The
// V loop double-buffers it. The dDelta planes [2][64][BV] of every slice stay for the item
// (kDdEl at union offset kDdOff: dV = T^T dDelta after the loop).
constexpr int kSliceEl = 4 * SPL + 4 * CPL;
constexpr int kDdEl = NVS * 2 * CPL;
// The raw q/k tiles and the dW planes are [64][128] bf16 matrices as two [64][64] column blocks in
// the 128-byte swizzle (wg::el128), the layout of the WY part's wgmma operands; the [64][64]
// planes (T, XpA, XpB, dT) are swz<64> planes, the same layout as one block.
struct Qk128 {
  __device__ __forceinline__ int operator()(int r, int c) const { return wg::el128(r, c); }
};
// The same offsets at one lane's accumulator positions of the 16 x 32 tile at (r0, c0) (r0 % 8,
// c0 % 32 == 0), taking the tile-local (r, cc) of for_frag / frag_rowdot (r = gq + 8h,
// cc = 8n + 2tq + u): the swizzled chunk is x ^ n with x formed once, so each position costs a
// few instructions instead of el128's full form (which made the WY part's register pressure
// spill).
struct FragQk {
  int base, x;
  __device__ __forceinline__ FragQk(int r0, int c0, int gq, int tq)
      : base((c0 >> 6) * 64 * 64 + (r0 + gq) * 64 + 2 * tq), x(((c0 >> 3) & 7) ^ gq) {}
  __device__ __forceinline__ int operator()(int r, int cc) const {
    return base + (r >> 3) * 8 * 64 + (((x ^ (cc >> 3)) & 7) << 3) + (cc & 1);
  }
};
constexpr int kQkF = C * DK;  // Kb and Qb (floats)
constexpr int kDwF = C * DK;  // the dW hi/lo planes (floats)
// Union offsets (floats). The V loop: the two slice buffers from 0, the dDelta planes at kDdOff.
// Between them, from the prologue to phase 10, the group's K K^T and Q K^T (scaled, fragment order
// [2][512] float4 each: every thread reads back only what it wrote itself or copied itself).
// The redistribution of the V loop's accumulators (the 48 n8 tiles that change warpgroup, [48][4][32]
// float4) lies in the slice buffers' place. The post-loop view: dT scratch, the XpA / XpB plane
// pairs, the dW planes, the row / column partials (ep, ec) below the gram fragments, M1 and G above
// them (where the dDelta planes were: dV is done by then).
constexpr int kGramO = kSliceEl;           // (kSliceEl bf16 elements: the two slice buffers' floats)
constexpr int kDdOff = kGramO + 2 * C * C;  // the dDelta planes
constexpr int kRedistF = 48 * 4 * 32 * 4;
static_assert(kRedistF <= kGramO, "the redistribution lies in the slice buffers' place");
constexpr int kDtsO = 0, kXpO = kDtsO + C * LDC, kDwO = kXpO + 2 * C * C, kEpO = kDwO + kDwF;
static_assert(kEpO + 8 * C <= kGramO, "dT scratch, XpA, XpB, dW planes, partials below the gram fragments");
constexpr int kM1O = kDdOff, kGsO = kM1O + C * LDC, kPostF = kGsO + C * LDC;
constexpr int kUnionA = kDdOff + kDdEl / 2;
constexpr int kUnion = (kUnionA > kPostF) ? kUnionA : kPostF;
constexpr int kBwdSmemF = kQkF + C * C + kUnion + 31 * C + 8;

// wgmma operands with the 128-byte swizzle start on 1024-byte boundaries (the q/k tiles, T planes,
// XpA, XpB, dW and dT planes); the 64-byte-swizzled slice planes on 512-byte ones.
static_assert(kQkF * 4 % 1024 == 0 && (kQkF + C * C) * 4 % 1024 == 0 && kXpO * 4 % 1024 == 0 &&
                  kDwO * 4 % 1024 == 0 && kM1O * 4 % 1024 == 0 && kSliceEl * 2 % 512 == 0 && SPL * 2 % 512 == 0 &&
                  kDdOff * 4 % 512 == 0 &&
                  CPL * 2 % 512 == 0,
              "operand alignment");
size_t bwd_smem_bytes() { return (size_t)kBwdSmemF * sizeof(float); }

#if GDN_BWD_WGMMA
// acc += A B over k = 16 KS (the WY part's products, one per warpgroup: rows 0-63, the columns of
// the descriptor b), A and B in the 128-byte swizzle (wg::k128 K-major, wg::mn128 MN-major when
// TA/TB). ALO/BLO: byte offset of the operand's lo plane (hi/lo split operand: 2 or 3 terms as
// mma16 forms them), 0 for an exact raw operand. Issued only: the caller fences, commits and waits.
template <int TA, int TB, int KS, uint32_t ALO, uint32_t BLO, int NT>
__device__ __forceinline__ void wy_mma(float (&acc)[NT][4], uint64_t a, uint64_t b) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    const uint32_t sa = TA ? kk * wg::kMn128Step : wg::k128_step(kk), sb = TB ? kk * wg::kMn128Step : wg::k128_step(kk);
    if constexpr (ALO != 0) wg::mma_ss<TA, TB>(acc, wg::desc_add(a, sa + ALO), wg::desc_add(b, sb));
    if constexpr (BLO != 0) wg::mma_ss<TA, TB>(acc, wg::desc_add(a, sa), wg::desc_add(b, sb + BLO));
    wg::mma_ss<TA, TB>(acc, wg::desc_add(a, sa), wg::desc_add(b, sb));
  }
}
// one synchronous product of the above (fence, issue, wait)
template <int TA, int TB, int KS, uint32_t ALO, uint32_t BLO, int NT>
__device__ __forceinline__ void wy_mma_sync(float (&acc)[NT][4], uint64_t a, uint64_t b) {
  wg::fence();
  wy_mma<TA, TB, KS, ALO, BLO>(acc, a, b);
  wg::commit();
  wg::wait<0>();
  wg::pin(acc);
}
constexpr uint32_t kT128 = 64 * 64 * 2;  // bytes of one [64][64] bf16 plane (the lo plane of a pair)
#endif

// (x0, x1) split into bf16 hi/lo (split2) and stored at element o of the hi plane and of the lo
// plane PL elements after it (the WY part's plane pairs: [2][64][64], PL = C*C; dW: PL = C*DK)
template <int PL>
__device__ __forceinline__ void put_pair(__nv_bfloat16* planes, int o, float x0, float x1) {
  uint32_t hi, lo;
  split2(x0, x1, hi, lo);
  *reinterpret_cast<uint32_t*>(planes + o) = hi;
  *reinterpret_cast<uint32_t*>(planes + PL + o) = lo;
}

// One (chunk, value head) item of gdn_bwd_chunk_kernel. q/k stay raw bf16 in shared memory (l2norm row scales rsQ/rsK applied
// outside the products). The V loop (the bulk of the FLOPs) runs on bf16 tensor cores with hi/lo
// split operands (gdn_mma16.cuh): the state kernels store h, dh, Delta and dDelta already split,
// so each slice is a plain cp.async copy, issued one slice ahead into the other buffer. The WY
// part after the loop multiplies hi/lo planes too (KK^T and QK^T: exact raw bf16 products). On
// sm_90a its nine products are wgmma as well (wy_mma: warpgroup wc computes the columns its four
// warps' fragments hold, so every epilogue is the mma.sync form's), reading the q/k tiles and
// the dW planes as 128-byte-swizzled column blocks (Qk128) and the [64][64] planes as they are.
//
// dq and dk of key head h are sums over its G value heads: the block runs them in order (j = 0..G-1,
// gdn_bwd_chunk_kernel) and carries the running sums in its own slot of p.gacc, in fragment order,
// so each thread reads back only what it wrote itself (no barrier) and the slot stays in L2.
// After the last value head it applies the l2norm backward and stores dq, dk.
//
// kSplit (Note [The split tail]): the item is value head j of split group sg, alone in its block:
// it loads the q/k tiles and forms K K^T, Q K^T itself, keeps its own dq, dk terms in the group's
// partial slots (p.gsplit), and the group's last item to finish (p.gcnt) sums them in value-head
// order and stores dq, dk.
template <bool kSplit>
__device__ __forceinline__ void bwd_chunk_item(const KParams& p, float* sm, int64_t bid, int j, int64_t sg) {
  GDN_PH_START
  __nv_bfloat16* Kb = reinterpret_cast<__nv_bfloat16*>(sm);  // [C][DK] (Qk128)
  __nv_bfloat16* Qb = Kb + C * DK;
  __nv_bfloat16* Tpb = Qb + C * DK;  // T planes [2][64][64] (swizzled)
  float* U = reinterpret_cast<float*>(Tpb + 2 * C * C);  // union
  // V-loop view: two slice buffers, the dDelta planes of all slices
  __nv_bfloat16* const slice_buf = reinterpret_cast<__nv_bfloat16*>(U);
  __nv_bfloat16* const dDall = reinterpret_cast<__nv_bfloat16*>(U + kDdOff);  // [NVS][2][64][BV]
  // the group's K K^T, Q K^T (fragment order, [2][kBwdThreads] float4 each)
  float4* const KKf = reinterpret_cast<float4*>(U + kGramO) + threadIdx.x;
  float4* const QKf = KKf + 2 * kBwdThreads;
  // post-loop view
  float* dTs = U + kDtsO;        // [C][LDC]
  // [2][64][64] swizzled bf16 hi/lo plane pairs of the WY part: Pg diag(rsK), then M1;
  // diag(rsQ) Pg, then Gsym diag(rsK)
  __nv_bfloat16* XpA = reinterpret_cast<__nv_bfloat16*>(U + kXpO);
  __nv_bfloat16* XpB = XpA + 2 * C * C;
  __nv_bfloat16* dWp = reinterpret_cast<__nv_bfloat16*>(U + kDwO);  // [2][C][DK] hi/lo planes of dW (Qk128)
  float* M1s = U + kM1O;         // [C][LDC] (holds the dT planes)
  __nv_bfloat16* dTp = reinterpret_cast<__nv_bfloat16*>(M1s);
  float* Gs = U + kGsO;          // [C][LDC]
  float* gam = U + kUnion;
  float* bet = gam + C;
  float* dbp = bet + C;          // [4][C] dbeta partials
  float* rp = dbp + 4 * C;       // [4][C] row partial scratch
  float* dgam = rp + 4 * C;      // [C]
  float* dbt = dgam + C;         // [C]
  float* rks = dbt + C;          // [C]
  float* red = rks + C;          // [C] + 8
  float* rp2 = red + C + 8;      // [4][C]
  float* dotq = rp2 + 4 * C;     // [4][C] l2norm backward: row dots of the group's dq, dk with q, k
  float* dotk = dotq + 4 * C;    // [4][C]
  float* rsK = dotk + 4 * C;     // [C] l2norm row scales (kept for the group)
  float* rsQ = rsK + C;
  float* bge = rsQ + C;          // [C] beta e^gamma (per row of the item)
  float* bgk = bge + C;          // [C] beta e^gamma rsK (the dT product's column factors)
  float* gx = bgk + C;           // [C] the fused gate's input x = a + dt_bias per row

  const int hv = (int)(bid % p.HV);
  const int64_t c = bid / p.HV;
  const int h = hv / p.G;
  const int n = p.ctab[2 * c];
  const int64_t bos = p.cu[n], eos = p.cu[n + 1];
  const int64_t t0 = bos + (int64_t)p.ctab[2 * c + 1] * C;
  const int L = (int)((eos - t0) < C ? (eos - t0) : C);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int wr = warp & 3, wc = warp >> 2;

  constexpr Qk128 el;
  const int jg = kSplit ? 0 : j;  // (the item's place in its block's run of the group)
  if (jg == 0) load_qk_tiles<kBwdThreads>(p, Kb, Qb, rsK, rsQ, t0, h, L, el);  // raw q/k (exact bf16) + l2norm scales (kept for the group)
  // normalised q/k values (raw x l2norm scale) for the row dots of the dgamma sums
  // (at the lane's accumulator positions of its 16 x 32 tile at (16 wr, 32 wc): tile-local r, cc)
  const FragQk fq(16 * wr, 32 * wc, gq, tq);
  auto Kn = [&](int r, int cc) { return __bfloat162float(Kb[fq(r, cc)]) * rsK[16 * wr + r]; };
  auto Qn = [&](int r, int cc) { return __bfloat162float(Qb[fq(r, cc)]) * rsQ[16 * wr + r]; };
  if (tid < C) {  // (cp.async: complete with slice 0, before the V loop's first barrier)
    const int r = tid < L ? tid : L - 1;
    cp_async4(gam + tid, p.gam + (t0 + r) * p.HV + hv, 4);
    cp_async4(bet + tid, p.bet + (t0 + r) * p.HV + hv, tid < L ? 4 : 0);
  }

  float aQ[4][4], aKs[4][4], aW[4][4], aPD[2][4], aT[2][4];
  // Adds the group's running sum (slot `which`: 0 dq, 1 dk) to a, and keeps the new sum there.
  // (Measured on the H200: loading the sum earlier, into registers, spilled and cost 0.2 ms; adding
  // into a [T,H,K] scratch with red.global instead of this slot, 0.06 ms.)
  const auto slot = [&](int which) {  // (formed where used: a pointer live across the V loop spills)
    const int64_t i = kSplit ? (sg * p.G + j) * 2 + which : (int64_t)blockIdx.x * 2 + which;
    return reinterpret_cast<float4*>(kSplit ? p.gsplit : p.gacc) + i * (C * DK / 4) + threadIdx.x;
  };
#if !GDN_BWD_WGMMA
  const auto carry = [&](float (&a)[4][4], int which, bool keep) {
    float4* const s = slot(which);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      if (jg > 0) {
        const float4 x = s[n * kBwdThreads];
        a[n][0] += x.x; a[n][1] += x.y; a[n][2] += x.z; a[n][3] += x.w;
      }
      if (keep) s[n * kBwdThreads] = make_float4(a[n][0], a[n][1], a[n][2], a[n][3]);
    }
  };
#else
  // The same in two halves: the sum loaded while the wgmma product that completes a runs, then
  // added and kept (0.05 ms of the backward at 1x8192 and 4x2048: loaded after the product, the
  // loads waited behind it, two L2 round trips per item on the critical path).
  const auto carry_load = [&](float4 (&x)[4], int which) {  // (for j = 0 too: the values are not used then)
#pragma unroll
    for (int n = 0; n < 4; ++n) x[n] = slot(which)[n * kBwdThreads];
  };
  const auto carry_add = [&](float (&a)[4][4], const float4 (&x)[4], int which, bool keep) {
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      if (jg > 0) { a[n][0] += x[n].x; a[n][1] += x[n].y; a[n][2] += x[n].z; a[n][3] += x[n].w; }
      if (keep) slot(which)[n * kBwdThreads] = make_float4(a[n][0], a[n][1], a[n][2], a[n][3]);
    }
  };
#endif
  // l2norm backward, first half: the row dots of the group sum with the normalised rows, by quarter row
  const auto l2_dots = [&](float (&a)[4][4], float* dots, const auto& X) {
    float d0, d1;
    frag_rowdot(a, X, d0, d1);
    if (tq == 0) {
      dots[wc * C + 16 * wr + gq] = d0;
      dots[wc * C + 16 * wr + gq + 8] = d1;
    }
  };
  // second half (after a barrier): dx = rs (dy - (dy . y) y), y the normalised row
  const auto l2_apply = [&](float (&a)[4][4], const float* dots, const float* rs, const auto& X) {
    for_frag(a, [&](int r, int cc, float& x) {
      const int rr = 16 * wr + r;
      x = rs[rr] * (x - (dots[rr] + dots[C + rr] + dots[2 * C + rr] + dots[3 * C + rr]) * X(r, cc));
    });
  };
#if GDN_BWD_WGMMA
  float vacc[16][4];  // the V loop's product(s) of this warpgroup: two m64n64 accumulators
  zero_acc(vacc);
#else
  zero_acc(aQ); zero_acc(aKs); zero_acc(aW); zero_acc(aPD); zero_acc(aT);
#endif
  float frob = 0.f;
  static_assert(2 * DK * BV / 8 == 2 * kBwdThreads && 2 * C * BV / 8 == kBwdThreads, "slice/threads");
  // Slice vs into buffer B: three plane pairs of the workspace, dO and v rows (zero beyond L)
  // as 16-byte copies when aligned, plain stores otherwise, all into the swizzled planes; the
  // dDelta pair into dDall. Complete after cp_async_wait + __syncthreads.
  const auto load_slice = [&](int vs, __nv_bfloat16* B) {
    const int64_t so = slice_planes(c, p.HV, hv, vs, DK), co = slice_planes(c, p.HV, hv, vs, C);
    const uint64_t once = l2_evict_first();  // (the planes are read once)
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // S0, dS_C: [2][128][32] each
      const int v = tid + i * kBwdThreads, pl = v >> 9;
      const int r = (v >> 2) & (DK - 1), c8 = (v & 3) * 8;
      cp_async16_once(B + pl * SPL + wg::sw64(r, c8), p.hs + so + v * 8, 16, once);
      cp_async16_once(B + 2 * SPL + pl * SPL + wg::sw64(r, c8), p.dhs + so + v * 8, 16, once);
    }
    {  // Delta, dDelta: [2][64][32] each
      const int v = tid, pl = v >> 8;
      const int r = (v >> 2) & (C - 1), c8 = (v & 3) * 8;
      cp_async16_once(B + 4 * SPL + pl * CPL + wg::sw64(r, c8), p.Dl + co + v * 8, 16, once);
      cp_async16_once(dDall + vs * 2 * CPL + pl * CPL + wg::sw64(r, c8), p.dDl + co + v * 8, 16, once);
    }
    const int v0 = vs * BV;
    const int rb = (tid & 255) >> 2, c8 = (tid & 3) * 8;  // threads < 256: dO, the others: v
    const bool isdo = tid < 256;
    const __nv_bfloat16* src = isdo ? bf16_at(p.dO, t0 * p.do_st + (int64_t)hv * p.do_sh + v0)
                                    : bf16_at(p.v, t0 * p.v_st + (int64_t)hv * p.v_sh + v0);
    const int64_t sst = isdo ? p.do_st : p.v_st;
    __nv_bfloat16* d = B + 4 * SPL + 2 * CPL + (isdo ? 0 : CPL) + wg::sw64(rb, c8);
    if (p.vec_do && p.vec_v) {
      cp_async16(d, src + (rb < L ? rb : 0) * sst + c8, rb < L ? 16 : 0);
    } else {
      const __nv_bfloat16 z = __float2bfloat16_rn(0.f);
      for (int j = 0; j < 8; ++j) d[j] = rb < L ? src[rb * sst + c8 + j] : z;
    }
  };
  // K K^T and Q K^T (diag(rsX) X K^T diag(rsK), X = K, Q) depend on the key head only: the group's
  // first value head forms them in its prologue, under slice 0's copies, and keeps them in the
  // block's gram slot (after all dq/dk slots of p.gacc, fragment order) for the others, which copy
  // them in their prologue. Either way they lie in KKf / QKf until phase 10.
  float4* const gslot = reinterpret_cast<float4*>(p.gacc + (int64_t)gridDim.x * 2 * C * DK) +
                        (int64_t)blockIdx.x * 2 * (C * C / 4) + threadIdx.x;
  load_slice(0, slice_buf);
  // The T hi/lo planes (for dV = T^T dDelta and the WY part) and the gram copies: on wgmma a
  // group of their own, complete at the second slice's top (dV after the loop is their first
  // reader), so that slice 0's wait covers only slice 0.
  const auto load_t = [&] {
    const __nv_bfloat16* tpg = p.Tp + (c * p.HV + hv) * (int64_t)(2 * C * C);
    for (int v = tid; v < 2 * C * C / 8; v += kBwdThreads) {
      const int pl = v >> 9, r = (v >> 3) & 63, c8 = v & 7;
      cp_async16(Tpb + pl * C * C + swz<C>(r, c8 * 8), tpg + v * 8, 16);
    }
  };
#if !GDN_BWD_WGMMA
  load_t();  // (the mma.sync form's dV runs in the V loop)
#endif
  cp_async_commit();
#if GDN_BWD_WGMMA
  load_t();
#endif
  // (predicated, not branched: a branch on j > 0 here made ptxas spill 200 B)
#pragma unroll
  for (int n = 0; n < 4; ++n) cp_async16_if(KKf + n * kBwdThreads, gslot + n * kBwdThreads, jg > 0);
  cp_async_commit();
  constexpr int kLate = 1;  // (cp.async groups after slice 0's: T planes / gram copies)
  // The fused gate's input x = a + dt_bias, read now: the load of a waits under slice 0's copies
  // instead of at the item's end, where nothing hid it (fused config's bwd_chunk 1.158 against
  // 1.170 ms, backward 2.170 against 2.176 ms at 1x8192 over three paired rounds). Only x is
  // kept: the factors formed here too (three arrays, the epilogue reading them) spilled 180 B.
  if (p.gate_fused && tid < L) gx[tid] = ld_any(p.a, p.a_dt, (t0 + tid) * p.a_st + hv) + p.dt_bias[hv];
  if (jg == 0) {
    cp_async_wait<1 + kLate>();  // the q/k tiles and their row scales (slice 0 still in flight)
#if GDN_BWD_WGMMA
    wg::fence_smem();
#endif
    __syncthreads();
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const __nv_bfloat16* const Xb = w ? Qb : Kb;
      float acc[2][4];
      zero_acc(acc);
#if GDN_BWD_WGMMA
      wy_mma_sync<0, 0, DK / 16, 0, 0>(acc, wg::k128(Xb, 0), wg::k128(Kb, 16 * wc));
#else
      mma_rows<2, DK>(acc, Xb, 16 * wr, Kb, 16 * wc, el);
#endif
      const float* const rsX = w ? rsQ : rsK;
      const float rx[2] = {rsX[16 * wr + gq], rsX[16 * wr + gq + 8]};
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] *= rx[e >> 1] * rsK[16 * wc + 8 * n + 2 * tq + (e & 1)];
        const float4 x = make_float4(acc[n][0], acc[n][1], acc[n][2], acc[n][3]);
        KKf[(2 * w + n) * kBwdThreads] = x;
        if (!kSplit && p.G > 1) gslot[(2 * w + n) * kBwdThreads] = x;
      }
    }
  }
#pragma unroll 1
  for (int vs = 0; vs < NVS; ++vs) {
    // One barrier per slice: slice vs (and the q/k tiles, T planes) landed, and every reader of
    // the other buffer (slice vs - 1) is done; then slice vs + 1 loads into it during this one.
    // (The proxy fence comes with nothing in flight: it would wait for a pending copy too.)
    // (slice 0: the T planes and the gram copies may still be in flight; complete at slice 1)
    if (vs == 0) cp_async_wait<kLate>(); else cp_async_wait<0>();
#if GDN_BWD_WGMMA
    wg::fence_smem();  // (for the wgmma reads of the planes)
#endif
    __syncthreads();
    if (vs + 1 < NVS) load_slice(vs + 1, slice_buf + ((vs + 1) & 1) * kSliceEl);
    cp_async_commit();
    __nv_bfloat16* const S0p = slice_buf + (vs & 1) * kSliceEl;
    __nv_bfloat16* const dSp = S0p + 2 * SPL;
    __nv_bfloat16* const Dlp = dSp + 2 * SPL;  // Delta h/l, then dO and v
    __nv_bfloat16* const DDp = dDall + vs * 2 * CPL;
    // (phase clocks: the item's prologue and slice 0's wait in 15, the other slices' tops in 2)
    if (vs == 0) GDN_PH(15); else GDN_PH(2);
    // dQ += dO S0^T ; dKs += Delta dSC^T ; dW += dDelta S0^T   (16 x 32 tiles: rows 16wr, cols 32wc)
    // PD += dO Delta^T ; dT += dDelta V^T                     (16 x 16 tiles: rows 16wr, cols 16wc)
    // (the mma.sync form below: warp (wr, wc) builds those tiles of all five products.)
    // On sm_90a each warpgroup runs one product at full width as wgmma, A and B read from the
    // planes: warpgroup 0 dQ, 1 dKs, 2 dW (two m64n64 halves each), 3 PD and dT (m64n64), all
    // in vacc. An A plane is then read by one or two MMAs per k16 step instead of by all four
    // warpgroups: 160 KB of operand reads per slice instead of 272 KB (with each product's columns
    // split over the warpgroups, m64n32 / m64n16, the loop was bound by shared memory).
    // m64n128 for dQ, dKs, dW would read 128 KB, but beside warpgroup 3's two m64n64 in the same
    // array ptxas serialised every MMA (C7511). After the loop the accumulators go through shared
    // memory once into the fragments of the mma.sync form.
    // Both k16 steps stay in flight through the <S0, dS_C> sum below. (With A from registers,
    // under the 128-register cap, ptxas serialised the MMAs.)
#if GDN_BWD_WGMMA
    {
      // (all descriptors from three: the planes lie at fixed byte offsets from S0p, Dlp and DDp)
      constexpr uint32_t kP = 2 * SPL, kQ = 2 * CPL;  // bytes of one [128][32], one [64][32] plane
      constexpr uint32_t kHalf = 64 * 64;  // bytes to rows 64.. of a [128][32] plane (N = 64 halves)
      // B planes: S0 h/l at 0, kP; dS_C h/l at 2kP, 3kP. A planes (and B of PD, dT): Dh 0, Dl kQ,
      // dO 2kQ, v 3kQ from Dlp; dDh 0, dDl kQ from DDp
      const uint64_t dS = wg::desc_rows(S0p, 0), dA = wg::desc_rows(Dlp, 0), dE = wg::desc_rows(DDp, 0);
      // (the branch per warpgroup, each with its own fence: ptxas then keeps the accumulator
      // registers in place and issues the MMAs without serialising them)
      const auto issue = [&](auto&& one_step) {
        wg::fence();
#pragma unroll
        for (int k0 = 0; k0 < BV; k0 += 16) one_step((k0 / 16) * wg::kKStep);
        wg::commit();
      };
      if (wc == 0) {
        issue([&](uint32_t ks) {
          const uint64_t ao = wg::desc_add(dA, ks + 2 * kQ);
          wg::mma_ss_n64<0>(vacc, ao, wg::desc_add(dS, ks + kP));
          wg::mma_ss_n64<8>(vacc, ao, wg::desc_add(dS, ks + kP + kHalf));
          wg::mma_ss_n64<0>(vacc, ao, wg::desc_add(dS, ks));
          wg::mma_ss_n64<8>(vacc, ao, wg::desc_add(dS, ks + kHalf));
        });
      } else if (wc == 1) {
        issue([&](uint32_t ks) {
          const uint64_t aDh = wg::desc_add(dA, ks), aDl = wg::desc_add(dA, ks + kQ);
          wg::mma_ss_n64<0>(vacc, aDl, wg::desc_add(dS, ks + 2 * kP));
          wg::mma_ss_n64<8>(vacc, aDl, wg::desc_add(dS, ks + 2 * kP + kHalf));
          wg::mma_ss_n64<0>(vacc, aDh, wg::desc_add(dS, ks + 3 * kP));
          wg::mma_ss_n64<8>(vacc, aDh, wg::desc_add(dS, ks + 3 * kP + kHalf));
          wg::mma_ss_n64<0>(vacc, aDh, wg::desc_add(dS, ks + 2 * kP));
          wg::mma_ss_n64<8>(vacc, aDh, wg::desc_add(dS, ks + 2 * kP + kHalf));
        });
      } else if (wc == 2) {
        issue([&](uint32_t ks) {
          const uint64_t adh = wg::desc_add(dE, ks), adl = wg::desc_add(dE, ks + kQ);
          wg::mma_ss_n64<0>(vacc, adl, wg::desc_add(dS, ks));
          wg::mma_ss_n64<8>(vacc, adl, wg::desc_add(dS, ks + kHalf));
          wg::mma_ss_n64<0>(vacc, adh, wg::desc_add(dS, ks + kP));
          wg::mma_ss_n64<8>(vacc, adh, wg::desc_add(dS, ks + kP + kHalf));
          wg::mma_ss_n64<0>(vacc, adh, wg::desc_add(dS, ks));
          wg::mma_ss_n64<8>(vacc, adh, wg::desc_add(dS, ks + kHalf));
        });
      } else {
        issue([&](uint32_t ks) {
          const uint64_t ao = wg::desc_add(dA, ks + 2 * kQ), adh = wg::desc_add(dE, ks),
                         adl = wg::desc_add(dE, ks + kQ);
          wg::mma_ss_n64<0>(vacc, ao, wg::desc_add(dA, ks + kQ));
          wg::mma_ss_n64<0>(vacc, ao, wg::desc_add(dA, ks));
          wg::mma_ss_n64<8>(vacc, adl, wg::desc_add(dA, ks + 3 * kQ));
          wg::mma_ss_n64<8>(vacc, adh, wg::desc_add(dA, ks + 3 * kQ));
        });
      }
    }
#else
    __nv_bfloat16* const dOb = Dlp + 2 * CPL;
    __nv_bfloat16* const Vb = dOb + CPL;
#pragma unroll
    for (int k0 = 0; k0 < BV; k0 += 16) {
      uint32_t ao[4], aDh[4], aDl[4], adh[4], adl[4];
      const int ao_ = wg::a_off(16 * wr, k0, lane);
      ldsm_x4(ao, dOb + ao_);
      ldsm_x4(aDh, Dlp + ao_);
      ldsm_x4(aDl, Dlp + CPL + ao_);
      ldsm_x4(adh, DDp + ao_);
      ldsm_x4(adl, DDp + CPL + ao_);
#pragma unroll
      for (int nh = 0; nh < 2; ++nh) {
        uint32_t sh[4], sl[4], dh[4], dl2[4];
        const int bo = wg::bn_off(k0, 32 * wc + 16 * nh, lane);
        ldsm_x4(sh, S0p + bo);
        ldsm_x4(sl, S0p + SPL + bo);
        ldsm_x4(dh, dSp + bo);
        ldsm_x4(dl2, dSp + SPL + bo);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int nt = 2 * nh + t;
          mma_bf16(aQ[nt], ao, sl[2 * t], sl[2 * t + 1]);
          mma_bf16(aQ[nt], ao, sh[2 * t], sh[2 * t + 1]);
          mma_bf16(aKs[nt], aDl, dh[2 * t], dh[2 * t + 1]);
          mma_bf16(aKs[nt], aDh, dl2[2 * t], dl2[2 * t + 1]);
          mma_bf16(aKs[nt], aDh, dh[2 * t], dh[2 * t + 1]);
          mma_bf16(aW[nt], adl, sh[2 * t], sh[2 * t + 1]);
          mma_bf16(aW[nt], adh, sl[2 * t], sl[2 * t + 1]);
          mma_bf16(aW[nt], adh, sh[2 * t], sh[2 * t + 1]);
        }
      }
      {
        uint32_t bh[4], bl[4], bv[4];
        const int bo = wg::bn_off(k0, 16 * wc, lane);
        ldsm_x4(bh, Dlp + bo);
        ldsm_x4(bl, Dlp + CPL + bo);
        ldsm_x4(bv, Vb + bo);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          mma_bf16(aPD[t], ao, bl[2 * t], bl[2 * t + 1]);
          mma_bf16(aPD[t], ao, bh[2 * t], bh[2 * t + 1]);
          mma_bf16(aT[t], adl, bv[2 * t], bv[2 * t + 1]);
          mma_bf16(aT[t], adh, bv[2 * t], bv[2 * t + 1]);
        }
      }
    }
#endif
    GDN_PH(3);
    {  // <S0, dS_C> of the slice, from the planes (hi + lo; the same layout in all four): eight
       // elements per thread, one 16-byte load per plane
      const int off = 8 * tid;
      static_assert(8 * kBwdThreads == SPL, "one 16-byte piece per thread and plane");
      const uint4 q[4] = {*reinterpret_cast<const uint4*>(S0p + off), *reinterpret_cast<const uint4*>(S0p + SPL + off),
                          *reinterpret_cast<const uint4*>(dSp + off), *reinterpret_cast<const uint4*>(dSp + SPL + off)};
      const auto f2 = [](uint32_t u) { return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u)); };
      const uint32_t w[4][4] = {{q[0].x, q[0].y, q[0].z, q[0].w}, {q[1].x, q[1].y, q[1].z, q[1].w},
                                {q[2].x, q[2].y, q[2].z, q[2].w}, {q[3].x, q[3].y, q[3].z, q[3].w}};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 ah = f2(w[0][i]), al = f2(w[1][i]), bh = f2(w[2][i]), bl = f2(w[3][i]);
        frob += (ah.x + al.x) * (bh.x + bl.x) + (ah.y + al.y) * (bh.y + bl.y);
      }
    }
#if !GDN_BWD_WGMMA
    {  // dV = diag(beta) T^T dDelta (16 x 8 tiles: rows 16wr, cols 8wc; on sm_90a after the loop)
      float acc[1][4], acc2[1][4];  // two accumulators: two independent MMA chains
      zero_acc(acc);
      zero_acc(acc2);
#pragma unroll
      for (int k0 = 0; k0 < C; k0 += 16) {
        uint32_t ah[4], al[4], bh[2], bl[2];
        const int ao_ = at_off_sw<C>(16 * wr, k0, lane);
        ldsm_x4_t(ah, Tpb + ao_);
        ldsm_x4_t(al, Tpb + C * C + ao_);
        // only this warp's n8 block of dDelta (x2: half the bytes of an x4 of the 16-wide tile)
        const int bo = wg::b_off(k0, 8 * wc, lane);
        ldsm_x2_t(bh, DDp + bo);
        ldsm_x2_t(bl, DDp + CPL + bo);
        mma_bf16(acc2[0], al, bh[0], bh[1]);
        mma_bf16(acc2[0], ah, bl[0], bl[1]);
        mma_bf16(acc[0], ah, bh[0], bh[1]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][e] = bet[16 * wr + gq + 8 * (e >> 1)] * (acc[0][e] + acc2[0][e]);
      store_grad_rows(p.dv, p.gdt, t0 * p.dv_st + (int64_t)hv * p.dv_sh + vs * BV, p.dv_st, acc, 16 * wr, 8 * wc, L,
                      p.pair_dv);
    }
#endif
#if GDN_BWD_WGMMA
    wg::wait<0>();  // (the last k16 step's MMAs ran alongside the <S0, dS_C> sum)
    wg::pin(vacc);
#endif
    GDN_PH(4);
  }
  // block-reduce frob (deterministic)
  {
#pragma unroll
    for (int o = 16; o; o >>= 1) frob += __shfl_xor_sync(0xffffffffu, frob, o);
    if (lane == 0) red[warp] = frob;
  }
#if GDN_BWD_WGMMA
  // dV = diag(beta) T^T dDelta for all 128 columns after the loop (the mma.sync form's 16 x 8 tile
  // per warp and slice in the loop reads 96 KB by ldmatrix per slice): warpgroup wc the 32 of
  // slice wc, A = T^T (the T planes MN-major), B = the slice's dDelta planes (MN-major, 64-byte
  // swizzle), hi/lo x hi/lo in three products; it runs under the redistribution below (which
  // stays below kDdOff).
  float aV[4][4];
  zero_acc(aV);
  {
    constexpr uint32_t kTlo = C * C * 2, kDlo = 2 * CPL;  // bytes to the lo plane of T, of dDelta
    const uint64_t a = wg::mn128(Tpb, 0), b = wg::desc64_mn(dDall + wc * 2 * CPL);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      const uint64_t ak = wg::desc_add(a, kk * wg::kMn128Step), bk = wg::desc_add(b, kk * wg::kMn64Step);
      wg::mma_ss<1, 1>(aV, wg::desc_add(ak, kTlo), bk);
      wg::mma_ss<1, 1>(aV, ak, wg::desc_add(bk, kDlo));
      wg::mma_ss<1, 1>(aV, ak, bk);
    }
    wg::commit();
  }
  // The products to the fragments of the mma.sync form: warpgroup g's 16 n8 tiles of product g
  // through shared memory as [g][tile][wr][lane] float4 (the same rows wr, gq in both layouts:
  // only columns change warpgroup), then warp (wr, wc) takes tiles 4wc.. of dQ, dKs, dW and
  // 2wc.. of PD, 8 + 2wc.. of dT. (Whole-warp float4 runs: no bank conflicts.)
  {
    float4* const R = reinterpret_cast<float4*>(U) + wr * 32 + lane;
    // (product g's tile n at its rank among the 12 tiles g sends: the 48 fit in the slice buffers' place)
    const auto rslot = [](int g, int n) {
      return g * 12 + (g < 3 ? (n < 4 * g ? n : n - 4) : (n < 6 ? n : n < 14 ? n - 2 : n - 4));
    };
    __syncthreads();  // every reader of the last slice's buffer is done
    // (the tiles a warpgroup keeps for itself stay in registers: 4 of its 16)
    const auto kept = [&](int n) { return wc < 3 ? n >> 2 == wc : (n & 7) >> 1 == 3; };
#pragma unroll
    for (int n = 0; n < 16; ++n)
      if (!kept(n)) R[rslot(wc, n) * 128] = make_float4(vacc[n][0], vacc[n][1], vacc[n][2], vacc[n][3]);
    __syncthreads();
    const auto take = [&](float (&a)[4], int g, int tile, bool own, const float (&mine)[4]) {
      if (own) {
        a[0] = mine[0]; a[1] = mine[1]; a[2] = mine[2]; a[3] = mine[3];
      } else {
        const float4 x = R[rslot(g, tile) * 128];
        a[0] = x.x; a[1] = x.y; a[2] = x.z; a[3] = x.w;
      }
    };
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      take(aQ[n], 0, 4 * wc + n, wc == 0, vacc[n]);
      take(aKs[n], 1, 4 * wc + n, wc == 1, vacc[4 + n]);
      take(aW[n], 2, 4 * wc + n, wc == 2, vacc[8 + n]);
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      take(aPD[n], 3, 2 * wc + n, wc == 3, vacc[6 + n]);
      take(aT[n], 3, 8 + 2 * wc + n, wc == 3, vacc[14 + n]);
    }
  }  // (the barrier below frees the union again)
  GDN_PH(0);  // (phase clocks: dV issue and the redistribution in 0, dV's wait and store, dbeta in 1)
  wg::wait<0>();
  wg::pin(aV);
  for_frag(aV, [&](int r, int, float& x) { x *= bet[16 * wr + r]; });
  store_grad_rows(p.dv, p.gdt, t0 * p.dv_st + (int64_t)hv * p.dv_sh, p.dv_st, aV, 16 * wr, 32 * wc, L, p.pair_dv);
#endif
  // dbeta_b (before the sigmoid) = sum_v (T^T dDelta)_bv v_bv = sum_a T_ab (dDelta v^T)_ab: the
  // column sums of T .* dT-accumulator aT (T hi + lo), by warp row block into dbp[wr][b]
  {
    float cs[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int b = 16 * wc + 8 * n + 2 * tq + u;
        float x = 0.f;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int a = 16 * wr + gq + 8 * hh, o = swz_el<C>(a, b);
          x += (__bfloat162float(Tpb[o]) + __bfloat162float(Tpb[C * C + o])) * aT[n][2 * hh + u];
        }
#pragma unroll
        for (int m = 4; m < 32; m <<= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
        cs[n][u] = x;
      }
    if (gq == 0)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int u = 0; u < 2; ++u) dbp[wr * C + 16 * wc + 8 * n + 2 * tq + u] = cs[n][u];
  }
  GDN_PH(1);
  const float gl = gam[L - 1];
  // scale the V-loop accumulators (rows >= L selected to 0). A lane's fragments span two rows,
  // 16wr + gq and 16wr + gq + 8 (bit 3 of for_frag's tile row), so the factors are taken per row:
  // one expf each instead of one per element (ncu: the per-element form was 11 % of bwd_chunk's
  // instructions).
  {
    const int ra = 16 * wr + gq, rb = ra + 8;
    const bool va = ra < L, vb = rb < L;
    const float qa = p.scale * expf(gam[ra]), qb = p.scale * expf(gam[rb]);
    const float ka = expf(gl - gam[ra]), kb = expf(gl - gam[rb]);
    for_frag(aQ, [&](int r, int, float& x) { x = ((r & 8) ? vb : va) ? ((r & 8) ? qb : qa) * x : 0.f; });
    for_frag(aKs, [&](int r, int, float& x) { x = ((r & 8) ? vb : va) ? ((r & 8) ? kb : ka) * x : 0.f; });
  }
  if (tid < C) {  // (one expf per row instead of one per lane and use below)
    const float be = bet[tid] * expf(gam[tid]);
    bge[tid] = be;
    bgk[tid] = be * rsK[tid];
  }
  __syncthreads();  // union free now
  GDN_PH(5);
  // Per-row and per-column sums of a 64 x 64 fragment matrix (the lane's rows 16 wr + gq + 8 hh,
  // columns 16 wc + 8 n + 2 tq + u), reduced over the warp's lanes in a fixed order and stored as
  // partials by warp: rows into ep[wc][r], columns into ec[wr][c] (summed after the next barrier).
  float* const ep = U + kEpO;
  float* const ec = ep + 4 * C;
  const auto frag_sums = [&](float (&rs)[2], float (&cs)[2][2]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      rs[hh] += __shfl_xor_sync(0xffffffffu, rs[hh], 1);
      rs[hh] += __shfl_xor_sync(0xffffffffu, rs[hh], 2);
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int m = 4; m < 32; m <<= 1) cs[n][u] += __shfl_xor_sync(0xffffffffu, cs[n][u], m);
    if (tq == 0) {
      ep[wc * C + 16 * wr + gq] = rs[0];
      ep[wc * C + 16 * wr + gq + 8] = rs[1];
    }
    if (gq == 0)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int u = 0; u < 2; ++u) ec[wr * C + 16 * wc + 8 * n + 2 * tq + u] = cs[n][u];
  };
  for_frag(aT, [&](int r, int j, float& x) {
    r += 16 * wr;
    j += 16 * wc;
    dTs[r * LDC + j] = bet[j] * x;
  });
#pragma unroll
  for (int nn = 0; nn < 4; ++nn)  // dW = -aW as bf16 hi/lo planes
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      // (row 16 wr + gq + 8 hh, column 32 wc + 8 nn + 2 tq)
      put_pair<C * DK>(dWp, fq(gq + 8 * hh, nn * 8 + 2 * tq), -aW[nn][2 * hh], -aW[nn][2 * hh + 1]);
    }
  // Pg = s (dO Delta^T) .* Gamma (lower incl. diagonal, valid rows): bf16 planes of Pg diag(rsK)
  // (A of Pg K) and diag(rsQ) Pg (A^T of Pg^T Q), and the dgamma sums of E = Pg .* QK taken from
  // the fragments (QK = Q K^T at the same positions): row r's E_rj (j < r) and column r's E_ir
  // (i > r), the diagonal left out. (Pg and QK through shared memory as fp32, 8 threads per row
  // summing them, took 3.5 % of bwd_chunk's stall samples, ncu.)
  {
    float qk[2][4];  // (Q K^T at the lane's positions)
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const float4 x = QKf[n * kBwdThreads];
      qk[n][0] = x.x; qk[n][1] = x.y; qk[n][2] = x.z; qk[n][3] = x.w;
    }
    float rs[2] = {0.f, 0.f}, cs[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    for_pairs<2>(16 * wr, 16 * wc, [&](int r, int j, int nn, int hh) {
      float v[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int jj = j + u;
        v[u] = (r >= jj && r < L) ? p.scale * aPD[nn][2 * hh + u] * expf(gam[r] - gam[jj]) : 0.f;
        const float e = r > jj ? v[u] * qk[nn][2 * hh + u] : 0.f;
        rs[hh] += e;
        cs[nn][u] += e;
      }
      const int o = swz_el<C>(r, j);
      put_pair<C * C>(XpA, o, v[0] * rsK[j], v[1] * rsK[j + 1]);
      put_pair<C * C>(XpB, o, v[0] * rsQ[r], v[1] * rsQ[r]);
    });
    frag_sums(rs, cs);
  }
  // dgamma, direct part, formed without catastrophic cancellation:
  //   q_r . dq_state_r  +  sum_{j<r} E_rj - sum_{i>r} E_ir  (E = Pg .* QK, the diagonal cancels
  //   exactly and is left out; the partials above)  - k_r . dk_state_r (r < last)  + last row: e^{gl}<S0,dSC> +
  //   sum_{r<last} k_r . dk_state_r.
  {
    float rq0, rq1, rs0, rs1;
    frag_rowdot(aQ, Qn, rq0, rq1);
    frag_rowdot(aKs, Kn, rs0, rs1);
    if (tq == 0) {
      const int r = 16 * wr + gq;
      rp[wc * C + r] = rq0;
      rp[wc * C + r + 8] = rq1;
      rp2[wc * C + r] = rs0;
      rp2[wc * C + r + 8] = rs1;
    }
  }
#if GDN_BWD_WGMMA
  wg::fence_smem();  // (the XpA, XpB and dW planes: wgmma operands after the barrier)
#endif
  __syncthreads();
  GDN_PH(6);
  // dQ += Pg K (final for this value head)
  // (the l2norm scale of K is folded into A so that B is the exact raw bf16 K: 2 MMAs)
  // dK_direct = dK_state + Pg^T Q
#if GDN_BWD_WGMMA
  // (issued first: the row sums below run while they do)
  wg::fence();
  wy_mma<0, 1, 4, kT128, 0>(aQ, wg::k128(XpA, 0), wg::mn128(Kb, 32 * wc));
  wg::commit();
  wy_mma<1, 1, 4, kT128, 0>(aKs, wg::mn128(XpB, 0), wg::mn128(Qb, 32 * wc));
  wg::commit();
  float4 sq[4];  // (the group's running dq sum, loaded while the products and the row sums run)
  carry_load(sq, 0);
#endif
  if (tid < C) {  // fixed-order sums of the partials
    const int r = tid;
    dgam[r] = (rp[r] + rp[C + r] + rp[2 * C + r] + rp[3 * C + r]) + ((ep[r] + ep[C + r] + ep[2 * C + r] + ep[3 * C + r]) -
                                                                     (ec[r] + ec[C + r] + ec[2 * C + r] + ec[3 * C + r]));
    rks[r] = (rp2[r] + rp2[C + r] + rp2[2 * C + r] + rp2[3 * C + r]);
  }
  // (the sum is kept after the last value head too: read back at the end of the item)
#if GDN_BWD_WGMMA
  wg::wait<1>();
  wg::pin(aQ);
  carry_add(aQ, sq, 0, true);
#else
  mma_planes64_raw<false>(aQ, XpA, 16 * wr, Kb, 32 * wc, el);
  carry(aQ, 0, true);
#endif
  if (!kSplit && j == p.G - 1 && p.l2norm) l2_dots(aQ, dotq, Qn);
#if GDN_BWD_WGMMA
  wg::wait<0>();
  wg::pin(aKs);
#else
  mma_planes64_raw<true>(aKs, XpB, 16 * wr, Qb, 32 * wc, el);
#endif
  GDN_PH(7);
  // dT += dW (diag(beta e^gam) K)^T, masked to strictly lower valid
  {
    float acc[2][4];
    zero_acc(acc);
#if GDN_BWD_WGMMA
    // (issuing T^T dW here too, to run under the epilogue below, measured the same)
    wy_mma_sync<0, 0, DK / 16, 2 * kT128, 0>(acc, wg::k128(dWp, 0), wg::k128(Kb, 16 * wc));
#else
    // bf16 tensor cores: A = dW planes, B = raw K (B[k][n] = K[n][k], K rows via ldmatrix)
#pragma unroll
    for (int k0 = 0; k0 < DK; k0 += 16) {
      uint32_t ah[4], al[4], b[4];
      const int ao = frag_a(el, 16 * wr, k0, lane);
      ldsm_x4(ah, dWp + ao);
      ldsm_x4(al, dWp + C * DK + ao);
      ldsm_x4(b, Kb + frag_bn(el, k0, 16 * wc, lane));
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        mma_bf16(acc[t], al, b[2 * t], b[2 * t + 1]);
        mma_bf16(acc[t], ah, b[2 * t], b[2 * t + 1]);
      }
    }
#endif
    float2 cfs[2];  // per-column factors beta e^gamma rsK (two columns per lane and n8 tile)
#pragma unroll
    for (int nn = 0; nn < 2; ++nn) cfs[nn] = *reinterpret_cast<const float2*>(bgk + 16 * wc + nn * 8 + 2 * tq);
    for_pairs<2>(16 * wr, 16 * wc, [&](int r, int j, int nn, int hh) {
      const float2 cf = cfs[nn];
      float v[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int jj = j + u;
        const float x = dTs[r * LDC + jj] + (u ? cf.y : cf.x) * acc[nn][2 * hh + u];
        v[u] = (r > jj && r < L) ? x : 0.f;
      }
      put_pair<C * C>(dTp, swz_el<C>(r, j), v[0], v[1]);  // dT planes (A of M1 = dT T^T)
    });
#if GDN_BWD_WGMMA
    wg::fence_smem();  // (the dT planes: an operand after the barriers below)
#endif
  }
  GDN_PH(8);
  {  // TtdW = T^T dW: dK += diag(beta e^gam) TtdW ; row dot with K
    float acc[4][4];
    zero_acc(acc);
#if GDN_BWD_WGMMA
    wy_mma_sync<1, 1, 4, kT128, 2 * kT128>(acc, wg::mn128(Tpb, 0), wg::mn128(dWp, 32 * wc));
#else
    // bf16 tensor cores: A = T^T (T planes, transposed loads), B = dW planes
#pragma unroll
    for (int k0 = 0; k0 < C; k0 += 16) {
      uint32_t ah[4], al[4];
      const int ao = at_off_sw<C>(16 * wr, k0, lane);
      ldsm_x4_t(ah, Tpb + ao);
      ldsm_x4_t(al, Tpb + C * C + ao);
#pragma unroll
      for (int nh = 0; nh < 2; ++nh) {
        uint32_t bh[4], bl[4];
        const int bo = frag_b(el, k0, 32 * wc + 16 * nh, lane);
        ldsm_x4_t(bh, dWp + bo);
        ldsm_x4_t(bl, dWp + C * DK + bo);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const int nt = 2 * nh + t;
          mma_bf16(acc[nt], al, bh[2 * t], bh[2 * t + 1]);
          mma_bf16(acc[nt], ah, bl[2 * t], bl[2 * t + 1]);
          mma_bf16(acc[nt], ah, bh[2 * t], bh[2 * t + 1]);
        }
      }
    }
#endif
    float w0, w1;
    frag_rowdot(acc, Kn, w0, w1);
    __syncthreads();  // rp reuse
    if (tq == 0) {
      const int r = 16 * wr + gq;
      rp[wc * C + r] = w0;
      rp[wc * C + r + 8] = w1;
    }
    {
      const int ra = 16 * wr + gq;  // (rows ra and ra + 8: one factor each)
      const float fa = bge[ra], fb = bge[ra + 8];
#pragma unroll
      for (int nn = 0; nn < 4; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) aKs[nn][e] += (e & 2 ? fb : fa) * acc[nn][e];
    }
  }
  __syncthreads();
  GDN_PH(9);
  if (tid < C) {
    const int r = tid;
    const float w = (rp[r] + rp[C + r] + rp[2 * C + r] + rp[3 * C + r]);
    const float eg = expf(gam[r]);
    dbt[r] = (dbp[r] + dbp[C + r] + dbp[2 * C + r] + dbp[3 * C + r]) + eg * w;
    dgam[r] += bet[r] * eg * w;
  }
  // M1 = dT T^T
  {
    float acc[2][4];
    zero_acc(acc);
    // A = dT planes, B = T^T (B[k][n] = T[n][k]: T planes, non-transposed loads)
#if GDN_BWD_WGMMA
    wy_mma_sync<0, 0, 4, kT128, kT128>(acc, wg::k128(dTp, 0), wg::k128(Tpb, 16 * wc));
#else
    mma_planes64<false, true>(acc, dTp, 16 * wr, Tpb, 16 * wc);
#endif
#pragma unroll
    for (int nn = 0; nn < 2; ++nn)  // M1 planes (B of Ghat) in XpA (Pg K is long done)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = 16 * wr + gq + 8 * hh, j = 16 * wc + nn * 8 + 2 * tq;
        put_pair<C * C>(XpA, swz_el<C>(r, j), acc[nn][2 * hh], acc[nn][2 * hh + 1]);
      }
  }
#if GDN_BWD_WGMMA
  wg::fence_smem();  // (the M1 planes)
#endif
  __syncthreads();
  GDN_PH(10);
  {  // Ghat = -(T^T M1) .* Gamma, strictly lower valid
    float acc[2][4];
    zero_acc(acc);
    // A = T^T (transposed loads of the T planes), B = M1 planes [k][n]
#if GDN_BWD_WGMMA
    wy_mma_sync<1, 1, 4, kT128, kT128>(acc, wg::mn128(Tpb, 0), wg::mn128(XpA, 16 * wc));
#else
    mma_planes64<true, false>(acc, Tpb, 16 * wr, XpA, 16 * wc);
#endif
    // G to shared memory (Gsym needs its transpose) and the sums of G .* KK from the fragments:
    // row r's sum_j G_rj KK_rj and column r's sum_j beta_j G_jr KK_jr (KK at the lane's own
    // positions: gram_k wrote them from the same fragment layout)
    float rs[2] = {0.f, 0.f}, cs[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = 16 * wr + gq + 8 * hh, j = 16 * wc + 8 * n + 2 * tq;
        const float4 k4 = KKf[n * kBwdThreads];
        const float2 kk = hh ? make_float2(k4.z, k4.w) : make_float2(k4.x, k4.y);
        float g[2];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          g[u] = (r > j + u && r < L) ? -acc[n][2 * hh + u] * expf(gam[r] - gam[j + u]) : 0.f;
          const float e = g[u] * (u ? kk.y : kk.x);
          rs[hh] += e;
          cs[n][u] += bet[r] * e;
        }
        *reinterpret_cast<float2*>(Gs + r * LDC + j) = make_float2(g[0], g[1]);
      }
    frag_sums(rs, cs);
  }
  __syncthreads();
  GDN_PH(11);
  // dbeta_r += sum_j G_rj KK_rj ; dgam_r += sum_j E_rj - sum_j E_jr, E = G beta_r KK (the partials)
  if (tid < C) {
    const int r = tid;
    const float sb = (ep[r] + ep[C + r]) + (ep[2 * C + r] + ep[3 * C + r]);
    const float sc = (ec[r] + ec[C + r]) + (ec[2 * C + r] + ec[3 * C + r]);
    dbt[r] += sb;
    dgam[r] += bet[r] * sb - sc;
  }
  // Gsym diag(rsK) = (diag(beta) G + G^T diag(beta)) diag(rsK) -> bf16 planes in XpB
  // (a warp takes 8 rows x 4 column pairs: the row-major float2 reads, the transposed reads and the
  // swizzled plane stores are then free of bank conflicts; one row per warp made the transposed
  // reads 8-way conflicts)
  for (int i = tid; i < C * C / 2; i += blockDim.x) {
    const int w = i >> 5, l = i & 31;
    const int r = 8 * (w & 7) + (l & 7), j = 8 * (w >> 3) + 2 * (l >> 3);
    const float2 gr = *reinterpret_cast<const float2*>(Gs + r * LDC + j);
    const float g0 = (bet[r] * gr.x + bet[j] * Gs[j * LDC + r]) * rsK[j];
    const float g1 = (bet[r] * gr.y + bet[j + 1] * Gs[(j + 1) * LDC + r]) * rsK[j + 1];
    put_pair<C * C>(XpB, swz_el<C>(r, j), g0, g1);
  }
#if GDN_BWD_WGMMA
  wg::fence_smem();  // (the Gsym planes)
#endif
  __syncthreads();
  GDN_PH(12);
#if GDN_BWD_WGMMA
  {
    wg::fence();
    wy_mma<0, 1, 4, kT128, 0>(aKs, wg::k128(XpB, 0), wg::mn128(Kb, 32 * wc));
    wg::commit();
    float4 sk[4];  // (the group's running dk sum, loaded while the product runs)
    carry_load(sk, 1);
    wg::wait<0>();
    wg::pin(aKs);
    carry_add(aKs, sk, 1, kSplit || j < p.G - 1);
  }
#else
  mma_planes64_raw<false>(aKs, XpB, 16 * wr, Kb, 32 * wc, el);
  carry(aKs, 1, kSplit || j < p.G - 1);
#endif
  bool done = j == p.G - 1;  // the group's dq, dk are complete
  if constexpr (kSplit) {
    // this item's dq, dk terms are in the group's partial slots; the last of the group's items
    // to count itself sums them (value-head order: the sums of the unsplit run, bit for bit,
    // since each of its carries adds one term to the sum of those before, and + commutes)
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(p.gcnt + sg, 1) == p.G - 1;
    __syncthreads();
    done = last;
    if (done) {
      __threadfence();
      const auto part = [&](int jj, int which) {
        return reinterpret_cast<const float4*>(p.gsplit) + ((sg * p.G + jj) * 2 + which) * (C * DK / 4) + threadIdx.x;
      };
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        float4 q = __ldcg(part(0, 0) + n * kBwdThreads), k = __ldcg(part(0, 1) + n * kBwdThreads);
        for (int jj = 1; jj < p.G; ++jj) {
          const float4 a = __ldcg(part(jj, 0) + n * kBwdThreads), b = __ldcg(part(jj, 1) + n * kBwdThreads);
          q.x += a.x; q.y += a.y; q.z += a.z; q.w += a.w;
          k.x += b.x; k.y += b.y; k.z += b.z; k.w += b.w;
        }
        aKs[n][0] = k.x; aKs[n][1] = k.y; aKs[n][2] = k.z; aKs[n][3] = k.w;
        // (dq's sum where the unsplit run keeps it: the block's slot 0 is not this group's, so the
        // store below reads it back from here)
        aQ[n][0] = q.x; aQ[n][1] = q.y; aQ[n][2] = q.z; aQ[n][3] = q.w;
      }
      if (p.l2norm) l2_dots(aQ, dotq, Qn);
    }
  }
  if (done && p.l2norm) l2_dots(aKs, dotk, Kn);
  __syncthreads();
  if (done) {
    if (p.l2norm) l2_apply(aKs, dotk, rsK, Kn);
    store_grad_rows(p.dk, p.gdt, t0 * p.dk_st + (int64_t)h * p.dk_sh, p.dk_st, aKs, 16 * wr, 32 * wc, L, p.pair_dk);
    if constexpr (!kSplit) {
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const float4 x = slot(0)[n * kBwdThreads];
        aQ[n][0] = x.x; aQ[n][1] = x.y; aQ[n][2] = x.z; aQ[n][3] = x.w;
      }
    }
    if (p.l2norm) l2_apply(aQ, dotq, rsQ, Qn);
    store_grad_rows(p.dq, p.gdt, t0 * p.dq_st + (int64_t)h * p.dq_sh, p.dq_st, aQ, 16 * wr, 32 * wc, L, p.pair_dq);
  }
  GDN_PH(13);
  if (warp == 0) {  // lane owns rows 2*lane, 2*lane+1; fixed-order warp reductions and scan
    float fr = lane < kBwdThreads / 32 ? red[lane] : 0.f;
#pragma unroll
    for (int o = 16; o; o >>= 1) fr += __shfl_xor_sync(0xffffffffu, fr, o);
    const int r0 = 2 * lane, r1 = r0 + 1;
    const float k0 = r0 < L - 1 ? rks[r0] : 0.f, k1 = r1 < L - 1 ? rks[r1] : 0.f;
    float sk = k0 + k1;
#pragma unroll
    for (int o = 16; o; o >>= 1) sk += __shfl_xor_sync(0xffffffffu, sk, o);
    const float last = expf(gl) * fr + sk;
    float d0 = r0 < L ? dgam[r0] - k0 + (r0 == L - 1 ? last : 0.f) : 0.f;
    float d1 = r1 < L ? dgam[r1] - k1 + (r1 == L - 1 ? last : 0.f) : 0.f;
    // reverse cumsum within the chunk -> dg (suffix sums over the lanes' pairs)
    const float pair = d0 + d1;
    float suf = pair;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_down_sync(0xffffffffu, suf, o);
      if (lane + o < 32) suf += y;
    }
    float after = __shfl_down_sync(0xffffffffu, suf, 1);  // exclusive: the pairs after this lane's
    if (lane == 31) after = 0.f;
    dgam[r0] = d0 + d1 + after;
    dgam[r1] = d1 + after;
  }
  __syncthreads();
  if (tid < L) {
    const int r = tid;
    const int64_t t = t0 + r, i = t * p.HV + hv;
    const float dg = dgam[r];
    if (p.gate_fused) {
      const float x = gx[r];  // (this thread's, from the prologue)
      const float spg = x > 20.f ? 1.f : 1.f / (1.f + expf(-x));
      const float ea = expf(p.A_log[hv]);
      const float sp = x > 20.f ? x : log1pf(expf(x));
      const float da = -dg * ea * spg;
      p.dg[i] = da;
      rp[r] = dg * (-ea * sp);  // dA_log contribution
      rp[C + r] = da;           // ddt_bias contribution
    } else {
      p.dg[i] = dg;
    }
    const float b = bet[r];
    p.dbeta[i] = p.beta_sigmoid ? dbt[r] * b * (1.f - b) : dbt[r];
  }
  if (p.gate_fused) {
    __syncthreads();
    if (warp == 0) {
      float sa = 0.f, sd = 0.f;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int r = 2 * lane + u;
        if (r < L) { sa += rp[r]; sd += rp[C + r]; }
      }
#pragma unroll
      for (int o = 16; o; o >>= 1) {
        sa += __shfl_xor_sync(0xffffffffu, sa, o);
        sd += __shfl_xor_sync(0xffffffffu, sd, o);
      }
      if (lane == 0) {
        p.part[(c * p.HV + hv) * 2] = sa;
        p.part[(c * p.HV + hv) * 2 + 1] = sd;
      }
    }
  }
  GDN_PH(14);
}

// Persistent: one block per SM walks the groups (chunk, key head) in launch order, each group's
// value heads in order (measured 0.025 ms faster than one block per item at 1x8192; an L2
// prefetch of the next item's first slices during the WY part gained nothing on top).
//
// Note [Beside the recompute] (gated_delta.cu): gdn_bwd_chunk_beside_kernel is the programmatic
// dependent of gdn_rec16t_kernel and starts on the SMs the recompute leaves. Its blocks take
// the groups by ticket, in chunk order (a block that starts late takes what is left), and run a
// group once the recompute has published its chunk (p.ready), until thread 0 has seen every
// recompute block finish (p.ready[-1] counts them). Thread 0 draws the next ticket after the
// group. (Drawing it during the group's first item, under its copies, spilled registers inside
// the V loop: bwd_chunk 0.05 ms slower even with nothing to wait for.)
__device__ __forceinline__ bool published(const int* r, int full) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(r) : "memory");
  return v >= full;
}
// (group g = c * H + h; its count is that of the publishing chunk, up to 7 chunks after c: no
// 64-bit product or remainder, which made ptxas spill inside the items)
__device__ __forceinline__ void wait_published(const KParams& p, int64_t c, int64_t g) {
  const int n = p.ctab[2 * c];
  const int64_t cb = p.coff[n], last = p.coff[n + 1] - cb - 1, l = p.ctab[2 * c + 1];
  const int ahead = (int)(((l | 7) < last ? (l | 7) : last) - l);  // chunks to the count covering chunk c
  const int* r = p.ready + g + ahead * p.H;
  while (!published(r, p.ready_full)) __nanosleep(256);
}
// The group (chunk-major index c * H + h) of ticket t: the early key heads' groups first, in chunk
// order (Note [The recompute beside the reverse pass]: their recompute blocks share SMs and
// publish slowly, at the same pace for every early key head), then the others in chunk order; NT *
// H and beyond: none left. (32-bit: the host sets early_heads only below 2^30 groups,
// so the tickets drawn beyond them and these products fit; 64-bit divisions here made ptxas spill
// inside the items.)
__device__ __forceinline__ int64_t ticket_group(const KParams& p, int64_t t) {
  if (p.early_heads == 0) return t;
  const uint32_t u = (uint32_t)t, nt = (uint32_t)p.NT, e = (uint32_t)p.early_heads * nt, late = p.H - p.early_heads;
  if (u < e) return (int64_t)((u / p.early_heads) * p.H + u % p.early_heads);
  const uint32_t v = u - e;
  return (int64_t)((v / late) * p.H + p.early_heads + v % late);
}

// Note [The split tail]
// A block runs a group's value heads one after the other, so the launch-order kernel's last round
// of groups (groups mod blocks of them) leaves the other SMs idle for a whole group: at 4x2048
// (2048 groups on 132 SMs) 68 groups, three items each, while 64 SMs wait. Those groups (all groups
// when there are fewer than SMs) therefore run as single items over all SMs where that ends sooner
// (gdn_backward decides), in a kernel of their own (gdn_bwd_chunk_split_kernel): each item forms
// what its group's first value head would (the q/k tiles, K K^T and Q K^T), keeps its dq, dk terms
// in the group's partial slots, and the last to finish sums them in value-head order
// (bwd_chunk_item<true>). The sums equal the unsplit run's bit for bit. The kernel is the
// programmatic dependent of this one, whose blocks let it launch at once, so its blocks take each
// SM this one leaves. (In this kernel's loop the split items made ptxas spill inside the whole
// groups' items.) H200, 4x2048: bwd_chunk 1.085 ms against 1.100 unsplit, kept backward
// 1.681-1.693 against 1.695-1.710 ms; lengths 300, 200, 100: 0.202 against 0.227 ms; 4x512, where
// the split rounds would end no sooner, unsplit. Not by ticket, beside the recompute: splitting
// the last round of tickets made the backward at 1x8192 0.04-0.06 ms slower (its tail waits for
// the recompute's last chunks).
__global__ void __launch_bounds__(kBwdThreads, 1) gdn_bwd_chunk_kernel(KParams p) {
  extern __shared__ __align__(1024) float sm[];
  asm volatile("griddepcontrol.launch_dependents;");  // (the split items need nothing of this kernel)
  const int64_t whole = p.NT * p.H - p.split_groups;
  for (int64_t gi = blockIdx.x; gi < whole; gi += gridDim.x) {
    const int64_t first = (gi / p.H) * p.HV + (gi % p.H) * p.G;  // item (chunk, value head G h)
    for (int j = 0; j < p.G; ++j) {
      bwd_chunk_item<false>(p, sm, first + j, j, 0);
      __syncthreads();  // the next item reuses the shared memory
    }
  }
}

__global__ void __launch_bounds__(kBwdThreads, 1) gdn_bwd_chunk_split_kernel(KParams p) {
  extern __shared__ __align__(1024) float sm[];
  const int64_t whole = p.NT * p.H - p.split_groups;
  for (int64_t u = blockIdx.x; u < p.split_groups * p.G; u += gridDim.x) {
    const int64_t sg = u / p.G, gi = whole + sg;
    const int j = (int)(u - sg * p.G);
    bwd_chunk_item<true>(p, sm, (gi / p.H) * p.HV + (gi % p.H) * p.G + j, j, sg);
    __syncthreads();
  }
}

// The same beside the recompute (Note [Beside the recompute]): groups by ticket (a kernel of its
// own: one loop for both schedules slowed the launch-order one by 0.025 ms at 4x2048).
__global__ void __launch_bounds__(kBwdThreads, 1) gdn_bwd_chunk_beside_kernel(KParams p) {
  extern __shared__ __align__(1024) float sm[];
  __shared__ int64_t cur;  // the block's next group
  __shared__ int all;      // thread 0 saw every recompute block finish
  const int64_t groups = p.NT * p.H;
  const auto next = [&](int64_t t) {  // thread 0: ticket t's group, once its chunk is published
    const int64_t g = ticket_group(p, t);
    if (g < groups && !all) {
      all = published(p.ready - 1, p.ready_blocks);
      if (!all) wait_published(p, g / p.H, g);
    }
    cur = g;
  };
  int64_t gi = blockIdx.x;
  // (p.ticket is always set here; the launch-order branches stay because with them ptxas spills
  // 16 B in this kernel, without them 236 B)
  if (p.ticket) {
    if (threadIdx.x == 0) {
      if (p.dh_done)  // every reverse pass block has finished
        while (!published(p.dh_done, p.dh_blocks)) __nanosleep(256);
      all = 0, next((int64_t)atomicAdd(p.ticket, 1ull));
    }
    __syncthreads();
    gi = cur;
  }
  while (gi < groups) {
    const int64_t first = (gi / p.H) * p.HV + (gi % p.H) * p.G;  // item (chunk, value head G h)
    for (int j = 0; j < p.G; ++j) {
      bwd_chunk_item<false>(p, sm, first + j, j, 0);
      __syncthreads();  // the next item reuses the shared memory
    }
    if (p.ticket) {
      if (threadIdx.x == 0) next((int64_t)atomicAdd(p.ticket, 1ull));
      __syncthreads();
      gi = cur;
    } else {
      gi += gridDim.x;
    }
  }
}

// One block per value head: dA_log, ddt_bias = sums of per-chunk partials (fixed order).
__global__ void gdn_param_reduce_kernel(KParams p) {
  __shared__ float sa[256], sd[256];
  const int hv = blockIdx.x;
  float a = 0.f, d = 0.f;
  for (int64_t c = threadIdx.x; c < p.NT; c += blockDim.x) {
    a += p.part[(c * p.HV + hv) * 2];
    d += p.part[(c * p.HV + hv) * 2 + 1];
  }
  sa[threadIdx.x] = a;
  sd[threadIdx.x] = d;
  __syncthreads();
  for (int s = blockDim.x / 2; s; s >>= 1) {
    if ((int)threadIdx.x < s) {
      sa[threadIdx.x] += sa[threadIdx.x + s];
      sd[threadIdx.x] += sd[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (p.dA_log) p.dA_log[hv] = sa[0];
    if (p.ddt) p.ddt[hv] = sd[0];
  }
}

}  // namespace qrun::gdn::detail
