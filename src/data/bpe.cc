#include "data/bpe.h"

#include <algorithm>
#include <functional>
#include <mutex>
#include <unordered_map>

namespace myriad::hf {

// (left, right) -> (rank, result): open addressing over 64-bit keys.
struct BytePairEncoder::PairTable {
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0, result = 0;
  };
  static constexpr uint64_t kEmpty = ~0ULL;  // ids are >= 0, so no key is all ones

  explicit PairTable(size_t entries) {
    size_t capacity = 16;
    while (capacity < 2 * entries) capacity <<= 1;
    slots.resize(capacity);
    mask = capacity - 1;
  }
  static uint64_t Key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  static uint64_t Mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  Slot* SlotFor(uint64_t key) {
    for (uint64_t i = Mix(key) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == key || slots[i].key == kEmpty) return &slots[i];
    }
  }
  const Slot* Find(int32_t left, int32_t right) const {
    const uint64_t key = Key(left, right);
    for (uint64_t i = Mix(key) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == key) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }

  std::vector<Slot> slots;
  uint64_t mask = 0;
};

// Word -> tokens, in shards with a lock each; a full shard is emptied.
struct BytePairEncoder::WordCache {
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxWordBytes = 256;  // longer words are merged every time
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> words;
  };
  explicit WordCache(size_t capacity) : per_shard(std::max<size_t>(1, capacity / kShards)) {}
  Shard& ShardFor(std::string_view word) { return shards[Hash()(word) % kShards]; }

  size_t per_shard;
  std::array<Shard, kShards> shards;
};

BytePairEncoder::BytePairEncoder(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges,
                                 size_t cache_words)
    : byte_ids_(byte_ids), pairs_(std::make_unique<PairTable>(merges.size())) {
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    // A merge listed twice keeps its later rank, as in Hugging Face's table.
    PairTable::Slot* slot = pairs_->SlotFor(PairTable::Key(merges[rank].left, merges[rank].right));
    slot->key = PairTable::Key(merges[rank].left, merges[rank].right);
    slot->rank = static_cast<int32_t>(rank);
    slot->result = merges[rank].result;
  }
  if (cache_words > 0) cache_ = std::make_unique<WordCache>(cache_words);
}

BytePairEncoder::~BytePairEncoder() = default;

void BytePairEncoder::Encode(std::string_view word, std::vector<int32_t>* out) const {
  if (word.size() == 1) {
    out->push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (!cache_ || word.size() > WordCache::kMaxWordBytes) {
    MergeWord(word, out);
    return;
  }
  WordCache::Shard& shard = cache_->ShardFor(word);
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.words.find(word);
    if (it != shard.words.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out->size();
  MergeWord(word, out);
  std::vector<int32_t> tokens(out->begin() + static_cast<std::ptrdiff_t>(first), out->end());
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.words.size() >= cache_->per_shard) shard.words.clear();
  shard.words.emplace(std::string(word), std::move(tokens));
}

void BytePairEncoder::MergeWord(std::string_view word, std::vector<int32_t>* out) const {
  const int32_t n = static_cast<int32_t>(word.size());
  // Symbols form a linked list over the byte positions; a symbol keeps the
  // position of its first byte, and a merged-away symbol gets id -1.
  std::vector<int32_t> id(n), prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    id[i] = byte_ids_[static_cast<unsigned char>(word[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank, pos, left, right, result;
    // The heap's top is the lowest rank, then the leftmost position.
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Candidate> heap;
  heap.reserve(static_cast<size_t>(n));
  auto consider = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    const PairTable::Slot* m = pairs_->Find(id[pos], id[next[pos]]);
    if (m == nullptr) return;
    heap.push_back({m->rank, pos, id[pos], id[next[pos]], m->result});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate c = heap.back();
    heap.pop_back();
    // Skip entries made stale by an earlier merge at or next to them.
    if (id[c.pos] != c.left || next[c.pos] < 0 || id[next[c.pos]] != c.right) continue;
    const int32_t right = next[c.pos];
    id[c.pos] = c.result;
    id[right] = -1;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out->push_back(id[i]);
}

}  // namespace myriad::hf
