#include "model/params.h"

#include "core/check.h"

namespace myriad {

LocalDims LocalDims::Of(const ModelConfig& c, const ShardPlan& p) {
  LocalDims d;
  d.H = c.n_heads / p.tp;
  d.Hkv = c.n_kv_heads / p.tp;
  d.F = c.d_ff / p.tp;
  d.Fe = c.d_expert / p.tp;
  d.SF = c.n_shared_experts * c.d_expert / p.tp;
  d.E_local = c.n_routed_experts / p.ep;
  d.E_begin = d.E_local * p.ep_rank;
  return d;
}

int64_t ParamLayout::Add(const std::string& name, std::vector<int64_t> shape, bool decay, int tp_dim,
                         bool expert) {
  ParamInfo p;
  p.name = name;
  p.global_shape = shape;
  p.block = block_;
  p.expert = expert;
  if (tp_dim >= 0 && plan_.tp > 1) {
    CHECK_MSG(shape[tp_dim] % plan_.tp == 0, "%s: dim %d of size %lld does not split %d ways", name.c_str(),
              tp_dim, static_cast<long long>(shape[tp_dim]), plan_.tp);
    shape[tp_dim] /= plan_.tp;
    p.tp_dim = tp_dim;
    p.tp_offset = shape[tp_dim] * plan_.tp_rank;
  }
  p.shape = std::move(shape);
  p.numel = 1;
  for (auto d : p.shape) p.numel *= d;
  p.offset = total_;
  p.decay = decay;
  total_ += p.numel;
  params_.push_back(p);
  return p.offset;
}

BlockWeights<int64_t> ParamLayout::AddBlock(const std::string& prefix, bool moe, bool indexer) {
  const int64_t C = cfg_.d_model, D = cfg_.head_dim();
  const int64_t HD = cfg_.n_heads * D, KVD = cfg_.n_kv_heads * D;
  BlockWeights<int64_t> b;
  b.moe = moe;
  b.attn_norm = Add(prefix + "input_layernorm.weight", {C}, false);
  if (cfg_.mla()) {
    // DeepSeek's order and names. Not split by tensor parallelism (the
    // layout validator refuses tp > 1 for MLA).
    const int64_t H = cfg_.n_heads, Dqk = cfg_.qk_head_dim(), R = cfg_.kv_lora_rank, Qr = cfg_.q_lora_rank;
    b.mla = true;
    if (Qr > 0) {
      b.q_a = Add(prefix + "self_attn.q_a_proj.weight", {Qr, C}, true);
      b.q_a_norm = Add(prefix + "self_attn.q_a_layernorm.weight", {Qr}, false);
      b.q_b = Add(prefix + "self_attn.q_b_proj.weight", {H * Dqk, Qr}, true);
    } else {
      b.wq = Add(prefix + "self_attn.q_proj.weight", {H * Dqk, C}, true);
    }
    b.kv_a = Add(prefix + "self_attn.kv_a_proj_with_mqa.weight", {R + cfg_.qk_rope_head_dim, C}, true);
    b.kv_a_norm = Add(prefix + "self_attn.kv_a_layernorm.weight", {R}, false);
    b.kv_b = Add(prefix + "self_attn.kv_b_proj.weight", {H * (cfg_.qk_nope_head_dim + cfg_.v_head_dim), R}, true);
    b.wo = Add(prefix + "self_attn.o_proj.weight", {C, H * cfg_.v_head_dim}, true);
  } else {
    // Tensor parallelism: q/k/v and gate/up split by rows (output features,
    // whole heads), o and down by columns (Megatron's column/row split).
    b.wq = Add(prefix + "self_attn.q_proj.weight", {HD, C}, true, 0);
    b.wk = Add(prefix + "self_attn.k_proj.weight", {KVD, C}, true, 0);
    b.wv = Add(prefix + "self_attn.v_proj.weight", {KVD, C}, true, 0);
    if (cfg_.qkv_bias) {
      b.bq = Add(prefix + "self_attn.q_proj.bias", {HD}, false, 0);
      b.bk = Add(prefix + "self_attn.k_proj.bias", {KVD}, false, 0);
      b.bv = Add(prefix + "self_attn.v_proj.bias", {KVD}, false, 0);
      CHECK(b.bk == b.bq + dims_.H * D && b.bv == b.bk + dims_.Hkv * D);
    }
    if (cfg_.qk_norm) {
      b.q_norm = Add(prefix + "self_attn.q_norm.weight", {D}, false);
      b.k_norm = Add(prefix + "self_attn.k_norm.weight", {D}, false);
    }
    b.wo = Add(prefix + "self_attn.o_proj.weight", {C, HD}, true, 1);
    // The kernels rely on q|k|v and gate|up being adjacent (one GEMM each).
    CHECK(b.wk == b.wq + dims_.H * D * C && b.wv == b.wk + dims_.Hkv * D * C);
  }
  b.ffn_norm = Add(prefix + "post_attention_layernorm.weight", {C}, false);
  if (indexer) {
    // DSA's lightning indexer: queries, one key and the per-head weights,
    // adjacent (one GEMM computes all three).
    const int64_t Hi = cfg_.dsa_index_heads, Di = cfg_.dsa_index_dim;
    b.indexer = true;
    b.iq = Add(prefix + "self_attn.indexer.wq.weight", {Hi * Di, C}, true);
    b.ik = Add(prefix + "self_attn.indexer.wk.weight", {Di, C}, true);
    b.iw = Add(prefix + "self_attn.indexer.weights_proj.weight", {Hi, C}, true);
    CHECK(b.ik == b.iq + Hi * Di * C && b.iw == b.ik + Di * C);
  }
  if (!moe) {
    const int64_t F = cfg_.d_ff;
    b.w_gate = Add(prefix + "mlp.gate_proj.weight", {F, C}, true, 0);
    b.w_up = Add(prefix + "mlp.up_proj.weight", {F, C}, true, 0);
    b.w_down = Add(prefix + "mlp.down_proj.weight", {C, F}, true, 1);
    CHECK(b.w_up == b.w_gate + dims_.F * C);
    return b;
  }
  const int64_t E = cfg_.n_routed_experts, F = cfg_.d_expert;
  b.router = Add(prefix + "mlp.gate.weight", {E, C}, true);
  bias_names_.push_back(prefix + "mlp.gate.e_score_correction_bias");
  // Expert parallelism: this rank holds experts [E_begin, E_begin + E_local).
  for (int64_t e = dims_.E_begin; e < dims_.E_begin + dims_.E_local; ++e) {
    std::string ep = prefix + "mlp.experts." + std::to_string(e) + ".";
    b.e_gate.push_back(Add(ep + "gate_proj.weight", {F, C}, true, 0, true));
    b.e_up.push_back(Add(ep + "up_proj.weight", {F, C}, true, 0, true));
    b.e_down.push_back(Add(ep + "down_proj.weight", {C, F}, true, 1, true));
    CHECK(b.e_up.back() == b.e_gate.back() + dims_.Fe * C);
  }
  if (cfg_.n_shared_experts > 0) {
    const int64_t SF = cfg_.n_shared_experts * F;
    b.s_gate = Add(prefix + "mlp.shared_experts.gate_proj.weight", {SF, C}, true, 0);
    b.s_up = Add(prefix + "mlp.shared_experts.up_proj.weight", {SF, C}, true, 0);
    b.s_down = Add(prefix + "mlp.shared_experts.down_proj.weight", {C, SF}, true, 1);
    CHECK(b.s_up == b.s_gate + dims_.SF * C);
  }
  return b;
}

ParamLayout::ParamLayout(const ModelConfig& cfg, const ShardPlan& plan)
    : cfg_(cfg), plan_(plan), dims_(LocalDims::Of(cfg, plan)) {
  const int64_t C = cfg.d_model, V = cfg.vocab_size;
  const int64_t l0 = plan.layer_begin, l1 = plan.layer_end < 0 ? cfg.n_layers : plan.layer_end;
  // The last pipeline stage needs the embedding for a tied head or the MTP
  // modules' inputs: it keeps a copy (its gradient is summed with the first
  // stage's).
  const bool embed = plan.first_stage || (plan.last_stage && (cfg.tie_embeddings || cfg.mtp_depth > 0));
  if (embed) offsets_.embed = Add("model.embed_tokens.weight", {V, C}, true);
  offsets_.layers.resize(cfg.n_layers);  // entries outside [l0, l1) stay empty
  for (int64_t l = l0; l < l1; ++l) {
    block_ = static_cast<int>(l);
    offsets_.layers[l] = AddBlock("model.layers." + std::to_string(l) + ".", cfg.is_moe_layer(l),
                                  cfg.dsa_indexer_layer(l));
    block_ = -1;
  }
  if (!plan.last_stage) return;
  offsets_.norm = Add("model.norm.weight", {C}, false);
  offsets_.head = cfg.tie_embeddings ? offsets_.embed : Add("lm_head.weight", {V, C}, true);
  for (int64_t j = 0; j < cfg.mtp_depth; ++j) {
    std::string p = "model.mtp." + std::to_string(j) + ".";
    MtpWeights<int64_t> m;
    m.enorm = Add(p + "enorm.weight", {C}, false);
    m.hnorm = Add(p + "hnorm.weight", {C}, false);
    m.eh_proj = Add(p + "eh_proj.weight", {C, 2 * C}, true);
    block_ = static_cast<int>(cfg.n_layers + j);
    m.block = AddBlock(p + "block.", cfg.mtp_block_is_moe());
    block_ = -1;
    m.norm = Add(p + "norm.weight", {C}, false);
    offsets_.mtp.push_back(std::move(m));
  }
}

namespace {
BlockWeights<float*> BindBlock(const BlockWeights<int64_t>& o, float* base) {
  BlockWeights<float*> b;
  auto at = [&](int64_t off) { return base + off; };
  b.moe = o.moe;
  b.attn_norm = at(o.attn_norm); b.wo = at(o.wo);
  b.ffn_norm = at(o.ffn_norm);
  if (o.mla) {
    b.mla = true;
    if (o.q_a) { b.q_a = at(o.q_a); b.q_a_norm = at(o.q_a_norm); b.q_b = at(o.q_b); }
    else b.wq = at(o.wq);
    b.kv_a = at(o.kv_a); b.kv_a_norm = at(o.kv_a_norm); b.kv_b = at(o.kv_b);
  } else {
    b.wq = at(o.wq); b.wk = at(o.wk); b.wv = at(o.wv);
  }
  if (o.bq || o.bk || o.bv) { b.bq = at(o.bq); b.bk = at(o.bk); b.bv = at(o.bv); }
  if (o.q_norm || o.k_norm) { b.q_norm = at(o.q_norm); b.k_norm = at(o.k_norm); }
  if (o.indexer) {
    b.indexer = true;
    b.iq = at(o.iq); b.ik = at(o.ik); b.iw = at(o.iw);
  }
  if (!o.moe) {
    b.w_gate = at(o.w_gate); b.w_up = at(o.w_up); b.w_down = at(o.w_down);
    return b;
  }
  b.router = at(o.router);
  for (size_t e = 0; e < o.e_gate.size(); ++e) {
    b.e_gate.push_back(at(o.e_gate[e]));
    b.e_up.push_back(at(o.e_up[e]));
    b.e_down.push_back(at(o.e_down[e]));
  }
  if (o.s_gate || o.s_up || o.s_down) {
    b.s_gate = at(o.s_gate); b.s_up = at(o.s_up); b.s_down = at(o.s_down);
  }
  return b;
}
}  // namespace

ModelWeights<float*> ParamLayout::Bind(float* base) const {
  ModelWeights<float*> w;
  w.embed = base + offsets_.embed;
  for (const auto& b : offsets_.layers) w.layers.push_back(BindBlock(b, base));
  w.norm = base + offsets_.norm;
  w.head = base + offsets_.head;
  for (const auto& m : offsets_.mtp) {
    MtpWeights<float*> p;
    p.enorm = base + m.enorm; p.hnorm = base + m.hnorm; p.eh_proj = base + m.eh_proj; p.norm = base + m.norm;
    p.block = BindBlock(m.block, base);
    w.mtp.push_back(std::move(p));
  }
  return w;
}

}  // namespace myriad
