// Whether two views share an element (core/overlap.h): exact for one layout by a bounded search over
// the index differences, by byte extents for dense views.
#include "core/overlap.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/fast_common.h"

namespace posenc::fast {
namespace {

using I = std::int64_t;

// One dimension of a shared layout: stride s > 0, and the range [lo, hi] of i_a − i_b between an
// index of a and one of b along it.
struct Dim {
  I s, lo, hi;
};

// Whether delta = Σ_k d_k·s_k has a solution with d_k ∈ [lo_k, hi_k] over dims [0, n) (strides
// descending); *budget counts the steps (false once spent: undecided).
bool reachable(const Dim* dims, int n, I delta, int* budget, bool* spent) {
  if (n == 0) return delta == 0;
  if (--*budget < 0) {
    *spent = true;
    return false;
  }
  // the smaller dims reach [rlo, rhi]; d must leave delta − d·s inside it
  I rlo = 0, rhi = 0;
  for (int k = 1; k < n; ++k) rlo += dims[k].lo * dims[k].s, rhi += dims[k].hi * dims[k].s;
  const Dim& d0 = dims[0];
  // delta − d·s ∈ [rlo, rhi]  ⇔  d ∈ [⌈(delta − rhi)/s⌉, ⌊(delta − rlo)/s⌋]
  const auto floor_div = [](I x, I y) { return x / y - ((x % y != 0) && ((x < 0) != (y < 0))); };
  const I first = std::max(d0.lo, -floor_div(-(delta - rhi), d0.s)), last = std::min(d0.hi, floor_div(delta - rlo, d0.s));
  for (I d = first; d <= last && !*spent; ++d)
    if (reachable(dims + 1, n - 1, delta - d * d0.s, budget, spent)) return true;
  return false;
}

// Whether v's elements fill its byte extent (no gaps): then any byte of the extent is an element's.
bool dense(const View& v) {
  std::uintptr_t lo, hi;
  extent(v, &lo, &hi);
  return static_cast<std::uintptr_t>(v.numel()) * dtype_size(v.dtype) == hi - lo;
}

}  // namespace

bool overlap(const View& a, const View& b) {
  if (!a.present() || !b.present() || a.numel() == 0 || b.numel() == 0) return false;
  std::uintptr_t alo, ahi, blo, bhi;
  extent(a, &alo, &ahi);
  extent(b, &blo, &bhi);
  if (ahi <= blo || bhi <= alo) return false;
  bool same = a.dtype == b.dtype && a.ndim == b.ndim;
  Dim dims[kMaxDims];
  int n = 0;
  for (int k = 0; same && k < a.ndim; ++k) {
    if (a.shape[k] <= 1 && b.shape[k] <= 1) continue;
    if (a.strides[k] != b.strides[k] || a.strides[k] <= 0) same = false;
    else dims[n++] = Dim{a.strides[k], -(b.shape[k] - 1), a.shape[k] - 1};
  }
  if (same) {
    const I es = static_cast<I>(dtype_size(a.dtype));
    const I delta = static_cast<I>(reinterpret_cast<std::uintptr_t>(b.data) - reinterpret_cast<std::uintptr_t>(a.data));
    if (delta % es != 0) return true;  // elements that straddle each other
    std::sort(dims, dims + n, [](const Dim& x, const Dim& y) { return x.s > y.s; });
    int budget = 4096;
    bool spent = false;
    const bool hit = reachable(dims, n, delta / es, &budget, &spent);
    if (!spent) return hit;
  }
  return dense(a) && dense(b);
}

Status check_disjoint(std::initializer_list<std::pair<const char*, const View*>> outputs) {
  for (auto a = outputs.begin(); a != outputs.end(); ++a)
    for (auto b = outputs.begin(); b != a; ++b)
      if (overlap(*a->second, *b->second))
        return Status::Invalid(a->first, std::string("expected memory disjoint from the output ") + b->first);
  return Status::Ok();
}

}  // namespace posenc::fast
