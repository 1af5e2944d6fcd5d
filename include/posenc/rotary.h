// posenc/rotary.h — the rotary encodings beyond 1D RoPE: 2D RoPE for vision (axial and mixed),
// M-RoPE (position triples (t, h, w), chunked and interleaved sections) and xPos (RoPE with a
// per-pair decay). rope.h's RoPE is the one-position case of the same rotation.
//
// Each rotates pairs (a, b) of the first r = rotary_dim dimensions of a token's q or k — the pair
// layouts of rope.h (interleaved (2k, 2k+1) or half (k, k + r/2)) — by an angle φ_k and scales them
// by a·ρ_k (a: the attention factor of rope.h's scheme; ρ_k: xPos's decay, 1 for the others):
//
//      x'_a = a·ρ_k·(x_a·cos φ_k − x_b·sin φ_k)
//      x'_b = a·ρ_k·(x_a·sin φ_k + x_b·cos φ_k)          dimensions r .. D−1 pass through
//
// and the backward applies the transpose, a·ρ_k·R(−φ_k). The encodings differ in φ_k and ρ_k:
//
// ---- rope2d: 2D RoPE (Heo et al. 2024, RoPE-ViT, arXiv 2403.13298; the authors' code,
//      naver-ai/rope-vit, models/vit_rope.py) ---------------------------------------------------
// Two positions per token, (x, y): positions [2, L] or [B, 2, L], row 0 = x (the column: the
// authors' t_x = index mod width), row 1 = y (the row). r must be a multiple of 4.
//   axial  pairs k < r/4 rotate by x·ω_k, pairs k ≥ r/4 by y·ω_{k−r/4}: the first quarter of the
//          rotary dimensions encodes x, the next y (the authors' compute_axial_cis concatenates the x
//          and y rotations in this order), each with the ladder ω_j = theta^(−4j/r), j < r/4, which
//          is RoPE's frequency ladder for a rotary dimension of r/2: any frequency scheme of rope.h
//          applies to it (its call length: the largest coordinate + 1). theta defaults to 100, as
//          the authors' code for RoPE-Axial.
//   mixed  φ_{h,k} = x·θˣ_{h,k} + y·θʸ_{h,k} with learned per-head frequencies freqs [2, H, r/2]
//          (freqs[0] = θˣ, freqs[1] = θʸ; H the heads of x; the authors' compute_mixed_cis). The
//          backward also gives dfreqs: with y = a·R(φ)x and g = ∂L/∂y,
//            ∂L/∂φ_k = g_b·y_a − g_a·y_b,  dθˣ_{h,k} = Σ_tokens x·∂L/∂φ_k,  dθʸ_{h,k} = Σ y·∂L/∂φ_k.
//          mixed reads layout and rotary_dim (the frequencies are the tensor); theta is the
//          magnitude base of rope2d_mixed_init (the authors use 10 for RoPE-Mixed).
// q·k after rope2d depends on the positions only through the 2D offset (Δx, Δy) (tested).
//
// ---- mrope: M-RoPE (Wang et al. 2024, Qwen2-VL, arXiv 2409.12191; transformers' Qwen2-VL
//      apply_multimodal_rotary_pos_emb and Qwen3-VL apply_interleaved_mrope) ----------------------
// Three positions per token, (t, h, w): positions [3, L] or [B, 3, L]. ω_k is rope.h's (r/2
// frequencies, any scheme; the call length: the largest component + 1) and pair k rotates by
// p_axis(k)·ω_k, axis(k) given by mrope_section = [s_t, s_h, s_w] (s_t + s_h + s_w = r/2; Qwen2-VL:
// 16, 24, 24 for r = 128):
//   chunked      k < s_t: t;  s_t ≤ k < s_t + s_h: h;  else w. In transformers' half layout the
//                frequency index k is the same in both halves (its mrope_section * 2 split of the
//                cos/sin of cat(freqs, freqs)), which is pair k = (k, k + r/2) here.
//   interleaved  k ≡ 1 (mod 3) and k < 3·s_h: h;  k ≡ 2 (mod 3) and k < 3·s_w: w;  else t
//                (Qwen3-VL: t h w t h w … t t). 3·s_h ≤ r/2 + 1 and 3·s_w ≤ r/2 are required, so
//                that each axis gets exactly its count (transformers' slices would silently give
//                fewer).
// The layout defaults to half (transformers' rotate_half). A text token has t = h = w = its 1D
// position, and M-RoPE on it is RoPE (tested).
//
// ---- xpos: xPos (Sun et al. 2022, A Length-Extrapolatable Transformer, arXiv 2212.10554; the
//      authors' torchscale XPOS) -----------------------------------------------------------------
// One position per token (rope.h's positions) and RoPE's rotation (φ_k = m·ω_k, rope.h's schemes;
// the layout defaults to half as everywhere; torchscale's rotate_every_two is interleaved), scaled
// per pair by
//   ζ_k = (2k/r + γ)/(1 + γ),  ρ_k = ζ_k^((m − c)/scale_base) for a query, ζ_k^(−(m − c)/scale_base)
//   for a key,
// so that a query at m and a key at n give Σ_k ζ_k^((m − n)/scale_base)·(the RoPE terms of pair k):
// the logit depends on m − n only, c cancels. c (center) defaults to ⌈n/2⌉, n the call's length
// (largest position + 1, or rope.seq_len): torchscale's exponents run from −⌈n/2⌉ for the call's
// first position, so the scales stay near 1 (at γ = 0.4, ζ_0^(±(m − c)/scale_base) leaves
// float32's range once |m − c| > ≈ 36000·scale_base/512: keys above c, queries below it; float16's
// once |m − c| > ≈ 4500·scale_base/512, float64's ≈ 290000·scale_base/512). A call where some a·ρ_k
// exceeds the largest finite value of the output's dtype is an error naming "positions" with the
// position and the limit (m ≤ c + lim for keys, m ≥ c − lim for queries), not an inf or NaN
// output. On the other side (queries above c, keys below it) a·ρ_k falling below the dtype's
// smallest normal value (float32: |m − c| > ≈ 35700·scale_base/512) is the same error with that
// side's limit (m ≤ c + lim for queries, m ≥ c − lim for keys): the vector would flush to 0. A
// scale base so small that one position from c already leaves the range names "scale_base".
// xpos_table checks its scales so when given the dtype they are to be stored in.
// Queries and keys rotated in separate
// calls must share c: calls whose largest positions agree do (torchscale's prefill and decode
// both); otherwise pass seq_len or c itself. Defaults γ = 0.4, scale_base = 512 (the paper's and
// torchscale's). In attention (attention.h) c defaults to the middle of the call's positions.
//
// ---- arguments ----------------------------------------------------------------------------------
// x, y: [B, L, H, D], float32, float64, bfloat16 or float16 (math in float32 for the 16-bit types
// and float32, in double for float64); y has x's dtype and may alias x. Angles are formed in double
// (rope.h's accurate mode, or its hf mode where the params ask for it; mixed: x·θˣ + y·θʸ in double).
// The public functions are fast paths (RoPE's Highway kernel, rope_cpu.cc; bound as rope.h's, ρ
// computed in double and rounded once; a call with an angle beyond 2^47 runs the reference, as
// rope.h says); posenc::reference (reference.h) holds the plain ones. Positions are bounded as
// view.h says (|position| ≤ 2^53); rope.h bounds the frequencies, and mixed's freqs must be finite
// with |θ| ≤ 2^968, so that every angle is finite.
// Errors name the argument ("x", "positions", "freqs", "dfreqs") or the params field
// ("rotary_dim", "mrope_section", "scale_base", "gamma", "center", "theta", …).
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
Expected<Rope2dVariant> parse_rope2d_variant(const std::string& s);

