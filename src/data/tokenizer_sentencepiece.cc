// Our own SentencePiece models (training and loading) and foreign
// SentencePiece models from Hugging Face folders.
#include "data/tokenizer.h"
#include "data/tokenizer_backend.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <unordered_map>

#include "core/checksum.h"
#include "core/env.h"
#include "core/log.h"
#include "core/utf8.h"

// SentencePiece logs every training stage at INFO to stderr; the library
// exports its level setter but its header does not declare it.
namespace sentencepiece::logging {
int GetMinLogLevel();
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace myriad {
namespace {

// Cuts `text` into the segments SentencePiece may see and the bytes it must
// not: calls on_segment(view) for maximal runs of safe characters and
// on_byte(b) for every '\n', NUL, byte of a literal U+2581 or malformed byte.
template <typename OnSegment, typename OnByte>
void ForEachSegment(std::string_view text, OnSegment&& on_segment, OnByte&& on_byte) {
  size_t start = 0, i = 0;
  auto flush = [&](size_t end) {
    if (end > start) on_segment(text.substr(start, end - start));
  };
  while (i < text.size()) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n' || c == 0) {
      flush(i);
      on_byte(c);
      start = ++i;
      continue;
    }
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = Utf8CharLength(text, i);
    if (len == 0) {
      flush(i);
      on_byte(c);
      start = ++i;
      continue;
    }
    if (len == 3 && text.compare(i, 3, "\xE2\x96\x81") == 0) {
      flush(i);
      for (int k = 0; k < 3; ++k) on_byte(static_cast<unsigned char>(text[i + k]));
      start = i += 3;
      continue;
    }
    i += len;
  }
  flush(i);
}

// Feeds the training lines to SentencePiece without writing a temp file.
class VectorSentenceIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorSentenceIterator(const std::vector<std::string>* lines) : lines_(lines) {}
  bool done() const override { return index_ >= lines_->size(); }
  void Next() override { ++index_; }
  const std::string& value() const override { return (*lines_)[index_]; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  const std::vector<std::string>* lines_;
  size_t index_ = 0;
};

// The training lines: the segments Encode will hand to SentencePiece,
// sampled down to about `max_bytes` by a seeded hash of each line.
std::vector<std::string> TrainingLines(const std::vector<std::string>& documents,
                                       const TokenizerTrainOptions& options, int64_t* total_bytes) {
  std::vector<std::string_view> all;
  int64_t bytes = 0;
  for (const auto& doc : documents) {
    ForEachSegment(
        doc,
        [&](std::string_view seg) {
          if (seg.size() > static_cast<size_t>(options.max_line_bytes)) return;
          all.push_back(seg);
          bytes += static_cast<int64_t>(seg.size());
        },
        [](unsigned char) {});
  }
  *total_bytes = bytes;
  std::vector<std::string> lines;
  if (options.max_training_bytes <= 0 || bytes <= options.max_training_bytes) {
    lines.reserve(all.size());
    for (auto s : all) lines.emplace_back(s);
    return lines;
  }
  // Keep a line when its hash falls below keep * 2^64.
  const double keep = static_cast<double>(options.max_training_bytes) / static_cast<double>(bytes);
  const uint64_t threshold = static_cast<uint64_t>(keep * 18446744073709551615.0);
  const uint64_t salt = options.seed * 0x9e3779b97f4a7c15ULL;
  uint64_t index = 0;
  for (auto s : all) {
    // Mix in the position so that a line repeated many times (a common
    // idiom in code) is sampled in proportion, not all-or-nothing.
    uint64_t h = Checksum64(s) ^ salt ^ (index++ * 0xbf58476d1ce4e5b9ULL);
    h ^= h >> 31;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 29;
    if (h < threshold) lines.emplace_back(s);
  }
  return lines;
}

// SentencePiece gives every character that helps reach `coverage` its own
// piece and fails when those pieces alone overflow the vocabulary. Returns the
// coverage to ask for so that at most `max_chars` characters are required,
// counting characters the way it does (all code points of the lines), but no
// less than SentencePiece's floor of 0.98; *chars_at_floor receives how many
// characters that floor requires.
constexpr double kMinCoverage = 0.98;
double CappedCharacterCoverage(const std::vector<std::string>& lines, double coverage,
                               size_t max_chars, size_t* chars_at_floor) {
  std::unordered_map<uint32_t, uint64_t> counts;
  uint64_t total = 0;
  for (const auto& line : lines) {
    for (size_t i = 0; i < line.size();) {
      size_t len = Utf8CharLength(line, i);
      if (len == 0) len = 1;
      uint32_t cp = 0;
      for (size_t k = 0; k < len; ++k) cp = (cp << 8) | static_cast<unsigned char>(line[i + k]);
      ++counts[cp];
      ++total;
      i += len;
    }
  }
  std::vector<uint64_t> freq;
  freq.reserve(counts.size());
  for (const auto& [cp, n] : counts) freq.push_back(n);
  std::sort(freq.begin(), freq.end(), std::greater<>());
  *chars_at_floor = 0;
  for (uint64_t covered = 0; *chars_at_floor < freq.size() &&
                             static_cast<double>(covered) < kMinCoverage * static_cast<double>(total);) {
    covered += freq[(*chars_at_floor)++];
  }
  if (freq.size() <= max_chars) return coverage;
  uint64_t covered = 0;
  for (size_t k = 0; k < max_chars; ++k) covered += freq[k];
  // A hair below the share of the top max_chars, so float rounding inside
  // SentencePiece cannot pull in one more.
  const double capped = static_cast<double>(covered) / static_cast<double>(total) * (1.0 - 1e-5);
  return std::max(kMinCoverage, std::min(coverage, capped));
}

// Rounds down: rounding up could make SentencePiece require one more character.
std::string CoverageString(double coverage) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9f", std::floor(coverage * 1e9) / 1e9);
  return buf;
}

