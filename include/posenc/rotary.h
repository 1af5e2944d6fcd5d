// posenc/rotary.h — rotary encodings beyond 1D RoPE: 2D RoPE (axial, mixed), M-RoPE and xPos.
// Angles, scales, position ids, ranges and errors: docs/rotary.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "posenc/rope.h"
#include "posenc/view.h"

namespace posenc {

// ---- rope2d ---------------------------------------------------------------------------------------
enum class Rope2dVariant { kAxial, kMixed };
const char* rope2d_variant_name(Rope2dVariant v);  // "axial" / "mixed"
Expected<Rope2dVariant> parse_rope2d_variant(const std::string& s);  // inverse of the above

// 2D RoPE (RoPE-ViT): positions (x, y) per token.
struct Rope2dParams {
  Rope2dVariant variant = Rope2dVariant::kAxial;
  // layout, rotary_dim (a multiple of 4, 0 = D) and, for axial, theta and the frequency scheme of
  // the per-axis ladder (rotary dimension r/2).
  RopeParams rope{.theta = 100.0};

  bool operator==(const Rope2dParams&) const = default;
};

// x, y [B, L, H, D]; positions [2, L] or [B, 2, L] (row 0 x, row 1 y); freqs [2, H, r/2] for mixed
// (absent for axial). Errors name the argument or the params field.
Status rope2d_forward(const Rope2dParams& p, const View& x, const Positions& pos, const View& freqs,
                      const View& y);
// dx = (a·R(φ))ᵀ dy; dfreqs (mixed, optional, [2, H, r/2], overwritten) needs x, the forward's input.
// dx may be absent when dfreqs is given.
Status rope2d_backward(const Rope2dParams& p, const View& dy, const Positions& pos, const View& freqs,
                       const View& dx, const View& x = View{}, const View& dfreqs = View{});

// RoPE-Mixed's initialisation (the authors' init_random_2d_freqs) for the given per-head angles
// α_h (one per head): returns freqs [2, H, r/2], magnitudes theta^(−4j/r) along α_h and α_h + π/2.
Expected<std::vector<double>> rope2d_mixed_init(std::int64_t heads, std::int64_t rotary_dim, double theta,
                                                const std::vector<double>& angles);

// ---- mrope ----------------------------------------------------------------------------------------
enum class MropeVariant { kChunked, kInterleaved };
const char* mrope_variant_name(MropeVariant v);  // "chunked" / "interleaved"
Expected<MropeVariant> parse_mrope_variant(const std::string& s);  // inverse of the above

// M-RoPE (Qwen2-VL): positions (t, h, w) per token; pair k reads the axis mrope_section assigns it.
struct MropeParams {
  MropeVariant variant = MropeVariant::kChunked;
  std::vector<std::int64_t> mrope_section{};  // [s_t, s_h, s_w], sum r/2 (required)
  RopeParams rope{.layout = RopeLayout::kHalf};  // the frequencies and pair layout

  bool operator==(const MropeParams&) const = default;
};

// x, y [B, L, H, D]; positions [3, L] or [B, 3, L] (absent ids: (p, p, p), p = offset + l).
// Errors name the argument or the params field.
Status mrope_forward(const MropeParams& p, const View& x, const Positions& pos, const View& y);
// dx = (a·R(φ))ᵀ dy, with mrope_forward's shapes and errors.
Status mrope_backward(const MropeParams& p, const View& dy, const Positions& pos, const View& dx);

// One piece of a sequence for mrope_positions: a text run or an image / video grid.
struct MropeSegment {
  enum class Kind { kText, kImage, kVideo };
  Kind kind = Kind::kText;
  std::int64_t length = 0;           // text: number of tokens (≥ 1)
  std::int64_t t = 1, h = 1, w = 1;  // image, video: the grid (each ≥ 1)
};
// The (t, h, w) ids of a sequence and where a following text token sits.
struct MropePositions {
  std::vector<std::int64_t> ids;  // [3, L]: rows t, h, w
  std::int64_t length = 0;        // L
  std::int64_t next = 0;          // largest id + 1: where a following text token sits
  std::int64_t delta() const { return next - length; }  // transformers' rope_deltas
};
// The ids of one sequence of segments, as transformers' Qwen2-VL get_rope_index builds them
// (docs/rotary.md); spatial_merge must divide every grid's h and w. Errors name segments or
// spatial_merge.
Expected<MropePositions> mrope_positions(const std::vector<MropeSegment>& segments,
                                         std::int64_t spatial_merge = 1);

// ---- xpos -----------------------------------------------------------------------------------------
enum class XposRole { kQuery, kKey };
const char* xpos_role_name(XposRole r);  // "query" / "key"
Expected<XposRole> parse_xpos_role(const std::string& s);  // inverse of the above

// xPos: RoPE's rotation with a per-pair decay ζ^(±(m − c)/scale_base).
struct XposParams {
  double scale_base = 512.0;            // > 0
  double gamma = 0.4;                   // > 0
  std::optional<std::int64_t> center{};  // c; absent: ⌈n/2⌉, n the call's length
  RopeParams rope{};                    // the rotation (layout half by default)

  bool operator==(const XposParams&) const = default;
};

// x, y [B, L, H, D] holding queries (role kQuery: scaled by ζ^((m−c)/s)) or keys (kKey: ζ^(−(m−c)/s)).
// A scale beyond the output dtype's range is an error naming positions (or scale_base).
Status xpos_forward(const XposParams& p, XposRole role, const View& x, const Positions& pos, const View& y);
// dx = (a·ρ·R(φ))ᵀ dy, with xpos_forward's shapes and errors.
Status xpos_backward(const XposParams& p, XposRole role, const View& dy, const Positions& pos, const View& dx);

// The centre c of a call whose length is n (largest position + 1; seq_len when set): p.center, else ⌈n/2⌉.
std::int64_t xpos_center(const XposParams& p, std::int64_t n);

// ---- tables (what posenc table writes) --------------------------------------------------------------
// The angle φ and factor a·ρ of every pair for one sequence of L tokens at pos, [heads, L, r/2] each
// (heads = H of freqs for rope2d mixed, else 1); validation and errors as the forward's.
// A table of angles φ and scales a·ρ, [heads, length, pairs] each (C order).
struct RotaryTable {
  std::int64_t heads = 1, length = 0, pairs = 0;
  std::vector<double> angle, scale;
};
Expected<RotaryTable> rope2d_table(const Rope2dParams& p, std::int64_t head_dim, std::int64_t length,
                                   const Positions& pos, const View& freqs);
Expected<RotaryTable> mrope_table(const MropeParams& p, std::int64_t head_dim, std::int64_t length,
                                  const Positions& pos);
// xpos_table: with scale_dtype, the scales must be finite in that dtype (the table's storage), as
// xpos_forward requires of its output's; without, they are not checked (an angle table).
Expected<RotaryTable> xpos_table(const XposParams& p, XposRole role, std::int64_t head_dim, std::int64_t length,
                                 const Positions& pos, std::optional<DType> scale_dtype = std::nullopt);

}  // namespace posenc
