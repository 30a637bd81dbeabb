#include "edge/patterns.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <map>
#include <string>

#include "edge/checksums.h"
#include "edge/normalize.h"

namespace myriad::edge {
namespace {

bool IsDigit(char32_t c) { return c >= U'0' && c <= U'9'; }
bool IsUpper(char32_t c) { return c >= U'A' && c <= U'Z'; }
bool IsLetter(char32_t c) { return IsUpper(c) || (c >= U'a' && c <= U'z'); }
bool IsAlnum(char32_t c) { return IsDigit(c) || IsLetter(c); }
bool IsHex(char32_t c) { return IsDigit(c) || (c >= U'a' && c <= U'f') || (c >= U'A' && c <= U'F'); }
char32_t Lower(char32_t c) { return IsUpper(c) ? c + 32 : c; }

std::string Ascii(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) out.push_back(c < 0x80 ? static_cast<char>(c) : '?');
  return out;
}

// A candidate on the normalised text. A decoy (a timestamp, an 18-digit run
// with a wrong check character) takes part in overlap resolution, so that
// nothing inside it is found, and is then dropped.
struct Cand {
  int64_t s, e;  // normalised [s, e)
  EntityType type;
  float conf;
  bool decoy = false;
};

// ---- context keywords -------------------------------------------------------

// Ambiguous numbers right after these are order/invoice/tracking numbers.
const std::u32string_view kDecoyWords[] = {U"订单", U"单号", U"发票", U"流水", U"编号", U"运单", U"快递",
                                           U"序列号", U"序号", U"批次", U"工单", U"交易号", U"凭证", U"合同号",
                                           U"order", U"invoice", U"ref", U"tracking", U"serial", U"sn",
                                           U"transaction", U"txn", U"receipt", U"sku"};
// ... unless one of these is nearer.
const std::u32string_view kPiiWords[] = {U"电话", U"手机", U"联系", U"致电", U"拨打", U"卡号", U"银行卡",
                                         U"身份证", U"证件", U"护照", U"tel", U"phone", U"mobile",
                                         U"call", U"card", U"passport", U"ssn"};
constexpr int64_t kContextWindow = 16;

// The end of the nearest occurrence of any of `words` ending within the
// window before `s`; -1 when none.
int64_t NearestWordEnd(const std::u32string& t, int64_t s, const std::u32string_view* words, size_t n) {
  const int64_t lo = std::max<int64_t>(0, s - kContextWindow);
  int64_t best = -1;
  for (size_t w = 0; w < n; ++w) {
    const auto& word = words[w];
    const int64_t len = static_cast<int64_t>(word.size());
    for (int64_t a = lo; a + len <= s; ++a) {
      bool same = true;
      for (int64_t k = 0; k < len && same; ++k) same = Lower(t[a + k]) == word[k];
      // An ASCII keyword is a word of its own, not the tail of a longer one
      // ("preference"); a short one not a head either ("snow").
      if (same && IsLetter(word[0]) && a > 0 && IsLetter(t[a - 1])) same = false;
      if (same && IsLetter(word[0]) && len <= 3 && a + len < static_cast<int64_t>(t.size()) && IsLetter(t[a + len]))
        same = false;
      if (same) best = std::max(best, a + len);
    }
  }
  return best;
}

bool DecoyContext(const std::u32string& t, int64_t s) {
  const int64_t d = NearestWordEnd(t, s, kDecoyWords, std::size(kDecoyWords));
  if (d < 0) return false;
  return NearestWordEnd(t, s, kPiiWords, std::size(kPiiWords)) < d;
}

bool WordBefore(const std::u32string& t, int64_t s, std::initializer_list<std::u32string_view> words) {
  std::vector<std::u32string_view> w(words);
  return NearestWordEnd(t, s, w.data(), w.size()) >= 0;
}

// ---- digit runs and chunks --------------------------------------------------

struct Run {
  int64_t s, e;        // digits [s, e); e includes a trailing X of an ID
  bool x = false;      // ends in X/x (only an ID may)
  bool attached_left = false, attached_right = false;  // touches a letter
};

// Runs joined by one connector: "138 0013 8000", "(010) 1234-5678", "+1 (415) 555-0132".
struct Chunk {
  std::vector<Run> runs;
  std::vector<std::u32string> gaps;  // gaps[k] between runs[k] and runs[k+1]
};

bool IsConnector(std::u32string_view g) {
  static const std::u32string_view kConnectors[] = {U" ", U"-", U".", U" (", U"(", U") ", U")", U")-", U" - ", U"- "};
  for (auto c : kConnectors)
    if (g == c) return true;
  return false;
}

std::vector<Chunk> FindChunks(const std::u32string& t) {
  std::vector<Run> runs;
  const int64_t n = static_cast<int64_t>(t.size());
  for (int64_t i = 0; i < n;) {
    if (!IsDigit(t[i])) {
      ++i;
      continue;
    }
    Run r;
    r.s = i;
    while (i < n && IsDigit(t[i])) ++i;
    r.e = i;
    if (i < n && (t[i] == U'X' || t[i] == U'x') && (i + 1 >= n || !IsAlnum(t[i + 1]))) {
      r.x = true;
      r.e = ++i;
    }
    r.attached_left = r.s > 0 && IsLetter(t[r.s - 1]);
    r.attached_right = r.e < n && IsLetter(t[r.e]);
    runs.push_back(r);
  }
  std::vector<Chunk> chunks;
  for (const Run& r : runs) {
    if (!chunks.empty()) {
      Chunk& c = chunks.back();
      const Run& prev = c.runs.back();
      std::u32string gap = t.substr(prev.e, r.s - prev.e);
      if (!prev.x && !prev.attached_right && !r.attached_left && IsConnector(gap)) {
        c.gaps.push_back(std::move(gap));
        c.runs.push_back(r);
        continue;
      }
    }
    chunks.push_back(Chunk{{r}, {}});
  }
  return chunks;
}

// ---- validators -------------------------------------------------------------

int DaysIn(int y, int m) {
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)) return 29;
  return kDays[m - 1];
}

