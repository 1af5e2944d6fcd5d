// Validation shared by the learned reference and its fast dispatcher (same Status for same input).
#pragma once

#include <vector>

#include "posenc/absolute.h"

namespace posenc::learned {
// Validates the positions against the table's rows and returns them expanded to [B, L].
Expected<std::vector<std::int64_t>> checked_positions(const Positions& pos, std::int64_t B, std::int64_t L,
                                                      std::int64_t max_len);
// Validates the views of learned_forward (x [B, L, D], table [max_len, D], y like x).
Status check_forward(const View& x, const View& table, const View& y);
}  // namespace posenc::learned
