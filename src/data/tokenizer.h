// Tokenizer: a byte-exact BPE tokenizer on top of SentencePiece.
//
// Contract: Decode(Encode(s)) == s for EVERY byte string s: English, Chinese,
// emoji, code with indentation, runs of spaces, tabs, CR/LF and even invalid
// UTF-8. SentencePiece alone does not give that (it treats input lines as
// sentences, rewrites U+2581 to a space and replaces malformed UTF-8), so
// Encode cuts the text into segments at the bytes SentencePiece would alter
// and writes those bytes as byte tokens itself:
//   - '\n'                       -> the byte token <0x0A>
//   - a literal U+2581 ("▁")     -> the byte tokens <0xE2><0x96><0x81>
//   - a NUL or malformed byte    -> its byte token <0xNN>
// Every other segment goes to SentencePiece, which was trained on the same
// segments (lines), with identity normalisation, no dummy prefix, no removal
// of whitespace, whitespace-only pieces allowed (indentation becomes a few
// tokens) and byte fallback (characters outside the vocabulary become their
// UTF-8 bytes, so nothing is ever <unk>).
//
// Ids: 0 = <unk>, 1 = <s> (bos), 2 = </s> (eos), then the 256 byte tokens,
// then learned pieces. No padding id.
//
// Thread safety: a loaded Tokenizer is immutable; Encode/Decode may be called
// from any number of threads at once. TokenStreamDecoder is single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace myriad {

struct TokenizerTrainOptions {
  // Characters covering this fraction of all characters get their own piece;
  // the rare rest (mostly rare Chinese characters) falls back to bytes.
  double character_coverage = 0.995;
  // Cap on the training text; above it, lines are sampled deterministically
  // (by a hash of the line and `seed`). Keeps training to seconds.
  int64_t max_training_bytes = 6 * 1000 * 1000;
  uint64_t seed = 1;
  int num_threads = 2;
  // Lines longer than this (bytes) are left out of training, not of encoding.
  int max_line_bytes = 8192;
  // Digits are split into single-digit pieces (better arithmetic, fewer
  // junk pieces).
  bool split_digits = true;
};

class Tokenizer {
 public:
  // Trains a BPE model on `documents` and writes `<model_prefix>.model`
  // (binary SentencePiece model, written atomically) and
  // `<model_prefix>.vocab` (one "piece<TAB>id" per line, for people).
  // `vocab_size` counts every id including <unk>, <s>, </s> and the 256 byte
  // tokens, so it must be at least 259 + a few pieces; when the text is too
  // small to learn that many merges the model is smaller (see vocab_size()).
  static Status Train(const std::vector<std::string>& documents, const std::string& model_prefix,
                      int vocab_size, const TokenizerTrainOptions& options = {});
  // Same, with the whole UTF-8 text file at `text_path` as the one document.
  static Status TrainFromFile(const std::string& text_path, const std::string& model_prefix,
                              int vocab_size, const TokenizerTrainOptions& options = {});

  // Loads a model written by Train. Errors name the path and give a hint.
  static Result<Tokenizer> Load(const std::string& model_path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> Encode(std::string_view text) const;
  // Appends the tokens of `text` to `*out` (no bos/eos are added).
  void EncodeTo(std::string_view text, std::vector<int32_t>* out) const;

  // Exact inverse of Encode. Control ids (bos/eos) decode to nothing, <unk>
  // and ids outside [0, vocab_size) to U+FFFD. The result is the raw bytes
  // of the pieces: a sequence cut in the middle of a character may end in an
  // incomplete UTF-8 sequence (use TokenStreamDecoder for streaming text).
  std::string Decode(const std::vector<int32_t>& ids) const;
  // The bytes one id stands for (a piece with "▁" turned into spaces, or one
  // raw byte for a byte token). May be part of a UTF-8 character.
  const std::string& DecodePiece(int32_t id) const;
  // The piece as SentencePiece spells it ("▁def", "<0x0A>"), for debugging.
  std::string PieceName(int32_t id) const;

  int vocab_size() const { return static_cast<int>(piece_bytes_.size()); }
  int bos_id() const { return bos_id_; }
  int eos_id() const { return eos_id_; }
  int unk_id() const { return unk_id_; }
  int byte_id(uint8_t byte) const { return byte_ids_[byte]; }
  const std::string& path() const { return path_; }

 private:
  Tokenizer();
  void EncodeSegment(std::string_view segment, std::vector<int32_t>* out) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::vector<std::string> piece_bytes_;  // id -> the bytes it decodes to
  int32_t byte_ids_[256] = {};
  int bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
  std::string path_;
};

// Turns a stream of ids into text one id at a time without ever emitting a
// broken UTF-8 character: bytes of a character split over several tokens are
// held back until the character is complete; bytes that can never form a
// valid character are emitted as U+FFFD. Concatenating every Push and the
// final Finish gives valid UTF-8, equal to Decode(ids) whenever that is valid.
class TokenStreamDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  explicit TokenStreamDecoder(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  // Returns the text this id completes (possibly empty).
  std::string Push(int32_t id);
  // Returns what is still held back (an incomplete character becomes U+FFFD)
  // and resets the decoder.
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
};

}  // namespace myriad
