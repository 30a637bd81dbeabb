#include "model/inference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/half.h"
#include "ops/ops.h"

namespace myriad {

bool ParseWeightFormat(const std::string& s, WeightFormat* out) {
  if (s == "fp32" || s == "f32") return *out = WeightFormat::kF32, true;
  if (s == "fp16" || s == "f16") return *out = WeightFormat::kF16, true;
  if (s == "int8" || s == "q8") return *out = WeightFormat::kQ8, true;
  return false;
}

const char* WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return "fp32";
    case WeightFormat::kF16: return "fp16";
    case WeightFormat::kQ8: return "int8";
  }
  return "?";
}

void InferLinear::Init(const float* w, int64_t out, int64_t in, WeightFormat fmt) {
  out_ = out; in_ = in; fmt_ = fmt; f32_ = w;
  if (fmt == WeightFormat::kF16) {
    f16_.resize(out * in);
    for (int64_t i = 0; i < out * in; ++i) f16_[i] = FloatToHalf(w[i]);
  } else if (fmt == WeightFormat::kQ8) {
    q8_.resize(out * in);
    scale_.resize(out);
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
      float amax = 0;
      for (int64_t i = 0; i < in; ++i) amax = std::max(amax, std::fabs(w[o * in + i]));
      float s = amax > 0 ? amax / 127.f : 1.f;
      scale_[o] = s;
      for (int64_t i = 0; i < in; ++i)
        q8_[o * in + i] = static_cast<int8_t>(std::lrint(std::clamp(w[o * in + i] / s, -127.f, 127.f)));
    }
  }
}

void InferLinear::Apply(const float* x, int64_t n, float* y) const {
  switch (fmt_) {
    case WeightFormat::kF32:
      ops::Linear(x, f32_, n, in_, out_, y);
      return;
    case WeightFormat::kF16:
      for (int64_t r = 0; r < n; ++r) ops::GemvF16(f16_.data(), x + r * in_, out_, in_, y + r * out_);
      return;
    case WeightFormat::kQ8:
      for (int64_t r = 0; r < n; ++r)
        ops::GemvQ8(q8_.data(), scale_.data(), x + r * in_, out_, in_, y + r * out_);
      return;
  }
}

int64_t InferLinear::bytes() const {
  switch (fmt_) {
    case WeightFormat::kF32: return out_ * in_ * 4;
    case WeightFormat::kF16: return out_ * in_ * 2;
    case WeightFormat::kQ8: return out_ * in_ + out_ * 4;
  }
  return 0;
}

InferenceSession::InferenceSession(const Model& model, int64_t max_len, WeightFormat fmt)
    : model_(model), cfg_(model.config()), max_len_(std::min<int64_t>(max_len, model.config().max_seq_len)),
      fmt_(fmt) {
  const int64_t C = cfg_.d_model, D = cfg_.head_dim(), H = cfg_.n_heads, Hkv = cfg_.n_kv_heads;
  auto W = model.layout().Bind(const_cast<float*>(model.params().data()));
  embed_ = W.embed;
  norm_ = W.norm;
  head_.Init(W.head, cfg_.vocab_size, C, fmt);
  int bias_i = 0;
  layers_.resize(cfg_.n_layers);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    const auto& w = W.layers[l];
    Layer& L = layers_[l];
    L.moe = w.moe;
    L.attn_norm = w.attn_norm;
    L.ffn_norm = w.ffn_norm;
    L.wq.Init(w.wq, H * D, C, fmt);
    L.wk.Init(w.wk, Hkv * D, C, fmt);
    L.wv.Init(w.wv, Hkv * D, C, fmt);
    L.wo.Init(w.wo, C, H * D, fmt);
    if (!w.moe) {
      // gate_proj and up_proj are adjacent: one [2F, C] matrix.
      L.w_gate.Init(w.w_gate, 2 * cfg_.d_ff, C, fmt);
      L.w_down.Init(w.w_down, C, cfg_.d_ff, fmt);
    } else {
      const int64_t F = cfg_.d_expert, E = cfg_.n_routed_experts;
      L.router = w.router;
      L.bias = model.biases()[bias_i++].data();
      L.e_gate.resize(E); L.e_down.resize(E);
      for (int64_t e = 0; e < E; ++e) {
        L.e_gate[e].Init(w.e_gate[e], 2 * F, C, fmt);
        L.e_down[e].Init(w.e_down[e], C, F, fmt);
      }
      if (w.s_gate) {
        const int64_t SF = cfg_.n_shared_experts * F;
        L.s_gate.Init(w.s_gate, 2 * SF, C, fmt);
        L.s_down.Init(w.s_down, C, SF, fmt);
      }
    }
    L.k_cache.assign(max_len_ * Hkv * D, 0.f);
    L.v_cache.assign(max_len_ * Hkv * D, 0.f);
  }
}

int64_t InferenceSession::WeightBytesPerToken() const {
  int64_t b = head_.bytes();
  for (const auto& L : layers_) {
    b += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes();
    if (!L.moe) {
      b += L.w_gate.bytes() + L.w_down.bytes();
    } else {
      b += cfg_.top_k * (L.e_gate[0].bytes() + L.e_down[0].bytes());
      b += L.s_gate.bytes() + L.s_down.bytes() + cfg_.n_routed_experts * cfg_.d_model * 4;
    }
  }
  return b;
}

