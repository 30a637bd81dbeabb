#include "edge/restore_check.h"

#include <regex>

namespace myriad::edge {
namespace {

// One piece of an answer: literal text, or a placeholder (type, index).
struct Piece {
  std::string text;
  EntityType type = EntityType::kPerson;
  int index = 0;  // 0: literal
};

// The placeholder of a piece written as `style` says.
std::string Written(const Piece& p, int style) {
  const std::string name = EntityTypeName(p.type);
  const std::string idx = std::to_string(p.index);
  std::string lower = name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string wide;  // full-width digits
  for (char c : idx) wide += "\xEF\xBC" + std::string(1, static_cast<char>(0x90 + (c - '0')));
  switch (style) {
    case 0: return PlaceholderText(p.type, p.index);
    case 1: return "\u27E6" + lower + "_" + idx + "\u27E7";
    case 2: return "\u27E6 " + name + "_" + idx + " \u27E7";
    case 3: return "[[" + name + "_" + idx + "]]";
    case 4: return "\u3010" + name + "_" + idx + "\u3011";
    default: return "\u27E6" + name + "_" + wide + "\u27E7";
  }
}

// The redacted text cut into pieces at its placeholders (canonical form only:
// the vault wrote them).
std::vector<Piece> Pieces(const std::string& redacted) {
  static const std::regex ph("\u27E6([A-Z_]+)_([0-9]+)\u27E7");
  std::vector<Piece> out;
  auto begin = std::sregex_iterator(redacted.begin(), redacted.end(), ph);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    auto type = ParseEntityType(m[1].str());
    if (!type) continue;
    out.push_back({redacted.substr(last, m.position(0) - last)});
    out.push_back({"", *type, std::stoi(m[2].str())});
    last = m.position(0) + m.length(0);
  }
  out.push_back({redacted.substr(last)});
  return out;
}

}  // namespace

RestoreCheck CheckRestores(const Redactor& redactor, const std::vector<std::string>& documents) {
  RestoreCheck r;
  for (const std::string& doc : documents) {
    Vault vault;
    const Redaction red = redactor.Redact(doc, &vault);
    ++r.documents;
    const std::vector<Piece> pieces = Pieces(red.text);
    std::vector<Piece> placeholders;
    for (const Piece& p : pieces)
      if (p.index) placeholders.push_back(p);
    // Answers: the echo in each style (styles rotate along the text), then
    // the placeholders repeated in reverse order, each twice.
    std::vector<std::vector<Piece>> answers;
    for (int style = 0; style < 6; ++style) answers.push_back(pieces);
    std::vector<Piece> repeat;
    for (auto it = placeholders.rbegin(); it != placeholders.rend(); ++it) {
      repeat.push_back({"; "});
      repeat.push_back(*it);
      repeat.push_back({" = "});
      repeat.push_back(*it);
    }
    if (!placeholders.empty()) answers.push_back(repeat);
    for (size_t a = 0; a < answers.size(); ++a) {
      std::string answer, expected;
      int k = 0, n = 0;
      bool missing = false;
      for (const Piece& p : answers[a]) {
        if (!p.index) {
          answer += p.text;
          expected += p.text;
          continue;
        }
        const int style = a < 6 ? static_cast<int>(a) : (k++ % 6);
        answer += Written(p, style);
        const std::string* orig = vault.Original(p.type, p.index);
        if (!orig) missing = true;
        expected += orig ? *orig : "";
        ++n;
      }
      ++r.answers;
      r.placeholders += n;
      const Restored whole = Restore(answer, vault);
      StreamRestorer stream(&vault);
      std::string streamed;
      for (size_t i = 0; i < answer.size(); i += 3) streamed += stream.Push(std::string_view(answer).substr(i, 3));
      streamed += stream.Finish();
      const bool ok = !missing && whole.ok() && whole.text == expected && streamed == expected &&
                      stream.unresolved().empty();
      if (!ok) {
        ++r.failures;
        if (r.examples.size() < 5)
          r.examples.push_back("answer " + std::to_string(a) + ": " + answer.substr(0, 160) + " -> " +
                               whole.text.substr(0, 160));
      }
    }
  }
  return r;
}

}  // namespace myriad::edge
