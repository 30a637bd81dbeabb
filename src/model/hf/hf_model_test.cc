// config.json of each family mapped to our ModelConfig, and the one-line
// refusals of what the import does not implement.
#include "model/hf/hf_model.h"
#include "model/hf/hf_test_configs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/env.h"
#include "core/safetensors.h"

namespace myriad::hf {
namespace {

nlohmann::json Base(const std::string& arch) { return BaseHfConfig(arch); }

// The tiny DeepSeek-V3 of tests/hf/make_tiny.py, with q_lora_rank 24.
nlohmann::json DeepseekV3() {
  auto j = Base("DeepseekV3ForCausalLM");
  j["num_key_value_heads"] = 4;
  j.update({{"kv_lora_rank", 32}, {"q_lora_rank", 24}, {"qk_nope_head_dim", 16}, {"qk_rope_head_dim", 8},
            {"v_head_dim", 12}, {"n_routed_experts", 16}, {"num_experts_per_tok", 4}, {"moe_intermediate_size", 32},
            {"n_shared_experts", 1}, {"routed_scaling_factor", 2.5}, {"n_group", 4}, {"topk_group", 2},
            {"first_k_dense_replace", 1}, {"moe_layer_freq", 1}, {"norm_topk_prob", true}, {"scoring_func", "sigmoid"},
            {"topk_method", "noaux_tc"}, {"num_nextn_predict_layers", 1}, {"rope_interleave", true},
            {"attention_bias", false},
            {"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64},
                              {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}}}});
  return j;
}

std::string Error(const nlohmann::json& j) {
  auto r = MapHfConfig(j, "config.json");
  return r.ok() ? "" : r.status().message();
}

TEST(HfConfig, LlamaWithLlama3RopeScaling) {
  auto j = Base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  auto r = MapHfConfig(j, "config.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelConfig& c = r->config;
  EXPECT_EQ(c.d_model, 64);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim(), 16);
  EXPECT_EQ(c.n_dense_layers, 3);
  EXPECT_EQ(c.n_routed_experts, 0);
  EXPECT_EQ(c.rope_scaling, "llama3");
  EXPECT_EQ(c.rope_factor, 8.0);
  EXPECT_EQ(c.rope_original_max_pos, 64);
  EXPECT_EQ(c.rope_theta, 50000.0);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(r->eos_token_ids, (std::vector<int64_t>{2, 3}));
}

TEST(HfConfig, QwenFamilies) {
  auto q2 = MapHfConfig(Base("Qwen2ForCausalLM"), "config.json");
  ASSERT_TRUE(q2.ok()) << q2.status().message();
  EXPECT_TRUE(q2->config.qkv_bias);
  EXPECT_FALSE(q2->config.qk_norm);
  auto j3 = Base("Qwen3ForCausalLM");
  j3["head_dim"] = 24;
  auto q3 = MapHfConfig(j3, "config.json");
  ASSERT_TRUE(q3.ok()) << q3.status().message();
  EXPECT_TRUE(q3->config.qk_norm);
  EXPECT_EQ(q3->config.head_dim(), 24);
  auto jm = Base("Qwen3MoeForCausalLM");
  jm.update({{"head_dim", 16}, {"num_experts", 8}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32},
             {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", {0}}});
  auto qm = MapHfConfig(jm, "config.json");
  ASSERT_TRUE(qm.ok()) << qm.status().message();
  EXPECT_EQ(qm->config.n_dense_layers, 1);
  EXPECT_EQ(qm->config.n_routed_experts, 8);
  EXPECT_EQ(qm->config.top_k, 2);
  EXPECT_EQ(qm->config.d_expert, 32);
  EXPECT_TRUE(qm->config.norm_topk_prob);
  EXPECT_EQ(qm->config.score_func, "softmax");
  EXPECT_EQ(qm->config.bias_update_rate, 0.0);
  EXPECT_TRUE(qm->config.dense_layers.empty());
  // Dense layers after an MoE one (mlp_only_layers, decoder_sparse_step):
  // the layers (l + 1) % step != 0 or listed are dense.
  jm["num_hidden_layers"] = 6;
  jm["max_window_layers"] = 6;
  jm["mlp_only_layers"] = {4};
  jm["decoder_sparse_step"] = 2;
  auto qs = MapHfConfig(jm, "config.json");
  ASSERT_TRUE(qs.ok()) << qs.status().message();
  EXPECT_EQ(qs->config.n_dense_layers, 1);  // layer 0: (0 + 1) % 2 != 0
  EXPECT_EQ(qs->config.dense_layers, (std::vector<int64_t>{2, 4}));
  for (int64_t l = 0; l < 6; ++l) EXPECT_EQ(qs->config.is_moe_layer(l), l == 1 || l == 3 || l == 5) << l;
  EXPECT_EQ(qs->config.n_moe_layers(), 3);
}

TEST(HfConfig, RefusalsNameTheFileAndTheKey) {
  EXPECT_EQ(Error(Base("MistralForCausalLM")),
            "config.json: architecture \"MistralForCausalLM\" is not supported (supported: LlamaForCausalLM, "
            "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, DeepseekV3ForCausalLM)");
  auto j = Base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
  EXPECT_EQ(Error(j), "config.json: LlamaForCausalLM key \"rope_scaling\" rope type \"longrope\" is not supported "
                      "(supported: default, linear, llama3, yarn)");
  j = Base("LlamaForCausalLM");
  j["attention_bias"] = true;
  EXPECT_NE(Error(j).find("key \"attention_bias\" = true is not supported yet"), std::string::npos) << Error(j);
  j = Base("LlamaForCausalLM");
  j["embedding_multiplier"] = 12.0;
  EXPECT_NE(Error(j).find("key \"embedding_multiplier\" is not known to Myriad's import of LlamaForCausalLM"),
            std::string::npos)
      << Error(j);
  j = Base("Qwen2ForCausalLM");
  j["use_sliding_window"] = true;
  EXPECT_NE(Error(j).find("\"use_sliding_window\" = true is not supported yet (sliding-window attention)"),
            std::string::npos)
      << Error(j);
  j = Base("LlamaForCausalLM");
  j.erase("hidden_size");
  EXPECT_EQ(Error(j), "config.json: LlamaForCausalLM needs the key \"hidden_size\"");
  j = DeepseekV3();
  j["scoring_func"] = "softmax";
  EXPECT_EQ(Error(j), "config.json: DeepseekV3ForCausalLM key \"scoring_func\" = \"softmax\" is not supported "
                      "(DeepSeek-V3's is sigmoid)");
  j = DeepseekV3();
  j["moe_layer_freq"] = 2;
  EXPECT_NE(Error(j).find("key \"moe_layer_freq\" = 2 with first_k_dense_replace = 1 makes layer 1 dense"),
            std::string::npos)
      << Error(j);
  j = DeepseekV3();
  j["attention_bias"] = true;
  EXPECT_NE(Error(j).find("key \"attention_bias\" = true is not supported yet"), std::string::npos) << Error(j);
  j = DeepseekV3();
  j["use_mla_cache_magic"] = 1;
  EXPECT_NE(Error(j).find("key \"use_mla_cache_magic\" is not known to Myriad's import of DeepseekV3ForCausalLM"),
            std::string::npos)
      << Error(j);
}

TEST(HfConfig, DeepseekV3MapsMlaRouterAndMtp) {
  auto r = MapHfConfig(DeepseekV3(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelConfig& c = r->config;
  EXPECT_TRUE(c.mla());
  EXPECT_EQ(c.q_lora_rank, 24);
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_head_dim(), 24);
  EXPECT_EQ(c.v_dim(), 12);
  EXPECT_EQ(c.rope_dim(), 8);
  EXPECT_EQ(c.kv_cache_floats_per_token_layer(), 40);
  EXPECT_EQ(c.n_dense_layers, 1);
  EXPECT_EQ(c.n_routed_experts, 16);
  EXPECT_EQ(c.top_k, 4);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c.sigmoid_scores());
  EXPECT_EQ(c.mtp_depth, 1);
  EXPECT_TRUE(c.mtp_after_final_norm);
  EXPECT_EQ(c.rope_scaling, "yarn");
  EXPECT_EQ(c.rope_mscale_all_dim, 1.0);
  EXPECT_TRUE(r->rope_interleave);
  auto j = DeepseekV3();
  j["q_lora_rank"] = nullptr;  // q_proj
  j["rope_interleave"] = false;
  r = MapHfConfig(j, "config.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->config.q_lora_rank, 0);
  EXPECT_FALSE(r->rope_interleave);
}

TEST(HfConfig, MtpModulesAreDeepSeeksExtraLayers) {
  ModelConfig c;
  c.n_layers = 61;
  EXPECT_EQ(HfTensorName(c, "model.mtp.0.block.self_attn.q_proj.weight"), "model.layers.61.self_attn.q_proj.weight");
  EXPECT_EQ(HfTensorName(c, "model.mtp.0.enorm.weight"), "model.layers.61.enorm.weight");
  EXPECT_EQ(HfTensorName(c, "model.mtp.1.norm.weight"), "model.layers.62.shared_head.norm.weight");
  EXPECT_EQ(HfTensorName(c, "model.layers.3.mlp.gate.weight"), "model.layers.3.mlp.gate.weight");
}

// A Qwen3-MoE folder written from a model of ours under Hugging Face's
// names loads back bit for bit; an extra or a missing tensor is refused.
TEST(HfLoad, FolderLoadsBitwiseAndStrayTensorsAreRefused) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::path(::testing::TempDir()) / ("myriad_hfload_" + std::to_string(getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto j = Base("Qwen3MoeForCausalLM");
  j.update({{"head_dim", 24}, {"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32},
            {"norm_topk_prob", true}, {"mlp_only_layers", {0}}});
  std::ofstream(dir + "/config.json") << j.dump(2);
  auto info = MapHfConfig(j, "config.json");
  ASSERT_TRUE(info.ok()) << info.status().message();
  Model src(info->config);
  src.InitWeights(17);
  const std::vector<float> params = src.ParamsToHost();
  std::vector<TensorView> views;
  for (const auto& p : src.layout().params())
    views.push_back({HfTensorName(info->config, p.name), "F32", p.shape, params.data() + p.offset,
                     static_cast<size_t>(p.numel) * sizeof(float)});
  auto write = [&](const std::vector<TensorView>& v) {
    ASSERT_TRUE(WriteSafetensors(Env::Default(), dir + "/model.safetensors", v, {{"format", "pt"}}).ok());
  };
  write(views);
  auto m = LoadHfModel(dir);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->ParamsToHost(), params);
  EXPECT_NE((*m)->layout().params().size(), 0u);

  const float extra[2] = {1, 2};
  auto with_extra = views;
  with_extra.push_back({"model.layers.0.self_attn.o_proj.bias", "F32", {2}, extra, sizeof extra});
  write(with_extra);
  auto e = LoadHfModel(dir);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("tensor model.layers.0.self_attn.o_proj.bias is not used by Qwen3MoeForCausalLM"),
            std::string::npos)
      << e.status().message();

  auto missing = views;
  missing.erase(missing.begin() + 3);
  write(missing);
  auto g = LoadHfModel(dir);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("tensor " + views[3].name), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("is missing"), std::string::npos) << g.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace myriad::hf
