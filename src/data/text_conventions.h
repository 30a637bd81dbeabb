// How a model's text is framed: the ids every prompt starts with, and the
// ids that end a reply. One place for `generate`, `serve` and `eval`.
//
//   - Our own models (a Myriad tokenizer): training packs documents as
//     doc + eos, so a prompt starts after eos, and eos ends a reply.
//   - Hugging Face models: bos when the tokenizer prepends one (adds_bos();
//     Llama 3 and DeepSeek-V3 do, Qwen does not), and a reply ends at any of
//     the model's eos ids (config.json / generation_config.json: Llama 3.1
//     instruct lists <|eot_id|> and <|eom_id|> besides <|end_of_text|>) or the
//     tokenizer's own eos token.
#pragma once

#include <cstdint>
#include <vector>

#include "data/tokenizer.h"

namespace myriad {

struct TextConventions {
  std::vector<int32_t> prompt_prefix;  // prepended to every prompt
  std::vector<int32_t> stop_ids;       // generation ends at any of these (not emitted)

  bool IsStop(int32_t id) const;
  // A token that is not text for people: a stop id, bos, or a special token.
  static bool IsControl(const Tokenizer& tok, int32_t id);

  // `model_eos_ids` are the model's own (empty for our models); ids outside
  // the tokenizer's vocabulary are dropped.
  static TextConventions For(const Tokenizer& tok, const std::vector<int64_t>& model_eos_ids = {});
};

}  // namespace myriad
