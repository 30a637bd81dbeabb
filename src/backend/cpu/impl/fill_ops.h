// Fills a BackendOps table with the portable kernels of impl/, compiled for
// the ISA of the including TU. GEMM always goes through blas.h.
#pragma once

#include "backend/backend.h"
#include "backend/cpu/blas.h"
#include "backend/cpu/dsa/dsa.h"
#include "backend/cpu/impl/attention.h"
#include "backend/cpu/impl/copy_ops.h"
#include "backend/cpu/impl/elementwise.h"
#include "backend/cpu/impl/gemv.h"
#include "backend/cpu/impl/paged_attention.h"
#include "backend/cpu/impl/moe_route.h"
#include "backend/cpu/kernels.h"

namespace myriad::cpu {
namespace {

inline void FillPortableOps(BackendOps* o) {
  FillHostMemoryOps(o);
  o->gemm = BlasSgemm;
  o->rmsnorm_fwd = RmsnormFwdK;
  o->rmsnorm_bwd = RmsnormBwdK;
  o->rope = RopeK;
  o->swiglu_fwd = SwigluFwdK;
  o->swiglu_bwd = SwigluBwdK;
  o->softmax_xent = SoftmaxXentK;
  o->attention_fwd = AttentionFwdK;
  o->attention_bwd = AttentionBwdK;
  o->paged_attention = PagedAttentionK;
  o->attention_merge = AttentionMergeK;
  o->moe_route = MoeRouteK;
  o->moe_route_bwd = MoeRouteBwdK;
  o->moe_balance_stats = MoeBalanceStatsK;
  o->moe_gather = MoeGatherK;
  o->moe_combine = MoeCombineK;
  o->moe_combine_bwd = MoeCombineBwdK;
  // The DSA kernels pick their ISA variants themselves (dsa::UseDsaKernelIsa).
  o->dsa_indexer_topk = dsa::IndexerTopK;
  o->dsa_sparse_attention = dsa::SparseAttention;
  o->dsa_sparse_attention_bwd = dsa::SparseAttentionBackward;
  o->dsa_indexer_loss = dsa::IndexerLoss;
  o->copy_rows = CopyRowsK;
  o->add_scaled = AddScaledK;
  o->embedding_bwd = EmbeddingBwdK;
  o->sum = SumK;
  o->adamw = AdamWK;
  o->sumsq = SumsqK;
  o->gemv_f32 = GemvF32K;
  o->gemv_f16 = GemvF16K;
  o->gemv_q8 = GemvQ8K;
}

}  // namespace
}  // namespace myriad::cpu