int Num(std::string_view s) {
  int v = 0;
  for (char c : s) v = v * 10 + (c - '0');
  return v;
}

bool PlausibleYmd(int y, int m, int d) { return m >= 1 && m <= 12 && d >= 1 && d <= DaysIn(y, m); }

bool PlausibleTime(std::string_view hhmmss) {
  if (Num(hhmmss.substr(0, 2)) > 23 || Num(hhmmss.substr(2, 2)) > 59) return false;
  return hhmmss.size() < 6 || Num(hhmmss.substr(4, 2)) <= 59;
}

// 20231105143015 (and 12- or 17-digit forms): a timestamp, not an identifier.
bool LooksLikeTimestamp(const std::string& d) {
  if (d.size() != 12 && d.size() != 14 && d.size() != 17) return false;
  const int y = Num(d.substr(0, 4));
  if (y < 1970 || y > 2099 || !PlausibleYmd(y, Num(d.substr(4, 2)), Num(d.substr(6, 2)))) return false;
  return PlausibleTime(std::string_view(d).substr(8, d.size() == 12 ? 4 : 6));
}

bool MobileBody(std::string_view d) { return d.size() == 11 && d[0] == '1' && d[1] >= '3' && d[1] <= '9'; }

// Card numbers outside UnionPay: the issuer ranges and lengths of the common schemes.
bool OtherCardPrefix(std::string_view d) {
  const size_t n = d.size();
  const int p2 = Num(d.substr(0, 2)), p4 = Num(d.substr(0, 4));
  if (d[0] == '4') return n == 13 || n == 16 || n == 19;            // Visa
  if (p2 >= 51 && p2 <= 55) return n == 16;                           // Mastercard
  if (p4 >= 2221 && p4 <= 2720) return n == 16;                       // Mastercard 2-series
  if (p2 == 34 || p2 == 37) return n == 15;                           // American Express
  if (p2 == 35) return n >= 16 && n <= 19;                            // JCB
  if (p2 == 36 || p2 == 38 || p2 == 30) return n >= 14 && n <= 16;    // Diners
  if (p4 == 6011 || p2 == 65) return n >= 16 && n <= 19;              // Discover
  return false;
}

// Landline extensions: "010-12345678-123", "转 123", "ext. 123", "x123".
int64_t ExtendExtension(const std::u32string& t, int64_t e) {
  const int64_t n = static_cast<int64_t>(t.size());
  int64_t k = e;
  while (k < n && t[k] == U' ') ++k;
  static const std::u32string_view kMarks[] = {U"ext.", U"ext", U"转", U"分机", U"x", U"-"};
  bool marked = false;
  for (auto m : kMarks) {
    const int64_t len = static_cast<int64_t>(m.size());
    if (k + len <= n) {
      bool same = true;
      for (int64_t q = 0; q < len && same; ++q) same = Lower(t[k + q]) == m[q];
      if (same) {
        k += len;
        marked = true;
        break;
      }
    }
  }
  if (!marked) return e;
  while (k < n && t[k] == U' ') ++k;
  const int64_t ds = k;
  while (k < n && IsDigit(t[k])) ++k;
  if (k - ds < 1 || k - ds > 5 || (k < n && IsAlnum(t[k]))) return e;
  return k;
}

