// Kernel parameter block and kernel declarations shared by the gated delta launch code.
#pragma once
#include <cstdint>

#include "gdn_common.cuh"

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
  float* hs; float* dhs;     // [NT,HV,K,V]
  float* Dl; float* dDl;     // [T,HV,V]
  float* dqh; float* dkh;    // [T,HV,K]
  float* part;               // [NT,HV,2]
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
  // dv rows may be written as element pairs (4 or 8 bytes; pointer and strides allow it)
  int pair_dv;
  int pair_o;   // o rows may be written as bf16 pairs (4 bytes)
};

__device__ __forceinline__ const __nv_bfloat16* bf16_at(const void* p, int64_t off) {
  return static_cast<const __nv_bfloat16*>(p) + off;
}

}  // namespace qrun::gdn::detail
