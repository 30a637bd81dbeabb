// The formats behind myriad::Tokenizer (internal to src/data): each loader
// reads one kind of file and hands the facade a backend that encodes, plus
// the id tables the facade answers from (data/tokenizer.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"

namespace myriad {

// One tokenizer format. Immutable once loaded; every method may be called
// from any number of threads at once.
class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;
  // Appends the ids of `text` (any bytes); never adds bos/eos.
  virtual void EncodeTo(std::string_view text, std::vector<int32_t>* out) const = 0;
  // The piece as the format spells it, for an id in [0, vocab_size).
  virtual std::string PieceName(int32_t id) const = 0;
  // For formats whose decoding is more than joining DecodePiece of each id
  // (SentencePiece drops its dummy-prefix space): writes *out, returns true.
  virtual bool Decode(const std::vector<int32_t>& ids, std::string* out) const { return false; }
};

// What a loader hands to the Tokenizer.
struct TokenizerParts {
  TokenizerParts() { byte_ids.fill(-1); }
  TokenizerKind kind = TokenizerKind::kMyriad;
  std::unique_ptr<TokenizerBackend> backend;
  std::vector<std::string> piece_bytes;  // id -> the bytes it decodes to
  std::vector<bool> special;             // id -> a control or special token
  std::array<int32_t, 256> byte_ids;     // byte -> its single-byte token, or -1
  int32_t bos_id = -1, eos_id = -1, unk_id = -1;
  bool adds_bos = false;
};

// The settings of a Hugging Face folder's tokenizer_config.json that the
// tokenizer files themselves do not carry.
struct HfTokenizerConfig {
  std::optional<std::string> bos_token, eos_token;
  std::optional<bool> add_bos_token;
};
// Reads `path` (a tokenizer_config.json); a missing file gives an empty config.
Result<HfTokenizerConfig> ReadHfTokenizerConfig(const std::string& path);

// A SentencePiece model. `hf` null: one of ours (Tokenizer::Train), encoded
// so that any bytes round-trip; otherwise a foreign model from a Hugging Face
// folder (e.g. Llama 2), encoded with SentencePiece's own semantics.
Result<TokenizerParts> LoadSentencePiece(const std::string& path, const HfTokenizerConfig* hf);

// A Hugging Face tokenizer.json: LoadHfTokenizerJson in data/hf_tokenizer.h.

}  // namespace myriad
