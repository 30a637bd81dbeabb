// Export is the inverse of the import: for each family and variant the
// config that MapHfConfig makes of a config.json maps back to a config.json
// that MapHfConfig reads as the same ModelConfig and the same architecture;
// a model exports to a folder LoadHfModel reads back bit for bit; what no
// family has is refused with the feature's name. (The folders of make_tiny.py
// and the independent reference: tests/hf/export_roundtrip.sh.)
#include "model/hf/hf_export.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/half.h"
#include "model/hf/hf_model.h"
#include "model/hf/hf_test_configs.h"
#include "model/hf/hf_weights.h"

namespace myriad::hf {
namespace {

namespace fs = std::filesystem;

nlohmann::json Base(const std::string& arch) { return BaseHfConfig(arch); }

nlohmann::json MoeBase() {
  auto j = Base("Qwen3MoeForCausalLM");
  j.update({{"head_dim", 16}, {"num_experts", 8}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32},
            {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", {0}}});
  return j;
}

// DeepSeek-V3 as its own files have it: MLA with q_lora_rank, the sigmoid
// group-limited router, shared experts, a dense prefix, an MTP layer, yarn
// with mscale = mscale_all_dim, interleaved RoPE rows.
nlohmann::json DeepseekBase() {
  auto j = Base("DeepseekV3ForCausalLM");
  j["num_key_value_heads"] = 4;
  j.update({{"moe_intermediate_size", 32}, {"n_shared_experts", 1}, {"n_routed_experts", 8},
            {"routed_scaling_factor", 2.5}, {"kv_lora_rank", 16}, {"q_lora_rank", 24}, {"qk_rope_head_dim", 8},
            {"v_head_dim", 12}, {"qk_nope_head_dim", 16}, {"n_group", 4}, {"topk_group", 2},
            {"num_experts_per_tok", 2}, {"first_k_dense_replace", 1}, {"moe_layer_freq", 1},
            {"norm_topk_prob", true}, {"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"},
            {"num_nextn_predict_layers", 1}, {"rope_interleave", true}, {"attention_bias", false},
            {"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64},
                              {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}}});
  return j;
}

// Every family and the variants the import maps differently.
std::vector<std::pair<std::string, nlohmann::json>> Variants() {
  std::vector<std::pair<std::string, nlohmann::json>> v;
  auto add = [&](const std::string& name, nlohmann::json j) { v.emplace_back(name, std::move(j)); };
  add("llama", Base("LlamaForCausalLM"));
  auto j = Base("LlamaForCausalLM");
  j["tie_word_embeddings"] = true;
  j["head_dim"] = 24;  // 4 x 24 != 64
  add("llama tied, head_dim 24", j);
  j = Base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  add("llama linear", j);
  j = Base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  add("llama llama3", j);
  j = Base("LlamaForCausalLM");
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}};
  add("llama yarn (default attention factor, old 'type' key)", j);
  j = Base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"mscale", 1.0}, {"mscale_all_dim", 0.5},
                       {"beta_fast", 16.0}, {"beta_slow", 2.0}, {"truncate", false}};
  add("llama yarn mscale, no truncation, no original", j);
  j = Base("LlamaForCausalLM");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 3.0}, {"rope_theta", 1e6}};
  add("llama transformers-5 rope_parameters", j);
  add("qwen2", Base("Qwen2ForCausalLM"));
  j = Base("Qwen2ForCausalLM");
  j.update({{"tie_word_embeddings", true}, {"use_sliding_window", false}, {"sliding_window", 256},
            {"max_window_layers", 3}});
  add("qwen2 tied", j);
  add("qwen3 (head_dim 128 by default)", Base("Qwen3ForCausalLM"));
  j = Base("Qwen3ForCausalLM");
  j["head_dim"] = 16;  // = 64 / 4: our d_head 0
  add("qwen3 head_dim 16", j);
  add("qwen3_moe", MoeBase());
  j = MoeBase();
  j["mlp_only_layers"] = nlohmann::json::array();
  j["norm_topk_prob"] = false;
  j["tie_word_embeddings"] = true;
  add("qwen3_moe all MoE, unnormalised, tied", j);
  j = MoeBase();
  j.erase("mlp_only_layers");
  j.erase("norm_topk_prob");  // HF's default: false
  j["num_hidden_layers"] = 2;
  j["decoder_sparse_step"] = 2;  // layer 0 dense, layer 1 MoE
  add("qwen3_moe decoder_sparse_step 2", j);
  j = MoeBase();
  j["num_hidden_layers"] = 4;
  j["mlp_only_layers"] = {0, 2};  // a dense layer between MoE ones
  add("qwen3_moe mlp_only_layers [0, 2]", j);
  j = MoeBase();
  j["num_hidden_layers"] = 5;
  j.erase("mlp_only_layers");
  j["decoder_sparse_step"] = 2;  // layers 1 and 3 MoE
  add("qwen3_moe decoder_sparse_step 2 over 5 layers", j);
  add("deepseek_v3 (q_lora_rank, MTP 1, yarn mscale, interleaved)", DeepseekBase());
  j = DeepseekBase();
  j["q_lora_rank"] = nullptr;  // q_proj
  j["num_nextn_predict_layers"] = 0;
  j["rope_interleave"] = false;
  j["rope_scaling"] = nullptr;
  add("deepseek_v3 q_proj, no MTP, no yarn, rotate-half", j);
  j = DeepseekBase();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}, {"mscale", 0.7}, {"mscale_all_dim", 1.0}};
  j.update({{"norm_topk_prob", false}, {"n_group", 1}, {"topk_group", 1}, {"routed_scaling_factor", 1.0},
            {"first_k_dense_replace", 0}, {"n_shared_experts", 0}, {"tie_word_embeddings", true}});
  add("deepseek_v3 all MoE, mscale != mscale_all_dim, unnormalised, tied", j);
  j = DeepseekBase();
  j.update({{"n_routed_experts", 0}, {"num_nextn_predict_layers", 2}});
  add("deepseek_v3 dense, MTP 2", j);
  j = DeepseekBase();
  j.update({{"first_k_dense_replace", 3}});  // every main layer dense, the MTP layer MoE is refused by the import
  j["num_nextn_predict_layers"] = 0;
  add("deepseek_v3 experts but every layer dense", j);
  return v;
}

