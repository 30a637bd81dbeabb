// Byte-pair merging for byte-level BPE (internal to src/data): the merges of
// a Hugging Face tokenizer.json applied to the bytes of one pre-token.
//
// A word starts as one symbol per byte; the adjacent pair with the lowest
// merge rank is merged, the leftmost first among equal ranks, until no pair
// has a merge. Results are cached per word (bounded, thread-safe), so the
// words of running text are merged once.
//
// Thread safety: Encode may be called from any number of threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace myriad::hf {

class BytePairEncoder {
 public:
  struct Merge {
    int32_t left, right, result;  // token ids
  };
  // `byte_ids[b]`: the token of byte b (all >= 0). `merges` in rank order.
  // `cache_words`: how many words the cache holds at most (0: no cache).
  BytePairEncoder(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges,
                  size_t cache_words = 1 << 16);
  ~BytePairEncoder();
  BytePairEncoder(const BytePairEncoder&) = delete;
  BytePairEncoder& operator=(const BytePairEncoder&) = delete;

  // Appends the tokens of `word` (raw bytes, not empty) to *out.
  void Encode(std::string_view word, std::vector<int32_t>* out) const;

 private:
  struct PairTable;
  struct WordCache;
  void MergeWord(std::string_view word, std::vector<int32_t>* out) const;

  std::array<int32_t, 256> byte_ids_;
  std::unique_ptr<PairTable> pairs_;
  std::unique_ptr<WordCache> cache_;
};

}  // namespace myriad::hf
