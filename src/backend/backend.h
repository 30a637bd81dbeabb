// The backend seam: a narrow table of slots that a device implements —
// device memory (allocate, free, copy, set, synchronise) and the ops. The
// model and trainer reach a device only through this table (via src/ops/,
// which validates shapes once). MYRIAD_BACKEND_SLOTS below lists every slot
// once; supports(), the parity test and docs/backends.md iterate it.
//
// Conventions for every op:
//   * fp32 unless the name says otherwise, row-major, contiguous unless a
//     stride is given; all pointers are device pointers of this backend
//     (host memory for the CPU backend).
//   * B batch, T sequence length, C model width, H query heads, Hkv key/value
//     heads (H % Hkv == 0), D head dim, V vocabulary, N rows (= B*T tokens),
//     F hidden width of a SwiGLU.
//   * "writes" means the output is overwritten; "accumulates" means +=.
//   * Ops assume valid shapes (src/ops checks them) and never allocate on the
//     hot path except where noted.
//   * Results are deterministic: same inputs, same thread count, same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace myriad {

enum class Trans : int { kNo = 0, kYes = 1 };

// Attention over token-major tensors. The query rows are the last Tq
// positions of a sequence of Tk keys (q_offset = Tk - Tq), so the same op
// serves training (Tq == Tk) and decoding against a KV cache (Tq == 1).
// Element [b, t, h, d] of q lives at q + b*q_batch_stride + t*H*D + h*D + d;
// k and v use kv_batch_stride and Hkv heads; out and dout use H heads and
// out_batch_stride; lse is [B, H, Tq] contiguous.
struct AttentionParams {
  int B = 0, Tq = 0, Tk = 0, H = 0, Hkv = 0, D = 0;
  float scale = 0.f;  // usually 1/sqrt(D)
  bool causal = true;
  int64_t q_batch_stride = 0, kv_batch_stride = 0, out_batch_stride = 0;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;  // writes [B, Tq, H, D]
  float* lse = nullptr;  // writes [B, H, Tq] log-sum-exp of scaled scores; may be null in fwd
};

struct AttentionBackwardParams {
  AttentionParams fwd;          // the forward's inputs, out and lse (all read)
  const float* dout = nullptr;  // [B, Tq, H, D], out_batch_stride
  float* dq = nullptr;          // writes, q layout
  float* dk = nullptr;          // writes, kv layout
  float* dv = nullptr;          // writes, kv layout
};

// Attention over a paged KV cache (serving): the new query rows of several
// sequences in one call, each sequence reading its keys and values in place
// through its own block table (no gather into a contiguous buffer).
//   Sequence s owns query rows [q_start[s], q_start[s+1]) of q and out
//   (n_s rows, n_s may be 0; row r of head h at q + r*H*D + h*D). Its rows
//   are the last n_s of its kv_len[s] keys (n_s <= kv_len[s]), causal: row i
//   sits at position kv_len[s] - n_s + i and sees keys [0, that position].
//   Key t of sequence s lies in pool block b = blocks[s*max_blocks + t /
//   block_tokens], at slot t % block_tokens; its head hk row starts at
//     k + b*block_stride + (t % block_tokens)*token_stride + hk*D
//   (v likewise, same strides; for a layer of serve::KvPool, k and v point
//   at that layer's key and value rows of block 0). Entries of `blocks` past
//   a sequence's last key are never read. Block ids lie in [0, num_blocks).
// DSA models (sparse mode): when sel is non-null, batch row r attends only
// to the keys listed in sel[r*sel_k, (r+1)*sel_k): positions in its own
// sequence, each at most the row's position, ended by the first -1 (a row
// with no key writes zeros). That is SparseAttentionParams' selection
// (dsa_indexer_topk's idx) read through the block table.
// Writes out [q_start[n_seq], H*D]; no lse (serving needs none).
struct PagedAttentionParams {
  int n_seq = 0, H = 0, Hkv = 0, D = 0;
  float scale = 0.f;                 // usually 1/sqrt(D)
  const int32_t* q_start = nullptr;  // [n_seq + 1], q_start[0] = 0, non-decreasing
  const int32_t* kv_len = nullptr;   // [n_seq]
  const int32_t* blocks = nullptr;   // [n_seq, max_blocks] pool block ids
  int max_blocks = 0, block_tokens = 0;
  int64_t num_blocks = 0;            // blocks in the pool (for validation)
  int64_t block_stride = 0, token_stride = 0;  // floats
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
  const int32_t* sel = nullptr;  // [q_start[n_seq], sel_k] or null (dense causal)
  int sel_k = 0;
};