TEST(HfExportConfig, InverseOfTheImportForEveryFamilyAndVariant) {
  for (const auto& [name, j] : Variants()) {
    SCOPED_TRACE(name);
    auto in = MapHfConfig(j, "config.json");
    ASSERT_TRUE(in.ok()) << in.status().message();
    HfExportOptions opt;
    opt.bos_token_id = in->bos_token_id;
    opt.eos_token_ids = in->eos_token_ids;
    opt.rope_interleave = in->rope_interleave;
    auto out = HfConfigFor(in->config, opt);
    ASSERT_TRUE(out.ok()) << out.status().message();
    auto back = MapHfConfig(nlohmann::json::parse(out->dump()), "exported config.json");
    ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << out->dump(2);
    EXPECT_EQ(back->architecture, in->architecture);
    EXPECT_EQ(back->config.ToJson(), in->config.ToJson()) << out->dump(2);
    EXPECT_EQ(back->eos_token_ids, in->eos_token_ids);
    EXPECT_EQ(back->bos_token_id, in->bos_token_id);
    EXPECT_EQ(back->rope_interleave, in->rope_interleave);
  }
}

TEST(HfExportConfig, OurConfigsMapToTheFamilyWithTheirFeatures) {
  ModelConfig c;  // our defaults: an MoE without q/k norms
  c.n_routed_experts = 0;
  c.n_dense_layers = c.n_layers;
  auto arch = [](const ModelConfig& c) {
    auto j = HfConfigFor(c);
    return j.ok() ? (*j)["architectures"][0].get<std::string>() : j.status().message();
  };
  EXPECT_EQ(arch(c), "LlamaForCausalLM");
  c.qkv_bias = true;
  EXPECT_EQ(arch(c), "Qwen2ForCausalLM");
  c.qkv_bias = false;
  c.qk_norm = true;
  EXPECT_EQ(arch(c), "Qwen3ForCausalLM");
  c.n_routed_experts = 8;
  c.n_dense_layers = 1;
  EXPECT_EQ(arch(c), "Qwen3MoeForCausalLM");
  // Training-only keys do not matter.
  c.aux_loss_weight = 0.01;
  c.bias_update_rate = 0.001;
  EXPECT_EQ(arch(c), "Qwen3MoeForCausalLM");
  // Our MoE features that only DeepSeek-V3 has, which needs MLA.
  c.n_shared_experts = 1;
  c.score_func = "sigmoid";
  EXPECT_EQ(arch(c), "model: shared experts (model.n_shared_experts=1) and sigmoid routing scores "
                     "(model.score_func=\"sigmoid\") have no Qwen3MoeForCausalLM equivalent, and "
                     "DeepseekV3ForCausalLM, which has them, needs MLA: set model.kv_lora_rank > 0 (with q_lora_rank, "
                     "qk_nope_head_dim, qk_rope_head_dim and v_head_dim; this model's attention is GQA, "
                     "model.n_kv_heads=8) to train a model that exports as DeepSeek-V3 (hint: a Qwen3-MoE-shaped "
                     "model — softmax scores, no shared experts, model.qk_norm = true — exports too)");
  {
    // With MLA: DeepSeek-V3, and what it cannot express refused by name.
    ModelConfig m = c;
    m.qk_norm = false;
    m.kv_lora_rank = 16, m.q_lora_rank = 16, m.qk_nope_head_dim = 8, m.qk_rope_head_dim = 4, m.v_head_dim = 8;
    EXPECT_EQ(arch(m), "DeepseekV3ForCausalLM");
    m.mtp_depth = 1;
    EXPECT_EQ(arch(m), "model: multi-token prediction modules reading the hidden state before the final norm "
                       "(model.mtp_after_final_norm=false) have no DeepseekV3ForCausalLM equivalent: its MTP layers "
                       "read it after the norm (hint: train with model.mtp_after_final_norm = true, or --drop-mtp "
                       "exports the main model without them)");
    EXPECT_TRUE(HfConfigFor(m, [] { HfExportOptions o; o.drop_mtp = true; return o; }()).ok());
    m.mtp_after_final_norm = true;
    EXPECT_EQ(arch(m), "DeepseekV3ForCausalLM");
    m.score_func = "softmax";
    EXPECT_EQ(arch(m), "model: softmax routing scores (model.score_func=\"softmax\"; its router is sigmoid) has no "
                       "DeepseekV3ForCausalLM equivalent");
    m.score_func = "sigmoid";
    m.n_layers = 4;
    m.dense_layers = {2};
    EXPECT_EQ(arch(m), "model: dense layers after the first MoE layer (model.dense_layers=[2]; its dense layers are a "
                       "prefix, first_k_dense_replace) has no DeepseekV3ForCausalLM equivalent");
    m.dense_layers.clear();
    m.qk_norm = true;  // a GQA-only key (Validate's refusal)
    EXPECT_NE(arch(m).find("qkv_bias, qk_norm and d_head belong to q/k/v attention"), std::string::npos) << arch(m);
    m.qk_norm = false;
    m.n_routed_experts = 0;  // dense MLA: DeepSeek-V3 with first_k_dense_replace past every layer
    m.n_dense_layers = m.n_layers;
    auto j = HfConfigFor(m);
    ASSERT_TRUE(j.ok()) << j.status().message();
    EXPECT_EQ((*j)["first_k_dense_replace"], 5);
  }
  c.n_shared_experts = 0;
  c.score_func = "softmax";
  c.n_group = 2;
  c.topk_group = 1;
  EXPECT_NE(arch(c).find("group-limited routing (model.n_group=2) have no Qwen3MoeForCausalLM"), std::string::npos);
  c.n_group = c.topk_group = 1;
  c.routed_scaling_factor = 2.5;
  EXPECT_NE(arch(c).find("a routing scale (model.routed_scaling_factor=2.5) have no"), std::string::npos);
  c.routed_scaling_factor = 1;
  c.qk_norm = false;
  EXPECT_NE(arch(c).find("an MoE model without per-head q/k norms (model.qk_norm=false) has no Hugging Face "
                         "equivalent"),
            std::string::npos);
  c.qk_norm = true;
  c.qkv_bias = true;
  EXPECT_NE(arch(c).find("q/k/v biases (model.qkv_bias=true) in an MoE model"), std::string::npos);
  c.qkv_bias = false;
  c.mtp_depth = 1;
  EXPECT_NE(arch(c).find("multi-token prediction modules (model.mtp_depth=1) have no Qwen3MoeForCausalLM "
                         "equivalent (hint: --drop-mtp"),
            std::string::npos);
  HfExportOptions drop;
  drop.drop_mtp = true;
  EXPECT_TRUE(HfConfigFor(c, drop).ok());
  c.mtp_depth = 0;
  c.attention = "dsa";
  EXPECT_NE(arch(c).find("DSA sparse attention (model.attention=\"dsa\") has no equivalent"), std::string::npos);
  ModelConfig d;
  d.n_routed_experts = 0;
  d.n_dense_layers = d.n_layers;
  d.qkv_bias = d.qk_norm = true;
  EXPECT_NE(arch(d).find("q/k/v biases together with per-head q/k norms"), std::string::npos);
}

