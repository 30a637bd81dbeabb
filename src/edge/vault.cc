// The Vault: one placeholder per distinct entity of a session, its JSON form
// and its atomic file.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/env.h"
#include "edge/normalize.h"
#include "edge/redact.h"

namespace myriad::edge {
namespace {

bool IsSpace(char32_t c) { return c == U' ' || c == U'\t' || c == U'\n' || c == U'\r' || c == U'\f' || c == U'\v'; }
char32_t Upper(char32_t c) { return c >= U'a' && c <= U'z' ? c - 32 : c; }
char32_t Lower(char32_t c) { return c >= U'A' && c <= U'Z' ? c + 32 : c; }

bool MobileBody(std::string_view d) { return d.size() == 11 && d[0] == '1' && d[1] >= '3' && d[1] <= '9'; }

constexpr char kFormat[] = "myriad-vault-1";

}  // namespace

std::string PlaceholderText(EntityType type, int index) {
  return std::string("\u27E6") + EntityTypeName(type) + "_" + std::to_string(index) + "\u27E7";
}

std::string EntityKey(EntityType type, std::string_view value) {
  const std::u32string t = Normalize(DecodeUtf8(value)).text;
  std::u32string k;
  switch (type) {
    case EntityType::kPhone:
    case EntityType::kResidentId:
    case EntityType::kBankCard:
    case EntityType::kSsn: {
      std::string d;
      for (char32_t c : t) {
        if (c >= U'0' && c <= U'9') d.push_back(static_cast<char>(c));
        if ((c == U'X' || c == U'x') && type == EntityType::kResidentId) d.push_back('X');
      }
      if (type == EntityType::kPhone) {
        if (d.size() == 15 && d.compare(0, 4, "0086") == 0 && MobileBody(std::string_view(d).substr(4))) d.erase(0, 4);
        if (d.size() == 13 && d.compare(0, 2, "86") == 0 && MobileBody(std::string_view(d).substr(2))) d.erase(0, 2);
      }
      return d;
    }
    case EntityType::kEmail:
    case EntityType::kIp:
      for (char32_t c : t)
        if (!IsSpace(c)) k.push_back(Lower(c));
      break;
    case EntityType::kCreditCode:
    case EntityType::kPassport:
    case EntityType::kPlate:
      for (char32_t c : t)
        if (!IsSpace(c) && c != U'-' && c != U'\u00B7' && c != U'\u2022' && c != U'\u30FB') k.push_back(Upper(c));
      break;
    default: {  // names, addresses, organisations, URLs: whitespace collapsed
      bool space = false;
      for (char32_t c : t) {
        if (IsSpace(c)) {
          space = !k.empty();
          continue;
        }
        if (space) k.push_back(U' ');
        space = false;
        k.push_back(c);
      }
    }
  }
  return EncodeUtf8(k);
}

void Vault::Add(Entry e) {
  const int type = static_cast<int>(e.type);
  by_key_.emplace(std::make_pair(type, e.key), entries_.size());  // a second form of a loaded key keeps the first
  by_index_.emplace(std::make_pair(type, e.index), entries_.size());
  int& next = next_index_[type];
  next = std::max(next, e.index + 1);
  entries_.push_back(std::move(e));
}

std::string Vault::Placeholder(EntityType type, std::string_view value) {
  std::string key = EntityKey(type, value);
  const auto it = by_key_.find({static_cast<int>(type), key});
  if (it != by_key_.end()) return PlaceholderText(type, entries_[it->second].index);
  const auto next = next_index_.find(static_cast<int>(type));
  const int index = next == next_index_.end() ? 1 : next->second;
  Add(Entry{type, index, std::string(value), std::move(key)});
  return PlaceholderText(type, index);
}

const std::string* Vault::Original(EntityType type, int index) const {
  const auto it = by_index_.find({static_cast<int>(type), index});
  return it == by_index_.end() ? nullptr : &entries_[it->second].original;
}

int64_t Vault::size() const { return static_cast<int64_t>(entries_.size()); }

std::string Vault::ToJson() const {
  nlohmann::json entries = nlohmann::json::array();
  for (const Entry& e : entries_)
    entries.push_back({{"type", EntityTypeName(e.type)}, {"index", e.index}, {"original", e.original}});
  const nlohmann::json j = {{"format", kFormat}, {"entries", std::move(entries)}};
  // Invalid UTF-8 in an original cannot be written as JSON: it is replaced.
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Result<Vault> Vault::FromJson(std::string_view json) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    return Status::Error("malformed vault: not JSON (" + what + ")");
  }
  if (!j.is_object() || !j.contains("entries") || !j["entries"].is_array())
    return Status::Error("malformed vault: expected {\"format\": \"" + std::string(kFormat) +
                         "\", \"entries\": [...]}");
  if (j.contains("format") && j["format"] != kFormat)
    return Status::Error("malformed vault: format " + j["format"].dump() + " (expected \"" + kFormat + "\")");
  Vault v;
  for (size_t i = 0; i < j["entries"].size(); ++i) {
    const nlohmann::json& e = j["entries"][i];
    const std::string where = "malformed vault: entries[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("type") || !e["type"].is_string() || !e.contains("index") ||
        !e["index"].is_number_integer() || !e.contains("original") || !e["original"].is_string())
      return Status::Error(where + ": expected {\"type\": string, \"index\": integer, \"original\": string}");
    const auto type = ParseEntityType(e["type"].get<std::string>());
    if (!type) return Status::Error(where + ": unknown type " + e["type"].dump());
    const int64_t index = e["index"].get<int64_t>();
    if (index < 1 || index > 1000000000) return Status::Error(where + ": index " + std::to_string(index) + " is not >= 1");
    if (v.Original(*type, static_cast<int>(index)))
      return Status::Error(where + ": " + EntityTypeName(*type) + "_" + std::to_string(index) + " appears twice");
    const std::string original = e["original"].get<std::string>();
    v.Add(Entry{*type, static_cast<int>(index), original, EntityKey(*type, original)});
  }
  return v;
}

Status Vault::Save(const std::string& path) const { return WriteFileAtomic(Env::Default(), path, ToJson()); }

Result<Vault> Vault::Load(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, Env::Default()->ReadFile(path));
  Result<Vault> v = FromJson(text);
  if (!v.ok()) return v.status().With(path);
  return v;
}

}  // namespace myriad::edge
