// CheckedSize: size arithmetic on config values that cannot wrap silently.
//
//   using S = CheckedSize;
//   S embed = S::Key("model.vocab_size", m.vocab_size) * S::Key("model.d_model", m.d_model);
//   RETURN_IF_ERROR((embed * 4).Check("the embedding's size"));
//   // "the embedding's size overflows 64-bit integers (it grows with model.vocab_size x model.d_model; hint: lower them)"
//
// Every value carries the config keys it grows with: a product takes the
// keys of both factors (but of a factor 0 or 1), a sum the keys of its larger term (the one that
// decides its size). A product or sum that leaves int64 (or a value above the
// limit given to Check) is an error naming those keys, so a config whose sizes
// do not fit is refused at load with the keys to lower, before anything is
// allocated from it. Operands must be >= 0 (sizes and counts).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace myriad {

class CheckedSize {
 public:
  CheckedSize(int64_t v = 0) : v_(v) {}  // NOLINT: a constant, implicit by design (no key)
  static CheckedSize Key(std::string key, int64_t v) {
    CheckedSize s(v);
    s.keys_.push_back(std::move(key));
    return s;
  }

  friend CheckedSize operator*(const CheckedSize& a, const CheckedSize& b) {
    // Once overflowed, a value keeps the keys of the operation that overflowed.
    if (a.overflow_ || b.overflow_) return a.overflow_ ? a : b;
    CheckedSize r;
    r.overflow_ = __builtin_mul_overflow(a.v_, b.v_, &r.v_);
    // A factor of 0 or 1 grows nothing: its keys are not named.
    if (a.v_ > 1) r.keys_ = a.keys_;
    if (b.v_ > 1)
      for (const auto& k : b.keys_) r.AddKey(k);
    return r;
  }
  friend CheckedSize operator+(const CheckedSize& a, const CheckedSize& b) {
    if (a.overflow_ || b.overflow_) return a.overflow_ ? a : b;
    CheckedSize r = a.v_ >= b.v_ ? a : b;
    if (__builtin_add_overflow(a.v_, b.v_, &r.v_)) {
      r.overflow_ = true;
      for (const auto& k : (a.v_ >= b.v_ ? b : a).keys_) r.AddKey(k);
    }
    return r;
  }
  CheckedSize& operator+=(const CheckedSize& o) { return *this = *this + o; }

  bool overflow() const { return overflow_; }
  int64_t value() const { return v_; }
  const std::vector<std::string>& keys() const { return keys_; }
  // "model.n_layers, model.d_model" (the keys, in the order they came in).
  std::string KeyList() const {
    std::string s;
    for (const auto& k : keys_) s += (s.empty() ? "" : ", ") + k;
    return s.empty() ? "constants" : s;
  }

  // Ok when the value fits (no overflow, <= limit), else "<what> overflows
  // 64-bit integers (...)" / "<what> = v exceeds <limit> (...)" naming the keys.
  Status Check(const std::string& what, int64_t limit = std::numeric_limits<int64_t>::max()) const {
    if (!overflow_ && v_ <= limit) return Status::Ok();
    const std::string why = overflow_ ? " overflows 64-bit integers" : " = " + std::to_string(v_) + " exceeds " +
                                                                        std::to_string(limit);
    return Status::Error(what + why + " (it grows with " + KeyList() + "; hint: lower " +
                         (keys_.size() > 1 ? "them" : "it") + ")");
  }

 private:
  void AddKey(const std::string& k) {
    for (const auto& have : keys_)
      if (have == k) return;
    keys_.push_back(k);
  }
  int64_t v_ = 0;
  bool overflow_ = false;
  std::vector<std::string> keys_;
};

}  // namespace myriad
