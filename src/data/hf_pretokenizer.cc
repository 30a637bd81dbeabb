#include "data/hf_pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cctype>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/log.h"

namespace myriad::hf {
namespace {

using nlohmann::json;

// GPT-2's pattern, which ByteLevel applies when use_regex is true.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Oniguruma's \s (U+0009..U+000D, U+0085, Zl, Zp, Zs) is exactly Unicode's
// White_Space property; PCRE2's \s lacks U+0085.
constexpr char kSpace[] = "\\p{White_Space}";
constexpr char kNotSpace[] = "\\P{White_Space}";
// Oniguruma's \w: General_Category Letter|Mark|Number|Connector_Punctuation.
constexpr char kWordChars[] = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr char kHexChars[] = "0-9a-fA-F";

bool IsHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// A general category as PCRE2 and Oniguruma both spell it: "L", "Lu", "L&".
bool IsGeneralCategory(std::string_view name) {
  static const char* kNames[] = {"C",  "Cc", "Cf", "Cn", "Co", "Cs", "L",  "L&", "LC", "Ll", "Lm",
                                 "Lo", "Lt", "Lu", "M",  "Mc", "Me", "Mn", "N",  "Nd", "Nl", "No",
                                 "P",  "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "S",  "Sc", "Sk",
                                 "Sm", "So", "Z",  "Zl", "Zp", "Zs", "Any"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return false;
}

class Translator {
 public:
  explicit Translator(std::string_view p) : p_(p) {}

  Result<std::string> Run() {
    while (i_ < p_.size()) {
      char c = p_[i_];
      if (c == '\\') {
        RETURN_IF_ERROR(Escape());
      } else if (c == '[') {
        RETURN_IF_ERROR(OpenClass());
      } else if (c == ']' && depth_ > 0) {
        --depth_;
        out_ += c;
        ++i_;
      } else if (depth_ > 0) {
        if (c == '&' && i_ + 1 < p_.size() && p_[i_ + 1] == '&') {
          return Unsupported("class intersection &&");
        }
        out_ += c;
        ++i_;
      } else if (c == '(') {
        RETURN_IF_ERROR(Group());
      } else if (c == '{') {
        RETURN_IF_ERROR(Interval());
      } else {
        out_ += c;
        ++i_;
      }
    }
    if (depth_ > 0) return Status::Error("unterminated character class");
    return out_;
  }

 private:
  Status Unsupported(const std::string& what) const {
    return Status::Error(what + " at offset " + std::to_string(i_) + " is not supported");
  }

  Status OpenClass() {
    if (depth_ > 0) {
      if (p_.compare(i_, 2, "[:") == 0) return Unsupported("POSIX bracket [:...:]");
      return Unsupported("nested character class");
    }
    ++depth_;
    out_ += '[';
    ++i_;
    if (i_ < p_.size() && p_[i_] == '^') out_ += p_[i_++];
    // A ']' first in a class is a literal in both engines.
    if (i_ < p_.size() && p_[i_] == ']') out_ += p_[i_++];
    return Status::Ok();
  }

  // "(?" groups: the ones both engines read alike pass; flag groups other
  // than i (Oniguruma's (?m) is PCRE2's (?s)) are refused.
  Status Group() {
    if (p_.compare(i_, 2, "(?") != 0) {
      out_ += p_[i_++];
      return Status::Ok();
    }
    static const char* kPlain[] = {"(?:", "(?=", "(?!", "(?<=", "(?<!", "(?>", "(?<", "(?#"};
    for (const char* g : kPlain) {
      if (p_.compare(i_, std::char_traits<char>::length(g), g) == 0) {
        out_ += p_[i_++];
        return Status::Ok();
      }
    }
    size_t j = i_ + 2;
    while (j < p_.size() && (p_[j] == 'i' || p_[j] == '-')) ++j;
    if (j > i_ + 2 && j < p_.size() && (p_[j] == ':' || p_[j] == ')')) {
      out_.append(p_, i_, j + 1 - i_);
      i_ = j + 1;
      return Status::Ok();
    }
    return Unsupported("group flags " + std::string(p_.substr(i_, std::min<size_t>(5, p_.size() - i_))));
  }

  // In Oniguruma's syntax "{n,m}+" repeats the interval (PCRE2 would make it
  // possessive); refused rather than guessed.
  Status Interval() {
    size_t j = i_ + 1;
    while (j < p_.size() && (std::isdigit(static_cast<unsigned char>(p_[j])) || p_[j] == ',')) ++j;
    if (j > i_ + 1 && j < p_.size() && p_[j] == '}') {
      out_.append(p_, i_, j + 1 - i_);
      i_ = j + 1;
      if (i_ < p_.size() && p_[i_] == '+') return Unsupported("interval followed by +");
      return Status::Ok();
    }
    out_ += "\\{";  // a literal brace in Oniguruma
    ++i_;
    return Status::Ok();
  }

  Status Escape() {
    if (i_ + 1 >= p_.size()) return Status::Error("pattern ends with a backslash");
    const char e = p_[i_ + 1];
    const bool in_class = depth_ > 0;
    auto emit = [&](const std::string& s, size_t consumed = 2) {
      out_ += s;
      i_ += consumed;
      return Status::Ok();
    };
    switch (e) {
      case 's': return emit(kSpace);
      case 'S': return emit(kNotSpace);
      case 'w': return emit(in_class ? std::string(kWordChars) : "[" + std::string(kWordChars) + "]");
      case 'W':
        if (in_class) return Unsupported("\\W inside a character class");
        return emit("[^" + std::string(kWordChars) + "]");
      case 'h': return emit(in_class ? std::string(kHexChars) : "[" + std::string(kHexChars) + "]");
      case 'H':
        if (in_class) return Unsupported("\\H inside a character class");
        return emit("[^" + std::string(kHexChars) + "]");
      case 'b':
        if (in_class) return emit("\\x08");
        return Unsupported("\\b (word boundary)");
      case 'B': return Unsupported("\\B (not a word boundary)");
      case 'u': {
        if (i_ + 6 > p_.size()) return Status::Error("\\u needs four hex digits");
        for (size_t k = 2; k < 6; ++k) {
          if (!IsHex(p_[i_ + k])) return Status::Error("\\u needs four hex digits");
        }
        return emit("\\x{" + std::string(p_.substr(i_ + 2, 4)) + "}", 6);
      }
      case 'p':
      case 'P': return Property(e);
      default:
        if (e >= '0' && e <= '7' && (e == '0' || (i_ + 2 < p_.size() && p_[i_ + 2] >= '0' && p_[i_ + 2] <= '7'))) {
          return Unsupported("octal escape");
        }
        out_.append(p_, i_, 2);
        i_ += 2;
        return Status::Ok();
    }
  }

  // \p{Name}: general categories pass; other names are scripts (PCRE2's bare
  // \p{Han} would mean Script_Extensions, Oniguruma's means Script).
  Status Property(char e) {
    std::string name;
    size_t consumed;
    if (i_ + 2 < p_.size() && p_[i_ + 2] == '{') {
      size_t close = p_.find('}', i_ + 3);
      if (close == std::string_view::npos) return Status::Error("unterminated \\p{");
      name = std::string(p_.substr(i_ + 3, close - i_ - 3));
      consumed = close + 1 - i_;
    } else if (i_ + 2 < p_.size()) {
      name = std::string(1, p_[i_ + 2]);
      consumed = 3;
    } else {
      return Status::Error("\\p needs a property name");
    }
    bool negate = e == 'P';
    if (!name.empty() && name[0] == '^') {
      negate = !negate;
      name.erase(0, 1);
    }
    std::string pcre_name = IsGeneralCategory(name) || name == "White_Space" ? name : "sc:" + name;
    out_ += negate ? "\\P{" : "\\p{";
    out_ += pcre_name;
    out_ += '}';
    i_ += consumed;
    return Status::Ok();
  }

  std::string_view p_;
  size_t i_ = 0;
  int depth_ = 0;
  std::string out_;
};

struct MatchState {
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    CHECK(data && context && jit_stack);
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
    pcre2_set_heap_limit(context, 1024 * 1024);  // KiB, for the interpreter fallback
  }
  ~MatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
  pcre2_match_data* data;
  pcre2_match_context* context;
  pcre2_jit_stack* jit_stack;
};

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

Result<SplitBehavior> ParseBehavior(const json& v, const std::string& where) {
  static const std::pair<const char*, SplitBehavior> kNames[] = {
      {"Removed", SplitBehavior::kRemoved},
      {"Isolated", SplitBehavior::kIsolated},
      {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
      {"MergedWithNext", SplitBehavior::kMergedWithNext},
      {"Contiguous", SplitBehavior::kContiguous},
  };
  if (v.is_string()) {
    for (const auto& [name, b] : kNames) {
      if (v.get<std::string>() == name) return b;
    }
  }
  return Status::Error(where + ": behavior " + v.dump() +
                       " is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

std::string EscapeLiteral(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

std::string TypeOf(const json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"].get<std::string>();
  return j.dump();
}

bool BoolField(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

}  // namespace

Result<std::string> OnigurumaToPcre2(std::string_view pattern) { return Translator(pattern).Run(); }

Result<Regex> Regex::Compile(std::string_view pattern) {
  auto translated = OnigurumaToPcre2(pattern);
  if (!translated.ok()) {
    return Status::Error("regex " + json(std::string(pattern)).dump() + ": " + translated.status().message());
  }
  const std::string& pcre = translated.value();
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre.data()), pcre.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, cc);
  pcre2_compile_context_free(cc);
  if (code == nullptr) {
    return Status::Error("regex " + json(std::string(pattern)).dump() + " does not compile (as PCRE2 " +
                         json(pcre).dump() + ", at offset " + std::to_string(offset) +
                         "): " + Pcre2Message(error));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when unavailable
  Regex r;
  r.code_ = std::shared_ptr<pcre2_real_code_8>(code, pcre2_code_free);
  r.pattern_ = std::string(pattern);
  return r;
}

bool Regex::NextMatch(std::string_view text, size_t from, size_t* begin, size_t* end) const {
  thread_local MatchState state;
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = pcre2_match(code_.get(), subject, text.size(), from, PCRE2_NO_UTF_CHECK, state.data,
                       state.context);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc = pcre2_match(code_.get(), subject, text.size(), from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                     state.data, state.context);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    // A resource limit on a gigantic input (no sane text gets here): say so
    // and let the rest of the text be one piece rather than drop it.
    LOG_WARN("tokenizer: regex %s failed at byte %zu of %zu: %s; the rest is one piece",
             pattern_.c_str(), from, text.size(), Pcre2Message(rc).c_str());
    return false;
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

void SplitByRegex(const Regex& regex, SplitBehavior behavior, bool invert, std::string_view text,
                  Pieces* out) {
  // The spans of `text` in order, each marked delimiter or not.
  struct Span {
    size_t begin, end;
    bool delimiter;
  };
  std::vector<Span> spans;
  size_t prev = 0;
  regex.ForEachMatch(text, [&](size_t b, size_t e) {
    if (b > prev) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  });
  if (prev < text.size()) spans.push_back({prev, text.size(), invert});

  auto emit = [&](size_t b, size_t e) {
    if (e > b) out->push_back(text.substr(b, e - b));
  };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) emit(s.begin, s.end);
      return;
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.delimiter) emit(s.begin, s.end);
      }
      return;
    case SplitBehavior::kContiguous: {
      // Runs of delimiters become one piece.
      for (size_t k = 0; k < spans.size();) {
        size_t j = k + 1;
        if (spans[k].delimiter) {
          while (j < spans.size() && spans[j].delimiter) ++j;
        }
        emit(spans[k].begin, spans[j - 1].end);
        k = j;
      }
      return;
    }
    case SplitBehavior::kMergedWithPrevious: {
      // A delimiter joins the piece before it, unless that was a delimiter too.
      std::vector<std::pair<size_t, size_t>> merged;
      bool previous_delimiter = false;
      for (const Span& s : spans) {
        if (s.delimiter && !previous_delimiter && !merged.empty()) {
          merged.back().second = s.end;
        } else {
          merged.push_back({s.begin, s.end});
        }
        previous_delimiter = s.delimiter;
      }
      for (const auto& [b, e] : merged) emit(b, e);
      return;
    }
    case SplitBehavior::kMergedWithNext: {
      // A delimiter joins the piece after it, unless that is a delimiter too.
      std::vector<std::pair<size_t, size_t>> merged;
      bool next_delimiter = false;
      for (size_t k = spans.size(); k-- > 0;) {
        const Span& s = spans[k];
        if (s.delimiter && !next_delimiter && !merged.empty()) {
          merged.back().first = s.begin;
        } else {
          merged.push_back({s.begin, s.end});
        }
        next_delimiter = s.delimiter;
      }
      for (size_t k = merged.size(); k-- > 0;) emit(merged[k].first, merged[k].second);
      return;
    }
  }
}

// ---------------------------------------------------------------- Normalizer

Result<Normalizer> Normalizer::FromJson(const json& config, const std::string& origin) {
  Normalizer n;
  if (config.is_null()) return n;
  static const std::pair<const char*, NormalForm> kForms[] = {
      {"NFC", NormalForm::kNFC}, {"NFD", NormalForm::kNFD}, {"NFKC", NormalForm::kNFKC}, {"NFKD", NormalForm::kNFKD}};
  const std::string type = TypeOf(config);
  if (type == "Sequence") {
    const json* list = config.contains("normalizers") ? &config["normalizers"] : nullptr;
    if (list == nullptr || !list->is_array()) {
      return Status::Error(origin + ": normalizer Sequence has no \"normalizers\" list");
    }
    for (const json& item : *list) {
      ASSIGN_OR_RETURN(Normalizer inner, FromJson(item, origin));
      n.forms_.insert(n.forms_.end(), inner.forms_.begin(), inner.forms_.end());
    }
    return n;
  }
  for (const auto& [name, form] : kForms) {
    if (type == name) {
      n.forms_.push_back(form);
      return n;
    }
  }
  return Status::Error(origin + ": normalizer \"" + type +
                       "\" is not supported (supported: null, NFC, NFD, NFKC, NFKD, a Sequence of them)");
}

Normalizer Normalizer::Forms(std::vector<NormalForm> forms) {
  Normalizer n;
  n.forms_ = std::move(forms);
  return n;
}

std::string Normalizer::Apply(std::string_view text) const {
  std::string current(text);
  for (NormalForm form : forms_) {
    int options = UTF8PROC_STABLE;
    switch (form) {
      case NormalForm::kNFC: options |= UTF8PROC_COMPOSE; break;
      case NormalForm::kNFD: options |= UTF8PROC_DECOMPOSE; break;
      case NormalForm::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
      case NormalForm::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t* result = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(current.data()),
                                      static_cast<utf8proc_ssize_t>(current.size()), &result,
                                      static_cast<utf8proc_option_t>(options));
    CHECK_MSG(n >= 0, "utf8proc: %s (the text is valid UTF-8)", utf8proc_errmsg(n));
    current.assign(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
    std::free(result);
  }
  return current;
}

// ------------------------------------------------------------- PreTokenizer

struct PreTokenizer::Step {
  enum Kind { kSplit, kByteLevel } kind = kSplit;
  // kSplit (and kByteLevel with use_regex):
  std::shared_ptr<const Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // kByteLevel:
  bool add_prefix_space = false;
};

namespace {

Status AddSteps(const json& config, const std::string& origin,
                std::vector<std::shared_ptr<const PreTokenizer::Step>>* steps) {
  using Step = PreTokenizer::Step;
  const std::string type = TypeOf(config);
  if (type == "Sequence") {
    const json* list = config.contains("pretokenizers") ? &config["pretokenizers"] : nullptr;
    if (list == nullptr || !list->is_array()) {
      return Status::Error(origin + ": pre_tokenizer Sequence has no \"pretokenizers\" list");
    }
    for (const json& item : *list) RETURN_IF_ERROR(AddSteps(item, origin, steps));
    return Status::Ok();
  }
  auto step = std::make_shared<Step>();
  if (type == "ByteLevel") {
    step->kind = Step::kByteLevel;
    step->add_prefix_space = BoolField(config, "add_prefix_space", false);
    if (BoolField(config, "use_regex", true)) {
      auto regex = Regex::Compile(kGpt2Pattern);
      CHECK_MSG(regex.ok(), "%s", regex.status().message().c_str());
      step->regex = std::make_shared<Regex>(std::move(regex.value()));
    }
  } else if (type == "Split") {
    const std::string where = origin + ": pre_tokenizer Split";
    const json* pattern = config.contains("pattern") ? &config["pattern"] : nullptr;
    std::string regex_text;
    if (pattern != nullptr && pattern->is_object() && pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
      regex_text = (*pattern)["Regex"].get<std::string>();
    } else if (pattern != nullptr && pattern->is_object() && pattern->contains("String") &&
               (*pattern)["String"].is_string()) {
      regex_text = EscapeLiteral((*pattern)["String"].get<std::string>());
    } else {
      return Status::Error(where + ": \"pattern\" must be {\"Regex\": ...} or {\"String\": ...}");
    }
    auto regex = Regex::Compile(regex_text);
    if (!regex.ok()) return Status::Error(where + ": " + regex.status().message());
    step->regex = std::make_shared<Regex>(std::move(regex.value()));
    ASSIGN_OR_RETURN(step->behavior, ParseBehavior(config.value("behavior", json()), where));
    step->invert = BoolField(config, "invert", false);
  } else if (type == "Digits") {
    // HF splits at char::is_numeric, i.e. General_Category N.
    auto regex = Regex::Compile("\\p{N}");
    CHECK_MSG(regex.ok(), "%s", regex.status().message().c_str());
    step->regex = std::make_shared<Regex>(std::move(regex.value()));
    step->behavior = BoolField(config, "individual_digits", false) ? SplitBehavior::kIsolated
                                                                   : SplitBehavior::kContiguous;
  } else {
    return Status::Error(origin + ": pre_tokenizer \"" + type +
                         "\" is not supported (supported: ByteLevel, Split, Digits, a Sequence of them "
                         "ending in ByteLevel)");
  }
  steps->push_back(std::move(step));
  return Status::Ok();
}

}  // namespace

Result<PreTokenizer> PreTokenizer::FromJson(const json& config, const std::string& origin) {
  PreTokenizer p;
  if (config.is_null()) {
    return Status::Error(origin + ": pre_tokenizer is null; a byte-level BPE needs a ByteLevel pre_tokenizer");
  }
  RETURN_IF_ERROR(AddSteps(config, origin, &p.steps_));
  for (size_t k = 0; k < p.steps_.size(); ++k) {
    const bool last = k + 1 == p.steps_.size();
    if ((p.steps_[k]->kind == Step::kByteLevel) != last) {
      return Status::Error(origin + ": pre_tokenizer must end in ByteLevel, and have it only there "
                           "(steps after the byte mapping would see mapped text)");
    }
  }
  return p;
}

void PreTokenizer::Run(std::string_view text, Pieces* out, std::deque<std::string>* arena) const {
  Pieces current{text}, next;
  for (const auto& step : steps_) {
    next.clear();
    for (std::string_view piece : current) {
      if (step->kind == Step::kByteLevel && step->add_prefix_space && !piece.starts_with(' ')) {
        arena->push_back(" " + std::string(piece));
        piece = arena->back();
      }
      if (step->regex == nullptr) {
        next.push_back(piece);
      } else {
        SplitByRegex(*step->regex, step->behavior, step->invert, piece, &next);
      }
    }
    current.swap(next);
  }
  out->insert(out->end(), current.begin(), current.end());
}

}  // namespace myriad::hf
