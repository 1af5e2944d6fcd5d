// class Fused (attention_fused_cpu.h): the backward (FlashAttention-2; attention_cpu.cc describes
// its passes): pass 1's lse and D, pass 2 per (b, kv head) over its key blocks, the split of a unit
// over the threads, dQ's rotation back and rope2d mixed's frequency gradients. Where its tiles fit,
// a backward without saved statistics takes the stored path instead
// (attention_fused_backward_stored.cc).
#include <omp.h>

#include "attention/attention_fused_cpu.h"
#include "enc/rotary/rope/rope_math.h"

namespace posenc::fused_cpu {

void Fused::backward(const View& dout, const View& dq, const View& dk, const View& dv,
                     const EncodingGrads& g, const Saved* saved) const {
  const I B = d_.B, M = d_.M, N = d_.N, Hq = d_.Hq, Hkv = d_.Hkv, D = d_.D, G = d_.G;
  Bwd bw{dout, direct(dout), dq, dk, dv, {}, {}, 0};
  // the careful steps on every tile (attention_tiles.h): k or v not finite
  bw.careful = (cf_.k_known ? !cf_.k_finite : !all_finite(simd_, k_, threads_)) ||
               !all_finite(simd_, v_, threads_);
  // the bfloat16 rate (keys_rate): the forward's conditions, dout bfloat16 too, not rope2d mixed
  bw.rate = bf16_ && !bw.careful && !per_head_ && dout.dtype == DType::kBF16 && M > 1;
  // rope2d mixed with dfreqs: the per-head sums [2, r/2] in gw; dQ̃ is then accumulated even
  // when dq is not wanted.
  bw.freq = per_head_ && g.freqs.present();
  bw.npar = bias_ == Bias::kT5 ? p_.t5.num_buckets
            : bias_ == Bias::kLearned || p_.encoding == Encoding::kKerple ? 2
            : bias_ == Bias::kFire ? 2 * fire_p_.segs() + 2
            : bw.freq              ? 2 * d_.rot.half
                                   : 0;
  const I npar = bw.npar;
  std::vector<double> gw(ix(B * Hq * npar), 0.0);  // [B, Hq, npar]
  if (stored_ok(bw, saved)) {  // attention_fused_backward_stored.cc
    stored_backward(bw, &gw);
    write_param_grads(gw, bw, g);
    return;
  }
  pass1(&bw, saved);
  attn_fast::RegionGuard guard;
  // pass 2, per (b, kv head) = unit; units beyond the last multiple of the thread count are split
  // over the key blocks (see the file comment).
  const I U = B * Hkv, T = threads_, whole = U - U % T, nkb = (N + kBk - 1) / kBk;
  const bool need_dq = dq.present() || bw.freq;
  const bool dq_dir = dq.present() && direct_out(dq, Hq) && !attn_fast::dq_buffered(G, M, D);
#pragma omp parallel num_threads(threads_) if (threads_ > 1 && whole > 1)
  if (whole > 0) {
    Scratch& w = thread_scratch();
    std::vector<float> dqbuf;  // [G, M, D]
    guard.run([&] {
      w.init(D);
      w.init_backward(D);
      if (bw.rate) w.init_bf16_backward(D);
      dqbuf.resize(need_dq && !dq_dir ? ix(G * M * D) : 0);
    });
#pragma omp for schedule(dynamic, 1)
    for (I u = 0; u < whole; ++u) {
      if (guard.failed()) continue;
      const I b = u / Hkv, kh = u % Hkv;
      const Acc acc = dq_dir    ? dq_in_place(dq, b, kh)
                      : need_dq ? Acc{dqbuf.data(), D, M * D, 0}
                                : Acc{};
      for (I g = 0; g < G && acc.p; ++g) zero_rows(acc, g, 0, M);
      keys(bw, b, kh, 0, nkb, acc, npar ? &gw[ix((b * Hq + kh * G) * npar)] : nullptr, &w);
      for (I g = 0; g < G && acc.p; ++g) {
        if (bw.freq)  // dQ̃ of head h is complete: its frequency gradient, before it is rotated back
          freq_grad_rows(true, b, kh * G + g, 0, M, nullptr, 0, acc.row(g, 0), acc.ld, w.row.data(),
                         &gw[ix((b * Hq + kh * G + g) * npar)]);
        finish_dq(dq, dq_dir, acc, b, kh, g, 0, M);
      }
    }
  }
  guard.rethrow();
  for (I u = whole; u < U; ++u) split_unit(bw, u / Hkv, u % Hkv, dq_dir, &gw);
  write_param_grads(gw, bw, g);
}

void Fused::pass1(Bwd* bw, const Saved* saved) const {
  const I B = d_.B, M = d_.M, Hq = d_.Hq, D = d_.D;
  // Pass 1 at the rate too, unless there are parameter gradients: they sum dS over whole rows, and
  // Σ_j dS_ij = 0 needs D of the out pass 2's P gives (the float32 products' out)
  const bool rate1 = bw->rate && bw->npar == 0;
  // pass 1: lse and D = rowsum(dO ⊙ out), [B, Hq, M]
  bw->lse.resize(ix(B * Hq * M));
  bw->Dv.resize(ix(B * Hq * M));
  const I nqb = (M + kBq - 1) / kBq;
  Panels panels = saved ? Panels{} : key_panels(rate1);  // released after pass 1
  attn_fast::RegionGuard guard;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    Scratch& w = thread_scratch();
    std::vector<double> l;
    guard.run([&] {
      w.init(D);
      w.init_backward(D);
      if (rate1) w.init_bf16(D);
      l.resize(ix(kBq));
    });
#pragma omp for schedule(dynamic, 1)
    for (I task = 0; task < B * Hq * nqb; ++task) {
      if (guard.failed()) continue;
      I b, h, q0, nq;
      query_task(task, nqb, &b, &h, &q0, &nq);
      if (saved) {
        attn_fast::load_rows(saved->out, D, b, q0, nq, h, w.o.data());
        const View& ls = saved->lse;
        const double* base = static_cast<const double*>(ls.data);
        for (I i = 0; i < nq; ++i) l[ix(i)] = base[b * ls.strides[0] + h * ls.strides[1] + (q0 + i) * ls.strides[2]];
      } else {
        forward_block(b, h, q0, nq, &w, w.o.data(), l.data(), bw->careful, rate1, &panels);
      }
      const Tile dO = rows(bw->dout, bw->dir_dout, b, q0, nq, h, w.dout.data(), nullptr, 0);
      for (I i = 0; i < nq; ++i) {
        const std::size_t at = ix((b * Hq + h) * M + q0 + i);
        bw->lse[at] = static_cast<float>(l[ix(i)]);
        bw->Dv[at] = simd_.dot(dO.p + i * dO.ld, &w.o[ix(i * D)], ix(D));
      }
    }
  }
  guard.rethrow();
}

