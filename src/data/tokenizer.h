// Tokenizer: text <-> token ids, for our own models and for open models.
//
// Three kinds of files load (Tokenizer::Load):
//   - our own SentencePiece BPE (Tokenizer::Train, `myriad prepare`);
//   - a Hugging Face tokenizer.json with a byte-level BPE model (GPT-2,
//     Llama 3, Qwen2/Qwen3, DeepSeek-V3 and the like), with the semantics of
//     Hugging Face's `tokenizers` library (data/hf_tokenizer.h);
//   - a SentencePiece tokenizer.model from a Hugging Face folder (Llama 2
//     style), with SentencePiece's own semantics.
// Files of any other kind are refused with one line naming the file and what
// is not supported, never loaded as a different tokenizer.
//
// Our own models. Contract: Decode(Encode(s)) == s for EVERY byte string s:
// English, Chinese, emoji, code with indentation, runs of spaces, tabs,
// CR/LF and even invalid UTF-8. SentencePiece alone does not give that (it
// treats input lines as sentences, rewrites U+2581 to a space and replaces
// malformed UTF-8), so Encode cuts the text into segments at the bytes
// SentencePiece would alter and writes those bytes as byte tokens itself:
//   - '\n'                       -> the byte token <0x0A>
//   - a literal U+2581 ("▁")     -> the byte tokens <0xE2><0x96><0x81>
//   - a NUL or malformed byte    -> its byte token <0xNN>
// Every other segment goes to SentencePiece, which was trained on the same
// segments (lines), with identity normalisation, no dummy prefix, no removal
// of whitespace, whitespace-only pieces allowed (indentation becomes a few
// tokens) and byte fallback (characters outside the vocabulary become their
// UTF-8 bytes, so nothing is ever <unk>).
// Ids: 0 = <unk>, 1 = <s> (bos), 2 = </s> (eos), then the 256 byte tokens,
// then learned pieces. No padding id.
//
// Byte-level BPE (tokenizer.json): Encode gives Hugging Face's ids for valid
// UTF-8 (added tokens such as "<|im_start|>" in the text become their ids);
// a malformed byte becomes its byte token, so Decode(Encode(s)) == s for any
// bytes when the normalizer is null (with NFC: == NFC(s)) and no added token
// strips spaces (lstrip/rstrip).
//
// Encode never adds bos/eos: adds_bos() says whether the format prepends
// bos_id() to a sequence (Llama 3, DeepSeek-V3, Llama 2), and callers decide.
//
// Thread safety: a loaded Tokenizer is immutable (its internal caches are
// synchronised); Encode/Decode may be called from any number of threads at
// once. TokenStreamDecoder is single-threaded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace myriad {

class TokenizerBackend;
struct TokenizerParts;

// Which kind of file a Tokenizer was loaded from.
enum class TokenizerKind {
  kMyriad,          // our own SentencePiece model (Tokenizer::Train)
  kSentencePiece,   // a foreign SentencePiece tokenizer.model (Hugging Face folder)
  kHuggingFaceBpe,  // a Hugging Face tokenizer.json, byte-level BPE
};

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

  // Loads `path`:
  //   - a tokenizer.json (Hugging Face, byte-level BPE);
  //   - any other file: a SentencePiece model. With a tokenizer_config.json
  //     beside it, it is a Hugging Face one (SentencePiece's own semantics);
  //     otherwise one of ours (written by Train);
  //   - a folder (a Hugging Face model folder): its tokenizer.json, else its
  //     tokenizer.model; when its tokenizer.json is refused and a
  //     tokenizer.model is there, that one, with a warning in the log.
  // A tokenizer_config.json beside a Hugging Face file supplies the bos/eos
  // tokens and add_bos_token. Errors are one line naming the path, with a
  // hint.
  static Result<Tokenizer> Load(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  std::vector<int32_t> Encode(std::string_view text) const;
  // Appends the tokens of `text` to `*out` (no bos/eos are added).
  void EncodeTo(std::string_view text, std::vector<int32_t>* out) const;

  // Inverse of Encode. Ids outside [0, vocab_size), <unk> and ids no token
  // has decode to U+FFFD. SentencePiece control ids (bos/eos) decode to
  // nothing; a Hugging Face added token, special or not, to its text (as HF's
  // decode without skip_special_tokens; is_special tells them apart). The
  // result is the raw bytes of the pieces: a sequence cut in the middle of a
  // character may end in an incomplete UTF-8 sequence (use
  // TokenStreamDecoder for streaming text). A foreign SentencePiece model
  // decodes as SentencePiece does (the dummy-prefix space dropped).
  std::string Decode(const std::vector<int32_t>& ids) const;
  // The bytes one id stands for (a piece with "▁" turned into spaces, one raw
  // byte for a byte token, a byte-level BPE token's bytes). May be part of a
  // UTF-8 character.
  const std::string& DecodePiece(int32_t id) const;
  // The piece as the file spells it ("▁def", "<0x0A>", "Ġworld"), for debugging.
  std::string PieceName(int32_t id) const;

  TokenizerKind kind() const { return kind_; }
  // Ids run over [0, vocab_size); with Hugging Face files that is the largest
  // id + 1, added tokens included.
  int vocab_size() const { return static_cast<int>(piece_bytes_.size()); }
  // -1 where the format has none.
  int bos_id() const { return bos_id_; }
  int eos_id() const { return eos_id_; }
  int unk_id() const { return unk_id_; }
  // Whether the format puts bos_id() before every sequence (Encode does not).
  bool adds_bos() const { return adds_bos_; }
  // A control token (bos/eos of SentencePiece) or a special added token
  // ("<|im_end|>"): not text a model writes for people.
  bool is_special(int32_t id) const { return id >= 0 && id < vocab_size() && special_[id]; }
  // The single-byte token of `byte`; -1 only for a foreign SentencePiece
  // model without byte fallback.
  int byte_id(uint8_t byte) const { return byte_ids_[byte]; }
  const std::string& path() const { return path_; }
  // 16 hex digits (Checksum64) over every id's bytes and special flag: two
  // tokenizers with the same fingerprint map every id to the same text, so
  // their next-token distributions compare id by id (a remote distillation
  // teacher's /v1/models reports it).
  std::string VocabFingerprint() const;

 private:
  Tokenizer(std::string path, TokenizerParts parts);

  std::unique_ptr<TokenizerBackend> backend_;
  std::vector<std::string> piece_bytes_;  // id -> the bytes it decodes to
  std::vector<bool> special_;
  int32_t byte_ids_[256] = {};
  int bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
  bool adds_bos_ = false;
  TokenizerKind kind_ = TokenizerKind::kMyriad;
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