// ---- the digit detectors over one chunk's runs [i, j] ----------------------

struct DigitCand {
  const std::u32string& t;
  const Chunk& c;
  size_t i, j;
  std::string digits;            // digits only (an ID's X last)
  std::vector<size_t> sizes;     // digits per run
  int64_t s, e;                  // span on the normalised text
  bool whole;                    // the candidate is the whole chunk
  bool gaps_in(std::initializer_list<std::u32string_view> allowed) const {
    for (size_t k = i; k < j; ++k)
      if (std::find(allowed.begin(), allowed.end(), std::u32string_view(c.gaps[k])) == allowed.end()) return false;
    return true;
  }
};

void DetectDigits(const DigitCand& d, std::vector<Cand>* out) {
  const std::u32string& t = d.t;
  const std::string& D = d.digits;
  const size_t n = D.size();
  const bool has_x = D.back() == 'X';
  // The keyword scan is the costly part: only for a candidate that matched.
  int ctx = -1;
  auto ctx_decoy = [&] {
    if (ctx < 0) ctx = DecoyContext(t, d.s) ? 1 : 0;
    return ctx == 1;
  };
  const bool plus = d.s > 0 && t[d.s - 1] == U'+';
  const bool paren_plus = plus && d.s > 1 && t[d.s - 2] == U'(' && d.j > d.i && d.c.gaps[d.i][0] == U')';
  auto add = [&](int64_t s, int64_t e, EntityType type, float conf, bool decoy = false) {
    out->push_back(Cand{s, e, type, conf, decoy});
  };

  // Resident IDs: 18 characters with the GB 11643 check character and a
  // plausible birth date; 15 digits with a plausible YYMMDD.
  const size_t before = out->size();
  if (n == 18 && !plus && ResidentIdCheckValid(D)) {
    const int y = Num(D.substr(6, 4));
    const bool plausible = y >= 1900 && y <= 2099 && PlausibleYmd(y, Num(D.substr(10, 2)), Num(D.substr(12, 2))) &&
                           D[0] >= '1' && D[0] <= '8';
    add(d.s, d.e, EntityType::kResidentId, plausible ? (ctx_decoy() ? 0.6f : 0.99f) : 0.4f);
  }
  if (has_x) return;
  if (LooksLikeTimestamp(D) && d.i == d.j) {
    add(d.s, d.e, EntityType::kResidentId, 0, /*decoy=*/true);
    return;
  }
  // A 15-digit ID shares its length with American Express cards (34/37...):
  // an ID keyword before it, or a plausible birth date, makes it an ID.
  const bool id15 = n == 15 && d.i == d.j && D[0] >= '1' && D[0] <= '8' &&
                    PlausibleYmd(1900 + Num(D.substr(6, 2)), Num(D.substr(8, 2)), Num(D.substr(10, 2)));
  if (id15) {
    const bool kw = WordBefore(t, d.s, {U"身份证", U"证件", U"id", U"identity"});
    add(d.s, d.e, EntityType::kResidentId, ctx_decoy() ? 0.3f : (kw ? 0.92f : 0.8f));
  }
  // Four dotted groups of up to three digits are an IPv4 address (DetectIps),
  // never a phone or a card.
  if (d.j - d.i == 3 && d.gaps_in({U"."})) {
    bool quad = true;
    for (size_t k : d.sizes) quad = quad && k <= 3;
    if (quad) return;
  }

  // Mainland mobiles, with +86 / (+86) / 0086 or without.
  if (paren_plus && D.substr(0, 2) == "86" && d.sizes[0] == 2 && MobileBody(D.substr(2))) {
    add(d.s - 2, d.e, EntityType::kPhone, 0.97f);
  } else if (plus && D.substr(0, 2) == "86" && MobileBody(D.substr(2))) {
    add(d.s - 1, d.e, EntityType::kPhone, 0.97f);
  } else if (!plus && D.substr(0, 4) == "0086" && (d.sizes[0] == 4 || d.i == d.j) && MobileBody(D.substr(4))) {
    add(d.s, d.e, EntityType::kPhone, 0.97f);
  } else if (!plus && MobileBody(D)) {
    add(d.s, d.e, EntityType::kPhone, ctx_decoy() ? 0.4f : 0.9f);
  }

  // International numbers: +CC then 7-14 digits in groups.
  if (plus && d.sizes[0] <= 3 && D[0] != '0') {
    const size_t rest = n - d.sizes[0];
    const bool grouped = d.j > d.i && rest >= 7 && rest <= 14;
    const bool contiguous = d.j == d.i && n >= 8 && n <= 15;
    if (grouped || contiguous) {
      const int64_t s = paren_plus ? d.s - 2 : d.s - 1;
      add(s, d.e, EntityType::kPhone, grouped ? 0.85f : 0.75f);
    }
  }

  // Mainland landlines: 0 + area code (010, 02x: 3 digits; others 4), 7-8 digits.
  if (!plus && n >= 10 && D[0] == '0' && D[1] != '0' && (D[1] != '1' || D[2] == '0')) {
    const size_t area = (D[1] == '1' || D[1] == '2') ? 3 : 4;  // 010 and 02x; the rest 0[3-9]xx
    const size_t sub = n - area;
    const bool area_group = d.j > d.i && d.sizes[0] == area;
    if (sub >= 7 && sub <= 8 && (area_group || d.i == d.j)) {
      int64_t s = d.s;
      if (s > 0 && t[s - 1] == U'(' && area_group && d.c.gaps[d.i][0] == U')') --s;
      float conf = area_group ? 0.85f : 0.6f;
      if (ctx_decoy()) conf = 0.3f;
      add(s, ExtendExtension(t, d.e), EntityType::kPhone, conf);
    }
  }

  // North American numbers: (415) 555-0132, 415-555-0132, 1-415-555-0132.
  if (!plus && d.j > d.i) {
    size_t k = d.i, off = 0;
    if (d.sizes[0] == 1 && D[0] == '1' && d.j - d.i == 3) {
      ++k;
      off = 1;
    }
    if (d.j - k == 2 && d.sizes[k - d.i] == 3 && d.sizes[k - d.i + 1] == 3 && d.sizes[k - d.i + 2] == 4 &&
        D[off] >= '2' && D[off + 3] >= '2') {
      const int64_t area_s = d.c.runs[k].s;
      const bool paren = area_s > 0 && t[area_s - 1] == U'(' && d.c.gaps[k][0] == U')';
      const bool dashed = d.gaps_in({U"-", U".", U" ", U") ", U")", U")-", U" (", U"("});
      if (dashed && (paren || off || d.gaps_in({U"-", U"."}))) {
        const int64_t s = paren && !off ? area_s - 1 : d.s;
        add(s, d.e, EntityType::kPhone, ctx_decoy() ? 0.3f : (paren ? 0.8f : 0.7f));
      }
    }
  }

  // Payment cards: contiguous, or in groups of four (American Express 4-6-5).
  if (!plus && n >= 13 && n <= 19) {
    bool grouping = d.i == d.j;
    if (!grouping && d.gaps_in({U" ", U"-"})) {
      grouping = true;
      for (size_t k = 0; k + 1 < d.sizes.size(); ++k) grouping = grouping && d.sizes[k] == 4;
      grouping = grouping && d.sizes.back() <= 4;
      if (d.sizes == std::vector<size_t>{4, 6, 5}) grouping = true;
    }
    if (grouping) {
      const bool luhn = LuhnValid(D);
      if (D[0] == '6' && D[1] == '2' && n >= 16) {
        add(d.s, d.e, EntityType::kBankCard, ctx_decoy() ? (luhn ? 0.45f : 0.3f) : (luhn ? 0.95f : 0.8f));
      } else if (luhn && OtherCardPrefix(D)) {
        add(d.s, d.e, EntityType::kBankCard, ctx_decoy() ? 0.3f : (id15 ? 0.6f : 0.85f));
      }
    }
  }

  // US social security numbers: AAA-GG-SSSS, the whole chunk.
  if (d.whole && d.sizes == std::vector<size_t>{3, 2, 4} && d.gaps_in({U"-"})) {
    const int area = Num(D.substr(0, 3));
    if (area != 0 && area != 666 && area < 900 && D.substr(3, 2) != "00" && D.substr(5) != "0000") {
      const bool kw = WordBefore(t, d.s, {U"ssn", U"social security", U"社会安全"});
      add(d.s, d.e, EntityType::kSsn, ctx_decoy() ? 0.3f : (kw ? 0.95f : 0.85f));
    }
  }

  // An 18-digit number that is no ID (wrong check character), no card and no
  // credit code: a decoy, so that nothing inside it is taken for a phone.
  if (n == 18 && out->size() == before && !CreditCodeCheckValid(D)) add(d.s, d.e, EntityType::kResidentId, 0, true);
}