// The demo's model (configs/demo-moe.toml) and the tests' tiny one have
// shared experts and GQA: refused with the reason; with MLA, DeepSeek-V3.
TEST(HfExportConfig, TheDemoConfigIsRefusedWithItsReasonAndExportsWithMla) {
  const char* src = std::getenv("MYRIAD_SOURCE_DIR");
  if (!src) GTEST_SKIP() << "needs MYRIAD_SOURCE_DIR (ctest sets it)";
  for (const char* name : {"configs/demo-moe.toml", "configs/tiny.toml"}) {
    auto doc = ConfigDoc::Load(std::string(src) + "/" + name);
    ASSERT_TRUE(doc.ok()) << doc.status().message();
    const ModelConfig c = ModelConfig::Read(doc->get());
    auto j = HfConfigFor(c);
    ASSERT_FALSE(j.ok()) << name;
    EXPECT_NE(j.status().message().find("shared experts (model.n_shared_experts=1)"), std::string::npos)
        << j.status().message();
    EXPECT_NE(j.status().message().find("DeepseekV3ForCausalLM, which has them, needs MLA: set model.kv_lora_rank"),
              std::string::npos);
    ModelConfig m = c;
    m.kv_lora_rank = 16, m.q_lora_rank = 16, m.qk_nope_head_dim = 8, m.qk_rope_head_dim = 4, m.v_head_dim = 8;
    m.mtp_after_final_norm = true;
    m.score_func = "sigmoid";
    auto d = HfConfigFor(m);
    ASSERT_TRUE(d.ok()) << name << ": " << d.status().message();
    EXPECT_EQ((*d)["architectures"][0], "DeepseekV3ForCausalLM");
  }
}

class HfExportFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::path(::testing::TempDir()) /
            ("myriad_hfexport_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static ModelConfig MoeConfig() {
    auto in = MapHfConfig(MoeBase(), "config.json");
    EXPECT_TRUE(in.ok()) << in.status().message();
    return in->config;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::string dir_;
};

TEST_F(HfExportFolder, LoadsBackBitwiseWithTokenizerAndGenerationConfig) {
  ModelConfig c = MoeConfig();
  Model m(c);
  m.InitWeights(5);
  std::ofstream(dir_ + "/tokenizer.json") << "{\"model\": {}}";
  std::ofstream(dir_ + "/tokenizer_config.json") << "{}";
  std::ofstream(dir_ + "/unrelated.txt") << "x";
  HfExportOptions opt;
  opt.bos_token_id = 1;
  opt.eos_token_ids = {2};
  opt.tokenizer_from = dir_ + "/tokenizer.json";
  opt.max_shard_bytes = 200000;  // several shards
  const std::string out = dir_ + "/out";
  ASSERT_TRUE(ExportHfModel(m, out, opt).ok());
  EXPECT_TRUE(fs::exists(out + "/" + kIndexFile));
  EXPECT_EQ(Read(out + "/tokenizer.json"), "{\"model\": {}}");
  EXPECT_TRUE(fs::exists(out + "/tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(out + "/unrelated.txt"));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  const auto gen = nlohmann::json::parse(Read(out + "/generation_config.json"));
  EXPECT_EQ(gen["eos_token_id"], 2);
  EXPECT_EQ(gen["bos_token_id"], 1);
  HfModelInfo info;
  auto back = LoadHfModel(out, &info);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(info.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ((*back)->config().ToJson(), c.ToJson());
  const std::vector<float> a = m.ParamsToHost(), b = (*back)->ParamsToHost();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);

  // A non-empty folder is refused, and kept; --force replaces it.
  auto again = ExportHfModel(m, out, opt);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.message(), out + ": exists and is not empty (hint: --force replaces it)");
  opt.overwrite = true;
  opt.max_shard_bytes = 0;
  ASSERT_TRUE(ExportHfModel(m, out + "/", opt).ok());
  EXPECT_FALSE(fs::exists(out + "/" + kIndexFile));  // the old shards went with the old folder
  EXPECT_TRUE(fs::exists(out + "/" + kSingleFile));
  EXPECT_FALSE(fs::exists(out + ".old"));
}

TEST_F(HfExportFolder, ATrainedSelectionBiasIsRefusedAndTheOldFolderKept) {
  Model m(MoeConfig());
  m.InitWeights(5);
  const std::string out = dir_ + "/out";
  fs::create_directories(out);
  std::ofstream(out + "/keep") << "old";
  m.biases()[1][3] = 0.25f;
  HfExportOptions opt;
  opt.overwrite = true;
  auto s = ExportHfModel(m, out, opt);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "model: model.layers.2.mlp.gate.e_score_correction_bias is non-zero (max |b| = 0.25): a "
                         "selection bias has no Qwen3MoeForCausalLM equivalent (it was trained with "
                         "model.bias_update_rate > 0; hint: train with bias_update_rate = 0 to export)");
  EXPECT_EQ(Read(out + "/keep"), "old");
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

// A DeepSeek-V3 model with a trained selection bias and an MTP layer: the
// folder holds DeepSeek's own layout (interleaved RoPE rows, [embedding;
// hidden] eh_proj, the MTP layer's embedding and head copies, the bias as
// e_score_correction_bias in F32) and loads back bit for bit.
TEST_F(HfExportFolder, DeepseekLoadsBackBitwiseInDeepseeksLayout) {
  for (bool interleave : {true, false}) {
    SCOPED_TRACE(interleave);
    auto in = MapHfConfig(DeepseekBase(), "config.json");
    ASSERT_TRUE(in.ok()) << in.status().message();
    const ModelConfig& c = in->config;
    Model m(c);
    m.InitWeights(7);
    for (auto& b : m.biases())
      for (size_t e = 0; e < b.size(); ++e) b[e] = 0.01f * static_cast<float>(e) - 0.03f;
    HfExportOptions opt;
    opt.rope_interleave = interleave;
    const std::string out = dir_ + "/out" + std::to_string(interleave);
    ASSERT_TRUE(ExportHfModel(m, out, opt).ok());
    HfModelInfo info;
    auto back = LoadHfModel(out, &info);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(info.architecture, "DeepseekV3ForCausalLM");
    EXPECT_EQ(info.rope_interleave, interleave);
    EXPECT_EQ((*back)->config().ToJson(), c.ToJson());
    EXPECT_EQ((*back)->ParamsToHost(), m.ParamsToHost());
    EXPECT_EQ((*back)->biases(), m.biases());
    auto w = HfWeights::Open(out);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->Find("model.layers.1.mlp.gate.e_score_correction_bias")->dtype, "F32");
    EXPECT_TRUE(w->Find("model.layers.3.mlp.gate.e_score_correction_bias"));  // the MTP layer's
    EXPECT_TRUE(w->Find("model.layers.3.shared_head.head.weight"));
    // One row of the folder's q_b_proj is the row of ours its layout names:
    // head 0's RoPE row 1 (interleaved: pair 0's second) is our row D/2.
    const std::vector<float> ours = m.ParamsToHost();
    const ParamInfo* q = nullptr;
    for (const ParamInfo& p : m.layout().params())
      if (p.name == "model.layers.0.self_attn.q_b_proj.weight") q = &p;
    ASSERT_NE(q, nullptr);
    auto theirs = w->ReadF32(q->name, q->shape);
    ASSERT_TRUE(theirs.ok());
    const int64_t cols = q->shape[1], row = c.qk_nope_head_dim + 1;
    const int64_t our_row = c.qk_nope_head_dim + (interleave ? c.qk_rope_head_dim / 2 : 1);
    EXPECT_TRUE(std::equal(theirs->begin() + row * cols, theirs->begin() + (row + 1) * cols,
                           ours.begin() + q->offset + our_row * cols));
  }
}