void Fused::write_param_grads(const std::vector<double>& gw, const Bwd& bw, const EncodingGrads& g) const {
  const I B = d_.B, Hq = d_.Hq, npar = bw.npar;
  std::vector<double> sum(ix(Hq * npar), 0.0);  // [Hq, npar]
  for (I h = 0; h < Hq; ++h)
    for (I r = 0; r < npar; ++r) {
      double acc = 0;
      for (I b = 0; b < B; ++b) acc += gw[ix((b * Hq + h) * npar + r)];
      sum[ix(h * npar + r)] = acc;
    }
  if (g.weights.present())  // t5, learned alibi: [npar, Hq]
    for (I r = 0; r < npar; ++r)
      for (I h = 0; h < Hq; ++h) g.weights.set(r * Hq + h, sum[ix(h * npar + r)]);
  if (p_.encoding == Encoding::kKerple)  // [Hq, 2]: ∂/∂r1, ∂/∂r2
    for (I h = 0; h < Hq; ++h) {
      if (g.r1.present()) g.r1.set(h, sum[ix(h * npar)]);
      if (g.r2.present()) g.r2.set(h, sum[ix(h * npar + 1)]);
    }
  if (bias_ == Bias::kFire) fire_grads(sum, g.fire);
  if (bw.freq) {  // [2, Hq, r/2]: ∂/∂θˣ, ∂/∂θʸ
    const I half = d_.rot.half;
    for (I ax = 0; ax < 2; ++ax)
      for (I h = 0; h < Hq; ++h)
        for (I k = 0; k < half; ++k) g.freqs.set((ax * Hq + h) * half + k, sum[ix(h * npar + ax * half + k)]);
  }
}