struct AdamWParams {
  int64_t n = 0;
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  int64_t step = 1;  // 1-based, for bias correction
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float grad_scale = 1.f;  // grads are multiplied by this first (clipping)
};

// MoE routing of N tokens over E experts, K per token (K <= E <= 256):
//   scores = softmax(logits) over E, or sigmoid(logits) elementwise;
//   group-limited (n_group > 1): the E experts form n_group groups of E /
//     n_group adjacent experts; a group's score is the sum of its two
//     largest scores[t,e] + bias[e] (its one, for groups of one); only the
//     experts of the topk_group best groups (ties: the lower group) compete;
//   sel[t, 0..K) = the K experts of largest scores[t,e] + bias[e] (bias
//     only chooses; ties go to the lower index), in descending order;
//   weights[t,k] = scale * scores[t, sel[t,k]] / sum_k scores[t, sel[t,k]]
//     (normalize), or scale * scores[t, sel[t,k]] (!normalize);
//   the permutation that groups the N*K (token, expert) rows by expert,
//     tokens ascending within an expert: expert e's rows are
//     [expert_offset[e], expert_offset[e+1]), perm[row] is the row's token
//     and pos[t,k] the row of (t, sel[t,k]).
// Every output is written; scores may alias logits. bias may be null.
struct MoeRouteParams {
  int64_t N = 0, E = 0, K = 0;
  bool sigmoid = false;
  bool normalize = true;           // weights sum to `scale`
  float scale = 1.f;               // routed_scaling_factor
  int64_t n_group = 1, topk_group = 1;
  const float* logits = nullptr;   // [N, E]
  const float* bias = nullptr;     // [E] or null
  float* scores = nullptr;         // [N, E]
  int32_t* sel = nullptr;          // [N, K]
  float* weights = nullptr;        // [N, K]
  int32_t* pos = nullptr;          // [N, K]
  int32_t* perm = nullptr;         // [N*K]
  int64_t* expert_offset = nullptr;  // [E+1]
};

// Backward of moe_route's weights (sel is held fixed) and, when balance is
// non-null, of the sequence-wise balance loss
//   L_bal = sum_t sum_e balance[t / T, e] * scores[t,e] / sum_e' scores[t,e'].
// Row t belongs to sequence t / T (N % T == 0). Writes d_logits [N, E]
// through the score function (softmax over E, or sigmoid elementwise).
struct MoeRouteBackwardParams {
  int64_t N = 0, E = 0, K = 0, T = 0;
  bool sigmoid = false;
  bool normalize = true;             // as moe_route's
  float scale = 1.f;
  const float* scores = nullptr;     // [N, E] moe_route's scores
  const int32_t* sel = nullptr;      // [N, K]
  const float* weights = nullptr;    // [N, K]
  const float* d_weights = nullptr;  // [N, K]
  const float* balance = nullptr;    // [N / T, E] loss coefficient per (sequence, expert), or null
  float* d_logits = nullptr;         // [N, E]
};

// DSA sparse attention (docs/sparse-attention.md; the math and layouts are
// in backend/cpu/dsa/dsa.h): the lightning indexer's top-k selection, the
// attention over the selected keys and its backward, and the indexer's KL
// loss against the main attention.
// The indexer's arithmetic for the selection. kInt8: qi per (t, head) and
// ki per key are quantised symmetrically, scale = amax / 127 and
// q = round-half-even(x * (127 / amax)) in float (clamped to +-127); then
// I8(t, s) = scale_k[s] * sum_j w[t, j] * scale_q[t, j] * relu(q8 . k8),
// the dot products exact in int32 (VNNI where the CPU has it; the same
// bits without). About 3x the fp32 rate here; the selection differs from
// fp32's only where scores differ by less than the quantisation error.
// The indexer's loss and gradients stay fp32 either way.
enum class IndexerPrecision { kFp32 = 0, kInt8 = 1 };

