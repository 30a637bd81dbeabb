#include "data/hf_tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <deque>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/env.h"
#include "data/bpe.h"
#include "data/hf_pretokenizer.h"
#include "core/utf8.h"

namespace myriad {
namespace {

using nlohmann::json;

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for
// themselves, the other 68 (controls, space, DEL, NBSP, soft hyphen) for
// U+0100.. in byte order. Returns byte -> code point.
std::array<uint32_t, 256> ByteLevelAlphabet() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    cp[b] = printable ? b : next++;
  }
  return cp;
}

// A vocabulary token as raw bytes: each character of its byte-level spelling
// is one byte. A token with other characters (never produced by the byte
// mapping) stands for its own UTF-8 text, as Hugging Face's decoder has it.
std::string TokenBytes(const std::string& token, const std::unordered_map<uint32_t, uint8_t>& byte_of) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    size_t len = Utf8CharLength(token, i);
    if (len == 0) return token;
    auto it = byte_of.find(Utf8Decode(token, i, len));
    if (it == byte_of.end()) return token;
    bytes.push_back(static_cast<char>(it->second));
    i += len;
  }
  return bytes;
}

// Unicode White_Space, which Hugging Face's lstrip/rstrip strip
// (char::is_whitespace): U+0009..U+000D, U+0085 and the Z categories.
bool IsWhiteSpace(uint32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return true;
  const utf8proc_category_t c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

std::string_view TrimWhiteSpaceStart(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len = Utf8CharLength(s, i);
    if (len == 0 || !IsWhiteSpace(Utf8Decode(s, i, len))) break;
    i += len;
  }
  return s.substr(i);
}

std::string_view TrimWhiteSpaceEnd(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4) --start;
    size_t len = Utf8CharLength(s, start);
    if (len != end - start || !IsWhiteSpace(Utf8Decode(s, start, len))) break;
    end = start;
  }
  return s.substr(0, end);
}

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, normalized = true;
};

// Finds added tokens in text: leftmost first, the longest among those that
// start there.
class AddedTokenMatcher {
 public:
  void Add(const AddedToken* token) {
    by_first_byte_[static_cast<unsigned char>(token->content[0])].push_back(token);
  }
  void Sort() {
    for (auto& bucket : by_first_byte_) {
      std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken* a, const AddedToken* b) {
        return a->content.size() > b->content.size();
      });
    }
  }
  const AddedToken* Find(std::string_view text, size_t from, size_t* at) const {
    for (size_t i = from; i < text.size(); ++i) {
      for (const AddedToken* token : by_first_byte_[static_cast<unsigned char>(text[i])]) {
        if (text.compare(i, token->content.size(), token->content) == 0) {
          *at = i;
          return token;
        }
      }
    }
    return nullptr;
  }

 private:
  std::array<std::vector<const AddedToken*>, 256> by_first_byte_;
};

// A stretch of text, or an added token found in it.
struct Section {
  std::string_view text;
  const AddedToken* token = nullptr;
};

// Cuts `text` at the added tokens; a token with lstrip (rstrip) takes the
// white space before (after) it out of its neighbouring text.
void SplitOnAddedTokens(const AddedTokenMatcher& matcher, std::string_view text, std::vector<Section>* out) {
  out->clear();
  size_t pos = 0, at = 0;
  while (const AddedToken* token = matcher.Find(text, pos, &at)) {
    out->push_back({text.substr(pos, at - pos), nullptr});
    out->push_back({text.substr(at, token->content.size()), token});
    pos = at + token->content.size();
  }
  out->push_back({text.substr(pos), nullptr});
  for (size_t k = 0; k < out->size(); ++k) {
    const AddedToken* token = (*out)[k].token;
    if (token == nullptr) continue;
    if (token->lstrip && k > 0 && (*out)[k - 1].token == nullptr) {
      (*out)[k - 1].text = TrimWhiteSpaceEnd((*out)[k - 1].text);
    }
    if (token->rstrip && k + 1 < out->size() && (*out)[k + 1].token == nullptr) {
      (*out)[k + 1].text = TrimWhiteSpaceStart((*out)[k + 1].text);
    }
  }
}