void Fused::finish_dq(const View& dq, bool in_place, const Acc& a, I b, I kh, I g, I i0, I i1) const {
  if (i1 <= i0) return;
  float* y = a.row(g, i0);
  const I h = kh * d_.G + g;
  if (tq_) rotate(y, i1 - i0, a.ld, *tq_, b, h, i0, true);
  if (!in_place && dq.present()) attn_fast::store_rows(dq, d_.D, b, i0, i1 - i0, h, y);
}

void Fused::freq_grad_rows(bool query, I b, I h, I i0, I n, const float* yt, I yld, const float* gt, I gld,
                           float* tmp, double* fg) const {
  const I half = d_.rot.half, L = query ? d_.M : d_.N;
  const std::vector<I>& ids = query ? d_.q_ids : d_.k_ids;
  const I bb = (query ? d_.q_batched : d_.k_batched) ? b : 0;
  for (I r = 0; r < n; ++r) {
    const I i = i0 + r;
    const float* y = yt ? yt + r * yld : tmp;
    if (!yt) {
      attn_fast::load_rows(q_, d_.D, b, i, 1, h, tmp);
      rotate(tmp, 1, d_.D, *tq_, b, h, i, false);
    }
    const float* g = gt + r * gld;
    const double px = static_cast<double>(ids[ix((bb * 2 + 0) * L + i)]) - pos0_[0];
    const double py = static_cast<double>(ids[ix((bb * 2 + 1) * L + i)]) - pos0_[1];
    for (I k = 0; k < half; ++k) {
      const I ia = interleaved_ ? 2 * k : k, ib = interleaved_ ? 2 * k + 1 : k + half;
      const double dphi = rope2d::dphi(y[ia], y[ib], g[ia], g[ib]);
      fg[k] += px * dphi;
      fg[half + k] += py * dphi;
    }
  }
}

std::vector<float> Fused::dense_rows(const Bwd& bw, I b, I kh) const {
  const I D = d_.D, G = d_.G, M = d_.M;
  std::vector<float> dense;
  if (2 * G * M * D * I{4} > dq_buffer_limit.load()) return dense;
  try {
    dense.resize(ix(2 * G * M * D));
  } catch (const std::bad_alloc&) {
    return dense;
  }
  for (I g = 0; g < G; ++g)
    for (I i0 = 0; i0 < M; i0 += kBq) {
      const I nq = std::min(kBq, M - i0), h = kh * G + g;
      rows(q_, false, b, i0, nq, h, &dense[ix((g * M + i0) * D)], tq_, h);
      rows(bw.dout, false, b, i0, nq, h, &dense[ix(((G + g) * M + i0) * D)], nullptr, 0);
    }
  return dense;
}