struct IndexerParams {
  int B = 0, Tq = 0, Tk = 0, Hi = 0, Di = 0, K = 0;
  IndexerPrecision precision = IndexerPrecision::kFp32;  // of the selection only
  int64_t qi_batch_stride = 0, ki_batch_stride = 0, wi_batch_stride = 0, idx_batch_stride = 0;
  const float* qi = nullptr;
  const float* ki = nullptr;
  const float* wi = nullptr;
  int32_t* idx = nullptr;  // writes [B, Tq, K]
  // Keys read in place through a block table (the serving pool), when
  // ki_blocks is set: key s of batch b is the row at ki +
  // ki_blocks[b * ki_max_blocks + s / ki_block_tokens] * ki_block_stride +
  // (s % ki_block_tokens) * Di (ki_batch_stride unused). IndexerKeyRow
  // resolves it for every implementation.
  const int32_t* ki_blocks = nullptr;
  int ki_max_blocks = 0, ki_block_tokens = 0;
  int64_t ki_block_stride = 0;
};

// The indexer key s of batch b (contiguous, or through the block table).
inline const float* IndexerKeyRow(const IndexerParams& p, int64_t b, int64_t s) {
  if (!p.ki_blocks) return p.ki + b * p.ki_batch_stride + s * p.Di;
  return p.ki + p.ki_blocks[b * p.ki_max_blocks + s / p.ki_block_tokens] * p.ki_block_stride +
         (s % p.ki_block_tokens) * p.Di;
}

struct SparseAttentionParams {
  int B = 0, Tq = 0, Tk = 0, H = 0, Hkv = 0, D = 0, K = 0;
  float scale = 0.f;
  int64_t q_batch_stride = 0, kv_batch_stride = 0, out_batch_stride = 0, idx_batch_stride = 0;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const int32_t* idx = nullptr;
  float* out = nullptr;  // writes [B, Tq, H, D]
  float* lse = nullptr;  // writes [B, H, Tq]; may be null
  // The forward kernel's schedule (SparseAttentionSchedule); all 0: resolved
  // by ResolveSparseAttentionSchedule.
  int q_block = 0, key_chunk = 0, dense_tile = 0;
};

struct SparseAttentionBackwardParams {
  SparseAttentionParams fwd;    // inputs, out and lse of the forward (read)
  const float* dout = nullptr;  // [B, Tq, H, D]
  float* dq = nullptr;          // writes, q layout
  float* dk = nullptr;          // writes, kv layout
  float* dv = nullptr;          // writes, kv layout
};

struct IndexerLossParams {
  IndexerParams indexer;         // qi, ki, wi and the selection idx (read)
  SparseAttentionParams attn;    // q, k, scale, lse of the main attention over idx (read)
  float* dqi = nullptr;          // writes, qi layout (may be null with the others: loss only)
  float* dki = nullptr;          // writes, ki layout
  float* dwi = nullptr;          // writes, wi layout
  float grad_scale = 1.f;        // multiplies the gradients
};

// One slot per op; a comment per slot. Optional slots may be null, and
// supports() says which are present.
enum class CopyKind : int { kHostToDevice = 0, kDeviceToHost = 1, kDeviceToDevice = 2 };

// The gemv_* slots read the weights once for up to this many rows of x (a
// batch's decode tokens), with each row's result equal to its own GEMV.
inline constexpr int64_t kSkinnyRows = 32;

struct BackendOps {
  // ---- device memory ----
  // Allocates `bytes` of device memory aligned to at least 64 bytes; contents
  // unspecified. Returns null only when bytes == 0. Out of memory aborts
  // with the size (callers size their allocations before they start).
  void* (*mem_alloc)(size_t bytes);
  // Frees what mem_alloc returned (null is a no-op).
  void (*mem_free)(void* p);
  // Copies `bytes` between host and device memory in the direction `kind`;
  // the regions must not overlap. Returns when the copy is complete.
  void (*mem_copy)(void* dst, const void* src, size_t bytes, CopyKind kind);
  // Sets `bytes` of device memory to the byte `value`.
  void (*mem_set)(void* dst, int value, size_t bytes);
  // Optional. The contents of [p, p + bytes), inside one mem_alloc block,
  // are no longer needed: the backend may give that memory back (the CPU
  // returns the whole pages inside the range to the OS). The range reads as
  // unspecified until written; bytes outside it are untouched. ZeRO-3 uses
  // it for the parameters a rank does not hold between steps.
  void (*mem_discard)(void* p, size_t bytes);
  // Waits for all work this backend has queued (ops may run asynchronously
  // on a device; on the CPU they are complete when they return).
  void (*synchronize)();

