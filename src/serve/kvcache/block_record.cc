#include "serve/kvcache/block_record.h"

#include <cstring>

#include "core/checksum.h"
#include "core/log.h"

namespace myriad::serve {

std::string EncodeBlockRecord(const KvBlock& b, const ModelFingerprint& fp) {
  const size_t payload = b.data.size() * sizeof(float);
  BlockRecordHeader h;
  h.magic = kBlockRecordMagic;
  h.version = kBlockRecordVersion;
  h.fingerprint = fp.value;
  h.key = b.key;
  h.float_count = b.data.size();
  h.checksum = Checksum64(b.data.data(), payload);
  std::string out(kBlockRecordHeaderBytes + payload, '\0');
  char* p = out.data();
  std::memcpy(p + 0, &h.magic, 4);
  std::memcpy(p + 4, &h.version, 4);
  std::memcpy(p + 8, &h.fingerprint, 8);
  std::memcpy(p + 16, &h.key, 8);
  std::memcpy(p + 24, &h.float_count, 8);
  std::memcpy(p + 32, &h.checksum, 8);
  if (payload) std::memcpy(p + kBlockRecordHeaderBytes, b.data.data(), payload);
  return out;
}

bool ParseBlockRecordHeader(std::string_view r, BlockRecordHeader* h) {
  if (r.size() < kBlockRecordHeaderBytes) return false;
  const char* p = r.data();
  std::memcpy(&h->magic, p + 0, 4);
  std::memcpy(&h->version, p + 4, 4);
  std::memcpy(&h->fingerprint, p + 8, 8);
  std::memcpy(&h->key, p + 16, 8);
  std::memcpy(&h->float_count, p + 24, 8);
  std::memcpy(&h->checksum, p + 32, 8);
  return h->magic == kBlockRecordMagic && h->version == kBlockRecordVersion;
}

Status DecodeBlockRecord(std::string_view r, const ModelFingerprint& fp, BlockKey expect_key,
                         int64_t expect_floats, KvBlock* out) {
  BlockRecordHeader h;
  if (r.size() < kBlockRecordHeaderBytes)
    return Status::Error("kv block record: " + std::to_string(r.size()) +
                         " bytes, shorter than its 40-byte header (truncated)");
  if (!ParseBlockRecordHeader(r, &h))
    return Status::Error("kv block record: bad magic or format version " +
                         std::to_string(h.version) + " (expected " +
                         std::to_string(kBlockRecordVersion) + ")");
  if (h.fingerprint != fp.value)
    return Status::Error("kv block record: model fingerprint " + ChecksumHex(h.fingerprint) +
                         " is not this model's " + fp.hex());
  if (h.key != expect_key)
    return Status::Error("kv block record: key " + ChecksumHex(h.key) + " where " +
                         ChecksumHex(expect_key) + " was asked for");
  const uint64_t payload = r.size() - kBlockRecordHeaderBytes;
  if (h.float_count > payload / sizeof(float) || payload != h.float_count * sizeof(float))
    return Status::Error("kv block record: header says " + std::to_string(h.float_count) +
                         " floats but the payload holds " + std::to_string(payload) +
                         " bytes (truncated or torn)");
  if (expect_floats > 0 && h.float_count != static_cast<uint64_t>(expect_floats))
    return Status::Error("kv block record: " + std::to_string(h.float_count) +
                         " floats where this model's blocks have " + std::to_string(expect_floats));
  const char* payload_ptr = r.data() + kBlockRecordHeaderBytes;
  if (Checksum64(payload_ptr, payload) != h.checksum)
    return Status::Error("kv block record: payload checksum mismatch (corrupt)");
  out->key = h.key;
  out->data.resize(h.float_count);
  if (payload) std::memcpy(out->data.data(), payload_ptr, payload);
  return Status::Ok();
}

void LogTierError(const char* tier, int64_t n_errors, const std::string& what) {
  if (n_errors > 0 && (n_errors & (n_errors - 1)) == 0)
    LOG_WARN("%s kv tier: %s (error %lld; a cache error only costs a recompute)", tier, what.c_str(),
             static_cast<long long>(n_errors));
}

}  // namespace myriad::serve
