#include "serve/kvcache/tier.h"

#include <cstring>

#include "core/checksum.h"

namespace myriad::serve {

std::string ModelFingerprint::hex() const { return ChecksumHex(value); }

BlockKey ChainKey(BlockKey parent, const int32_t* tokens, int n, const ModelFingerprint& fp) {
  // [parent u64][fingerprint u64][n i32][tokens i32 x n], hashed in one pass.
  // The count is hashed so that a short block never collides with a prefix
  // of a longer one; the fingerprint so that two models never share a key.
  std::string buf(8 + 8 + 4 + 4 * static_cast<size_t>(n), '\0');
  char* p = buf.data();
  std::memcpy(p, &parent, 8);
  std::memcpy(p + 8, &fp.value, 8);
  const int32_t count = n;
  std::memcpy(p + 16, &count, 4);
  if (n > 0) std::memcpy(p + 20, tokens, 4 * static_cast<size_t>(n));
  return Checksum64(buf.data(), buf.size());
}

int64_t BlockFloats(const ModelConfig& cfg) {
  return cfg.n_layers * kBlockTokens * cfg.kv_cache_floats_per_token_layer() +
         cfg.dsa_indexer_layers() * kBlockTokens * cfg.dsa_index_dim;
}

std::vector<bool> KvTier::ContainsMany(const std::vector<BlockKey>& keys) {
  std::vector<bool> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out[i] = Contains(keys[i]);
  return out;
}

}  // namespace myriad::serve
