#include "data/shards.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "core/checksum.h"

namespace myriad {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; add byte swapping for this host");

namespace {

constexpr const char* kRegenerateHint = "(hint: re-run `myriad prepare` to rewrite the shards)";

template <typename T>
T LoadLE(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void StoreLE(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

uint32_t HeaderChecksum(const uint8_t* header) {
  uint8_t copy[kShardHeaderBytes];
  std::memcpy(copy, header, kShardHeaderBytes);
  std::memset(copy + 20, 0, 4);
  return static_cast<uint32_t>(Checksum64(copy, kShardHeaderBytes));
}

uint64_t PaddedTokenBytes(uint64_t token_count, int token_bytes) {
  uint64_t raw = token_count * static_cast<uint64_t>(token_bytes);
  return (raw + 7) & ~uint64_t{7};
}

}  // namespace

std::string ShardFileName(const std::string& split, int index) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "_%03d.bin", index);
  return split + buf;
}

ShardWriter::ShardWriter(std::string path, uint32_t vocab_size, Env* env)
    : path_(std::move(path)), vocab_size_(vocab_size), env_(env) {
  CHECK_MSG(vocab_size_ > 0 && vocab_size_ <= (1u << 31), "%s: vocab_size=%u out of range",
            path_.c_str(), vocab_size_);
  token_bytes_ = vocab_size_ <= 65536 ? 2 : 4;
}

Status ShardWriter::AppendDocument(const int32_t* tokens, size_t count) {
  CHECK_MSG(!finished_, "%s: AppendDocument after Finish", path_.c_str());
  for (size_t i = 0; i < count; ++i) {
    if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= vocab_size_) {
      return Status::Error(path_ + ": document " + std::to_string(num_documents()) + " has id " +
                           std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                           " outside vocab_size=" + std::to_string(vocab_size_) +
                           " (hint: the tokenizer and the shard disagree on the vocabulary)");
    }
  }
  size_t at = payload_.size();
  payload_.resize(at + count * token_bytes_);
  char* p = payload_.data() + at;
  if (token_bytes_ == 2) {
    for (size_t i = 0; i < count; ++i) StoreLE<uint16_t>(p + 2 * i, static_cast<uint16_t>(tokens[i]));
  } else {
    for (size_t i = 0; i < count; ++i) StoreLE<uint32_t>(p + 4 * i, static_cast<uint32_t>(tokens[i]));
  }
  token_count_ += count;
  doc_offsets_.push_back(token_count_);
  return Status::Ok();
}

Status ShardWriter::Finish() {
  CHECK_MSG(!finished_, "%s: Finish called twice", path_.c_str());
  finished_ = true;
  payload_.resize(PaddedTokenBytes(token_count_, token_bytes_), '\0');
  size_t at = payload_.size();
  payload_.resize(at + doc_offsets_.size() * 8);
  for (size_t d = 0; d < doc_offsets_.size(); ++d) StoreLE<uint64_t>(payload_.data() + at + 8 * d, doc_offsets_[d]);

  char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, 8);
  StoreLE<uint32_t>(header + 8, kShardVersion);
  StoreLE<uint16_t>(header + 12, static_cast<uint16_t>(token_bytes_));
  StoreLE<uint32_t>(header + 16, vocab_size_);
  StoreLE<uint64_t>(header + 24, token_count_);
  StoreLE<uint64_t>(header + 32, num_documents());
  StoreLE<uint64_t>(header + 40, Checksum64(payload_.data(), payload_.size()));
  StoreLE<uint32_t>(header + 20, HeaderChecksum(reinterpret_cast<const uint8_t*>(header)));

  const std::string tmp = path_ + ".tmp";
  Status s;
  {
    auto file = env_->NewWritableFile(tmp);
    if (!file.ok()) return file.status();
    s = (*file)->Append(std::string_view(header, sizeof(header)));
    // Append in slices so a fault-injecting Env sees realistic write sizes.
    constexpr size_t kSlice = 8 << 20;
    for (size_t off = 0; s.ok() && off < payload_.size(); off += kSlice) {
      s = (*file)->Append(std::string_view(payload_).substr(off, kSlice));
    }
    if (s.ok()) s = (*file)->Sync();
    Status c = (*file)->Close();
    if (s.ok()) s = c;
  }
  if (s.ok()) s = env_->RenameFile(tmp, path_);
  if (!s.ok()) {
    (void)env_->RemoveAll(tmp);
    return s;
  }
  std::string().swap(payload_);
  std::string dir = std::filesystem::path(path_).parent_path().string();
  return env_->SyncDir(dir.empty() ? "." : dir);
}

