// config.json objects for the tests of the import and the export (test-only).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace myriad::hf {

// A small config.json of `arch` with the keys every family shares (GQA, bf16,
// two eos ids); each test adds its family's keys.
inline nlohmann::json BaseHfConfig(const std::string& arch) {
  return {{"architectures", {arch}}, {"vocab_size", 320}, {"hidden_size", 64}, {"num_hidden_layers", 3},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 96},
          {"max_position_embeddings", 256}, {"rms_norm_eps", 1e-6}, {"rope_theta", 50000.0},
          {"hidden_act", "silu"}, {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"},
          {"bos_token_id", 1}, {"eos_token_id", {2, 3}}};
}

}  // namespace myriad::hf