TEST_F(HfExportFolder, Bf16OnlyWhenExact) {
  ModelConfig c = MoeConfig();
  Model m(c);
  m.InitWeights(5);
  HfExportOptions opt;
  opt.dtype = "BF16";
  auto s = ExportHfModel(m, dir_ + "/out", opt);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("is not exactly representable in BF16"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().rfind(dir_ + "/out: tensor model.embed_tokens.weight element 0 = ", 0), 0u) << s.message();
  EXPECT_FALSE(fs::exists(dir_ + "/out"));
  EXPECT_FALSE(fs::exists(dir_ + "/out.tmp"));
  // Weights that are bfloat16 values (as imported from a bf16 folder) export as BF16, exactly.
  std::vector<float> p = m.ParamsToHost();
  for (float& v : p) v = Bf16ToFloat(FloatToBf16(v));
  m.ParamsFromHost(p.data(), 0, static_cast<int64_t>(p.size()));
  ASSERT_TRUE(ExportHfModel(m, dir_ + "/out", opt).ok());
  auto w = HfWeights::Open(dir_ + "/out");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->Find("model.embed_tokens.weight")->dtype, "BF16");
  auto back = LoadHfModel(dir_ + "/out");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ((*back)->ParamsToHost(), p);
  EXPECT_EQ(nlohmann::json::parse(Read(dir_ + "/out/config.json"))["torch_dtype"], "bfloat16");
}

}  // namespace
}  // namespace myriad::hf
