#include "data/tokenizer.h"

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

// SentencePiece logs every training stage at INFO to stderr; the library
// exports its level setter but its header does not declare it.
namespace sentencepiece::logging {
int GetMinLogLevel();
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace myriad {
namespace {

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 character at s[i], or 0 when the byte there
// does not start one (malformed, truncated, overlong or surrogate).
size_t Utf8CharLength(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

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

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

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
  ASSIGN_OR_RETURN(Tokenizer tok, Load(model_path));
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

Result<Tokenizer> Tokenizer::Load(const std::string& model_path) {
  const std::string hint = " (hint: run `myriad prepare` to train the tokenizer, or point to the "
                           "tokenizer.model it wrote)";
  if (!Env::Default()->FileExists(model_path)) {
    return Status::Error(model_path + ": tokenizer model not found" + hint);
  }
  auto bytes = Env::Default()->ReadFile(model_path);
  if (!bytes.ok()) return Status::Error(bytes.status().message() + hint);
  Tokenizer tok;
  tok.path_ = model_path;
  tok.processor_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  auto st = tok.processor_->LoadFromSerializedProto(bytes.value());
  if (!st.ok()) {
    return Status::Error(model_path + ": not a valid SentencePiece model (" +
                         std::to_string(bytes.value().size()) + " bytes): " + st.ToString() +
                         " (hint: the file is corrupt or not a tokenizer; re-run `myriad prepare`)");
  }
  const auto& sp = *tok.processor_;
  const int n = sp.GetPieceSize();
  std::fill(std::begin(tok.byte_ids_), std::end(tok.byte_ids_), -1);
  tok.piece_bytes_.resize(n);
  for (int id = 0; id < n; ++id) {
    const std::string& piece = sp.IdToPiece(id);
    std::string& out = tok.piece_bytes_[id];
    if (sp.IsByte(id)) {
      unsigned value = 0;
      if (std::sscanf(piece.c_str(), "<0x%02X>", &value) == 1 && value < 256) {
        tok.byte_ids_[value] = id;
        out.assign(1, static_cast<char>(value));
      }
    } else if (sp.IsUnknown(id)) {
      out = kReplacementChar;
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
  for (int b = 0; b < 256; ++b) {
    if (tok.byte_ids_[b] < 0) {
      return Status::Error(model_path + ": model has no byte token for byte " + std::to_string(b) +
                           " (hint: it was not trained with byte_fallback; retrain it with "
                           "`myriad prepare`)");
    }
  }
  tok.bos_id_ = sp.bos_id();
  tok.eos_id_ = sp.eos_id();
  tok.unk_id_ = sp.unk_id();
  if (tok.bos_id_ < 0 || tok.eos_id_ < 0) {
    return Status::Error(model_path + ": model defines no bos/eos ids (hint: retrain it with `myriad prepare`)");
  }
  return tok;
}

void Tokenizer::EncodeSegment(std::string_view segment, std::vector<int32_t>* out) const {
  std::vector<int> ids;
  auto st = processor_->Encode(segment, &ids);
  if (!st.ok()) {
    // Cannot happen for the well-formed UTF-8 segments we pass; stay exact anyway.
    for (unsigned char c : segment) out->push_back(byte_ids_[c]);
    return;
  }
  out->insert(out->end(), ids.begin(), ids.end());
}

void Tokenizer::EncodeTo(std::string_view text, std::vector<int32_t>* out) const {
  ForEachSegment(
      text, [&](std::string_view seg) { EncodeSegment(seg, out); },
      [&](unsigned char b) { out->push_back(byte_ids_[b]); });
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  EncodeTo(text, &out);
  return out;
}

const std::string& Tokenizer::DecodePiece(int32_t id) const {
  static const std::string kInvalid = kReplacementChar;
  if (id < 0 || id >= vocab_size()) return kInvalid;
  return piece_bytes_[id];
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += DecodePiece(id);
  return out;
}

std::string Tokenizer::PieceName(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "<invalid:" + std::to_string(id) + ">";
  return processor_->IdToPiece(id);
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
    out += kReplacementChar;
    ++i;
  }
  pending_.erase(0, i);
  return out;
}

std::string TokenStreamDecoder::Finish() {
  std::string out = pending_.empty() ? "" : kReplacementChar;
  pending_.clear();
  return out;
}

}  // namespace myriad
