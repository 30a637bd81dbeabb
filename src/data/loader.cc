#include "data/loader.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>

#include "core/check.h"
#include "core/env.h"
#include "core/log.h"
#include "core/rng.h"

namespace myriad {

nlohmann::json DataCursor::ToJson() const {
  return nlohmann::json{{"epoch", epoch}, {"index", index}, {"seed", seed}};
}

Result<DataCursor> DataCursor::FromJson(const nlohmann::json& json) {
  const std::string hint = " (hint: the cursor comes from a checkpoint manifest's \"data_cursor\"; "
                           "expected {\"epoch\": N, \"index\": N, \"seed\": N})";
  if (!json.is_object()) {
    return Status::Error("data cursor: expected a JSON object, got " + json.dump() + hint);
  }
  DataCursor c;
  for (auto [name, field] : {std::pair<const char*, uint64_t*>{"epoch", &c.epoch},
                             {"index", &c.index}, {"seed", &c.seed}}) {
    auto it = json.find(name);
    if (it == json.end()) {
      return Status::Error(std::string("data cursor: field '") + name + "' is missing in " +
                           json.dump() + hint);
    }
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
      return Status::Error(std::string("data cursor: field '") + name + "' is " + it->dump() +
                           ", not a non-negative integer" + hint);
    }
    *field = it->get<uint64_t>();
  }
  return c;
}

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

bool IsSafeSplitName(const std::string& s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '.';
  });
}

}  // namespace

Result<std::unique_ptr<DataLoader>> DataLoader::Open(const std::string& data_dir,
                                                     const std::string& split, int seq_len,
                                                     uint64_t seed) {
  const std::string where = data_dir + "/" + split;
  if (!IsSafeSplitName(split)) {
    return Status::Error(data_dir + ": bad split name '" + split +
                         "' (hint: use \"train\" or \"val\")");
  }
  if (seq_len < 1) {
    return Status::Error(where + ": seq_len=" + std::to_string(seq_len) +
                         " must be at least 1 (hint: set model.seq_len, e.g. 256)");
  }
  Env* env = Env::Default();
  auto names = env->ListDir(data_dir);
  if (!names.ok()) {
    return Status::Error(names.status().message() +
                         " (hint: run `myriad prepare --out " + data_dir + "` first)");
  }
  // <split>_NNN.bin, numbered 000, 001, ... without gaps.
  std::map<int, std::string> numbered;
  const std::string prefix = split + "_";
  for (const auto& name : names.value()) {
    if (name.size() <= prefix.size() + 4 || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - 4, 4, ".bin") != 0) {
      continue;
    }
    std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 4);
    if (digits.empty() || digits.size() > 6 ||
        !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); })) {
      continue;
    }
    numbered[std::stoi(digits)] = name;
  }
  if (numbered.empty()) {
    return Status::Error(data_dir + ": no " + split + "_*.bin shards (hint: run `myriad prepare --out " +
                         data_dir + "`, or check the data folder and split name)");
  }
  int expected = 0;
  for (const auto& [number, name] : numbered) {
    if (number != expected) {
      return Status::Error(data_dir + "/" + ShardFileName(split, expected) + ": missing, but " + name +
                           " exists (hint: the shard set is incomplete; re-run `myriad prepare`)");
    }
    ++expected;
  }

  std::unique_ptr<DataLoader> loader(new DataLoader());
  loader->data_dir_ = data_dir;
  loader->split_ = split;
  loader->seq_len_ = seq_len;
  for (const auto& [number, name] : numbered) {
    ASSIGN_OR_RETURN(ShardReader shard, ShardReader::Open(data_dir + "/" + name));
    if (loader->vocab_size_ == 0) loader->vocab_size_ = shard.vocab_size();
    if (shard.vocab_size() != loader->vocab_size_) {
      return Status::Error(shard.path() + ": vocab_size=" + std::to_string(shard.vocab_size()) +
                           " differs from " + std::to_string(loader->vocab_size_) + " in " +
                           loader->shards_.front().path() +
                           " (hint: shards from two prepare runs are mixed; re-run `myriad prepare`)");
    }
    if (shard.num_tokens() == 0) continue;
    loader->shard_start_.push_back(loader->num_tokens_);
    loader->num_tokens_ += shard.num_tokens();
    loader->shards_.push_back(std::move(shard));
  }
  const uint64_t window = static_cast<uint64_t>(seq_len) + 1;
  if (loader->num_tokens_ < window) {
    return Status::Error(where + ": " + std::to_string(loader->num_tokens_) +
                         " tokens are too few for one row of seq_len+1=" + std::to_string(window) +
                         " tokens (hint: lower seq_len, or give this split more text, e.g. a "
                         "larger val_fraction or corpus)");
  }
  loader->num_rows_ = (loader->num_tokens_ - 1) / static_cast<uint64_t>(seq_len);
  loader->seed_ = seed;
  loader->BuildPermutation(seed, 0, &loader->perm_);
  return loader;
}

