// RoPE's fast path: the public posenc::rope_forward / rope_backward / rope_apply_qk dispatch here,
// and the fast paths of rotary.h's encodings (rope2d, mrope, xpos: rope_fast.h's run_plan and
// mixed_freq_grad) run this kernel with a rotary::Plan giving each token's angles and scales.
//
// Validation is the reference's own (rope_check.h), so errors are identical. float32, bfloat16 and
// float16 views whose innermost dimension is contiguous run the Highway kernel of rope_kernels.cc
// (every target compiled, the best supported one chosen at run time); float64, a strided innermost
// dimension or a partial overlap of input and output fall back to posenc::reference, and so does a
// call whose largest angle exceeds 2^47 (fast::kMaxFastAngle: the kernel's reduction is exact
// enough below it; checked once per call, rotary plans included).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/fast_common.h"
#include "core/overlap.h"
#include "enc/rotary/rope/rope_check.h"
#include "enc/rotary/rope/rope_fast.h"
#include "enc/rotary/rope/rope_math.h"
#include "posenc/rope.h"
#include "posenc/reference.h"

namespace posenc {
bool rope_fast::kernel_ok(const View& in, const View& out) {
  return fast::fast_dtype(in.dtype) && fast::inner_contiguous(in) && fast::inner_contiguous(out) &&
         !fast::partial_alias(in, out);
}

namespace {

using rope_fast::kernel_ok;

void fill_tensor(rope_fast::Tensor* t, const View& in, const View& out) {
  t->in = in.data;
  t->out = out.data;
  t->H = in.dim(2);
  t->D = in.dim(3);
  for (int i = 0; i < 3; ++i) {
    t->is[i] = in.strides[i];
    t->os[i] = out.strides[i];
  }
}

// The call's frequencies, kept from the previous call on this thread while p, r and what the scheme
// reads of the call's length stay the same.
Expected<const RopeFrequencies*> cached_frequencies(const RopeParams& p, std::int64_t r, std::int64_t call_len) {
  POSENC_RETURN_IF_ERROR(rope::check_call(p, call_len));
  thread_local struct {
    bool ok = false;
    RopeParams p;
    std::int64_t r = 0, key = 0;
    RopeFrequencies f;
  } c;
  const std::int64_t key = rope::length_key(p, p.seq_len > 0 ? p.seq_len : call_len);
  if (!c.ok || c.r != r || c.key != key || !(c.p == p)) {
    c.ok = false;
    auto f = rope::frequencies(p, r, call_len);
    if (!f.ok()) return f.status();
    c.f = std::move(f).value();
    c.p = p;
    c.r = r;
    c.key = key;
    c.ok = true;
  }
  return &c.f;
}

// Whether every angle of the call lies in the fast kernel's range: |angle| <= fast::kMaxFastAngle at
// the largest |position| M (the angle of pair k grows with |m| in both modes).
bool fast_angles(const RopeFrequencies& f, std::int64_t M) {
  for (std::int64_t k = 0; k < f.rotary_dim / 2; ++k)
    if (!(std::fabs(f.angle(M, k)) <= fast::kMaxFastAngle)) return false;
  return true;
}

// Rotates up to two tensors sharing B, L, positions and dtype.
Status run_fast(const RopeParams& p, std::int64_t r, const View* in, const View* out, int n,
                const Positions& pos, double sign) {
  const std::int64_t B = in[0].dim(0), L = in[0].dim(1);
  auto ids = expand_positions("positions", pos, B, L);  // [B, L]
  if (!ids.ok()) return ids.status();
  auto fr = cached_frequencies(p, r, rope::call_length(*ids));
  if (!fr.ok()) return fr.status();
  const RopeFrequencies& f = **fr;
  if (!fast_angles(f, fast::max_abs(*ids))) {  // beyond the fast reduction: the reference, exactly reduced
    for (int i = 0; i < n; ++i)
      POSENC_RETURN_IF_ERROR(sign > 0 ? reference::rope_forward(p, in[i], pos, out[i])
                                      : reference::rope_backward(p, in[i], pos, out[i]));
    return Status::Ok();
  }
  rope_fast::Job j;
  j.dtype = in[0].dtype;
  j.interleaved = p.layout == RopeLayout::kInterleaved;
  j.B = B;
  j.L = L;
  j.r = r;
  j.pos = ids->data();
  j.hf = f.angles == RopeAngles::kHf;
  j.inv = j.hf ? f.inv_freq_f32.data() : f.inv_freq.data();
  j.sign = sign;
  j.scale = static_cast<float>(f.attention_factor);
  j.nt = n;
  std::int64_t elems = 0;
  bool in_place = true;
  for (int i = 0; i < n; ++i) {
    fill_tensor(&j.t[i], in[i], out[i]);
    elems += in[i].numel();
    in_place = in_place && in[i].data == out[i].data;
  }
  if (elems == 0) return Status::Ok();
  j.threads = fast::threads_for(elems);
  const bool large =
      elems * static_cast<std::int64_t>(dtype_size(j.dtype)) >= fast::kStreamMinBytes;
  // Measured on one core, posenc bench's q+k [1, 4096, 32, 128] (ratio to the same-run memcpy,
  // four alternating runs each): bfloat16 out of place with non-temporal stores 0.90–1.31
  // (interleaved) and 0.77–1.31 (half), with plain stores 0.50–0.92 and 0.61–0.98. A software
  // prefetch of the input rows 8 KiB ahead, once worth 0.78 → 0.88 for float32, now costs it:
  // 0.98–0.99 with it, 1.25–1.35 without (in place 1.08–1.13 → 1.67–1.76), so there is none.
  j.stream = large && !in_place;
  rope_fast::run(j);
  return Status::Ok();
}

Status rotate(const RopeParams& p, const char* in_arg, const View& in, const Positions& pos,
              const char* out_arg, const View& out, double sign) {
  auto rr = rope::check(p, in_arg, in, out_arg, out);
  if (!rr.ok()) return rr.status();
  if (!kernel_ok(in, out))
    return sign > 0 ? reference::rope_forward(p, in, pos, out) : reference::rope_backward(p, in, pos, out);
  return run_fast(p, *rr, &in, &out, 1, pos, sign);
}

}  // namespace

namespace {
// The job of one tensor (in → out) under a rotary call's plan; threads, stream and sign left to the
// caller.
rope_fast::Job plan_job(const rotary::Call& c, const View& in, const View& out) {
  rope_fast::Job j;
  j.dtype = in.dtype;
  j.interleaved = c.plan.layout == RopeLayout::kInterleaved;
  j.B = c.B;
  j.L = c.L;
  j.r = c.plan.r;
  j.pos = c.ids.data();
  j.plan = &c.plan;
  j.nt = 1;
  fill_tensor(&j.t[0], in, out);
  return j;
}
}  // namespace

bool rope_fast::angles_ok(const rotary::Call& c) {
  const rotary::Plan& pl = c.plan;
  if (pl.per_head()) {  // mixed: |x·θˣ + y·θʸ| <= max|x|·|θˣ| + max|y|·|θʸ|
    double mx = 0, my = 0;
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t l = 0; l < c.L; ++l) {
        mx = std::max(mx, std::fabs(static_cast<double>(c.ids[static_cast<std::size_t>((b * 2 + 0) * c.L + l)])));
        my = std::max(my, std::fabs(static_cast<double>(c.ids[static_cast<std::size_t>((b * 2 + 1) * c.L + l)])));
      }
    for (std::int64_t h = 0; h < pl.heads; ++h)
      for (std::int64_t k = 0; k < pl.half; ++k) {
        const double fx = pl.mixed[static_cast<std::size_t>(h * pl.half + k)];
        const double fy = pl.mixed[static_cast<std::size_t>((pl.heads + h) * pl.half + k)];
        if (!(mx * std::fabs(fx) + my * std::fabs(fy) <= fast::kMaxFastAngle)) return false;
      }
    return true;
  }
  const std::int64_t M = fast::max_abs(c.ids);  // every component at the largest |position|
  const std::int64_t p[3] = {M, M, M};
  for (std::int64_t k = 0; k < pl.half; ++k)
    if (!(std::fabs(pl.angle(p, k, 0)) <= fast::kMaxFastAngle)) return false;
  return true;
}