// An amount: a currency sign or code just before the chunk, or a currency
// word just after it ("¥138001380.00", "13800138000 元").
bool AmountContext(const std::u32string& t, int64_t s, int64_t e) {
  int64_t b = s;
  while (b > 0 && t[b - 1] == U' ') --b;
  if (b > 0) {
    const char32_t c = t[b - 1];
    if (c == U'$' || c == U'\u00A5' || c == U'\uFFE5' || c == U'\u20AC' || c == U'\u00A3') return true;
    for (std::u32string_view code : {U"rmb", U"cny", U"usd", U"eur", U"hkd"}) {
      const int64_t len = static_cast<int64_t>(code.size());
      if (b < len) continue;
      bool same = true;
      for (int64_t k = 0; k < len && same; ++k) same = Lower(t[b - len + k]) == code[k];
      if (same) return true;
    }
  }
  int64_t a = e;
  while (a < static_cast<int64_t>(t.size()) && t[a] == U' ') ++a;
  if (a < static_cast<int64_t>(t.size())) {
    const char32_t c = t[a];
    if (c == U'元' || c == U'块' || c == U'万' || c == U'亿' || c == U'%') return true;
  }
  return false;
}

void DetectDigitChunks(const std::u32string& t, std::vector<Cand>* out) {
  for (const Chunk& c : FindChunks(t)) {
    const int64_t cs = c.runs.front().s, ce = c.runs.back().e;
    if (AmountContext(t, cs, ce)) {
      out->push_back(Cand{cs, ce, EntityType::kBankCard, 0, /*decoy=*/true});
      continue;
    }
    for (size_t i = 0; i < c.runs.size(); ++i) {
      if (c.runs[i].attached_left) continue;
      std::string digits;
      std::vector<size_t> sizes;
      for (size_t j = i; j < c.runs.size(); ++j) {
        const Run& r = c.runs[j];
        if (j > i && c.runs[j].attached_left) break;
        for (int64_t k = r.s; k < r.e; ++k) digits.push_back(IsDigit(t[k]) ? static_cast<char>(t[k]) : 'X');
        sizes.push_back(static_cast<size_t>(r.e - r.s));
        if (digits.size() > 24) break;
        if (r.attached_right) break;
        // "138001380.00": a decimal fraction, not a group of a number.
        if (j > i && c.gaps[j - 1] == U"." && sizes.back() <= 2) continue;
        DigitCand d{t, c, i, j, digits, sizes, c.runs[i].s, r.e, i == 0 && j + 1 == c.runs.size()};
        DetectDigits(d, out);
      }
    }
  }
}