void Fused::keys(const Bwd& bw, I b, I kh, I kb0, I kb1, const Acc& acc, double* gwu, Scratch* w) const {
  if (bw.rate && keys_rate(bw, b, kh, kb0, kb1, acc, gwu, w)) return;
  const I D = d_.D, G = d_.G, M = d_.M, Hq = d_.Hq;
  const float sc = static_cast<float>(d_.scale);
  float* S = w->s.data();
  float* dP = w->dp.data();
  // dK̃ is needed for dk and for mixed's dfreqs. Mixed rotates the key block per query head (its
  // frequencies are per head): dK̃ of each head is rotated back on its own, then summed.
  const bool want_dk = bw.dk.present() || bw.freq;
  const std::vector<float> dense = dense_rows(bw, b, kh);  // else each tile's rows copied below
  for (I kb = kb0; kb < kb1; ++kb) {
    const I j0 = kb * kBk, nk = std::min(kBk, d_.N - j0), kp0 = d_.k_off + j0;
    // K, Q and dO are copied into dense rows (stride D) even where they could be read in place:
    // the dQ, dK and dV products read them as B, a row per step, and rows at the tensors' stride
    // (Hq·D floats) share few L1 sets
    Tile K{nullptr, D};
    if (!per_head_) K = rows(k_, false, b, j0, nk, kh, w->k.data(), tk_, kh * G);
    const Tile V = rows(v_, dir_v_, b, j0, nk, kh, w->v.data(), nullptr, 0);
    // Kᵀ and Vᵀ once for the block's query tiles (kNP), not packed again by each kNT product
    const bool packed = gemm_ != nullptr;
    if (packed) {
      if (!per_head_) tr_(K.p, K.ld, nk, D, w->kt.data(), kLdt);
      tr_(V.p, V.ld, nk, D, w->vt.data(), kLdt);
    }
    std::fill(w->dk.begin(), w->dk.begin() + nk * D, 0.f);
    std::fill(w->dv.begin(), w->dv.begin() + nk * D, 0.f);
    for (I g = 0; g < G; ++g) {
      const I h = kh * G + g;
      I ilo, ihi;
      query_range(h, kp0, nk, &ilo, &ihi);
      double* gwh = gwu ? gwu + g * bw.npar : nullptr;
      float* dKt = w->dk.data();
      if (per_head_) {
        K = rows(k_, false, b, j0, nk, kh, w->k.data(), tk_, h);
        if (packed) tr_(K.p, K.ld, nk, D, w->kt.data(), kLdt);
        dKt = w->dkg.data();
        std::fill(dKt, dKt + nk * D, 0.f);
      }
      for (I i0 = ilo; i0 < ihi; i0 += kBq) {
        const I nq = std::min(kBq, ihi - i0);
        const Tile Q = dense.empty() ? rows(q_, false, b, i0, nq, h, w->q.data(), tq_, h)
                                     : Tile{&dense[ix((g * M + i0) * D)], D};
        const Tile dO = dense.empty() ? rows(bw.dout, false, b, i0, nq, h, w->dout.data(), nullptr, 0)
                                      : Tile{&dense[ix(((G + g) * M + i0) * D)], D};
        logits(h, i0, nq, j0, nk, Q, K, w, packed && nq > 1 ? w->kt.data() : nullptr);
        // banded (tile_gemm.h): P and dS are formed on each row's visible keys only, the masked
        // ones keeping logits' zeros; dP's masked entries may stay unset
        const I bd = band(h, kp0 - (d_.q_off + i0));
        simd_.exp_rows(S, nq, nk, kBk, &bw.lse[ix((b * Hq + h) * M + i0)], bd);  // P
        const float* Di = &bw.Dv[ix((b * Hq + h) * M + i0)];
        if (packed)
          tile_gemm(gemm_, GemmForm::kNP, nq, nk, D, 1.f, dO.p, dO.ld, w->vt.data(), kLdt, dP, kBk, bd);
        else
          tile_gemm(gemm_, GemmForm::kNT, nq, nk, D, 1.f, dO.p, dO.ld, V.p, V.ld, dP, kBk, bd);
        // careful (attention_tiles.h): the products read sanitized dO, Q, K; dO's non-finite
        // entries' terms added back into dV; dS 0 wherever P is
        const bool careful = bw.careful || careful_rows(&bw.lse[ix((b * Hq + h) * M + i0)], Di, nq);
        const bool bad_do = careful && sanitize_rows(dO.p, dO.ld, nq, D, w->dos.data());
        if (bw.dv.present()) {
          const Tile dOp = bad_do ? Tile{w->dos.data(), D} : dO;
          tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, 1.f, S, kBk, dOp.p, dOp.ld, w->dv.data(), D, bd);
          if (bad_do) add_back_ptdo(S, nq, nk, dO.p, dO.ld, D, w->dv.data());
        }
        for (I i = 0; i < nq; ++i) {
          const I n = std::clamp<I>(i + bd + 1, 0, nk);
          if (careful) careful_ds(S + i * kBk, dP + i * kBk, n, Di[i]);
          else simd_.ds_row(S + i * kBk, dP + i * kBk, ix(n), Di[i]);
        }
        if (gwh && bias_ == Bias::kFire)
          fire_tile(h, i0, kp0 - (d_.q_off + i0), nq, nk, nullptr, S, gwh);
        else if (gwh && bias_ != Bias::kNone)
          param_grads(h, kp0 - (d_.q_off + i0), nq, nk, S, w->diag.data(), gwh);
        if (want_dk) {
          const Tile Qp = careful && sanitize_rows(Q.p, Q.ld, nq, D, w->qs.data()) ? Tile{w->qs.data(), D} : Q;
          tile_gemm(gemm_, GemmForm::kTN, nk, D, nq, sc, S, kBk, Qp.p, Qp.ld, dKt, D, bd);
        }
        if (acc.p) {
          const Tile Kp = careful && sanitize_rows(K.p, K.ld, nk, D, w->ks.data()) ? Tile{w->ks.data(), D} : K;
          tile_gemm(gemm_, GemmForm::kNN, nq, D, nk, sc, S, kBk, Kp.p, Kp.ld, acc.row(g, i0), acc.ld, bd);
        }
      }
      if (per_head_) {  // this head's dK̃ of the block is complete
        if (bw.freq && gwh) freq_grad_rows(false, b, h, j0, nk, K.p, K.ld, dKt, D, nullptr, gwh);
        rotate(dKt, nk, D, *tk_, b, h, j0, true);
        simd_.add_to(w->dk.data(), dKt, ix(nk * D));
      }
    }
    if (bw.dk.present()) {
      if (tk_ && !per_head_) rotate(w->dk.data(), nk, D, *tk_, b, kh * G, j0, true);
      attn_fast::store_rows(bw.dk, D, b, j0, nk, kh, w->dk.data());
    }
    if (bw.dv.present()) attn_fast::store_rows(bw.dv, D, b, j0, nk, kh, w->dv.data());
  }
}

