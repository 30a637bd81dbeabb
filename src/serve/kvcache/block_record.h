// The serialized form of a KV block, shared by the disk (T2) and Redis (T3)
// tiers: a fixed 40-byte little-endian header, then the fp32 payload.
//
//   offset  size  field
//        0     4  magic "MKVB"
//        4     4  format version (kBlockRecordVersion)
//        8     8  model fingerprint
//       16     8  block key
//       24     8  float count n
//       32     8  xxHash64 (core/checksum.h) of the payload bytes
//       40   4*n  payload: n fp32, [layer][k|v][token][Hkv*D]
//
// Decoding checks every field against what the reader expects, so a torn,
// truncated, bit-flipped or foreign record is refused rather than used.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "serve/kvcache/tier.h"

namespace myriad::serve {

constexpr uint32_t kBlockRecordMagic = 0x42564b4d;  // "MKVB" in file order
constexpr uint32_t kBlockRecordVersion = 1;
constexpr size_t kBlockRecordHeaderBytes = 40;

struct BlockRecordHeader {
  uint32_t magic = 0, version = 0;
  uint64_t fingerprint = 0, key = 0, float_count = 0, checksum = 0;
};

std::string EncodeBlockRecord(const KvBlock& b, const ModelFingerprint& fp);

// Parses only the header (no payload checksum): false when `record` is
// shorter than a header or its magic/version are not ours.
bool ParseBlockRecordHeader(std::string_view record, BlockRecordHeader* h);

// Full check: magic, version, fingerprint, key (`expect_key`), payload size
// (against the header and, when expect_floats > 0, against that), checksum.
// The error names the field that disagreed.
Status DecodeBlockRecord(std::string_view record, const ModelFingerprint& fp, BlockKey expect_key,
                         int64_t expect_floats, KvBlock* out);

// Warns on stderr about a tier failure when its error count is a power of
// two (1, 2, 4, ...): visible, but a dead Redis does not flood the log.
void LogTierError(const char* tier, int64_t n_errors, const std::string& what);

}  // namespace myriad::serve