class ScopedSentencePieceQuiet {
 public:
  ScopedSentencePieceQuiet() : saved_(sentencepiece::logging::GetMinLogLevel()) {
    sentencepiece::logging::SetMinLogLevel(std::max(saved_, 1));
  }
  ~ScopedSentencePieceQuiet() { sentencepiece::logging::SetMinLogLevel(saved_); }

 private:
  int saved_;
};

// Our own models: the text is cut where SentencePiece would alter it (see
// data/tokenizer.h); foreign models (`plain_`): SentencePiece as it is.
class SentencePieceBackend : public TokenizerBackend {
 public:
  SentencePieceBackend(std::unique_ptr<sentencepiece::SentencePieceProcessor> processor, bool plain,
                       const std::array<int32_t, 256>& byte_ids)
      : processor_(std::move(processor)), plain_(plain), byte_ids_(byte_ids) {}

  void EncodeTo(std::string_view text, std::vector<int32_t>* out) const override {
    if (plain_) {
      std::vector<int> ids;
      if (processor_->Encode(text, &ids).ok()) out->insert(out->end(), ids.begin(), ids.end());
      return;
    }
    ForEachSegment(
        text, [&](std::string_view seg) { EncodeSegment(seg, out); },
        [&](unsigned char b) { out->push_back(byte_ids_[b]); });
  }

  std::string PieceName(int32_t id) const override { return processor_->IdToPiece(id); }

  bool Decode(const std::vector<int32_t>& ids, std::string* out) const override {
    if (!plain_) return false;
    std::vector<int> sp_ids(ids.begin(), ids.end());
    return processor_->Decode(sp_ids, out).ok();
  }

