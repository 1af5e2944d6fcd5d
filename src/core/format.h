// How error messages print a number: the shortest natural form ("10000", "0.5", "nan").
#pragma once

#include <sstream>
#include <string>

namespace posenc {
inline std::string format_number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace posenc
