// DSA: DeepSeek-style sparse attention, as ops (CPU, OpenMP). A lightning
// indexer scores every earlier token for each query; each query attends only
// to its top-k tokens; the indexer learns from the main attention by KL.
// docs/sparse-attention.md has the math; cpu scalar references live beside
// the kernels (dsa_ref.cc) and every op is tested against them and against a
// PyTorch reference (tests/golden/dsa_reference.py).
//
// Layouts (row-major, per batch element b at b * *_batch_stride floats):
//   q   [B, Tq, H,  D]     main-attention queries (RoPE applied)
//   k,v [B, Tk, Hkv, D]    main-attention keys/values, H % Hkv == 0
//   qi  [B, Tq, Hi, Di]    indexer queries (Hi small heads of small dim Di)
//   ki  [B, Tk, Di]        indexer keys (one per token, shared by the heads)
//   wi  [B, Tq, Hi]        per-query head weights of the indexer
//   idx [B, Tq, K]         selected key positions, int32, ascending, -1 pads
// Query t sits at position pos(t) = Tk - Tq + t (prefill: Tq == Tk; decode:
// Tq == 1) and may see keys 0..pos(t) (causal).
//
// Indexer score:  I(t, s) = sum_j wi[t, j] * relu(qi[t, j, :] . ki[s, :]).
// Selection:      idx[t] = the K keys s <= pos(t) with the highest I(t, s)
//                 (ties: the lower s), sorted ascending; when pos(t) + 1 <= K
//                 every key 0..pos(t) is selected and the rest is -1.
// Sparse attention: out[t, h] = sum_{s in idx[t]} P(t, h, s) v[s, h / (H/Hkv)],
//                 P = softmax over s in idx[t] of scale * q[t, h] . k[s, h/g];
//                 lse[b, h, t] the log-sum-exp of those scaled scores.
//                 With K >= Tk this is exactly dense causal attention.
// Indexer loss:   p_t(s) = (1/H) sum_h P(t, h, s)  (the main attention's
//                 distribution over idx[t], detached), q_t(s) = softmax over
//                 s in idx[t] of I(t, s); loss = mean over b, t of
//                 KL(p_t || q_t); its gradient flows to qi, ki, wi only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace myriad::cpu::dsa {

// The parameter structs are the backend's (backend/backend.h: the dsa_* slots).
using myriad::IndexerLossParams;
using myriad::IndexerParams;
using myriad::IndexerPrecision;
using myriad::SparseAttentionBackwardParams;
using myriad::SparseAttentionParams;


// Scores and top-k selection fused: no [Tq, Tk] matrix is materialised.
void IndexerTopK(const IndexerParams& p);
// The ISA whose kernel variants the DSA ops run, like the backend's
// MYRIAD_CPU_ISA: "avx512" (16-lane step kernels, VNNI int8 tiles where the
// CPU has VNNI, else AVX2's; AVX-512 compress), "avx2" (8-lane step
// kernels, vpmaddubsw int8 tiles, permute-table compress), "scalar"
// (8-lane portable code, the portable int8 and candidate kernels); "": the
// default (MYRIAD_CPU_ISA where this CPU has it, else the best it has).
// Returns false, changing nothing, for a name this CPU cannot run. Results
// agree within each op's contract; the indexer's selection is the same bits
// on every ISA. For tests and benchmarks; call while no DSA op runs.
bool UseDsaKernelIsa(const std::string& isa);
// The ISAs this CPU can run ("scalar" always), and the one in use.
std::vector<std::string> AvailableDsaKernelIsas();
std::string DsaKernelIsa();

void SparseAttention(const SparseAttentionParams& p);

// How SparseAttention walks the work. q_block 1: the row kernel (each query
// row gathers its selected k/v rows on its own). q_block > 1: the blocked
// kernel: q_block rows of one kv head walk the keys in chunks of key_chunk
// positions together, so a chunk's k/v rows come from DRAM once and serve
// every row of the block that selected them from cache (k and v are first
// copied per kv head, so a chunk is contiguous). Both kernels take a row's
// keys in online-softmax steps of up to 128; the blocked kernel also ends a
// step at each chunk boundary, so schedules differ in rounding only (each
// schedule is deterministic, whatever the thread count). dense_tile > 0:
// masked dense attention (two GEMMs per kv head and tile of dense_tile query
// rows, unselected keys masked to -inf): the same math at dense cost, equal
// to the others up to fp32 rounding; a schedule the kernel lab may pick,
// never the default (the blocked kernel is faster even where the selection
// is most of the keys).
struct SparseAttentionSchedule {
  int q_block = 0;     // 0: not chosen
  int key_chunk = 0;   // 0: the default for the shape
  int dense_tile = 0;  // > 0: masked dense (q_block, key_chunk unused)
};
// The schedule for p: p's own q_block/key_chunk when set; else the installed
// lookup's answer (the kernel lab's tuned table, lab::InstallTunedKernels);
// else DefaultSparseAttentionSchedule.
SparseAttentionSchedule ResolveSparseAttentionSchedule(const SparseAttentionParams& p);
// l2_bytes: the L2 cache per core the default is sized for (0: this CPU's).
SparseAttentionSchedule DefaultSparseAttentionSchedule(const SparseAttentionParams& p,
                                                       int64_t l2_bytes = 0);
// Installs (or, with an empty function, removes) the process-wide lookup;
// it answers {0, 0} for shapes it knows nothing about. Call before kernels run.
void SetSparseAttentionScheduleLookup(
    std::function<SparseAttentionSchedule(const SparseAttentionParams&)> lookup);

void SparseAttentionBackward(const SparseAttentionBackwardParams& p);

// Returns the loss (mean KL over b, t).
double IndexerLoss(const IndexerLossParams& p);

// Scalar references (double accumulation), the oracles of the tests.
namespace ref {
void IndexerTopK(const IndexerParams& p);
void SparseAttention(const SparseAttentionParams& p);
void SparseAttentionBackward(const SparseAttentionBackwardParams& p);
double IndexerLoss(const IndexerLossParams& p);
}  // namespace ref

}  // namespace myriad::cpu::dsa