 private:
  void EncodeSegment(std::string_view segment, std::vector<int32_t>* out) const {
    std::vector<int> ids;
    auto st = processor_->Encode(segment, &ids);
    if (!st.ok()) {
      // Cannot happen for the well-formed UTF-8 segments we pass; stay exact anyway.
      for (unsigned char c : segment) out->push_back(byte_ids_[c]);
      return;
    }
    out->insert(out->end(), ids.begin(), ids.end());
  }

  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  bool plain_;
  std::array<int32_t, 256> byte_ids_;
};

}  // namespace

Result<TokenizerParts> LoadSentencePiece(const std::string& model_path, const HfTokenizerConfig* hf) {
  const std::string hint = hf != nullptr ? " (hint: the folder's tokenizer.model is damaged; fetch it again)"
                                         : " (hint: run `myriad prepare` to train the tokenizer, or point to "
                                           "the tokenizer.model it wrote)";
  if (!Env::Default()->FileExists(model_path)) {
    return Status::Error(model_path + ": tokenizer model not found" + hint);
  }
  auto bytes = Env::Default()->ReadFile(model_path);
  if (!bytes.ok()) return Status::Error(bytes.status().message() + hint);
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  auto st = processor->LoadFromSerializedProto(bytes.value());
  if (!st.ok()) {
    return Status::Error(model_path + ": not a valid SentencePiece model (" +
                         std::to_string(bytes.value().size()) + " bytes): " + st.ToString() +
                         (hf != nullptr ? hint
                                        : " (hint: the file is corrupt or not a tokenizer; re-run `myriad prepare`)"));
  }
  TokenizerParts parts;
  parts.kind = hf != nullptr ? TokenizerKind::kSentencePiece : TokenizerKind::kMyriad;
  const auto& sp = *processor;
  const int n = sp.GetPieceSize();
  parts.piece_bytes.resize(n);
  parts.special.resize(n);
  for (int id = 0; id < n; ++id) {
    const std::string& piece = sp.IdToPiece(id);
    std::string& out = parts.piece_bytes[id];
    parts.special[id] = sp.IsControl(id) || sp.IsUnknown(id);
    if (sp.IsByte(id)) {
      unsigned value = 0;
      if (std::sscanf(piece.c_str(), "<0x%02X>", &value) == 1 && value < 256) {
        parts.byte_ids[value] = id;
        out.assign(1, static_cast<char>(value));
      }
    } else if (sp.IsUnknown(id)) {
      out = kUtf8ReplacementChar;
    } else if (sp.IsControl(id) || sp.IsUnused(id)) {
      out.clear();
    } else {
      for (size_t i = 0; i < piece.size();) {
        if (piece.compare(i, 3, "\xE2\x96\x81") == 0) {
          out.push_back(' ');
          i += 3;
        } else {
          out.push_back(piece[i++]);
        }
      }
    }
  }
  parts.bos_id = sp.bos_id();
  parts.eos_id = sp.eos_id();
  parts.unk_id = sp.unk_id();
  if (hf != nullptr) {
    // The folder's tokenizer_config.json names the tokens in use.
    auto lookup = [&](const std::optional<std::string>& piece, int32_t* id) {
      if (piece && sp.PieceToId(*piece) != sp.unk_id()) *id = sp.PieceToId(*piece);
    };
    lookup(hf->bos_token, &parts.bos_id);
    lookup(hf->eos_token, &parts.eos_id);
    parts.adds_bos = parts.bos_id >= 0 && hf->add_bos_token.value_or(true);
  } else {
    for (int b = 0; b < 256; ++b) {
      if (parts.byte_ids[b] < 0) {
        return Status::Error(model_path + ": model has no byte token for byte " + std::to_string(b) +
                             " (hint: it was not trained with byte_fallback; retrain it with "
                             "`myriad prepare`)");
      }
    }
    if (parts.bos_id < 0 || parts.eos_id < 0) {
      return Status::Error(model_path + ": model defines no bos/eos ids (hint: retrain it with `myriad prepare`)");
    }
  }
  parts.backend = std::make_unique<SentencePieceBackend>(std::move(processor), hf != nullptr, parts.byte_ids);
  return parts;
}

