#include "ops/ops.h"

#include <cstdlib>
#include <string>

#include "backend/fenced/fenced_backend.h"
#include "core/check.h"

#define OP_CHECK(op, cond) CHECK_MSG(cond, "[%s] invalid arguments", op)

namespace myriad::ops {
namespace {
Backend* g_active = nullptr;
GemmPrecision g_precision = GemmPrecision::kFp32;
const BackendOps& T() { return Active()->ops(); }
// The GEMM the model's products use under the current precision.
auto ModelGemm() {
  if (g_precision == GemmPrecision::kBf16 && T().gemm_bf16) return T().gemm_bf16;
  return T().gemm;
}
}  // namespace

void SetGemmPrecision(GemmPrecision p) { g_precision = p; }
GemmPrecision GetGemmPrecision() { return g_precision; }
bool HasBf16Gemm() { return T().gemm_bf16 != nullptr; }

Backend* Active() {
  if (!g_active) {
    // MYRIAD_BACKEND=fenced: the CPU backend behind the fence (debugging the
    // seam: host code that touches device memory faults at its line).
    const char* env = std::getenv("MYRIAD_BACKEND");
    std::string which = env && *env ? env : "cpu";
    CHECK_MSG(which == "cpu" || which == "fenced", "MYRIAD_BACKEND=%s is not a backend (hint: cpu or fenced)",
              which.c_str());
    g_active = which == "fenced" ? FencedBackend(CpuBackend("")) : CpuBackend("");
  }
  CHECK_MSG(g_active != nullptr, "no CPU backend available");
  return g_active;
}
void SetActive(Backend* backend) { g_active = backend; }

void Gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  OP_CHECK("gemm", M >= 0 && N >= 0 && K >= 0 && C != nullptr);
  if (M == 0 || N == 0) return;
  ModelGemm()(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace {
constexpr int64_t kLinearGemvRows = 16;
}  // namespace

void Linear(const float* x, const float* W, int64_t N, int64_t in, int64_t out, float* y,
            bool accumulate) {
  OP_CHECK("linear", x && W && y && in > 0 && out > 0 && N >= 0);
  if (N == 0) return;
  // Decode-sized batches: the GEMV slot reads W once for all rows (no
  // packing of a skinny GEMM), each row's result independent of the batch.
  // Up to 16 rows it beats OpenBLAS (bench/README.md, "Batched decode").
  if (N <= kLinearGemvRows && !accumulate && T().gemv_f32 && g_precision == GemmPrecision::kFp32) {
    T().gemv_f32(W, x, N, out, in, y);
    return;
  }
  ModelGemm()(Trans::kNo, Trans::kYes, N, out, in, 1.f, x, in, W, in, accumulate ? 1.f : 0.f, y, out);
}

void LinearBackward(const float* dy, const float* x, const float* W, int64_t N, int64_t in,
                    int64_t out, float* dx, bool accumulate_dx, float* dW) {
  OP_CHECK("linear_backward", dy && x && W && dW && in > 0 && out > 0 && N >= 0);
  if (N == 0) return;
  auto gemm = ModelGemm();
  if (dx) gemm(Trans::kNo, Trans::kNo, N, in, out, 1.f, dy, out, W, in, accumulate_dx ? 1.f : 0.f, dx, in);
  gemm(Trans::kYes, Trans::kNo, out, in, N, 1.f, dy, out, x, in, 1.f, dW, in);
}

void RmsNorm(const float* x, const float* w, float eps, int64_t N, int64_t C, float* out,
             float* rstd) {
  OP_CHECK("rmsnorm", x && w && out && rstd && C > 0 && eps >= 0);
  T().rmsnorm_fwd(x, w, eps, N, C, out, rstd);
}
void RmsNormBackward(const float* dout, const float* x, const float* w, const float* rstd,
                     int64_t N, int64_t C, float* dx, float* dw) {
  OP_CHECK("rmsnorm_backward", dout && x && w && rstd && dx && dw && C > 0);
  T().rmsnorm_bwd(dout, x, w, rstd, N, C, dx, dw);
}
void Rope(float* x, int64_t N, int H, int D, const int32_t* pos, const float* cos_table,
          const float* sin_table, bool inverse, int64_t head_stride) {
  if (head_stride == 0) head_stride = D;
  OP_CHECK("rope", x && pos && cos_table && sin_table && H > 0 && D > 0 && D % 2 == 0 && head_stride >= D);
  T().rope(x, N, H, D, head_stride, pos, cos_table, sin_table, inverse);
}
void SwiGlu(const float* gu, int64_t N, int64_t F, float* out) {
  OP_CHECK("swiglu", gu && out && F > 0);
  T().swiglu_fwd(gu, N, F, out);
}
void SwiGluBackward(const float* dout, const float* gu, int64_t N, int64_t F, float* dgu) {
  OP_CHECK("swiglu_backward", dout && gu && dgu && F > 0);
  T().swiglu_bwd(dout, gu, N, F, dgu);
}
void SoftmaxXent(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                 float grad_scale, float* losses, float* dlogits) {
  OP_CHECK("softmax_xent", logits && targets && losses && V > 0);
  T().softmax_xent(logits, targets, N, V, grad_scale, losses, dlogits);
}
void Attention(const AttentionParams& p) {
  OP_CHECK("attention", p.q && p.k && p.v && p.out && p.H > 0 && p.Hkv > 0 && p.H % p.Hkv == 0 &&
                            p.D > 0 && p.Tq > 0 && p.Tk >= p.Tq && p.B > 0);
  T().attention_fwd(p);
}
void AttentionBackward(const AttentionBackwardParams& p) {
  OP_CHECK("attention_backward", p.fwd.lse && p.dout && p.dq && p.dk && p.dv);
  T().attention_bwd(p);
}
void PagedAttention(const PagedAttentionParams& p) {
  OP_CHECK("paged_attention", p.n_seq > 0 && p.q_start && p.kv_len && p.blocks && p.q && p.k && p.v &&
                                  p.out && p.H > 0 && p.Hkv > 0 && p.H % p.Hkv == 0 && p.D > 0 &&
                                  p.block_tokens > 0 && p.max_blocks > 0 && p.num_blocks > 0 &&
                                  p.token_stride >= (int64_t)p.Hkv * p.D &&
                                  p.block_stride >= (int64_t)p.block_tokens * p.token_stride);
  T().paged_attention(p);
}
void CheckPagedAttentionTables(const PagedAttentionParams& p) {
  CHECK_MSG(p.q_start[0] == 0, "[paged_attention] q_start[0] is %d, not 0", p.q_start[0]);
  for (int s = 0; s < p.n_seq; ++s) {
    const int n = p.q_start[s + 1] - p.q_start[s];
    CHECK_MSG(n >= 0 && n <= p.kv_len[s] && p.kv_len[s] <= (int64_t)p.max_blocks * p.block_tokens,
              "[paged_attention] sequence %d: %d query rows, %d keys, room for %lld keys in its table", s, n,
              p.kv_len[s], static_cast<long long>(p.max_blocks) * p.block_tokens);
    const int32_t* table = p.blocks + static_cast<int64_t>(s) * p.max_blocks;
    for (int i = 0; i < (p.kv_len[s] + p.block_tokens - 1) / p.block_tokens; ++i)
      CHECK_MSG(table[i] >= 0 && table[i] < p.num_blocks,
                "[paged_attention] sequence %d: block %d of its table is %d, outside the pool of %lld", s, i,
                table[i], static_cast<long long>(p.num_blocks));
  }
}
void MoeRoute(const MoeRouteParams& p) {
  OP_CHECK("moe_route", p.N >= 0 && p.E > 0 && p.E <= 256 && p.K > 0 && p.K <= p.E && p.logits &&
                            p.scores && p.sel && p.weights && p.pos && p.perm && p.expert_offset &&
                            p.n_group >= 1 && p.E % p.n_group == 0 && p.topk_group >= 1 &&
                            p.topk_group <= p.n_group && p.K <= p.topk_group * (p.E / p.n_group));
  T().moe_route(p);
}
void MoeRouteBackward(const MoeRouteBackwardParams& p) {
  OP_CHECK("moe_route_backward", p.N >= 0 && p.E > 0 && p.E <= 256 && p.K > 0 && p.K <= p.E && p.T > 0 &&
                                     p.N % p.T == 0 && p.scores && p.sel && p.weights && p.d_weights &&
                                     p.d_logits);
  if (p.N) T().moe_route_bwd(p);
}
void MoeBalanceStats(const float* scores, const int32_t* sel, int64_t B, int64_t T_, int64_t E, int64_t K,
                     double* stats) {
  OP_CHECK("moe_balance_stats", B >= 0 && T_ > 0 && E > 0 && K > 0 && K <= E && scores && sel && stats);
  if (B) T().moe_balance_stats(scores, sel, B, T_, E, K, stats);
}

void IndexerTopK(const IndexerParams& p) {
  OP_CHECK("dsa_indexer_topk", p.B >= 0 && p.Tq >= 0 && p.Tk >= p.Tq && p.Hi > 0 && p.Di > 0 && p.K > 0 &&
                                   (p.B * p.Tq == 0 || (p.qi && p.ki && p.wi && p.idx)) &&
                                   (!p.ki_blocks || (p.ki_block_tokens > 0 && p.ki_block_stride >= p.Di &&
                                                     (int64_t)p.ki_max_blocks * p.ki_block_tokens >= p.Tk)));
  if (p.B * p.Tq) T().dsa_indexer_topk(p);
}
void SparseAttention(const SparseAttentionParams& p) {
  OP_CHECK("dsa_sparse_attention", p.B >= 0 && p.Tq >= 0 && p.H > 0 && p.Hkv > 0 && p.H % p.Hkv == 0 &&
                                       p.D > 0 && p.K > 0 && (p.B * p.Tq == 0 || (p.q && p.k && p.v && p.idx && p.out)));
  if (p.B * p.Tq) T().dsa_sparse_attention(p);
}
void SparseAttentionBackward(const SparseAttentionBackwardParams& p) {
  OP_CHECK("dsa_sparse_attention_backward", p.fwd.lse && p.dout && p.dq && p.dk && p.dv);
  T().dsa_sparse_attention_bwd(p);
}
double IndexerLoss(const IndexerLossParams& p) {
  OP_CHECK("dsa_indexer_loss", p.indexer.qi && p.indexer.ki && p.indexer.wi && p.indexer.idx && p.attn.q &&
                                   p.attn.k && p.attn.lse && !p.indexer.ki_blocks);  // (training: contiguous keys)
  return T().dsa_indexer_loss(p);
}

void CopyRows(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t rows, int64_t width,
              float scale) {
  OP_CHECK("copy_rows", rows >= 0 && width >= 0 && ld_src >= width && ld_dst >= width &&
                            (rows == 0 || width == 0 || (src && dst)));
  if (rows && width) T().copy_rows(src, ld_src, dst, ld_dst, rows, width, scale);
}
void Copy(const float* src, int64_t n, float* dst) {
  OP_CHECK("copy", n >= 0 && (n == 0 || (src && dst)));
  if (n) T().mem_copy(dst, src, static_cast<size_t>(n) * sizeof(float), CopyKind::kDeviceToDevice);
}
void Discard(void* p, size_t bytes) {
  OP_CHECK("mem_discard", bytes == 0 || p);
  if (bytes && T().mem_discard) T().mem_discard(p, bytes);
}
void CopyBytes(const void* src, size_t bytes, void* dst) {
  OP_CHECK("copy_bytes", bytes == 0 || (src && dst));
  if (bytes) T().mem_copy(dst, src, bytes, CopyKind::kDeviceToDevice);
}
void AttentionMerge(float* out, int64_t out_batch_stride, float* lse, int64_t lse_stride, const float* out_b,
                    const float* lse_b, int B, int rows, int H, int D) {
  OP_CHECK("attention_merge", B >= 0 && rows >= 0 && H > 0 && D > 0 && lse_stride >= rows &&
                                  (B * rows == 0 || (out && lse && out_b && lse_b)));
  if (B * rows) T().attention_merge(out, out_batch_stride, lse, lse_stride, out_b, lse_b, B, rows, H, D);
}
void AddScaled(const float* x, const float* y, float alpha, int64_t n, float* out) {
  OP_CHECK("add_scaled", n >= 0 && (n == 0 || (x && y && out)));
  if (n) T().add_scaled(x, y, alpha, n, out);
}
void EmbeddingBackward(const float* dout, const int32_t* tok, int64_t N, int64_t C, float* dtable) {
  OP_CHECK("embedding_bwd", N >= 0 && C > 0 && (N == 0 || (dout && tok && dtable)));
  if (N) T().embedding_bwd(dout, tok, N, C, dtable);
}
double Sum(const float* x, int64_t n) {
  OP_CHECK("sum", n >= 0 && (n == 0 || x));
  return n ? T().sum(x, n) : 0.0;
}
void Zero(float* x, int64_t n) {
  OP_CHECK("zero", n >= 0 && (n == 0 || x));
  if (n) T().mem_set(x, 0, static_cast<size_t>(n) * sizeof(float));
}

void CopyToHost(void* host_dst, const void* device_src, size_t bytes) {
  if (bytes) T().mem_copy(host_dst, device_src, bytes, CopyKind::kDeviceToHost);
}
void CopyToDevice(void* device_dst, const void* host_src, size_t bytes) {
  if (bytes) T().mem_copy(device_dst, host_src, bytes, CopyKind::kHostToDevice);
}

void MoeGather(const float* src, const int32_t* idx, int64_t M, int64_t C, float* dst) {
  OP_CHECK("moe_gather", (M == 0 || (src && idx && dst)) && C > 0);
  if (M) T().moe_gather(src, idx, M, C, dst);
}
void MoeCombine(const float* buf, const int32_t* pos, const float* w, int64_t N, int64_t K,
                int64_t C, float* out) {
  OP_CHECK("moe_combine", buf && pos && out && K > 0 && C > 0);
  T().moe_combine(buf, pos, w, N, K, C, out);
}
void MoeCombineBackward(const float* dout, const float* buf, const int32_t* pos, const float* w,
                        int64_t N, int64_t K, int64_t C, float* dbuf, float* dw) {
  OP_CHECK("moe_combine_backward", dout && buf && pos && w && dbuf && dw && K > 0 && C > 0);
  T().moe_combine_bwd(dout, buf, pos, w, N, K, C, dbuf, dw);
}
void AdamW(const AdamWParams& p) {
  OP_CHECK("adamw", p.param && p.grad && p.m && p.v && p.step >= 1);
  T().adamw(p);
}
double SumSquares(const float* x, int64_t n) {
  OP_CHECK("sumsq", x || n == 0);
  return n ? T().sumsq(x, n) : 0.0;
}
void GemvF32(const float* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
  OP_CHECK("gemv_f32", W && x && y && rows >= 0 && out > 0 && in > 0);
  if (rows > 0) T().gemv_f32(W, x, rows, out, in, y);
}
void GemvF16(const uint16_t* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
  OP_CHECK("gemv_f16", W && x && y && rows >= 0 && out > 0 && in > 0);
  if (rows > 0) T().gemv_f16(W, x, rows, out, in, y);
}
void GemvQ8(const int8_t* Wq, const float* scale, const float* x, int64_t rows, int64_t out, int64_t in,
            float* y) {
  OP_CHECK("gemv_q8", Wq && scale && x && y && rows >= 0 && out > 0 && in > 0);
  if (rows > 0) T().gemv_q8(Wq, scale, x, rows, out, in, y);
}

}  // namespace myriad::ops
