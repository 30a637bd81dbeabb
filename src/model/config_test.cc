// ModelConfig::Validate: ranges, finite floats and sizes, for configs read
// from TOML and from a checkpoint's JSON alike.
#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/config.h"

namespace myriad {
namespace {

TEST(ModelConfigValidate, RangesApplyToConfigsFromJsonToo) {
  ModelConfig m;
  ASSERT_TRUE(m.Validate().ok()) << m.Validate().message();
  nlohmann::json j = m.ToJson();
  j["n_layers"] = 100000000;
  auto r = ModelConfig::FromJson(j);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), OutOfRange("model.n_layers", 100000000, 1, 1024));
  j = m.ToJson();
  j["vocab_size"] = int64_t{1} << 40;
  EXPECT_NE(ModelConfig::FromJson(j).status().message().find("model.vocab_size=1099511627776 is out of range"),
            std::string::npos);
}

TEST(ModelConfigValidate, NonFiniteFloatsAreRefused) {
  ModelConfig m;
  m.init_std = std::nan("");
  EXPECT_NE(m.Validate().message().find("model.init_std=nan must be a finite number"), std::string::npos)
      << m.Validate().message();
  m = ModelConfig();
  m.rope_theta = INFINITY;
  EXPECT_NE(m.Validate().message().find("model.rope_theta=inf must be a finite number"), std::string::npos)
      << m.Validate().message();
  m = ModelConfig();
  m.mtp_loss_weight = -1;
  EXPECT_NE(m.Validate().message().find("model.mtp_loss_weight=-1"), std::string::npos) << m.Validate().message();
}

// 1024 layers of width 2^20 (4096 heads of 256): every key in range.
ModelConfig Widest() {
  ModelConfig m;
  m.n_layers = 1024;
  m.d_model = int64_t{1} << 20;
  m.n_heads = 4096;
  m.n_kv_heads = 4096;
  return m;
}

TEST(ModelConfigValidate, SizesThatOverflowNameTheirKeys) {
  ModelConfig m = Widest();
  m.n_routed_experts = 256;
  m.d_expert = int64_t{1} << 22;
  const Status s = m.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "model: the parameters' size overflows 64-bit integers (it grows with model.n_layers, "
            "model.n_routed_experts, model.d_model, model.d_expert; hint: lower them)");
  // A large model that fits 64 bits passes (memory is the estimate's to judge).
  m.n_layers = 4;
  EXPECT_TRUE(m.Validate().ok()) << m.Validate().message();
  // The largest dense model the ranges allow: its sizes (parameters, RoPE
  // tables, a full-length sequence's KV cache) still fit 64 bits; memory is
  // what refuses it (train/memory_estimate.h).
  ModelConfig dense = Widest();
  dense.n_dense_layers = 1024;
  dense.n_routed_experts = 0;
  dense.mtp_depth = 16;
  dense.d_ff = int64_t{1} << 22;
  dense.max_seq_len = int64_t{1} << 24;
  dense.vocab_size = (int64_t{1} << 31) - 1;
  EXPECT_TRUE(dense.Validate().ok()) << dense.Validate().message();
}

}  // namespace
// train.init_from: [model] read over the source's config keeps every key the
// document does not give (the DSA rope default for TOML included) and takes
// those it does; the training-only keys travel with WithTrainingKeysOf.
TEST(ModelConfigRead, OverABaseKeepsItsValues) {
  ModelConfig base;
  base.d_model = 64;
  base.n_heads = 4;
  base.qk_norm = true;
  base.attention = "dsa";
  base.dsa_index_rope_dim = 0;  // as an old checkpoint has it
  auto doc = ConfigDoc::Parse("[model]\nn_kv_heads = 2\naux_loss_weight = 0.5\n", "<string>");
  ASSERT_TRUE(doc.ok());
  const ModelConfig c = ModelConfig::Read(doc->get(), &base);
  ASSERT_TRUE((*doc)->Finish().ok());
  EXPECT_EQ(c.d_model, 64);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.dsa_index_rope_dim, 0);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.aux_loss_weight, 0.5);
  const ModelConfig t = base.WithTrainingKeysOf(c);
  EXPECT_EQ(t.aux_loss_weight, 0.5);
  EXPECT_EQ(t.n_kv_heads, base.n_kv_heads);
  // Without a base, the TOML default of the DSA rope dims.
  auto plain = ConfigDoc::Parse("[model]\ndsa_index_dim = 32\n", "<string>");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(ModelConfig::Read(plain->get()).dsa_index_rope_dim, 16);
}

}  // namespace myriad

namespace myriad {
namespace {

TEST(ModelConfigDenseLayers, ReadFromTomlRoundTripsAndIsChecked) {
  auto doc = ConfigDoc::Parse("[model]\nn_layers = 5\nn_dense_layers = 1\ndense_layers = [2, 4]\n", "t.toml");
  ASSERT_TRUE(doc.ok());
  ModelConfig m = ModelConfig::Read(doc->get());
  ASSERT_TRUE((*doc)->Finish().ok()) << (*doc)->Finish().message();
  ASSERT_TRUE(m.Validate().ok()) << m.Validate().message();
  EXPECT_EQ(m.dense_layers, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(m.n_moe_layers(), 2);  // layers 1 and 3
  EXPECT_FALSE(m.is_moe_layer(0));
  EXPECT_TRUE(m.is_moe_layer(1));
  EXPECT_FALSE(m.is_moe_layer(2));
  EXPECT_TRUE(m.is_moe_layer(3));
  EXPECT_FALSE(m.is_moe_layer(4));
  auto back = ModelConfig::FromJson(m.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dense_layers, m.dense_layers);
  // Our own configs keep their JSON: the key is written only when set.
  EXPECT_FALSE(ModelConfig().ToJson().contains("dense_layers"));
  // Inside the prefix, out of range, unsorted: one line naming the key.
  for (auto bad : {std::vector<int64_t>{0}, std::vector<int64_t>{5}, std::vector<int64_t>{4, 2}}) {
    ModelConfig b = m;
    b.dense_layers = bad;
    EXPECT_NE(b.Validate().message().find("model.dense_layers: "), std::string::npos) << b.Validate().message();
  }
  auto notlist = ConfigDoc::Parse("[model]\ndense_layers = 3\n", "t.toml");
  ASSERT_TRUE(notlist.ok());
  (void)ModelConfig::Read(notlist->get());
  EXPECT_NE((*notlist)->Finish().message().find("model.dense_layers must be a list of integers"), std::string::npos)
      << (*notlist)->Finish().message();
}

}  // namespace
}  // namespace myriad