void rope_fast::run_plan(const rotary::Call& c, const View& in, const View& out, double sign, int role) {
  Job j = plan_job(c, in, out);
  j.sign = sign;
  j.role = role;
  const std::int64_t elems = in.numel();
  if (elems == 0) return;
  // Mixed computes the sin/cos of every (token, head): threads from a smaller size up.
  j.threads = fast::threads_for(c.plan.per_head() ? elems * 4 : elems);
  const bool large = elems * static_cast<std::int64_t>(dtype_size(j.dtype)) >= fast::kStreamMinBytes;
  j.stream = large && in.data != out.data;  // as run_fast
  rope_fast::run(j);
}

void rope_fast::mixed_freq_grad(const rotary::Call& c, const View& x, const View& dy, std::vector<double>* dfreqs) {
  Job j = plan_job(c, x, x);
  const std::size_t n = static_cast<std::size_t>(2 * c.H * c.plan.half);
  dfreqs->assign(n, 0.0);
  if (x.numel() == 0) return;
  j.threads = fast::threads_for(x.numel() * 4);
  std::vector<std::vector<double>> part(static_cast<std::size_t>(j.threads), std::vector<double>(n, 0.0));
  const std::int64_t ds[3] = {dy.strides[0], dy.strides[1], dy.strides[2]};
  rope_fast::mixed_grad(j, dy.data, ds, &part);
  for (const std::vector<double>& pt : part)  // in thread order: the result depends on the count only
    for (std::size_t i = 0; i < n; ++i) (*dfreqs)[i] += pt[i];
}

