#include "data/text_conventions.h"

#include <algorithm>

namespace myriad {

bool TextConventions::IsStop(int32_t id) const {
  return std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
}

bool TextConventions::IsControl(const Tokenizer& tok, int32_t id) {
  return id == tok.eos_id() || id == tok.bos_id() || tok.is_special(id);
}

TextConventions TextConventions::For(const Tokenizer& tok, const std::vector<int64_t>& model_eos_ids) {
  TextConventions c;
  auto add_stop = [&](int64_t id) {
    if (id < 0 || id >= tok.vocab_size()) return;
    if (!c.IsStop(static_cast<int32_t>(id))) c.stop_ids.push_back(static_cast<int32_t>(id));
  };
  if (tok.kind() == TokenizerKind::kMyriad) {
    if (tok.eos_id() >= 0) c.prompt_prefix.push_back(tok.eos_id());
  } else if (tok.adds_bos() && tok.bos_id() >= 0) {
    c.prompt_prefix.push_back(tok.bos_id());
  }
  for (int64_t id : model_eos_ids) add_stop(id);
  add_stop(tok.eos_id());
  return c;
}

}  // namespace myriad