struct Rope2dParams {
  Rope2dVariant variant = Rope2dVariant::kAxial;
  // layout, rotary_dim (a multiple of 4, 0 = D) and, for axial, theta and the frequency scheme of
  // the per-axis ladder (rotary dimension r/2).
  RopeParams rope{.theta = 100.0};

  bool operator==(const Rope2dParams&) const = default;
};

// freqs [2, H, r/2] for rope2d mixed: x [B, L, H, D]; positions [2, L] or [B, 2, L].
Status rope2d_forward(const Rope2dParams& p, const View& x, const Positions& pos, const View& freqs,
                      const View& y);
// dx = (a·R(φ))ᵀ dy; dfreqs (mixed, optional, [2, H, r/2], overwritten) needs x, the forward's input.
// dx may be absent when dfreqs is given.
Status rope2d_backward(const Rope2dParams& p, const View& dy, const Positions& pos, const View& freqs,
                       const View& dx, const View& x = View{}, const View& dfreqs = View{});

// RoPE-Mixed's initialisation (the authors' init_random_2d_freqs): for head h with angle α_h and the
// magnitudes μ_j = theta^(−4j/r), j < r/4,
//   freqs[0][h] = (μ·cos α_h, μ·cos(α_h + π/2)),   freqs[1][h] = (μ·sin α_h, μ·sin(α_h + π/2)),
// i.e. the first r/4 pairs point along the direction α_h and the next r/4 along α_h + π/2 (α_h = 0:
// RoPE-Axial's frequencies). The authors draw α_h uniformly in [0, 2π). Returns [2, H, r/2].
Expected<std::vector<double>> rope2d_mixed_init(std::int64_t heads, std::int64_t rotary_dim, double theta,
                                                const std::vector<double>& angles);

