#include "data/tokenizer.h"

#include <filesystem>
#include <optional>

#include "core/checksum.h"
#include "core/env.h"
#include "core/log.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer_backend.h"
#include "core/utf8.h"

namespace myriad {
namespace {

std::string Parent(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

}  // namespace

Tokenizer::Tokenizer(std::string path, TokenizerParts parts)
    : backend_(std::move(parts.backend)),
      piece_bytes_(std::move(parts.piece_bytes)),
      special_(std::move(parts.special)),
      bos_id_(parts.bos_id),
      eos_id_(parts.eos_id),
      unk_id_(parts.unk_id),
      adds_bos_(parts.adds_bos),
      kind_(parts.kind),
      path_(std::move(path)) {
  std::copy(parts.byte_ids.begin(), parts.byte_ids.end(), byte_ids_);
  special_.resize(piece_bytes_.size());
}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::Load(const std::string& path) {
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(path, ec);
  const std::string dir = is_dir ? path : Parent(path);
  auto config_for = [&]() -> Result<HfTokenizerConfig> {
    return ReadHfTokenizerConfig(dir + "/tokenizer_config.json");
  };
  auto load_json = [&](const std::string& file) -> Result<Tokenizer> {
    ASSIGN_OR_RETURN(HfTokenizerConfig config, config_for());
    ASSIGN_OR_RETURN(TokenizerParts parts, LoadHfTokenizerJson(file, config));
    return Tokenizer(file, std::move(parts));
  };
  // A SentencePiece model is a Hugging Face one when a tokenizer_config.json
  // is beside it, else one of ours.
  auto load_model = [&](const std::string& file) -> Result<Tokenizer> {
    std::optional<HfTokenizerConfig> config;
    if (Env::Default()->FileExists(dir + "/tokenizer_config.json")) {
      ASSIGN_OR_RETURN(config, config_for());
    }
    ASSIGN_OR_RETURN(TokenizerParts parts, LoadSentencePiece(file, config ? &*config : nullptr));
    return Tokenizer(file, std::move(parts));
  };
  if (is_dir) {
    const std::string json_path = path + "/tokenizer.json", model_path = path + "/tokenizer.model";
    const bool has_json = Env::Default()->FileExists(json_path);
    const bool has_model = Env::Default()->FileExists(model_path);
    if (has_json) {
      auto tok = load_json(json_path);
      if (tok.ok() || !has_model) return tok;
      auto fallback = load_model(model_path);
      if (!fallback.ok()) return tok.status();
      LOG_WARN("%s; using %s instead", tok.status().message().c_str(), model_path.c_str());
      return fallback;
    }
    if (has_model) return load_model(model_path);
    return Status::Error(path + ": a folder with neither tokenizer.json nor tokenizer.model (hint: point "
                                "to a Hugging Face model folder or to a tokenizer file)");
  }
  if (std::filesystem::path(path).extension() == ".json") return load_json(path);
  return load_model(path);
}

void Tokenizer::EncodeTo(std::string_view text, std::vector<int32_t>* out) const {
  backend_->EncodeTo(text, out);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  EncodeTo(text, &out);
  return out;
}

std::string Tokenizer::VocabFingerprint() const {
  std::string all;
  for (int id = 0; id < vocab_size(); ++id) {
    const std::string& b = piece_bytes_[id];
    const uint32_t n = static_cast<uint32_t>(b.size());
    all.append(reinterpret_cast<const char*>(&n), sizeof n);  // length-prefixed: no two lists collide
    all += b;
    all += special_[id] ? '\1' : '\0';
  }
  return ChecksumHex(Checksum64(all));
}

const std::string& Tokenizer::DecodePiece(int32_t id) const {
  static const std::string kInvalid = kUtf8ReplacementChar;
  if (id < 0 || id >= vocab_size()) return kInvalid;
  return piece_bytes_[id];
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  if (backend_->Decode(ids, &out)) return out;
  out.clear();
  for (int32_t id : ids) out += DecodePiece(id);
  return out;
}

std::string Tokenizer::PieceName(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "<invalid:" + std::to_string(id) + ">";
  return backend_->PieceName(id);
}

std::string TokenStreamDecoder::Push(int32_t id) {
  pending_ += tokenizer_->DecodePiece(id);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    size_t len = Utf8CharLength(pending_, i);
    if (len > 0) {
      out.append(pending_, i, len);
      i += len;
      continue;
    }
    // Not a complete character here: wait if it may still become one.
    unsigned char c = static_cast<unsigned char>(pending_[i]);
    size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (need > 0 && i + need > pending_.size()) {
      bool prefix_ok = true;
      for (size_t k = i + 1; k < pending_.size(); ++k) {
        prefix_ok &= (static_cast<unsigned char>(pending_[k]) & 0xC0) == 0x80;
      }
      if (prefix_ok) break;
    }
    out += kUtf8ReplacementChar;
    ++i;
  }
  pending_.erase(0, i);
  return out;
}

std::string TokenStreamDecoder::Finish() {
  std::string out = pending_.empty() ? "" : kUtf8ReplacementChar;
  pending_.clear();
  return out;
}

}  // namespace myriad