std::vector<I> Fused::key_cuts(I kh, I T) const {
  const I nkb = (d_.N + kBk - 1) / kBk;
  std::vector<double> pre(ix(nkb + 1), 0.0);  // work of the blocks before kb
  for (I kb = 0; kb < nkb; ++kb) {
    const I nk = std::min(kBk, d_.N - kb * kBk);
    double c = static_cast<double>(kBq) / 4;
    for (I g = 0; g < d_.G; ++g) {
      I ilo, ihi;
      query_range(kh * d_.G + g, d_.k_off + kb * kBk, nk, &ilo, &ihi);
      c += static_cast<double>(std::max<I>(ihi - ilo, 0));
    }
    pre[ix(kb + 1)] = pre[ix(kb)] + c * static_cast<double>(nk);
  }
  std::vector<I> cuts(ix(T + 1), nkb);
  cuts[0] = 0;
  I x = 0;
  for (I p = 1; p < T; ++p) {
    const double target = pre[ix(nkb)] * static_cast<double>(p) / static_cast<double>(T);
    while (x < nkb && pre[ix(x + 1)] <= target) ++x;
    if (x < nkb && pre[ix(x + 1)] - target < target - pre[ix(x)]) ++x;  // the nearer cut
    cuts[ix(p)] = x;
  }
  return cuts;
}