  // ---- ops ----
  // C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major; op(A) is [M,K].
  void (*gemm)(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
               float* C, int64_t ldc);
  // Same contract as gemm, but A and B are rounded to bf16 (round-to-nearest-even) before multiplying; products accumulate in fp32. Null where the CPU lacks AVX512-BF16.
  void (*gemm_bf16)(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                    float* C, int64_t ldc);

  // out[n,:] = x[n,:] * rstd[n] * w, rstd[n] = 1/sqrt(mean(x[n,:]^2) + eps).
  // Writes out [N,C] and rstd [N].
  void (*rmsnorm_fwd)(const float* x, const float* w, float eps, int64_t N, int64_t C,
                      float* out, float* rstd);
  // Accumulates dx [N,C] and dw [C].
  void (*rmsnorm_bwd)(const float* dout, const float* x, const float* w, const float* rstd,
                      int64_t N, int64_t C, float* dx, float* dw);

  // Rotary embedding, "rotate-half" pairing (d, d + D/2), in place on the
  // first D dims of each head of x, head h of token n at x + (n*H + h) *
  // head_stride (head_stride >= D; == D for [N, H, D]); token n is at
  // position pos[n]. cos/sin tables are [max_pos, D/2]: angle(p, i) = p *
  // theta^(-2i/D). inverse=true rotates by the negative angle (the backward).
  void (*rope)(float* x, int64_t N, int H, int D, int64_t head_stride, const int32_t* pos,
               const float* cos_table, const float* sin_table, bool inverse);

  // SwiGLU on a fused gate-up buffer: gu [N, 2F], row n = [gate (F) | up (F)]
  // (both projections come from one GEMM). Writes out [N, F] = silu(gate) * up.
  void (*swiglu_fwd)(const float* gu, int64_t N, int64_t F, float* out);
  // Writes dgu [N, 2F] = [dgate | dup] for dout [N, F].
  void (*swiglu_bwd)(const float* dout, const float* gu, int64_t N, int64_t F, float* dgu);

  // Softmax cross-entropy over logits [N,V] with targets [N] (-1: ignored, loss
  // 0, gradient 0). Writes losses [N] (natural log). If dlogits is non-null,
  // writes dlogits = (softmax - onehot) * grad_scale (it may alias logits).
  void (*softmax_xent)(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                       float grad_scale, float* losses, float* dlogits);

  // Causal (or full) multi-head attention with GQA; tiled with an online
  // softmax, never materialising the [Tq, Tk] score matrix.
  void (*attention_fwd)(const AttentionParams& p);
  void (*attention_bwd)(const AttentionBackwardParams& p);
  // Merges a partial attention result over another block of keys into the
  // running result of the same query rows (ring attention), by log-sum-exp:
  //   lse' = hi + log1p(exp(lo - hi)) with hi/lo the larger/smaller of
  //   (lse, lse_b);  out' = exp(lse - lse') out + exp(lse_b - lse') out_b.
  // Rows whose lse_b is -inf (no visible key) are left as they are. Row i <
  // rows, head h of batch b: out at out + b*out_batch_stride + (i*H + h)*D,
  // lse at lse[(b*H + h)*lse_stride + i]; out_b [B, rows, H, D] and lse_b
  // [B, H, rows] contiguous. Updates out and lse in place.
  void (*attention_merge)(float* out, int64_t out_batch_stride, float* lse, int64_t lse_stride,
                          const float* out_b, const float* lse_b, int B, int rows, int H, int D);
  // Causal GQA attention of serving batches over paged K/V read in place
  // (PagedAttentionParams); same math as attention_fwd on the gathered cache.
  void (*paged_attention)(const PagedAttentionParams& p);