// ---- text detectors ---------------------------------------------------------

void DetectEmails(const std::u32string& t, std::vector<Cand>* out) {
  const int64_t n = static_cast<int64_t>(t.size());
  auto local = [](char32_t c) { return IsAlnum(c) || c == U'.' || c == U'_' || c == U'%' || c == U'+' || c == U'-'; };
  auto domain = [](char32_t c) { return IsAlnum(c) || c == U'.' || c == U'-'; };
  for (int64_t a = 0; a < n; ++a) {
    if (t[a] != U'@') continue;
    int64_t s = a;
    while (s > 0 && local(t[s - 1])) --s;
    while (s < a && t[s] == U'.') ++s;
    int64_t e = a + 1;
    while (e < n && domain(t[e])) ++e;
    while (e > a + 1 && (t[e - 1] == U'.' || t[e - 1] == U'-')) --e;
    if (s == a || e == a + 1) continue;
    // The domain: labels with a dot, ending in a TLD of two or more letters.
    int64_t dot = -1;
    for (int64_t k = a + 1; k < e; ++k)
      if (t[k] == U'.') dot = k;
    if (dot < 0 || dot == a + 1 || e - dot - 1 < 2) continue;
    bool tld = true;
    for (int64_t k = dot + 1; k < e; ++k) tld = tld && IsLetter(t[k]);
    if (!tld) continue;
    out->push_back(Cand{s, e, EntityType::kEmail, 0.99f});
    a = e - 1;
  }
}

