// Status and Result<T>: how every function that meets the outside world
// (files, configs, requests) reports failure. Internal invariants use CHECK.
//
// A message names the thing, the value and, where one helps, a hint:
//   "config.toml: model.n_heads=12 does not divide d_model=1000 (hint: ...)"
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace myriad {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !message_.has_value(); }
  const std::string& message() const {
    static const std::string kOk = "ok";
    return message_ ? *message_ : kOk;
  }
  // Prefixes context, e.g. the file name: "ckpt/manifest.json: " + message.
  Status With(const std::string& context) const {
    if (ok()) return *this;
    return Status(context + ": " + *message_);
  }

 private:
  explicit Status(std::string m) : message_(std::move(m)) {}
  std::optional<std::string> message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}   // NOLINT: must be an error
  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& value() const& { return std::get<T>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

#define MYRIAD_CONCAT_INNER(a, b) a##b
#define MYRIAD_CONCAT(a, b) MYRIAD_CONCAT_INNER(a, b)

// RETURN_IF_ERROR(expr): propagate a non-ok Status.
#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::myriad::Status _st = (expr);             \
    if (!_st.ok()) return _st;                 \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): unwrap a Result<T> or propagate its Status.
#define ASSIGN_OR_RETURN(lhs, expr)                                  \
  auto MYRIAD_CONCAT(_res_, __LINE__) = (expr);                      \
  if (!MYRIAD_CONCAT(_res_, __LINE__).ok())                          \
    return MYRIAD_CONCAT(_res_, __LINE__).status();                  \
  lhs = std::move(MYRIAD_CONCAT(_res_, __LINE__)).value()

}  // namespace myriad