struct Transparent {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

class HfBpeBackend : public TokenizerBackend {
 public:
  HfBpeBackend(std::vector<std::string> token_names, std::deque<AddedToken> added, hf::Normalizer normalizer,
               hf::PreTokenizer pre_tokenizer, std::unique_ptr<hf::BytePairEncoder> bpe,
               std::unordered_map<std::string, int32_t, Transparent, std::equal_to<>> whole_words,
               bool ignore_merges, const std::array<int32_t, 256>& byte_ids)
      : token_names_(std::move(token_names)),
        added_(std::move(added)),
        normalizer_(std::move(normalizer)),
        pre_tokenizer_(std::move(pre_tokenizer)),
        bpe_(std::move(bpe)),
        whole_words_(std::move(whole_words)),
        ignore_merges_(ignore_merges),
        byte_ids_(byte_ids) {
    for (const AddedToken& t : added_) {
      (t.normalized && !normalizer_.empty() ? normalized_tokens_ : raw_tokens_).Add(&t);
    }
    raw_tokens_.Sort();
    normalized_tokens_.Sort();
  }

  void EncodeTo(std::string_view text, std::vector<int32_t>* out) const override {
    EncodeSections(raw_tokens_, text, out, [&](std::string_view t) { EncodeBytes(t, out); });
  }

  std::string PieceName(int32_t id) const override { return token_names_[id]; }

 private:
  // Added tokens become their ids, the text between them goes to encode_text.
  template <typename EncodeText>
  static void EncodeSections(const AddedTokenMatcher& matcher, std::string_view text, std::vector<int32_t>* out,
                             EncodeText&& encode_text) {
    std::vector<Section> sections;
    SplitOnAddedTokens(matcher, text, &sections);
    for (const Section& s : sections) {
      if (s.token != nullptr) {
        out->push_back(s.token->id);
      } else {
        encode_text(s.text);
      }
    }
  }

  // Valid UTF-8 runs go through the pipeline; a malformed byte becomes its
  // byte token (Hugging Face never sees one).
  void EncodeBytes(std::string_view text, std::vector<int32_t>* out) const {
    size_t start = 0, i = 0;
    while (i < text.size()) {
      size_t len = Utf8CharLength(text, i);
      if (len > 0) {
        i += len;
        continue;
      }
      EncodeValid(text.substr(start, i - start), out);
      out->push_back(byte_ids_[static_cast<unsigned char>(text[i])]);
      start = ++i;
    }
    EncodeValid(text.substr(start), out);
  }

  void EncodeValid(std::string_view text, std::vector<int32_t>* out) const {
    if (text.empty()) return;
    if (normalizer_.empty()) {
      EncodeWords(text, out);
      return;
    }
    const std::string normalized = normalizer_.Apply(text);
    EncodeSections(normalized_tokens_, normalized, out, [&](std::string_view t) { EncodeWords(t, out); });
  }

  void EncodeWords(std::string_view text, std::vector<int32_t>* out) const {
    if (text.empty()) return;
    hf::Pieces words;
    std::deque<std::string> arena;
    pre_tokenizer_.Run(text, &words, &arena);
    for (std::string_view word : words) {
      if (ignore_merges_) {
        auto it = whole_words_.find(word);
        if (it != whole_words_.end()) {
          out->push_back(it->second);
          continue;
        }
      }
      bpe_->Encode(word, out);
    }
  }

  std::vector<std::string> token_names_;
  std::deque<AddedToken> added_;  // stable addresses for the matchers
  AddedTokenMatcher raw_tokens_, normalized_tokens_;
  hf::Normalizer normalizer_;
  hf::PreTokenizer pre_tokenizer_;
  std::unique_ptr<hf::BytePairEncoder> bpe_;
  std::unordered_map<std::string, int32_t, Transparent, std::equal_to<>> whole_words_;  // ignore_merges
  bool ignore_merges_;
  std::array<int32_t, 256> byte_ids_;
};

// ---------------------------------------------------------------- parsing

class Parser {
 public:
  Parser(const std::string& path, const HfTokenizerConfig& config) : path_(path), config_(config) {}

  Result<TokenizerParts> Run(const json& root) {
    if (!root.is_object()) return Error("the top level is not a JSON object");
    const json& model = Get(root, "model");
    if (!model.is_object()) return Error("has no \"model\" object (hint: is this a tokenizer.json?)");
    if (!model.contains("type") || !model["type"].is_string()) {
      return Error("model has no \"type\" (hint: files written by tokenizers >= 0.10 name it; supported: BPE)");
    }
    const std::string type = model["type"].get<std::string>();
    if (type != "BPE") return Error("model type \"" + type + "\" is not supported (supported: BPE)");
    RETURN_IF_ERROR(CheckModelOptions(model));
    RETURN_IF_ERROR(ReadVocab(model));
    RETURN_IF_ERROR(ReadAddedTokens(root));
    ASSIGN_OR_RETURN(hf::Normalizer normalizer, hf::Normalizer::FromJson(Get(root, "normalizer"), path_));
    ASSIGN_OR_RETURN(hf::PreTokenizer pre_tokenizer, hf::PreTokenizer::FromJson(Get(root, "pre_tokenizer"), path_));
    RETURN_IF_ERROR(ReadPostProcessor(Get(root, "post_processor")));
    RETURN_IF_ERROR(CheckDecoder(Get(root, "decoder")));
    RETURN_IF_ERROR(ReadByteTokens());
    std::vector<hf::BytePairEncoder::Merge> merges;
    RETURN_IF_ERROR(ReadMerges(model, &merges));
    return Build(std::move(normalizer), std::move(pre_tokenizer), merges,
                 model.value("ignore_merges", false) == true);
  }

