// M-RoPE's position ids of one sequence of text runs and image / video grids: transformers' Qwen2-VL
// get_rope_index (see docs/rotary.md and mrope_math.h), written from its rule.
#include <algorithm>
#include <string>

#include "enc/rotary/mrope/mrope_math.h"
#include "posenc/rotary.h"

namespace posenc {

Expected<MropePositions> mrope_positions(const std::vector<MropeSegment>& segments, std::int64_t spatial_merge) {
  using I = std::int64_t;
  if (spatial_merge < 1)
    return Status::Invalid("spatial_merge", "expected a factor >= 1, got " + std::to_string(spatial_merge));
  constexpr I kMaxTokens = I{1} << 31;  // far beyond any context; keeps every id exact
  I total = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const MropeSegment& s = segments[i];
    const std::string at = "segment " + std::to_string(i + 1);
    I n = 0;
    if (s.kind == MropeSegment::Kind::kText) {
      if (s.length < 1) return Status::Invalid("segments", at + ": expected a text run of >= 1 tokens, got " +
                                                               std::to_string(s.length));
      n = s.length;
    } else if (s.kind == MropeSegment::Kind::kImage || s.kind == MropeSegment::Kind::kVideo) {
      if (s.t < 1 || s.h < 1 || s.w < 1)
        return Status::Invalid("segments", at + ": expected a grid t x h x w of sizes >= 1, got " +
                                               std::to_string(s.t) + "x" + std::to_string(s.h) + "x" + std::to_string(s.w));
      if (s.h % spatial_merge != 0 || s.w % spatial_merge != 0)
        return Status::Invalid("segments", at + ": the spatial merge " + std::to_string(spatial_merge) +
                                               " must divide h = " + std::to_string(s.h) + " and w = " +
                                               std::to_string(s.w));
      if (s.t > kMaxTokens || s.h > kMaxTokens || s.w > kMaxTokens)
        return Status::Invalid("segments", at + ": grid too large");
      // each factor ≤ 2^31: the product may pass int64 (t·h alone does not)
      if (__builtin_mul_overflow(s.t * (s.h / spatial_merge), s.w / spatial_merge, &n))
        return Status::Invalid("segments", at + ": grid too large (more than 2^31 tokens)");
    } else {
      return Status::Invalid("segments", at + ": unknown kind " + std::to_string(static_cast<int>(s.kind)));
    }
    if (n > kMaxTokens || total > kMaxTokens - n)
      return Status::Invalid("segments", "expected at most 2^31 tokens in all");
    total += n;
  }
  if (total == 0) return Status::Invalid("segments", "expected at least one segment");

  MropePositions out;
  out.length = total;
  out.ids.assign(static_cast<std::size_t>(3 * total), 0);
  auto put = [&](I tok, I t, I h, I w) {
    out.ids[static_cast<std::size_t>(tok)] = t;
    out.ids[static_cast<std::size_t>(total + tok)] = h;
    out.ids[static_cast<std::size_t>(2 * total + tok)] = w;
  };
  // next: the largest id so far + 1 (get_rope_index's st_idx, 0 at the start). A text run takes
  // next, next + 1, … in all three rows; a grid placed after it starts at st_idx + text_len, which is
  // again the largest id so far + 1.
  I tok = 0, next = 0;
  for (const MropeSegment& s : segments) {
    if (s.kind == MropeSegment::Kind::kText) {
      for (I j = 0; j < s.length; ++j) put(tok++, next + j, next + j, next + j);
      next += s.length;
      continue;
    }
    const I start = next, gt = s.t, gh = s.h / spatial_merge, gw = s.w / spatial_merge;
    for (I ti = 0; ti < gt; ++ti)
      for (I hi = 0; hi < gh; ++hi)
        for (I wi = 0; wi < gw; ++wi)
          put(tok++, mrope::grid_id(ti, start), mrope::grid_id(hi, start), mrope::grid_id(wi, start));
    next = start + std::max({gt, gh, gw});  // the grid's largest id + 1
  }
  out.next = next;
  return out;
}

}  // namespace posenc