// ---- mrope ----------------------------------------------------------------------------------------
enum class MropeVariant { kChunked, kInterleaved };
const char* mrope_variant_name(MropeVariant v);  // "chunked" / "interleaved"
Expected<MropeVariant> parse_mrope_variant(const std::string& s);

struct MropeParams {
  MropeVariant variant = MropeVariant::kChunked;
  std::vector<std::int64_t> mrope_section{};  // [s_t, s_h, s_w], sum r/2 (required)
  RopeParams rope{.layout = RopeLayout::kHalf};  // the frequencies and pair layout

  bool operator==(const MropeParams&) const = default;
};

// x [B, L, H, D]; positions [3, L] or [B, 3, L] (absent ids: (p, p, p), p = offset + l).
Status mrope_forward(const MropeParams& p, const View& x, const Positions& pos, const View& y);
Status mrope_backward(const MropeParams& p, const View& dy, const Positions& pos, const View& dx);

// The (t, h, w) ids of one sequence of text runs and image / video grids, as transformers'
// Qwen2-VL get_rope_index builds them: a text run continues from the largest id so far + 1 in all
// three rows (0 at the start); a grid of t × h × w tokens (after dividing h and w by spatial_merge,
// which must divide them) placed after the text before it gets t-index + s, row + s, column + s
// with s = that text's first id + its length, tokens ordered t-major, then rows, then columns.
// Videos follow the same rule as images (Qwen2-VL; Qwen2.5-VL's scaling of t by seconds per grid
// step is not done here).
struct MropeSegment {
  enum class Kind { kText, kImage, kVideo };
  Kind kind = Kind::kText;
  std::int64_t length = 0;           // text: number of tokens (≥ 1)
  std::int64_t t = 1, h = 1, w = 1;  // image, video: the grid (each ≥ 1)
};
struct MropePositions {
  std::vector<std::int64_t> ids;  // [3, L]: rows t, h, w
  std::int64_t length = 0;        // L
  std::int64_t next = 0;          // largest id + 1: where a following text token sits
  std::int64_t delta() const { return next - length; }  // transformers' rope_deltas
};
Expected<MropePositions> mrope_positions(const std::vector<MropeSegment>& segments,
                                         std::int64_t spatial_merge = 1);

// ---- xpos -----------------------------------------------------------------------------------------
enum class XposRole { kQuery, kKey };
const char* xpos_role_name(XposRole r);  // "query" / "key"
Expected<XposRole> parse_xpos_role(const std::string& s);

struct XposParams {
  double scale_base = 512.0;            // > 0
  double gamma = 0.4;                   // > 0
  std::optional<std::int64_t> center{};  // c; absent: ⌈n/2⌉, n the call's length
  RopeParams rope{};                    // the rotation (layout half by default)

  bool operator==(const XposParams&) const = default;
};

// x [B, L, H, D] holding queries (role kQuery: scaled by ζ^((m−c)/s)) or keys (kKey: ζ^(−(m−c)/s)).
Status xpos_forward(const XposParams& p, XposRole role, const View& x, const Positions& pos, const View& y);
Status xpos_backward(const XposParams& p, XposRole role, const View& dy, const Positions& pos, const View& dx);

// The centre c of a call whose length is n (largest position + 1; seq_len when set): p.center, else ⌈n/2⌉.
std::int64_t xpos_center(const XposParams& p, std::int64_t n);

// ---- tables (what posenc table writes) --------------------------------------------------------------
// For one sequence of L tokens at pos (ids [A, L], xpos [L]; or offset + l) and head dimension D:
// the angle φ and the factor a·ρ of every pair, as the forward rotation uses them (the rotation of
// pair k is a·ρ·R(φ)); [heads, L, r/2] each, heads = H of freqs for rope2d mixed, else 1. The
// validation and errors are the forward's (x being [1, L, heads, D]).
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
