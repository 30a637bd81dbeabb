// sparse_attention: the lab task for DSA's sparse attention kernel
// (ops/dsa.h: SparseAttention over the top-k keys the indexer selected).
// A SKELETON for now: MakeSparseAttentionTask() returns nullopt, so nothing is
// registered. Whoever owns the kernel fills it in; RegisterBuiltinTasks()
// (tasks.cc) registers it as soon as this returns a task. To fill it in:
//
//   class SparseAttentionInstance : public Instance {
//     // ops::dsa::SparseAttentionParams inputs: q [B,Tq,H,D], k, v [B,Tk,Hkv,D],
//     // idx [B,Tq,K] (ascending, -1 pads), built from the seed; `out` is
//     // [B,Tq,H,D] (lse, if checked too, appended to out).
//   };
//   make_instance: random q/k/v (Rng(seed)), idx either a random ascending
//     causal subset or the indexer's own top-k; out sized B*Tq*H*D.
//   reference:     the scalar reference of ops/dsa.h (double accumulation).
//   build(params): e.g. {"q_tile": 1|4|8, "k_block": 16|32|64, "gather": "rows"|"packed"},
//     each a callable that fills SparseAttentionParams and calls the kernel.
//   candidates:    the parameter grid; baseline = what ops::dsa uses today.
//   shapes:        prefill and decode, tails included: e.g.
//     {B=1,Tq=256,Tk=256,H=8,Hkv=4,D=64,K=64}, {B=1,Tq=1,Tk=4097,H=8,Hkv=4,D=64,K=2048},
//     and a K that is not a multiple of k_block.
//   tolerance:     1e-5 (fp32 with double reference; loosen with a reason).
//   cost:          flops = 4 * B*Tq*H*K*D (scores + weighted sum);
//     bytes = 4 * (q + out + B*Tq*Hkv*K*2*D gathered k/v rows) -- a lower bound.
#include <optional>

#include "lab/lab.h"

namespace myriad::lab {

std::optional<Task> MakeSparseAttentionTask() { return std::nullopt; }

}  // namespace myriad::lab
