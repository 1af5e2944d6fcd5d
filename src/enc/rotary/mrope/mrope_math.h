// M-RoPE's formulas written once (see docs/rotary.md for the definitions).
//
// Sources: Wang et al. 2024, Qwen2-VL (arXiv 2409.12191), its Multimodal Rotary Position Embedding;
// transformers' Qwen2-VL apply_multimodal_rotary_pos_emb (chunked sections: the cos/sin of
// cat(freqs, freqs) split by mrope_section * 2, chunk i taking row i mod 3 of (t, h, w)), Qwen3-VL's
// apply_interleaved_mrope (interleaved: frequency index k takes h where k ≡ 1 mod 3 below 3·s_h, w
// where k ≡ 2 mod 3 below 3·s_w, t elsewhere) and Qwen2-VL's get_rope_index (the position ids).
#pragma once

#include <cstdint>

namespace posenc::mrope {

using I = std::int64_t;

// The position row (0 = t, 1 = h, 2 = w) that frequency index k reads, k < r/2, s = mrope_section.
inline int chunked_axis(I k, const I* s) { return k < s[0] ? 0 : k < s[0] + s[1] ? 1 : 2; }
inline int interleaved_axis(I k, const I* s) {
  if (k % 3 == 1 && k < 3 * s[1]) return 1;
  if (k % 3 == 2 && k < 3 * s[2]) return 2;
  return 0;
}

// get_rope_index's grid token (ti, hi, wi) of a grid placed at start s: (ti + s, hi + s, wi + s);
// a text token j of a run that starts at s: (s + j) in all three rows.
inline I grid_id(I index, I start) { return index + start; }

}  // namespace posenc::mrope