void InferenceSession::Ffn(Layer& L, const float* f, int64_t n, float* out) {
  const int64_t C = cfg_.d_model;
  if (!L.moe) {
    const int64_t F = cfg_.d_ff;
    g_.resize(n * 2 * F); h_.resize(n * F);
    L.w_gate.Apply(f, n, g_.data());
    ops::SwiGlu(g_.data(), n, F, h_.data());
    L.w_down.Apply(h_.data(), n, out);
    return;
  }
  const int64_t E = cfg_.n_routed_experts, K = cfg_.top_k, F = cfg_.d_expert;
  scores_.resize(n * E);
  ops::Linear(f, L.router, n, C, E, scores_.data());
  std::memset(out, 0, n * C * sizeof(float));
  g_.resize(2 * F); h_.resize(F); eo_.resize(C);
  for (int64_t t = 0; t < n; ++t) {
    float* s = scores_.data() + t * E;
    if (cfg_.sigmoid_scores()) {
      for (int64_t e = 0; e < E; ++e) s[e] = 1.f / (1.f + std::exp(-s[e]));
    } else {
      float mx = *std::max_element(s, s + E), sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(s[e] - mx));
      for (int64_t e = 0; e < E; ++e) s[e] /= sum;
    }
    // Top-K of score + bias, the same rule as training (ties: lower index).
    std::vector<int32_t>& idx = expert_idx_;
    idx.resize(E);
    for (int64_t e = 0; e < E; ++e) idx[e] = static_cast<int32_t>(e);
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int32_t a, int32_t b) {
      float va = s[a] + L.bias[a], vb = s[b] + L.bias[b];
      return va > vb || (va == vb && a < b);
    });
    float z = 0;
    for (int64_t k = 0; k < K; ++k) z += s[idx[k]];
    for (int64_t k = 0; k < K; ++k) {
      int32_t e = idx[k];
      L.e_gate[e].Apply(f + t * C, 1, g_.data());
      ops::SwiGlu(g_.data(), 1, F, h_.data());
      L.e_down[e].Apply(h_.data(), 1, eo_.data());
      const float wk = s[e] / z;
      for (int64_t c = 0; c < C; ++c) out[t * C + c] += wk * eo_[c];
    }
  }
  if (L.s_gate.out() > 0) {
    const int64_t SF = L.s_gate.out() / 2;
    g_.resize(n * 2 * SF); h_.resize(n * SF); eo_.resize(n * C);
    L.s_gate.Apply(f, n, g_.data());
    ops::SwiGlu(g_.data(), n, SF, h_.data());
    L.s_down.Apply(h_.data(), n, eo_.data());
    for (int64_t i = 0; i < n * C; ++i) out[i] += eo_[i];
  }
}

const float* InferenceSession::Forward(const int32_t* tokens, int64_t n) {
  CHECK_MSG(n > 0 && len_ + n <= max_len_, "context of %lld tokens exceeds max_len %lld",
            static_cast<long long>(len_ + n), static_cast<long long>(max_len_));
  const int64_t C = cfg_.d_model, D = cfg_.head_dim(), H = cfg_.n_heads, Hkv = cfg_.n_kv_heads;
  const float eps = static_cast<float>(cfg_.norm_eps);
  x_.resize(n * C); a_.resize(n * C); q_.resize(n * H * D); att_.resize(n * H * D);
  f_.resize(n * C); tmp_.resize(n * C); rstd_.resize(n); pos_.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    CHECK_MSG(tokens[i] >= 0 && tokens[i] < cfg_.vocab_size, "token id %d out of range", tokens[i]);
    std::memcpy(x_.data() + i * C, embed_ + static_cast<int64_t>(tokens[i]) * C, C * sizeof(float));
    pos_[i] = static_cast<int32_t>(len_ + i);
  }
  for (auto& L : layers_) {
    ops::RmsNorm(x_.data(), L.attn_norm, eps, n, C, a_.data(), rstd_.data());
    float* kc = L.k_cache.data() + len_ * Hkv * D;
    float* vc = L.v_cache.data() + len_ * Hkv * D;
    L.wq.Apply(a_.data(), n, q_.data());
    L.wk.Apply(a_.data(), n, kc);
    L.wv.Apply(a_.data(), n, vc);
    ops::Rope(q_.data(), n, H, D, pos_.data(), model_.rope().cos.data(), model_.rope().sin.data(), false);
    ops::Rope(kc, n, Hkv, D, pos_.data(), model_.rope().cos.data(), model_.rope().sin.data(), false);
    AttentionParams p;
    p.B = 1; p.Tq = n; p.Tk = len_ + n; p.H = H; p.Hkv = Hkv; p.D = D;
    p.scale = 1.f / std::sqrt(static_cast<float>(D));
    p.causal = true;
    p.q_batch_stride = n * H * D; p.kv_batch_stride = max_len_ * Hkv * D; p.out_batch_stride = n * H * D;
    p.q = q_.data(); p.k = L.k_cache.data(); p.v = L.v_cache.data(); p.out = att_.data(); p.lse = nullptr;
    ops::Attention(p);
    L.wo.Apply(att_.data(), n, tmp_.data());
    for (int64_t i = 0; i < n * C; ++i) x_[i] += tmp_[i];
    ops::RmsNorm(x_.data(), L.ffn_norm, eps, n, C, f_.data(), rstd_.data());
    Ffn(L, f_.data(), n, tmp_.data());
    for (int64_t i = 0; i < n * C; ++i) x_[i] += tmp_[i];
  }
  len_ += n;
  // Only the last position's logits are needed.
  ops::RmsNorm(x_.data() + (n - 1) * C, norm_, eps, 1, C, a_.data(), rstd_.data());
  logits_.resize(cfg_.vocab_size);
  head_.Apply(a_.data(), 1, logits_.data());
  return logits_.data();
}

}  // namespace myriad