  // Router: scores, top-K, weights and the permutation (MoeRouteParams).
  // The one routing rule of training and inference.
  void (*moe_route)(const MoeRouteParams& p);
  // Router backward (MoeRouteBackwardParams): d(weights) and the balance
  // loss to d(logits).
  void (*moe_route_bwd)(const MoeRouteBackwardParams& p);
  // Balance-loss statistics of B sequences of T routed tokens, in double
  // (writes stats [2, B, E]): stats[b*E + e] counts the (t, k) of sequence b
  // with sel[t,k] == e; stats[(B + b)*E + e] = sum_t scores[t,e] / sum_e'
  // scores[t,e'].
  void (*moe_balance_stats)(const float* scores, const int32_t* sel, int64_t B, int64_t T,
                            int64_t E, int64_t K, double* stats);
  // MoE permutation. gather: dst[i,:] = src[idx[i],:] for i < M (writes).
  void (*moe_gather)(const float* src, const int32_t* idx, int64_t M, int64_t C, float* dst);
  // combine: out[t,:] += sum_k w[t,k] * buf[pos[t,k],:] for t < N, k < K
  // (accumulates). w may be null (weight 1): that is the backward of gather.
  void (*moe_combine)(const float* buf, const int32_t* pos, const float* w, int64_t N,
                      int64_t K, int64_t C, float* out);
  // Backward of combine: dbuf[pos[t,k],:] = w[t,k] * dout[t,:] (writes; every
  // row of dbuf named by pos is written exactly once), and
  // dw[t,k] = dot(dout[t,:], buf[pos[t,k],:]) (writes).
  void (*moe_combine_bwd)(const float* dout, const float* buf, const int32_t* pos,
                          const float* w, int64_t N, int64_t K, int64_t C, float* dbuf,
                          float* dw);

  // ---- DSA sparse attention (IndexerParams ... IndexerLossParams) ----
  // Scores and top-k selection fused: writes idx [B, Tq, K] (ascending, -1 pads).
  void (*dsa_indexer_topk)(const IndexerParams& p);
  // Attention of each query over its selected keys; writes out (and lse).
  void (*dsa_sparse_attention)(const SparseAttentionParams& p);
  void (*dsa_sparse_attention_bwd)(const SparseAttentionBackwardParams& p);
  // Returns the indexer's loss (mean KL over b, t); writes its gradients.
  double (*dsa_indexer_loss)(const IndexerLossParams& p);

  // ---- data movement and reductions the model needs between ops ----
  // Strided 2-D copy with a scale: dst[r*ld_dst + c] = scale * src[r*ld_src + c]
  // for r < rows, c < width (writes). src and dst must not overlap.
  void (*copy_rows)(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t rows,
                    int64_t width, float scale);
  // Residual add: out[i] = x[i] + alpha * y[i] for i < n (writes; out may
  // alias x or y).
  void (*add_scaled)(const float* x, const float* y, float alpha, int64_t n, float* out);
  // Embedding backward: dtable[tok[n], :] += dout[n, :] for n < N, rows
  // added in order of n (accumulates; tokens may repeat).
  void (*embedding_bwd)(const float* dout, const int32_t* tok, int64_t N, int64_t C, float* dtable);
  // Returns sum(x) accumulated in double (loss sums).
  double (*sum)(const float* x, int64_t n);

  // Fused AdamW with decoupled weight decay:
  //   g = grad*grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
  //   param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param)
  void (*adamw)(const AdamWParams& p);
  // Returns sum(x^2) accumulated in double.
  double (*sumsq)(const float* x, int64_t n);

