// Private: whether two views share an element (outputs that would write over each other).
#pragma once

#include <initializer_list>
#include <utility>

#include "posenc/status.h"
#include "posenc/view.h"

namespace posenc::fast {

// True when a and b (both present, both holding elements) share memory: exactly for two views of
// one layout (the same dtype and strides, shapes possibly different: slices of one buffer such as
// a fused QKV's q and k, which interleave without sharing an element), and for two views that each
// cover their byte extent densely (contiguous ones); other layouts whose extents meet are not
// reported (false). Used to refuse outputs that overlap each other or another call's input.
bool overlap(const View& a, const View& b);

// Outputs that share an element would write over each other: an error naming the later of the first
// such pair ("expected memory disjoint from the output <earlier>"); absent views are skipped.
Status check_disjoint(std::initializer_list<std::pair<const char*, const View*>> outputs);

}  // namespace posenc::fast
