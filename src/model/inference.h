// Incremental inference with a KV cache for one sequence: prefill a prompt,
// then decode token by token. Weights are read from a Model (fp32), or from
// converted copies in fp16 or int8 (per-output-row scales) for decode, which
// is bound by weight bytes per token. MTP modules are not used here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/block.h"
#include "model/model.h"

namespace myriad {

enum class WeightFormat { kF32, kF16, kQ8 };
// "fp32" | "fp16" | "int8"; false when unknown.
bool ParseWeightFormat(const std::string& s, WeightFormat* out);
const char* WeightFormatName(WeightFormat f);

// A matrix [out, in] in one of the formats, applied to rows of x.
class InferLinear {
 public:
  void Init(const float* w, int64_t out, int64_t in, WeightFormat fmt);
  // y[n, out] = x[n, in] @ W^T.
  void Apply(const float* x, int64_t n, float* y) const;
  int64_t bytes() const;
  int64_t out() const { return out_; }

 private:
  const float* f32_ = nullptr;
  std::vector<uint16_t> f16_;
  std::vector<int8_t> q8_;
  std::vector<float> scale_;
  int64_t out_ = 0, in_ = 0;
  WeightFormat fmt_ = WeightFormat::kF32;
};

class InferenceSession {
 public:
  // `model` must outlive the session (fp32 weights are read in place).
  InferenceSession(const Model& model, int64_t max_len, WeightFormat fmt = WeightFormat::kF32);

  // Appends tokens at positions [len(), len()+n) and returns the logits [V]
  // of the last one. Fails (CHECK) past max_len: callers check len() first.
  const float* Forward(const int32_t* tokens, int64_t n);
  int64_t len() const { return len_; }
  int64_t max_len() const { return max_len_; }
  void Reset() { len_ = 0; }
  // Bytes of weights read per decoded token (for the roofline).
  int64_t WeightBytesPerToken() const;

 private:
  struct Layer {
    bool moe = false;
    const float *attn_norm, *ffn_norm, *router;
    // w_gate, e_gate and s_gate hold gate and up projections together [2F, C].
    InferLinear wq, wk, wv, wo, w_gate, w_down, s_gate, s_down;
    std::vector<InferLinear> e_gate, e_down;
    const float* bias = nullptr;
    std::vector<float> k_cache, v_cache;  // [max_len, Hkv*D]
  };
  void Ffn(Layer& L, const float* f, int64_t n, float* out);

  const Model& model_;
  const ModelConfig cfg_;
  int64_t max_len_, len_ = 0;
  WeightFormat fmt_;
  std::vector<Layer> layers_;
  const float* embed_;
  const float* norm_;
  InferLinear head_;
  std::vector<float> x_, a_, q_, att_, f_, tmp_, g_, h_, logits_, rstd_, eo_, scores_;
  std::vector<int32_t> pos_, expert_idx_;
};

}  // namespace myriad
