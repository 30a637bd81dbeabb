// Op front-ends: the only way the model and trainer reach a backend. Each
// checks its arguments once (a failed check is a bug in the caller: CHECK
// aborts with the op's name) and dispatches through the active backend's op
// table. Shapes use the letters defined in backend/backend.h.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace myriad::ops {

// The backend all ops dispatch to; defaults to CpuBackend("") on first use.
Backend* Active();
void SetActive(Backend* backend);

// The explicit, named copies between host and device memory: small control
// data the host must read (expert row counts that size the grouped GEMMs)
// or write (token ids, positions). Every other byte stays on the device.
void CopyToHost(void* host_dst, const void* device_src, size_t bytes);
void CopyToDevice(void* device_dst, const void* host_src, size_t bytes);

// Precision of the model's matrix products (Linear, LinearBackward, Gemm):
// fp32, or bf16 inputs with fp32 accumulation where the backend has
// gemm_bf16. Process-wide; fp32 unless set. Setting bf16 on a backend
// without the slot is a no-op (HasBf16Gemm() tells).
enum class GemmPrecision { kFp32, kBf16 };
void SetGemmPrecision(GemmPrecision p);
GemmPrecision GetGemmPrecision();
bool HasBf16Gemm();

// y[N,out] (=|+=) x[N,in] @ W[out,in]^T.
void Linear(const float* x, const float* W, int64_t N, int64_t in, int64_t out, float* y,
            bool accumulate = false);
// Backward of Linear: dx[N,in] (=|+=) dy @ W (skipped when dx is null);
// dW[out,in] += dy^T @ x.
void LinearBackward(const float* dy, const float* x, const float* W, int64_t N, int64_t in,
                    int64_t out, float* dx, bool accumulate_dx, float* dW);
// Plain GEMM (see BackendOps::gemm).
void Gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

void RmsNorm(const float* x, const float* w, float eps, int64_t N, int64_t C, float* out,
             float* rstd);
void RmsNormBackward(const float* dout, const float* x, const float* w, const float* rstd,
                     int64_t N, int64_t C, float* dx, float* dw);
// head_stride 0: D (x is [N, H, D]).
void Rope(float* x, int64_t N, int H, int D, const int32_t* pos, const float* cos_table,
          const float* sin_table, bool inverse, int64_t head_stride = 0);
// gu [N, 2F] holds [gate | up] per row (one GEMM computes both).
void SwiGlu(const float* gu, int64_t N, int64_t F, float* out);
void SwiGluBackward(const float* dout, const float* gu, int64_t N, int64_t F, float* dgu);
void SoftmaxXent(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                 float grad_scale, float* losses, float* dlogits);
void Attention(const AttentionParams& p);
void AttentionBackward(const AttentionBackwardParams& p);
// The tables (q_start, kv_len, blocks) are device data: check their host
// copies once per batch with CheckPagedAttentionTables (every block a
// sequence's keys need lies in [0, num_blocks), rows fit their sequences).
void PagedAttention(const PagedAttentionParams& p);
void CheckPagedAttentionTables(const PagedAttentionParams& host_tables);
// Routing (BackendOps::moe_route); E <= 256.
void MoeRoute(const MoeRouteParams& p);
void MoeRouteBackward(const MoeRouteBackwardParams& p);
// stats [2, B, E] in double (BackendOps::moe_balance_stats).
void MoeBalanceStats(const float* scores, const int32_t* sel, int64_t B, int64_t T, int64_t E, int64_t K,
                     double* stats);
// DSA sparse attention (the dsa_* slots; backend/cpu/dsa/dsa.h has the math).
void IndexerTopK(const IndexerParams& p);
void SparseAttention(const SparseAttentionParams& p);
void SparseAttentionBackward(const SparseAttentionBackwardParams& p);
double IndexerLoss(const IndexerLossParams& p);
void MoeGather(const float* src, const int32_t* idx, int64_t M, int64_t C, float* dst);
void MoeCombine(const float* buf, const int32_t* pos, const float* w, int64_t N, int64_t K,
                int64_t C, float* out);
void MoeCombineBackward(const float* dout, const float* buf, const int32_t* pos, const float* w,
                        int64_t N, int64_t K, int64_t C, float* dbuf, float* dw);
// Data movement between ops (BackendOps contracts): dst[r*ld_dst + c] =
// scale * src[r*ld_src + c]; out = x + alpha*y; the embedding's row gather
// (a MoeGather of table rows) and its backward; a sum in double.
void CopyRows(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t rows, int64_t width,
              float scale = 1.f);
// dst[0..n) = src[0..n): a device-to-device copy (CopyBytes: of bytes).
void Copy(const float* src, int64_t n, float* dst);
void CopyBytes(const void* src, size_t bytes, void* dst);
// The contents of [p, p + bytes) of device memory are no longer needed
// (BackendOps::mem_discard; a no-op where the backend has no such slot).
void Discard(void* p, size_t bytes);
// BackendOps::attention_merge (ring attention's log-sum-exp merge).
void AttentionMerge(float* out, int64_t out_batch_stride, float* lse, int64_t lse_stride, const float* out_b,
                    const float* lse_b, int B, int rows, int H, int D);
void AddScaled(const float* x, const float* y, float alpha, int64_t n, float* out);
void EmbeddingBackward(const float* dout, const int32_t* tok, int64_t N, int64_t C, float* dtable);
double Sum(const float* x, int64_t n);
// Zeroes n floats of device memory.
void Zero(float* x, int64_t n);
void AdamW(const AdamWParams& p);
double SumSquares(const float* x, int64_t n);
// y[rows, out] = x[rows, in] @ W^T with W in fp32, fp16 or int8 (per-row
// scales): the BackendOps::gemv_* contracts (weights read once for up to
// kSkinnyRows rows; a blocked GEMM above).
void GemvF32(const float* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y);
void GemvF16(const uint16_t* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y);
void GemvQ8(const int8_t* Wq, const float* scale, const float* x, int64_t rows, int64_t out, int64_t in,
            float* y);

}  // namespace myriad::ops
