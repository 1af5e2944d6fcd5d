// fuzz_input.h — the fuzzer's bytes read as a sequence of small decisions (a byte, a bounded integer, a
// short string); once the bytes run out every read gives zero, so any input is a complete run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace posenc::fuzz {

class FuzzInput {
 public:
  FuzzInput(const std::uint8_t* data, std::size_t size) : p_(data), left_(size) {}

  // The next byte, or 0 when none is left.
  std::uint8_t byte() {
    if (left_ == 0) return 0;
    --left_;
    return *p_++;
  }
  // A value in [0, n) (n ≥ 1).
  unsigned below(unsigned n) { return byte() % n; }
  // Up to max_len bytes, the length given by the first byte.
  std::string text(std::size_t max_len) {
    const std::size_t n = below(static_cast<unsigned>(max_len) + 1);
    std::string s;
    for (std::size_t i = 0; i < n && left_ > 0; ++i) s.push_back(static_cast<char>(byte()));
    return s;
  }
  // Everything not yet read.
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(p_), left_);
    p_ += left_;
    left_ = 0;
    return s;
  }
  std::size_t left() const { return left_; }

 private:
  const std::uint8_t* p_;
  std::size_t left_;
};

}  // namespace posenc::fuzz