// Full-width punctuation ends a URL: "，" after one is the sentence's comma.
void DetectUrls(const Normalized& norm, std::u32string_view original, std::vector<Cand>* out) {
  const std::u32string& t = norm.text;
  const int64_t n = static_cast<int64_t>(t.size());
  static const std::u32string_view kStarts[] = {U"https://", U"http://", U"www."};
  auto url_char = [](char32_t c) {
    return c > 0x20 && c < 0x7F && c != U'<' && c != U'>' && c != U'"' && c != U'\'' && c != U'`' && c != U'{' &&
           c != U'}' && c != U'|' && c != U'\\' && c != U'^';
  };
  for (int64_t p = 0; p < n; ++p) {
    if (p > 0 && IsAlnum(t[p - 1])) continue;
    size_t plen = 0;
    for (auto st : kStarts) {
      if (p + static_cast<int64_t>(st.size()) > n) continue;
      bool same = true;
      for (size_t k = 0; k < st.size() && same; ++k) same = Lower(t[p + k]) == st[k];
      if (same) {
        plen = st.size();
        break;
      }
    }
    if (!plen) continue;
    int64_t e = p + plen;
    while (e < n && url_char(t[e]) && (IsAlnum(t[e]) || original[norm.origin[e]] < 0x80)) ++e;
    // Trailing sentence punctuation, and a closing bracket that opens nowhere inside.
    for (;;) {
      if (e <= p + static_cast<int64_t>(plen)) break;
      const char32_t c = t[e - 1];
      if (c == U'.' || c == U',' || c == U';' || c == U':' || c == U'!' || c == U'?') {
        --e;
        continue;
      }
      if (c == U')' || c == U']') {
        const char32_t open = c == U')' ? U'(' : U'[';
        if (std::count(t.begin() + p, t.begin() + e, open) < std::count(t.begin() + p, t.begin() + e, c)) {
          --e;
          continue;
        }
      }
      break;
    }
    if (e - p - static_cast<int64_t>(plen) < 3) continue;
    out->push_back(Cand{p, e, EntityType::kUrl, 0.95f});
    p = e - 1;
  }
}

// One IPv4 address at p; its end, or -1.
int64_t ParseIpv4(const std::u32string& t, int64_t p) {
  const int64_t n = static_cast<int64_t>(t.size());
  int64_t k = p;
  for (int octet = 0; octet < 4; ++octet) {
    if (octet > 0) {
      if (k >= n || t[k] != U'.') return -1;
      ++k;
    }
    const int64_t s = k;
    int v = 0;
    while (k < n && IsDigit(t[k]) && k - s < 4) v = v * 10 + static_cast<int>(t[k++] - U'0');
    if (k == s || k - s > 3 || v > 255 || (k - s > 1 && t[s] == U'0')) return -1;
  }
  return k;
}

