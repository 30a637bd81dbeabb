#include "core/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <toml++/toml.h>

namespace myriad {

ConfigDoc::~ConfigDoc() = default;

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

// Parses the value half of "key=value" as TOML (numbers, booleans, quoted
// strings); anything that is not valid TOML is taken as a bare string.
Status ApplyOverride(toml::table& root, const std::string& kv) {
  auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0)
    return Status::Error("--set " + kv + ": expected key=value (hint: --set train.lr=3e-4)");
  std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
    auto* v = parsed.get("v");
    if (!(v->is_integer() || v->is_floating_point() || v->is_boolean() || v->is_string()))
      return Status::Error("--set " + kv + ": only numbers, booleans and strings can be set");
  } catch (const toml::parse_error&) {
    parsed = toml::table{};
    parsed.insert("v", value);  // not TOML: a bare string
  }
  // Walk/create the dotted path.
  toml::table* t = &root;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) return Status::Error("--set " + kv + ": empty key segment");
    if (dot == std::string::npos) {
      parsed.get("v")->visit([&](auto&& n) { t->insert_or_assign(part, n); });
      break;
    }
    auto* child = t->get(part);
    if (!child) {
      t->insert(part, toml::table{});
      child = t->get(part);
    }
    if (!child->is_table()) return Status::Error("--set " + kv + ": " + part + " is not a table");
    t = child->as_table();
    start = dot + 1;
  }
  return Status::Ok();
}

// A decimal integer (sign, digits, '_' separators) beyond int64.
bool TooLargeForInt64(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (!s.empty() && s[0] == '+') s.erase(0, 1);
  if (s.empty() || s.find_first_not_of("-0123456789") != std::string::npos) return false;
  int64_t v;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc::result_out_of_range && end == s.data() + s.size();
}

void CollectKeys(const toml::table& t, const std::string& prefix, std::vector<std::string>* out) {
  for (auto&& [k, v] : t) {
    std::string full = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (v.is_table()) CollectKeys(*v.as_table(), full, out);
    else out->push_back(full);
  }
}

}  // namespace

Result<std::unique_ptr<ConfigDoc>> ConfigDoc::Parse(const std::string& text, const std::string& source,
                                                    const std::vector<std::string>& overrides) {
  std::unique_ptr<ConfigDoc> doc(new ConfigDoc());
  doc->source_ = source;
  try {
    doc->table_ = std::make_unique<toml::table>(toml::parse(text, source));
  } catch (const toml::parse_error& e) {
    std::ostringstream ss;
    ss << source << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
       << e.description() << " (hint: the file must be valid TOML)";
    return Status::Error(ss.str());
  }
  for (const auto& kv : overrides) RETURN_IF_ERROR(ApplyOverride(*doc->table_, kv));
  return doc;
}

Result<std::unique_ptr<ConfigDoc>> ConfigDoc::Load(const std::string& path,
                                                   const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) return Status::Error(path + ": cannot open config (hint: pass --config with a path to a .toml file)");
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), path, overrides);
}

bool ConfigDoc::Has(const std::string& key) const {
  return static_cast<bool>(table_->at_path(key));
}

void ConfigDoc::Fail(const std::string& message) {
  if (first_error_.empty()) first_error_ = source_ + ": " + message;
}

std::string OutOfRange(const std::string& key, int64_t v, int64_t lo, int64_t hi) {
  return key + "=" + std::to_string(v) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) +
         "] (hint: docs/config.md lists each key's range)";
}

int64_t ConfigDoc::GetInt(const std::string& key, int64_t def) {
  return GetInt(key, def, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
}

int64_t ConfigDoc::GetInt(const std::string& key, int64_t def, int64_t lo, int64_t hi) {
  read_keys_.insert(key);
  auto node = table_->at_path(key);
  if (!node) return def;
  if (auto v = node.value<int64_t>(); v && node.is_integer()) {
    if (*v >= lo && *v <= hi) return *v;
    Fail(OutOfRange(key, *v, lo, hi));
    return def;
  }
  // Digits that TOML could not hold (a --set value too large for 64 bits
  // arrives as a bare string): say so rather than "not an integer".
  if (auto s = node.value<std::string>(); s && TooLargeForInt64(*s)) {
    Fail(key + "=" + *s + " does not fit in a 64-bit integer (range [" + std::to_string(lo) + ", " +
         std::to_string(hi) + "])");
    return def;
  }
  Fail(key + " must be an integer (hint: write it without quotes or a decimal point)");
  return def;
}

std::vector<int64_t> ConfigDoc::GetIntList(const std::string& key, int64_t lo, int64_t hi) {
  read_keys_.insert(key);
  auto node = table_->at_path(key);
  std::vector<int64_t> out;
  if (!node) return out;
  const toml::array* arr = node.as_array();
  if (!arr) {
    Fail(key + " must be a list of integers (hint: e.g. [1, 3])");
    return out;
  }
  for (const auto& el : *arr) {
    auto v = el.value<int64_t>();
    if (!v || !el.is_integer()) {
      Fail(key + " must be a list of integers (hint: e.g. [1, 3])");
      return {};
    }
    if (*v < lo || *v > hi) {
      Fail(OutOfRange(key + "[]", *v, lo, hi));
      return {};
    }
    out.push_back(*v);
  }
  return out;
}

double ConfigDoc::GetFloat(const std::string& key, double def) {
  read_keys_.insert(key);
  auto node = table_->at_path(key);
  if (!node) return def;
  if (node.is_floating_point() || node.is_integer()) {
    const double v = *node.value<double>();
    if (std::isfinite(v)) return v;
    Fail(key + "=" + (std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf") + " must be a finite number");
    return def;
  }
  Fail(key + " must be a number");
  return def;
}

bool ConfigDoc::GetBool(const std::string& key, bool def) {
  read_keys_.insert(key);
  auto node = table_->at_path(key);
  if (!node) return def;
  if (node.is_boolean()) return *node.value<bool>();
  if (node.is_string()) {
    auto s = *node.value<std::string>();
    if (s == "true") return true;
    if (s == "false") return false;
  }
  Fail(key + " must be true or false");
  return def;
}

std::string ConfigDoc::GetString(const std::string& key, const std::string& def) {
  read_keys_.insert(key);
  auto node = table_->at_path(key);
  if (!node) return def;
  if (node.is_string()) return *node.value<std::string>();
  Fail(key + " must be a string (hint: put it in double quotes)");
  return def;
}

Status ConfigDoc::Finish() {
  if (!first_error_.empty()) return Status::Error(first_error_);
  std::vector<std::string> keys;
  CollectKeys(*table_, "", &keys);
  for (const auto& k : keys) {
    if (read_keys_.count(k)) continue;
    std::string best;
    size_t best_d = 1000;
    for (const auto& r : read_keys_) {
      size_t d = EditDistance(k, r);
      if (d < best_d) best_d = d, best = r;
    }
    std::string msg = source_ + ": unknown key " + k;
    if (!best.empty() && best_d <= 4) msg += " (hint: did you mean " + best + "?)";
    else msg += " (hint: see docs/config.md for the known keys)";
    return Status::Error(msg);
  }
  return Status::Ok();
}

}  // namespace myriad
