// Private: rope2d mixed in the decode kernel (attention_decode.cc). Its rotation differs per query
// head, so the cache holds unrotated keys: the query is rotated as for the other rotary encodings;
// per head, each key is turned by the low part of its x angle and the query back by the rest, per
// run of keys sharing it, from tables over the call's key positions (MixedKeys).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attention/attention_check.h"
#include "attention/attention_decode_task.h"

namespace posenc::decode_impl {

// The most bytes of a call's tables: larger position ranges leave the call to the tile kernel.
constexpr std::int64_t kMixedTableBytes = std::int64_t{32} << 20;

// Tables over a range of key positions, and what they were formed for (MixedKeys).
struct MixedData {
  std::vector<float> low;    // [Hq, kLow, r] and padding
  std::vector<float> cs[2];  // axis a: [Hq, rows(a), r] and padding
  I lo[2] = {0, 0}, w[2] = {0, 0};  // the positions [lo, lo + w) of each axis
  std::vector<double> freqs;  // the plan's θ [2, Hq, r/2] (the rows do not depend on the layout)
  I r = 0, Hq = 0;
  // The view of the tables for batch row b's keys.
  MixedKeys row(const attn::Dims& d, I b) const;
};

// Whether d (rope2d mixed) is within kMixedTableBytes.
bool mixed_fits(const attn::Dims& d);

// Tables covering d's key positions: the process's last ones when they were formed for the same
// frequencies and heads and cover them, else new ones (over a range grown by the last one's
// width where it grew, within kMixedTableBytes: a decode step meets one more key). Rows from
// the first row's e^{iθα} by steps in double (error ≤ ~w·2^−52), rounded to float.
std::shared_ptr<const MixedData> mixed_tables(const attn::Dims& d, int threads);

}  // namespace posenc::decode_impl
