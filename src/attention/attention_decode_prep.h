// Private: what the decode kernel (attention_decode.cc) prepares once per call before its tasks: the
// bias's tables (ALiBi's slopes, T5's table, KERPLE's and Sandwich's per-distance tables kept across
// calls, FIRE's MLP), xl's and cope's tensors, and each kv head's query rows.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "attention/attention_check.h"
#include "attention/attention_decode_task.h"
#include "attention/attention_tiles.h"
#include "attention/tile_gemm.h"
#include "enc/contextual/cope/cope_math.h"
#include "posenc/attention.h"

namespace posenc::decode_prep {

using decode_impl::Bias;
using decode_impl::I;

// KERPLE's bias per head at |Δ| = 0 … w − 1, [Hq, w] (attention_decode_prep.cc's kerple_table).
struct KerpleTable {
  std::shared_ptr<const std::vector<float>> tab;
  I w = 0;
};

// What a call's bias reads, owned (Bias points into it).
struct BiasData {
  Bias b;
  std::vector<double> slopes, sig;
  std::vector<float> t5, hs, w1, b1, w2, b2, inv;
  std::shared_ptr<const std::vector<float>> sw;
  KerpleTable kt;
};

// bd = the bias of call (p, d, t): bd->b read by the tasks, pointing into bd's own tables.
void prepare_bias(const AttentionParams& p, const attn::Dims& d, const EncodingTensors& t, int threads,
                  BiasData* bd);

// What xl and cope add to a call, prepared once: xl's u, v [Hq, D] in double and W [Hq, D, X] in
// float (read in place where it is a contiguous float32 tensor: a decode step reads it once); cope's
// table E [npos, D] in float.
struct PosData {
  I X = 0;                  // xl: the sinusoid's dimension (0: not xl)
  std::vector<double> u, v;
  std::vector<float> own;   // W converted, where it is not read in place
  const float* w = nullptr;
  I npos = 0, ncol = 0;     // cope: table rows (0: not cope), the rows a count reaches
  std::vector<float> e;
  attn_fast::TileGemmFn gemm = nullptr;  // the product's: tile_gemm_for(X) (xl), (D) (cope)
  attn_fast::TileTransposeFn tr = nullptr;  // xl: tile_transpose_fn()
  std::optional<attn_fast::BlasOneThread> one;  // where that is OpenBLAS: one thread in each task

  PosData(const AttentionParams& p, const attn::Dims& d, const EncodingTensors& t) {
    if (p.encoding == Encoding::kXL) {
      X = d.R;
      u = to_doubles(t.u);
      v = to_doubles(t.v);
      gemm = attn_fast::tile_gemm_for(X);
      tr = attn_fast::tile_transpose_fn();
      if (t.rel_proj.dtype == DType::kF32 && t.rel_proj.is_contiguous()) {
        w = static_cast<const float*>(t.rel_proj.data);
      } else {
        const std::vector<double> x = to_doubles(t.rel_proj);
        own.assign(x.begin(), x.end());
        w = own.data();
      }
    } else if (p.encoding == Encoding::kCope) {
      npos = d.npos;
      ncol = cope::rows_reached(npos, d.N);
      const std::vector<double> x = to_doubles(t.table);
      e.assign(x.begin(), x.begin() + ncol * d.D);
      gemm = attn_fast::tile_gemm_for(d.D);
    } else {
      return;
    }
    if (!gemm) one.emplace();
  }
};

// Q [R, D] of (b, kh): q_i of head kh·G + g, rotated (rotary encodings; in double, as the reference)
// and scaled, at row g·M + i; Qu (unless null): the same rows unscaled; xl: its Q and Ỹ; cope: qe
// [R, ncol] (q·E of each table row a count reaches).
void prepare_q(const attn::Dims& d, const View& q, I b, I kh, const PosData& pd, float* Q, float* Qu, float* Yt,
               float* qe);

}  // namespace posenc::decode_prep