void Fused::split_unit(const Bwd& bw, I b, I kh, bool dq_dir, std::vector<double>* gw) const {
  const I T = threads_, M = d_.M, D = d_.D, G = d_.G, npar = bw.npar;
  const std::vector<I> cuts = key_cuts(kh, T);
  std::vector<I> qlo(ix(T), 0), qhi(ix(T), 0);  // dQ rows each part touches
  for (I p = 0; p < T; ++p) {
    I lo = M, hi = 0;
    for (I kb = cuts[ix(p)]; kb < cuts[ix(p + 1)]; ++kb)
      for (I g = 0; g < G; ++g) {
        I ilo, ihi;
        query_range(kh * G + g, d_.k_off + kb * kBk, std::min(kBk, d_.N - kb * kBk), &ilo, &ihi);
        if (ilo < ihi) lo = std::min(lo, ilo), hi = std::max(hi, ihi);
      }
    if (lo < hi) qlo[ix(p)] = lo, qhi[ix(p)] = hi;
  }
  const bool want_dq = bw.dq.present() || bw.freq;  // mixed's dfreqs read dQ̃
  std::vector<float> prim;
  std::vector<std::vector<float>> part(ix(T));
  std::vector<Acc> acc(ix(T));
  if (want_dq) {
    if (dq_dir) {
      acc[0] = dq_in_place(bw.dq, b, kh);
    } else {
      prim.resize(ix(G * M * D));
      acc[0] = Acc{prim.data(), D, M * D, 0};
    }
    for (I p = 1; p < T; ++p) {
      const I n = qhi[ix(p)] - qlo[ix(p)];
      part[ix(p)].resize(ix(G * n * D));
      acc[ix(p)] = Acc{part[ix(p)].data(), D, n * D, qlo[ix(p)]};
    }
  }
  std::vector<double> gwp(ix(T * G * npar), 0.0);  // [T, G, npar]
  std::vector<double> fgp(bw.freq ? ix(T * G * npar) : 0, 0.0);  // mixed: dQ̃'s part, [thread, G, npar]
  attn_fast::RegionGuard guard;
#pragma omp parallel num_threads(static_cast<int>(T))
  {
    Scratch& w = thread_scratch();
    guard.run([&] {
      w.init(D);
      w.init_backward(D);
      if (bw.rate) w.init_bf16_backward(D);
    });
#pragma omp for schedule(dynamic, 1)
    for (I p = 0; p < T; ++p) {
      if (guard.failed()) continue;
      const Acc& a = acc[ix(p)];
      for (I g = 0; g < G && a.p; ++g)
        zero_rows(a, g, p == 0 ? 0 : qlo[ix(p)], p == 0 ? M : qhi[ix(p)]);
      keys(bw, b, kh, cuts[ix(p)], cuts[ix(p + 1)], a, npar ? &gwp[ix(p * G * npar)] : nullptr,
           &w);
    }
    if (want_dq && !guard.failed()) {  // after the loop's barrier: the same on every thread
#pragma omp for schedule(static)
      for (I gi = 0; gi < G * M; ++gi) {
        const I g = gi / M, i = gi % M;
        float* y = acc[0].row(g, i);
        for (I p = 1; p < T; ++p)
          if (i >= qlo[ix(p)] && i < qhi[ix(p)]) simd_.add_to(y, acc[ix(p)].row(g, i), ix(D));
        if (!bw.freq) finish_dq(bw.dq, dq_dir, acc[0], b, kh, g, i, i + 1);
      }
      if (bw.freq) {  // the rows of dQ̃ are complete: their frequency gradient, then the rotation back
        double* mine = &fgp[ix(static_cast<I>(omp_get_thread_num()) * G * npar)];
#pragma omp for schedule(static)
        for (I gi = 0; gi < G * M; ++gi) {
          const I g = gi / M, i = gi % M;
          freq_grad_rows(true, b, kh * G + g, i, 1, nullptr, 0, acc[0].row(g, i), acc[0].ld, w.row.data(),
                         mine + g * npar);
        }
#pragma omp for schedule(static)
        for (I gi = 0; gi < G * M; ++gi)
          finish_dq(bw.dq, dq_dir, acc[0], b, kh, gi / M, gi % M, gi % M + 1);
      }
    }
  }
  guard.rethrow();
  // In part (then thread) order: the result depends on the thread count only.
  for (I p = 0; p < T; ++p)
    for (I j = 0; j < G * npar; ++j)
      (*gw)[ix((b * d_.Hq + kh * G) * npar + j)] += gwp[ix(p * G * npar + j)];
  for (I p = 0; p < T && bw.freq; ++p)
    for (I j = 0; j < G * npar; ++j)
      (*gw)[ix((b * d_.Hq + kh * G) * npar + j)] += fgp[ix(p * G * npar + j)];
}

}  // namespace posenc::fused_cpu
