// Config: TOML documents with command-line overrides and typed, checked reads.
//
//   auto doc = ConfigDoc::Load("configs/demo-moe.toml", {"train.lr=3e-4"});
//   int64_t d = doc->GetInt("model.d_model", 256);
//   ...
//   RETURN_IF_ERROR(doc->Finish());   // errors: bad types, unknown keys
//
// Every read names its default, so the struct that reads the config is also
// the documentation of the defaults. Reads never fail on their own; the first
// problem is kept and reported by Finish(), which also rejects keys that no
// reader asked for (typos), naming the closest known key as a hint.
//
// Numbers are never taken on trust: GetFloat refuses inf and nan (no key
// means either), and GetInt with a range refuses a value outside it, or one
// that does not fit in 64 bits, instead of truncating or wrapping it
// ("train.threads=100000 is out of range [0, 1024]"; docs/config.md lists
// every key's range).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"

namespace toml {
inline namespace v3 {
class table;
}
}  // namespace toml

namespace myriad {

class ConfigDoc {
 public:
  ~ConfigDoc();
  // `source` names the document in messages (a path, or "<string>").
  static Result<std::unique_ptr<ConfigDoc>> Parse(const std::string& text,
                                                  const std::string& source,
                                                  const std::vector<std::string>& overrides = {});
  static Result<std::unique_ptr<ConfigDoc>> Load(const std::string& path,
                                                 const std::vector<std::string>& overrides = {});

  int64_t GetInt(const std::string& key, int64_t def);
  // The same, and the value must lie in [lo, hi].
  int64_t GetInt(const std::string& key, int64_t def, int64_t lo, int64_t hi);
  // A finite number (an integer is taken as one).
  double GetFloat(const std::string& key, double def);
  bool GetBool(const std::string& key, bool def);
  std::string GetString(const std::string& key, const std::string& def);
  // A list of integers, each in [lo, hi] ([] when absent).
  std::vector<int64_t> GetIntList(const std::string& key, int64_t lo, int64_t hi);
  bool Has(const std::string& key) const;

  // Records a validation problem found by the caller (first one wins).
  void Fail(const std::string& message);
  const std::string& source() const { return source_; }
  Status Finish();

 private:
  ConfigDoc() = default;
  std::string source_;
  std::unique_ptr<toml::table> table_;
  std::set<std::string> read_keys_;
  std::string first_error_;
};

// "key=v is out of range [lo, hi] (hint: ...)": the one message for a value
// outside its documented range (config reads and the checks of configs read
// from JSON).
std::string OutOfRange(const std::string& key, int64_t v, int64_t lo, int64_t hi);

// Edit distance, for "did you mean" hints.
size_t EditDistance(const std::string& a, const std::string& b);

}  // namespace myriad