Result<ShardReader> ShardReader::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  const uint8_t* p = file.data();
  const uint64_t size = file.size();
  auto fail = [&](const std::string& what) { return Status::Error(path + ": " + what); };

  if (size < kShardHeaderBytes) {
    return fail("truncated: " + std::to_string(size) + " bytes, shorter than the " +
                std::to_string(kShardHeaderBytes) + "-byte shard header " + kRegenerateHint);
  }
  if (std::memcmp(p, kShardMagic, 8) != 0) {
    std::string got;
    for (int i = 0; i < 8; ++i) got += (p[i] >= 0x20 && p[i] < 0x7F) ? static_cast<char>(p[i]) : '?';
    return fail("not a Myriad token shard: magic \"" + got + "\", expected \"MYRTOK01\" " +
                kRegenerateHint);
  }
  const uint32_t version = LoadLE<uint32_t>(p + 8);
  if (version != kShardVersion) {
    return fail("unsupported shard version " + std::to_string(version) + " (this build reads " +
                std::to_string(kShardVersion) + ") " + kRegenerateHint);
  }
  const uint32_t header_checksum = LoadLE<uint32_t>(p + 20);
  if (header_checksum != HeaderChecksum(p)) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%08x does not match its content (%08x)", header_checksum,
                  HeaderChecksum(p));
    return fail(std::string("corrupt header: header checksum ") + buf + " " + kRegenerateHint);
  }
  const uint16_t token_bytes = LoadLE<uint16_t>(p + 12);
  if (token_bytes != 2 && token_bytes != 4) {
    return fail("corrupt header: token_bytes=" + std::to_string(token_bytes) + ", expected 2 or 4 " +
                kRegenerateHint);
  }
  const uint32_t vocab_size = LoadLE<uint32_t>(p + 16);
  const uint64_t token_count = LoadLE<uint64_t>(p + 24);
  const uint64_t document_count = LoadLE<uint64_t>(p + 32);
  const uint64_t checksum = LoadLE<uint64_t>(p + 40);
  if (vocab_size == 0 || vocab_size > (1u << 31) || (token_bytes == 2 && vocab_size > 65536)) {
    return fail("corrupt header: vocab_size=" + std::to_string(vocab_size) + " with " +
                std::to_string(token_bytes) + "-byte ids " + kRegenerateHint);
  }
  // Sizes, guarding against overflow from a corrupt header.
  const uint64_t body = size - kShardHeaderBytes;
  const uint64_t tokens_in_file = body / token_bytes;
  if (token_count > body / token_bytes || document_count > body / 8) {
    return fail("truncated: header says " + std::to_string(token_count) + " tokens and " +
                std::to_string(document_count) + " documents but file holds " +
                std::to_string(tokens_in_file) + " tokens (" + std::to_string(size) + " bytes) " +
                kRegenerateHint);
  }
  const uint64_t expected =
      kShardHeaderBytes + PaddedTokenBytes(token_count, token_bytes) + (document_count + 1) * 8;
  if (size < expected) {
    return fail("truncated: header says " + std::to_string(token_count) + " tokens and " +
                std::to_string(document_count) + " documents (" + std::to_string(expected) +
                " bytes) but file holds " + std::to_string(size) + " bytes " + kRegenerateHint);
  }
  if (size > expected) {
    return fail("corrupt: " + std::to_string(size - expected) +
                " trailing bytes after the document index (header says " +
                std::to_string(token_count) + " tokens, " + std::to_string(document_count) +
                " documents) " + kRegenerateHint);
  }
  const uint64_t actual = Checksum64(p + kShardHeaderBytes, body);
  if (actual != checksum) {
    return fail("corrupt: payload checksum " + ChecksumHex(actual) + " does not match header " +
                ChecksumHex(checksum) + " (the file was damaged after it was written) " +
                kRegenerateHint);
  }

  ShardReader r;
  r.tokens_ = p + kShardHeaderBytes;
  r.index_ = r.tokens_ + PaddedTokenBytes(token_count, token_bytes);
  r.token_count_ = token_count;
  r.document_count_ = document_count;
  r.vocab_size_ = vocab_size;
  r.token_bytes_ = token_bytes;
  // The checksum matched, so these only fail for a file written by a buggy or
  // foreign writer; still report them rather than trust them.
  uint64_t prev = 0;
  for (uint64_t d = 0; d <= document_count; ++d) {
    uint64_t off = LoadLE<uint64_t>(r.index_ + 8 * d);
    if ((d == 0 && off != 0) || off < prev || off > token_count ||
        (d == document_count && off != token_count)) {
      return fail("corrupt document index: entry " + std::to_string(d) + " is " +
                  std::to_string(off) + " (previous " + std::to_string(prev) + ", " +
                  std::to_string(token_count) + " tokens) " + kRegenerateHint);
    }
    prev = off;
  }
  for (uint64_t i = 0; i < token_count; ++i) {
    uint32_t id = token_bytes == 2 ? LoadLE<uint16_t>(r.tokens_ + 2 * i)
                                   : LoadLE<uint32_t>(r.tokens_ + 4 * i);
    if (id >= vocab_size) {
      return fail("token " + std::to_string(id) + " at position " + std::to_string(i) +
                  " is outside vocab_size=" + std::to_string(vocab_size) + " " + kRegenerateHint);
    }
  }
  r.file_ = std::move(file);  // the mapping's address does not change on move
  return r;
}

int32_t ShardReader::token(uint64_t i) const {
  CHECK(i < token_count_);
  return token_bytes_ == 2 ? static_cast<int32_t>(LoadLE<uint16_t>(tokens_ + 2 * i))
                           : static_cast<int32_t>(LoadLE<uint32_t>(tokens_ + 4 * i));
}

void ShardReader::Read(uint64_t begin, uint64_t count, int32_t* out) const {
  CHECK_MSG(begin <= token_count_ && count <= token_count_ - begin,
            "%s: read [%llu, +%llu) past %llu tokens", path().c_str(),
            static_cast<unsigned long long>(begin), static_cast<unsigned long long>(count),
            static_cast<unsigned long long>(token_count_));
  if (token_bytes_ == 2) {
    const uint8_t* p = tokens_ + 2 * begin;
    for (uint64_t i = 0; i < count; ++i) out[i] = LoadLE<uint16_t>(p + 2 * i);
  } else {
    std::memcpy(out, tokens_ + 4 * begin, count * 4);
  }
}

std::pair<uint64_t, uint64_t> ShardReader::document_range(uint64_t d) const {
  CHECK(d < document_count_);
  return {LoadLE<uint64_t>(index_ + 8 * d), LoadLE<uint64_t>(index_ + 8 * (d + 1))};
}

std::vector<int32_t> ShardReader::ReadDocument(uint64_t d) const {
  auto [b, e] = document_range(d);
  std::vector<int32_t> out(e - b);
  Read(b, e - b, out.data());
  return out;
}

}  // namespace myriad
