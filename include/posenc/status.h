// posenc/status.h — errors as values: every entry point that can fail on bad input returns a Status
// (or an Expected<T>) naming the offending argument; the library never exits or aborts on input.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace posenc {

enum class Code { kOk = 0, kInvalidArgument, kOutOfRange, kIo, kInternal };

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  static Status Ok() { return {}; }
  // `arg` names the argument at fault (a parameter name such as "rotary_dim" or "q");
  // `what` says what was expected and what was found.
  static Status Invalid(std::string arg, std::string what) {
    return Status(Code::kInvalidArgument, std::move(arg), std::move(what));
  }
  static Status OutOfRange(std::string arg, std::string what) {
    return Status(Code::kOutOfRange, std::move(arg), std::move(what));
  }
  static Status Io(std::string arg, std::string what) {
    return Status(Code::kIo, std::move(arg), std::move(what));
  }
  static Status Internal(std::string what) { return Status(Code::kInternal, "", std::move(what)); }

  bool ok() const { return code_ == Code::kOk; }
  explicit operator bool() const { return ok(); }
  Code code() const { return code_; }
  const std::string& arg() const { return arg_; }
  const std::string& what() const { return what_; }
  // One line: "<arg>: <what>" (or just <what> when no argument is at fault).
  std::string message() const { return arg_.empty() ? what_ : arg_ + ": " + what_; }

 private:
  Status(Code c, std::string arg, std::string what)
      : code_(c), arg_(std::move(arg)), what_(std::move(what)) {}
  Code code_ = Code::kOk;
  std::string arg_, what_;
};

// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}                 // NOLINT(implicit)
  Expected(Status s) : v_(std::move(s)) {}                    // NOLINT(implicit)
  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  const T* operator->() const { return &value(); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace posenc

// Propagate a failed Status from the current function.
#define POSENC_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::posenc::Status posenc_status_ = (expr); \
    if (!posenc_status_.ok()) return posenc_status_; \
  } while (0)