Status rope_forward(const RopeParams& p, const View& x, const Positions& pos, const View& y) {
  return rotate(p, "x", x, pos, "y", y, +1.0);
}

Status rope_backward(const RopeParams& p, const View& dy, const Positions& pos, const View& dx) {
  return rotate(p, "dy", dy, pos, "dx", dx, -1.0);
}

Status rope_apply_qk(const RopeParams& p, const View& q, const View& k, const Positions& pos,
                     const View& q_out, const View& k_out, bool backward) {
  auto rq = rope::check(p, "q", q, "q_out", q_out);
  if (!rq.ok()) return rq.status();
  if (!k.present() && !k_out.present()) return rotate(p, "q", q, pos, "q_out", q_out, backward ? -1.0 : 1.0);
  auto rk = rope::check(p, "k", k, "k_out", k_out);
  if (!rk.ok()) return rk.status();
  if (k.dim(0) != q.dim(0) || k.dim(1) != q.dim(1))
    return Status::Invalid("k", "expected the batch and length of q, [" + std::to_string(q.dim(0)) + ", " +
                                    std::to_string(q.dim(1)) + ", *, *], got " + k.shape_str());
  if (*rq != *rk)
    return Status::Invalid("rotary_dim", "expected one rotary dimension for q and k (0 means D), got D = " +
                                             std::to_string(q.dim(3)) + " for q and " +
                                             std::to_string(k.dim(3)) + " for k");
  // each output may be its own input (in place), never the other's input or output
  if (fast::overlap(q_out, k))
    return Status::Invalid("q_out", "expected memory disjoint from k and k_out");
  if (fast::overlap(k_out, q) || fast::overlap(k_out, q_out))
    return Status::Invalid("k_out", "expected memory disjoint from q and q_out");
  const double sign = backward ? -1.0 : 1.0;
  if (q.dtype == k.dtype && kernel_ok(q, q_out) && kernel_ok(k, k_out)) {
    const View in[2] = {q, k}, out[2] = {q_out, k_out};
    return run_fast(p, *rq, in, out, 2, pos, sign);
  }
  POSENC_RETURN_IF_ERROR(rotate(p, "q", q, pos, "q_out", q_out, sign));
  return rotate(p, "k", k, pos, "k_out", k_out, sign);
}

}  // namespace posenc