  // Decode GEMVs over `rows` rows of x [rows, in] (one GEMV at rows == 1;
  // a batch's decode tokens at rows <= kSkinnyRows): y[m, o] = sum_i W[o,i] *
  // x[m,i] (writes y [rows, out]). Up to kSkinnyRows the weights are read once
  // for all rows, and each y[m, :] equals the rows == 1 result for x[m, :]
  // bit for bit in every backend (batch-invariant decode). Above it the
  // backend may take another order (a blocked GEMM).
  void (*gemv_f32)(const float* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y);
  // W stored as IEEE fp16 (uint16 bits), accumulated in fp32.
  void (*gemv_f16)(const uint16_t* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y);
  // W int8 with one scale per output row: W[o,i] ~= Wq[o,i] * scale[o], Wq in
  // [-127, 127] (symmetric quantisation; -128 is not a valid weight).
  // rows <= kSkinnyRows: each row of x is quantised to int8 with its own
  // absmax scale (VNNI where present; exact integer sums). rows >
  // kSkinnyRows (prefill): y = x @ (Wq * scale)^T in fp32, x not quantised.
  void (*gemv_q8)(const int8_t* Wq, const float* scale, const float* x, int64_t rows, int64_t out,
                  int64_t in, float* y);
};

// Every slot of BackendOps, once, in declaration order: X(name, required).
// Required slots must be non-null in every backend; optional ones may be
// null. The static_assert below fails when a slot is added to the struct
// but not here.
#define MYRIAD_BACKEND_SLOTS(X) \
  X(mem_alloc, true)            \
  X(mem_free, true)             \
  X(mem_copy, true)             \
  X(mem_set, true)              \
  X(mem_discard, false)         \
  X(synchronize, true)          \
  X(gemm, true)                 \
  X(gemm_bf16, false)           \
  X(rmsnorm_fwd, true)          \
  X(rmsnorm_bwd, true)          \
  X(rope, true)                 \
  X(swiglu_fwd, true)           \
  X(swiglu_bwd, true)           \
  X(softmax_xent, true)         \
  X(attention_fwd, true)        \
  X(attention_bwd, true)        \
  X(attention_merge, true)      \
  X(paged_attention, true)      \
  X(moe_route, true)            \
  X(moe_route_bwd, true)        \
  X(moe_balance_stats, true)    \
  X(moe_gather, true)           \
  X(moe_combine, true)          \
  X(moe_combine_bwd, true)      \
  X(dsa_indexer_topk, true)     \
  X(dsa_sparse_attention, true) \
  X(dsa_sparse_attention_bwd, true) \
  X(dsa_indexer_loss, true)     \
  X(copy_rows, true)            \
  X(add_scaled, true)           \
  X(embedding_bwd, true)        \
  X(sum, true)                  \
  X(adamw, true)                \
  X(sumsq, true)                \
  X(gemv_f32, true)             \
  X(gemv_f16, true)             \
  X(gemv_q8, true)

#define MYRIAD_COUNT_SLOT(name, required) +1
inline constexpr int kNumBackendSlots = 0 MYRIAD_BACKEND_SLOTS(MYRIAD_COUNT_SLOT);
#undef MYRIAD_COUNT_SLOT
static_assert(sizeof(BackendOps) == kNumBackendSlots * sizeof(void (*)()),
              "BackendOps and MYRIAD_BACKEND_SLOTS disagree: list every slot once");

struct BackendSlot {
  const char* name;
  bool required;
  bool (*present)(const BackendOps& ops);  // whether the slot is non-null
};
// The slots in declaration order (from MYRIAD_BACKEND_SLOTS).
const BackendSlot* BackendSlots();  // kNumBackendSlots entries
// The slot named `name`, or null.
const BackendSlot* FindBackendSlot(const std::string& name);
// Names of required slots that `ops` leaves null (empty when complete).
std::string MissingRequiredSlots(const BackendOps& ops);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;     // "cpu-avx512", "cpu-avx2", "cpu-scalar", "cuda"
  virtual const BackendOps& ops() const = 0;
  virtual int num_threads() const = 0;
  // Whether the slot named `op` (the field name above) is implemented.
  bool supports(const std::string& op) const {
    const BackendSlot* s = FindBackendSlot(op);
    return s && s->present(ops());
  }
};

// The CPU backend for the best ISA this machine has (or `isa` if given:
// "avx512", "avx2", "scalar"; unknown or unsupported names return null).
Backend* CpuBackend(const std::string& isa = "");
// The scalar reference oracles (cpu/ref): slow, simple, used only by tests.
const BackendOps& RefOps();

}  // namespace myriad
