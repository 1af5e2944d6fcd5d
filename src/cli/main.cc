// PLACEHOLDER until the CLI lands.
#include <cstdio>
#include "posenc/registry.h"
int main() {
  for (const auto& e : posenc::registry()) std::printf("%s\n", e.name.c_str());
  return 0;
}