Status Tokenizer::Train(const std::vector<std::string>& documents, const std::string& model_prefix,
                        int vocab_size, const TokenizerTrainOptions& options) {
  const std::string model_path = model_prefix + ".model";
  if (vocab_size < 260 || vocab_size > (1 << 24)) {
    return Status::Error(model_path + ": vocab_size=" + std::to_string(vocab_size) +
                         " is out of range (hint: use 260..16777216; 3 special ids and 256 byte "
                         "tokens come first, e.g. 4096)");
  }
  int64_t total_bytes = 0;
  std::vector<std::string> lines = TrainingLines(documents, options, &total_bytes);
  if (lines.empty()) {
    return Status::Error(model_path + ": no training text (" + std::to_string(documents.size()) +
                         " documents, all empty) (hint: check the corpus)");
  }
  int64_t sample_bytes = 0;
  for (const auto& l : lines) sample_bytes += static_cast<int64_t>(l.size());
  // At most half of the learnable ids go to single characters; the rest to merges.
  const size_t max_chars = std::max<size_t>(1, static_cast<size_t>(vocab_size - 259) / 2);
  size_t chars_at_floor = 0;
  const double coverage =
      CappedCharacterCoverage(lines, options.character_coverage, max_chars, &chars_at_floor);
  if (259 + chars_at_floor >= static_cast<size_t>(vocab_size)) {
    return Status::Error(model_path + ": vocab_size=" + std::to_string(vocab_size) +
                         " is too small for this text: " + std::to_string(chars_at_floor) +
                         " distinct characters make up 98% of it and need ids besides the 259 "
                         "reserved ones (hint: vocab_size >= " +
                         std::to_string(259 + 2 * chars_at_floor) + ", e.g. 4096)");
  }
  LOG_INFO("tokenizer: training BPE vocab=%d on %zu lines, %.2f MB (of %.2f MB), "
           "character_coverage=%.4f",
           vocab_size, lines.size(), sample_bytes / 1e6, total_bytes / 1e6, coverage);

  std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"hard_vocab_limit", "false"},
      {"byte_fallback", "true"},
      {"character_coverage", CoverageString(coverage)},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_by_whitespace", "true"},
      {"split_digits", options.split_digits ? "true" : "false"},
      {"max_sentence_length", std::to_string(options.max_line_bytes)},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", std::to_string(std::max(1, options.num_threads))},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
  };
  VectorSentenceIterator it(&lines);
  std::string serialized;
  {
    ScopedSentencePieceQuiet quiet;
    auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &serialized);
    if (!st.ok()) {
      return Status::Error(model_path + ": SentencePiece training failed: " + st.ToString() +
                           " (hint: a larger corpus or a smaller vocab_size)");
    }
  }
  RETURN_IF_ERROR(WriteFileAtomic(Env::Default(), model_path, serialized));

  // A readable vocabulary next to the model, for people and for diffs.
  ASSIGN_OR_RETURN(TokenizerParts parts, LoadSentencePiece(model_path, nullptr));
  Tokenizer tok(model_path, std::move(parts));
  std::string vocab;
  for (int id = 0; id < tok.vocab_size(); ++id) {
    vocab += tok.PieceName(id);
    vocab += '\t';
    vocab += std::to_string(id);
    vocab += '\n';
  }
  RETURN_IF_ERROR(WriteFileAtomic(Env::Default(), model_prefix + ".vocab", vocab));
  return Status::Ok();
}

Status Tokenizer::TrainFromFile(const std::string& text_path, const std::string& model_prefix,
                                int vocab_size, const TokenizerTrainOptions& options) {
  auto text = Env::Default()->ReadFile(text_path);
  if (!text.ok()) return text.status().With("tokenizer training text");
  std::vector<std::string> docs;
  docs.push_back(std::move(text.value()));
  return Train(docs, model_prefix, vocab_size, options);
}

}  // namespace myriad
