// Private: rope2d mixed in the decode kernel (attention_decode.cc). Its rotation differs per query
// head, so the cache holds unrotated keys: the query is rotated as for the other rotary encodings;
// per head, each key block is turned by its x angles and the query back by the y angles of a run
// of keys, from per-axis tables over the call's key positions (MixedKeys).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attention/attention_check.h"
#include "attention/attention_decode_task.h"

namespace posenc::decode_impl {

// The most bytes of a call's tables: larger position ranges leave the call to the tile kernel.
constexpr std::int64_t kMixedTableBytes = std::int64_t{32} << 20;

// Per-axis tables over a range of key positions, and what they were formed for.
struct MixedData {
  std::vector<float> cs[2];  // axis a: [Hq, w[a], r] and padding, each row the pairs' cos then sin (MixedKeys)
  I lo[2] = {0, 0}, w[2] = {0, 0};
  std::vector<double> freqs;  // the plan's θ [2, Hq, r/2] (the rows do not depend on the layout)
  I r = 0, Hq = 0;
  // The view of the tables for batch row b's keys.
  MixedKeys row(const attn::Dims& d, I b) const;
};

// Whether d (rope2d mixed) is within kMixedTableBytes.
bool mixed_fits(const attn::Dims& d);

// Tables covering d's key positions: the process's last ones when they were formed for the same
// frequencies and heads and cover them, else new ones (over a range grown by the last one's
// width where it grew, within kMixedTableBytes: a decode step meets one more key). Entries from
// e^{iθ·lo} and steps e^{iθ} in double (error ≤ ~w·2^−52), rounded to float.
std::shared_ptr<const MixedData> mixed_tables(const attn::Dims& d, int threads);

}  // namespace posenc::decode_impl