 private:
  Status Error(const std::string& what) const { return Status::Error(path_ + ": " + what); }

  static const json& Get(const json& obj, const char* key) {
    static const json kNull;
    auto it = obj.find(key);
    return it == obj.end() ? kNull : *it;
  }

  Status CheckModelOptions(const json& model) {
    const json& dropout = Get(model, "dropout");
    if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0.0)) {
      return Error("model.dropout " + dropout.dump() + " is not supported (supported: null)");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const json& v = Get(model, key);
      if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty())) {
        return Error(std::string("model.") + key + " " + v.dump() + " is not supported (supported: null)");
      }
    }
    return Status::Ok();
  }

  Status ReadVocab(const json& model) {
    const json& vocab = Get(model, "vocab");
    if (!vocab.is_object() || vocab.empty()) {
      return Error("model.vocab is missing or empty (hint: the file is damaged or not a BPE tokenizer.json)");
    }
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= kMaxId) {
        return Error("model.vocab[" + json(it.key()).dump() + "] = " + it.value().dump() +
                     " is not an id in [0, 2^30)");
      }
      const int32_t id = it.value().get<int32_t>();
      auto [pos, fresh] = id_of_.emplace(it.key(), id);
      (void)pos;
      if (!fresh) continue;
      if (static_cast<size_t>(id) >= names_.size()) names_.resize(id + 1), has_token_.resize(id + 1);
      if (has_token_[id]) {
        return Error("model.vocab gives id " + std::to_string(id) + " to both " + json(names_[id]).dump() +
                     " and " + json(it.key()).dump());
      }
      names_[id] = it.key();
      has_token_[id] = true;
    }
    return Status::Ok();
  }

  Status ReadAddedTokens(const json& root) {
    const json& list = Get(root, "added_tokens");
    if (list.is_null()) return Status::Ok();
    if (!list.is_array()) return Error("added_tokens is not a list");
    for (const json& item : list) {
      AddedToken t;
      if (!item.is_object() || !Get(item, "id").is_number_integer() || !Get(item, "content").is_string()) {
        return Error("added token " + item.dump() + " lacks an integer \"id\" or a string \"content\"");
      }
      const int64_t id = item["id"].get<int64_t>();
      t.content = item["content"].get<std::string>();
      if (id < 0 || id >= kMaxId) return Error("added token " + json(t.content).dump() + " has id " + std::to_string(id) + " outside [0, 2^30)");
      if (t.content.empty()) return Error("added token " + std::to_string(id) + " has empty content");
      t.id = static_cast<int32_t>(id);
      auto flag = [&](const char* key, bool fallback) {
        const json& v = Get(item, key);
        return v.is_boolean() ? v.get<bool>() : fallback;
      };
      t.special = flag("special", false);
      t.lstrip = flag("lstrip", false);
      t.rstrip = flag("rstrip", false);
      t.normalized = flag("normalized", !t.special);
      if (flag("single_word", false)) {
        return Error("added token " + json(t.content).dump() + ": single_word=true is not supported (supported: false)");
      }
      added_.push_back(std::move(t));
    }
    return Status::Ok();
  }

  // The id of a token named in the post-processor or tokenizer_config.json.
  int32_t IdOf(const std::string& token) const {
    for (const AddedToken& t : added_) {
      if (t.content == token) return t.id;
    }
    auto it = id_of_.find(token);
    return it == id_of_.end() ? -1 : it->second;
  }

  Status ReadPostProcessor(const json& pp) {
    if (pp.is_null()) return Status::Ok();
    const std::string type = pp.is_object() && Get(pp, "type").is_string() ? pp["type"].get<std::string>() : pp.dump();
    if (type == "ByteLevel") return Status::Ok();
    if (type == "Sequence") {
      if (!Get(pp, "processors").is_array()) return Error("post_processor Sequence has no \"processors\" list");
      for (const json& p : pp["processors"]) RETURN_IF_ERROR(ReadPostProcessor(p));
      return Status::Ok();
    }
    if (type != "TemplateProcessing") {
      return Error("post_processor \"" + type +
                   "\" is not supported (supported: null, ByteLevel, TemplateProcessing, a Sequence of them)");
    }
    const json& single = Get(pp, "single");
    if (!single.is_array()) return Error("post_processor TemplateProcessing has no \"single\" template");
    const std::string unsupported =
        "post_processor template " + single.dump() +
        " is not supported (supported: [$A] or [one special token, $A]; Encode adds nothing, adds_bos() reports the token)";
    std::vector<std::string> before;
    bool seen_a = false;
    for (const json& item : single) {
      if (item.contains("SpecialToken") && !seen_a) {
        before.push_back(item["SpecialToken"].value("id", ""));
      } else if (item.contains("Sequence") && item["Sequence"].value("id", "") == "A" && !seen_a) {
        seen_a = true;
      } else {
        return Error(unsupported);
      }
    }
    if (!seen_a || before.size() > 1) return Error(unsupported);
    if (before.empty()) return Status::Ok();
    const json& special = Get(Get(pp, "special_tokens"), before[0].c_str());
    int32_t id = -1;
    if (special.is_object() && Get(special, "ids").is_array()) {
      if (special["ids"].size() != 1 || !special["ids"][0].is_number_integer()) return Error(unsupported);
      id = special["ids"][0].get<int32_t>();
    } else {
      id = IdOf(before[0]);
    }
    if (id < 0) return Error("post_processor template token " + json(before[0]).dump() + " is not in the vocabulary");
    bos_id_ = id;
    adds_bos_ = true;
    return Status::Ok();
  }

  Status CheckDecoder(const json& decoder) {
    const std::string type = decoder.is_object() && Get(decoder, "type").is_string() ? decoder["type"].get<std::string>()
                                                                                  : decoder.dump();
    if (type == "ByteLevel") return Status::Ok();
    return Error("decoder \"" + type + "\" is not supported (supported: ByteLevel)");
  }

  Status ReadByteTokens() {
    const auto alphabet = ByteLevelAlphabet();
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      Utf8Append(alphabet[b], &ch);
      byte_of_[alphabet[b]] = static_cast<uint8_t>(b);
      auto it = id_of_.find(ch);
      if (it == id_of_.end()) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02X", b);
        return Error("model.vocab has no token for byte " + std::string(hex) + " (" + json(ch).dump() +
                     "); a byte-level BPE needs all 256 (hint: not a byte-level tokenizer?)");
      }
      byte_ids_[b] = it->second;
    }
    return Status::Ok();
  }

  Status ReadMerges(const json& model, std::vector<hf::BytePairEncoder::Merge>* merges) {
    const json& list = Get(model, "merges");
    if (!list.is_array()) return Error("model.merges is missing or not a list");
    merges->reserve(list.size());
    for (size_t k = 0; k < list.size(); ++k) {
      const json& m = list[k];
      std::string left, right;
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return Error("model.merges[" + std::to_string(k) + "] = " + m.dump() + " is not two tokens \"a b\"");
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return Error("model.merges[" + std::to_string(k) + "] = " + m.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
      }
      auto l = id_of_.find(left), r = id_of_.find(right), result = id_of_.find(left + right);
      for (const auto& [it, what] : {std::pair{l, &left}, std::pair{r, &right}}) {
        if (it == id_of_.end()) {
          return Error("model.merges[" + std::to_string(k) + "] = " + m.dump() + ": " + json(*what).dump() +
                       " is not in the vocab");
        }
      }
      if (result == id_of_.end()) {
        return Error("model.merges[" + std::to_string(k) + "] = " + m.dump() + ": the merged token " +
                     json(left + right).dump() + " is not in the vocab");
      }
      merges->push_back({l->second, r->second, result->second});
    }
    return Status::Ok();
  }

  Result<TokenizerParts> Build(hf::Normalizer normalizer, hf::PreTokenizer pre_tokenizer,
                               const std::vector<hf::BytePairEncoder::Merge>& merges, bool ignore_merges) {
    TokenizerParts parts;
    parts.kind = TokenizerKind::kHuggingFaceBpe;
    size_t size = names_.size();
    for (const AddedToken& t : added_) size = std::max(size, static_cast<size_t>(t.id) + 1);
    std::vector<std::string> names(size);
    parts.piece_bytes.assign(size, kUtf8ReplacementChar);
    parts.special.assign(size, false);
    for (size_t id = 0; id < names_.size(); ++id) {
      if (!has_token_[id]) continue;
      names[id] = names_[id];
      parts.piece_bytes[id] = TokenBytes(names_[id], byte_of_);
    }
    for (const AddedToken& t : added_) {
      names[t.id] = t.content;
      parts.piece_bytes[t.id] = t.content;
      parts.special[t.id] = t.special;
    }
    for (size_t id = 0; id < size; ++id) {
      if (names[id].empty()) names[id] = "<unused:" + std::to_string(id) + ">";
    }
    std::unordered_map<std::string, int32_t, Transparent, std::equal_to<>> whole_words;
    if (ignore_merges) {
      for (size_t id = 0; id < names_.size(); ++id) {
        if (has_token_[id]) whole_words.emplace(TokenBytes(names_[id], byte_of_), static_cast<int32_t>(id));
      }
    }
    std::copy(byte_ids_.begin(), byte_ids_.end(), parts.byte_ids.begin());
    parts.bos_id = bos_id_;
    parts.adds_bos = adds_bos_;
    if (parts.bos_id < 0 && config_.bos_token) parts.bos_id = IdOf(*config_.bos_token);
    if (config_.eos_token) parts.eos_id = IdOf(*config_.eos_token);
    // Without a tokenizer_config.json: the end-of-text tokens of the formats
    // this reads (GPT-2/Qwen, Llama 3, DeepSeek-V3).
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"}) {
      if (parts.eos_id < 0) parts.eos_id = IdOf(name);
    }
    parts.unk_id = -1;
    // unk_token is a model field; byte-level BPE never produces it.
    auto bpe = std::make_unique<hf::BytePairEncoder>(byte_ids_, merges);
    parts.backend = std::make_unique<HfBpeBackend>(std::move(names), std::move(added_), std::move(normalizer),
                                                   std::move(pre_tokenizer), std::move(bpe), std::move(whole_words),
                                                   ignore_merges, byte_ids_);
    return parts;
  }

  static constexpr int64_t kMaxId = int64_t{1} << 30;
  const std::string& path_;
  const HfTokenizerConfig& config_;
  std::unordered_map<std::string, int32_t> id_of_;  // model.vocab
  std::vector<std::string> names_;                  // model.vocab by id
  std::vector<bool> has_token_;
  std::deque<AddedToken> added_;
  std::unordered_map<uint32_t, uint8_t> byte_of_;  // byte-level character -> byte
  std::array<int32_t, 256> byte_ids_{};
  int32_t bos_id_ = -1;
  bool adds_bos_ = false;
};