void DataLoader::BuildPermutation(uint64_t seed, uint64_t epoch, std::vector<uint64_t>* perm) const {
  perm->resize(num_rows_);
  for (uint64_t i = 0; i < num_rows_; ++i) (*perm)[i] = i;
  Rng rng(SplitMix64(seed) ^ SplitMix64(epoch ^ 0x6a09e667f3bcc909ULL));
  for (uint64_t i = num_rows_; i > 1; --i) {
    uint64_t j = rng.Below(i);
    std::swap((*perm)[i - 1], (*perm)[j]);
  }
}

uint64_t DataLoader::RowAt(uint64_t seed, uint64_t epoch, uint64_t index) const {
  CHECK(index < num_rows_);
  if (seed == seed_ && epoch == epoch_) return perm_[index];
  std::vector<uint64_t> perm;
  BuildPermutation(seed, epoch, &perm);
  return perm[index];
}

void DataLoader::ReadTokens(uint64_t begin, uint64_t count, int32_t* out) const {
  CHECK_MSG(begin <= num_tokens_ && count <= num_tokens_ - begin,
            "%s/%s: token range past the end", data_dir_.c_str(), split_.c_str());
  size_t s = static_cast<size_t>(
      std::upper_bound(shard_start_.begin(), shard_start_.end(), begin) - shard_start_.begin() - 1);
  while (count > 0) {
    const ShardReader& shard = shards_[s];
    uint64_t local = begin - shard_start_[s];
    uint64_t n = std::min(count, shard.num_tokens() - local);
    shard.Read(local, n, out);
    out += n;
    begin += n;
    count -= n;
    ++s;
  }
}

void DataLoader::ReadRow(uint64_t row, int32_t* out) const {
  CHECK(row < num_rows_);
  ReadTokens(row * static_cast<uint64_t>(seq_len_), static_cast<uint64_t>(seq_len_) + 1, out);
}

void DataLoader::NextBatch(int batch, int32_t* out) {
  for (int b = 0; b < batch; ++b) {
    if (index_ >= num_rows_) {
      ++epoch_;
      index_ = 0;
      BuildPermutation(seed_, epoch_, &perm_);
    }
    ReadRow(perm_[index_++], out + static_cast<size_t>(b) * (seq_len_ + 1));
  }
}

Status DataLoader::Seek(const DataCursor& cursor) {
  if (cursor.index > num_rows_) {
    return Status::Error(data_dir_ + "/" + split_ + ": data cursor index " +
                         std::to_string(cursor.index) + " is beyond the " +
                         std::to_string(num_rows_) + " rows of seq_len=" + std::to_string(seq_len_) +
                         " (hint: the data or seq_len changed since the checkpoint was written)");
  }
  if (cursor.seed != seed_) {
    LOG_WARN("%s/%s: resuming with the cursor's data seed %llu, not the configured %llu",
             data_dir_.c_str(), split_.c_str(), static_cast<unsigned long long>(cursor.seed),
             static_cast<unsigned long long>(seed_));
  }
  if (cursor.seed != seed_ || cursor.epoch != epoch_) {
    BuildPermutation(cursor.seed, cursor.epoch, &perm_);
  }
  seed_ = cursor.seed;
  epoch_ = cursor.epoch;
  index_ = cursor.index;
  return Status::Ok();
}

}  // namespace myriad