void DetectIps(const Normalized& norm, std::u32string_view original, std::vector<Cand>* out) {
  const std::u32string& t = norm.text;
  const int64_t n = static_cast<int64_t>(t.size());
  // Full-width '：' and '．' end an address (they are the sentence's).
  auto ascii = [&](int64_t k) { return original[norm.origin[k]] < 0x80; };
  auto v6_char = [&](int64_t k) { return IsHex(t[k]) || ((t[k] == U':' || t[k] == U'.') && ascii(k)); };
  for (int64_t p = 0; p < n; ++p) {
    if (!IsDigit(t[p]) || (p > 0 && (IsAlnum(t[p - 1]) || (t[p - 1] == U'.' && ascii(p - 1))))) continue;
    const int64_t e = ParseIpv4(t, p);
    if (e < 0 || (e < n && (IsAlnum(t[e]) || (t[e] == U'.' && ascii(e) && e + 1 < n && IsDigit(t[e + 1])))))
      continue;
    out->push_back(Cand{p, e, EntityType::kIp, 0.9f});
    p = e - 1;
  }
  // IPv6: hex groups of 1-4 separated by ':', at most one '::', eight groups
  // without it (an IPv4 tail counts as two).
  for (int64_t p = 0; p < n; ++p) {
    if (!(IsHex(t[p]) || (t[p] == U':' && p + 1 < n && t[p + 1] == U':'))) continue;
    if (p > 0 && (IsAlnum(t[p - 1]) || (v6_char(p - 1) && (t[p - 1] == U'.' || (p > 1 && v6_char(p - 2))))))
      continue;
    int64_t e = p;
    while (e < n && v6_char(e)) ++e;
    while (e > p && t[e - 1] == U'.') --e;
    if (e < n && IsAlnum(t[e])) continue;
    const std::string s = Ascii(t.substr(p, e - p));
    const size_t dc = s.find("::");
    if (dc != std::string::npos && s.find("::", dc + 1) != std::string::npos) continue;
    int groups = 0, colons = 0;
    bool ok = true, ipv4_tail = false;
    size_t k = 0;
    while (k < s.size() && ok) {
      if (s[k] == ':') {
        ++colons;
        ++k;
        continue;
      }
      size_t q = k;
      while (q < s.size() && s[q] != ':') ++q;
      const std::string g = s.substr(k, q - k);
      if (g.find('.') != std::string::npos) {
        const std::u32string g32(g.begin(), g.end());
        ok = q == s.size() && ParseIpv4(g32, 0) == static_cast<int64_t>(g32.size());
        ipv4_tail = true;
        groups += 2;
      } else {
        ok = g.size() <= 4;
        ++groups;
      }
      k = q;
    }
    if (!ok || colons < 2) continue;
    if (s.front() == ':' && s.substr(0, 2) != "::") continue;
    if (s.back() == ':' && s.substr(s.size() - 2) != "::") continue;
    const bool compressed = dc != std::string::npos;
    if (compressed ? (groups >= 8 || groups < 2) : groups != 8) continue;
    if (!ipv4_tail && std::none_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    out->push_back(Cand{p, e, EntityType::kIp, 0.9f});
    p = e - 1;
  }
}

bool IsProvince(char32_t c) {
  static const std::u32string_view kProvinces = U"京津沪渝冀豫云辽黑湘皖鲁新苏浙赣鄂桂甘晋蒙陕吉闽贵粤青藏川宁琼";
  return kProvinces.find(c) != std::u32string_view::npos;
}
bool PlateChar(char32_t c) { return IsDigit(c) || (IsUpper(c) && c != U'I' && c != U'O'); }

void DetectPlates(const std::u32string& t, std::vector<Cand>* out) {
  const int64_t n = static_cast<int64_t>(t.size());
  for (int64_t p = 0; p + 7 <= n; ++p) {
    if (!IsProvince(t[p]) || p + 1 >= n || !IsUpper(t[p + 1]) || t[p + 1] == U'I' || t[p + 1] == U'O') continue;
    int64_t k = p + 2;
    if (k < n && (t[k] == U'\u00B7' || t[k] == U'\u2022' || t[k] == U'\u30FB' || t[k] == U' ' || t[k] == U'-')) ++k;
    auto bounded = [&](int64_t e) { return e <= n && (e == n || !IsAlnum(t[e])); };
    auto all = [&](int64_t a, int64_t b, bool (*f)(char32_t)) {
      for (int64_t q = a; q < b; ++q)
        if (q >= n || !f(t[q])) return false;
      return true;
    };
    // New-energy: D/F then one letter-or-digit and four digits, or five digits then D/F.
    if (bounded(k + 6) && k + 6 <= n) {
      const bool small = (t[k] == U'D' || t[k] == U'F') && PlateChar(t[k + 1]) && all(k + 2, k + 6, IsDigit);
      const bool large = all(k, k + 5, IsDigit) && (t[k + 5] == U'D' || t[k + 5] == U'F');
      if (small || large) {
        out->push_back(Cand{p, k + 6, EntityType::kPlate, 0.9f});
        continue;
      }
    }
    if (k + 5 <= n && bounded(k + 5) && all(k, k + 5, PlateChar)) {
      int digits = 0;
      for (int64_t q = k; q < k + 5; ++q) digits += IsDigit(t[q]);
      if (digits >= 1) out->push_back(Cand{p, k + 5, EntityType::kPlate, 0.9f});
    }
  }
}

// Alphanumeric tokens (ASCII letters and digits, bounded by anything else):
// credit codes and passports.
void DetectTokens(const std::u32string& t, std::vector<Cand>* out) {
  const int64_t n = static_cast<int64_t>(t.size());
  for (int64_t p = 0; p < n;) {
    if (!IsAlnum(t[p])) {
      ++p;
      continue;
    }
    const int64_t s = p;
    while (p < n && IsAlnum(t[p])) ++p;
    const int64_t e = p;
    if (e - s < 7 || e - s > 18) continue;  // no credit code or passport is shorter or longer
    const std::string tok = Ascii(t.substr(s, e - s));
    const bool ctx_decoy = DecoyContext(t, s);
    // Unified social credit code: 18 characters, department and type, a
    // six-digit area code, GB 32100 check character.
    if (tok.size() == 18 && CreditCodeCheckValid(tok)) {
      bool area = true;
      for (int k = 2; k < 8; ++k) area = area && std::isdigit(static_cast<unsigned char>(tok[k]));
      const bool letters = std::any_of(tok.begin(), tok.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
      const bool kw = WordBefore(t, s, {U"信用代码", U"社会信用", U"税号", U"纳税人识别号", U"credit code", U"uscc"});
      if (area && tok[0] != '0' && tok[1] != '0') {
        float conf = letters ? 0.95f : (kw ? 0.9f : 0.45f);
        if (ctx_decoy && !kw) conf = 0.3f;
        out->push_back(Cand{s, e, EntityType::kCreditCode, conf});
      }
    }
    // Passports: E/G + 8 digits, E + letter + 7 digits, D/S/P + 7 digits (China);
    // near 护照/passport also any 1-2 letters + 6-9 digits.
    const bool kw = WordBefore(t, s, {U"护照", U"passport"});
    size_t letters = 0;
    while (letters < tok.size() && IsLetter(static_cast<unsigned char>(tok[letters]))) ++letters;
    const size_t digits = tok.size() - letters;
    bool all_digits = true;
    for (size_t k = letters; k < tok.size(); ++k) all_digits = all_digits && std::isdigit(static_cast<unsigned char>(tok[k]));
    if (all_digits && letters >= 1) {
      const char l0 = tok[0];
      const bool cn = (letters == 1 && (l0 == 'E' || l0 == 'G') && digits == 8) ||
                      (letters == 2 && l0 == 'E' && tok[1] != 'I' && tok[1] != 'O' && IsUpper(tok[1]) && digits == 7) ||
                      (letters == 1 && (l0 == 'D' || l0 == 'S' || l0 == 'P') && (digits == 7 || digits == 8));
      const bool generic = kw && letters <= 2 && digits >= 6 && digits <= 9;
      if (cn || generic) {
        float conf = kw ? 0.95f : 0.85f;
        if (ctx_decoy && !kw) conf = 0.3f;
        out->push_back(Cand{s, e, EntityType::kPassport, conf});
      }
    }
  }
}

}  // namespace

bool PlausibleDate(std::u32string_view ymd) {
  if (ymd.size() != 8) return false;
  for (char32_t c : ymd)
    if (!IsDigit(c)) return false;
  const std::string d = Ascii(ymd);
  const int y = Num(d.substr(0, 4));
  return y >= 1900 && y <= 2099 && PlausibleYmd(y, Num(d.substr(4, 2)), Num(d.substr(6, 2)));
}

std::vector<Span> ResolveOverlaps(std::vector<Span> spans) {
  std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    const int64_t la = a.end - a.start, lb = b.end - b.start;
    if (la != lb) return la > lb;
    if (a.confidence != b.confidence) return a.confidence > b.confidence;
    return a.start < b.start;
  });
  std::vector<Span> kept;
  std::map<int64_t, int64_t> taken;  // start -> end of the kept spans
  for (const Span& s : spans) {
    if (s.end <= s.start) continue;
    const auto next = taken.lower_bound(s.start);
    if (next != taken.end() && next->first < s.end) continue;
    if (next != taken.begin() && std::prev(next)->second > s.start) continue;
    taken.emplace(s.start, s.end);
    kept.push_back(s);
  }
  std::sort(kept.begin(), kept.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  return kept;
}

std::vector<Span> DetectPatterns(std::u32string_view original) {
  const Normalized norm = Normalize(original);
  const std::u32string& t = norm.text;
  std::vector<Cand> cands;
  DetectDigitChunks(t, &cands);
  DetectEmails(t, &cands);
  DetectUrls(norm, original, &cands);
  DetectIps(norm, original, &cands);
  DetectPlates(t, &cands);
  DetectTokens(t, &cands);
  // Resolve with decoys marked by a confidence of 2 (they win ties), then
  // drop them and map the rest to the original text.
  std::vector<Span> spans;
  for (const Cand& c : cands) {
    Span s = norm.ToOriginal(c.s, c.e);
    s.type = c.type;
    s.confidence = c.decoy ? 2.0f : c.conf;
    spans.push_back(s);
  }
  std::vector<Span> kept;
  for (const Span& s : ResolveOverlaps(std::move(spans)))
    if (s.confidence > 0 && s.confidence <= 1) kept.push_back(s);
  return kept;
}

}  // namespace myriad::edge