// The token a tokenizer_config.json names: "<s>" or {"content": "<s>", ...}.
std::optional<std::string> TokenName(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

Result<json> ReadJson(const std::string& path) {
  auto text = Env::Default()->ReadFile(path);
  if (!text.ok()) return Status::Error(text.status().message() + " (hint: is the path right?)");
  try {
    return json::parse(text.value());
  } catch (const json::parse_error& e) {
    return Status::Error(path + ": not valid JSON (" + std::to_string(text.value().size()) +
                         " bytes; truncated or damaged?): " + e.what());
  }
}

}  // namespace

Result<HfTokenizerConfig> ReadHfTokenizerConfig(const std::string& path) {
  HfTokenizerConfig config;
  if (!Env::Default()->FileExists(path)) return config;
  ASSIGN_OR_RETURN(json root, ReadJson(path));
  if (!root.is_object()) return Status::Error(path + ": the top level is not a JSON object");
  if (root.contains("bos_token")) config.bos_token = TokenName(root["bos_token"]);
  if (root.contains("eos_token")) config.eos_token = TokenName(root["eos_token"]);
  if (root.contains("add_bos_token") && root["add_bos_token"].is_boolean()) {
    config.add_bos_token = root["add_bos_token"].get<bool>();
  }
  return config;
}

Result<TokenizerParts> LoadHfTokenizerJson(const std::string& path, const HfTokenizerConfig& config) {
  if (!Env::Default()->FileExists(path)) {
    return Status::Error(path + ": tokenizer file not found (hint: point to a tokenizer.json or a model folder)");
  }
  ASSIGN_OR_RETURN(json root, ReadJson(path));
  try {
    return Parser(path, config).Run(root);
  } catch (const json::exception& e) {
    // A field of an unexpected type that the checks above do not name.
    return Status::Error(path + ": unexpected content: " + e.what());
  }
}

}  // namespace myriad
