// posenc mrope-positions --segments text:N,image:TxHxW,video:TxHxW,... [--spatial-merge S]
//                        [--dtype int64|int32] --out P.npy
// M-RoPE's position ids of one sequence (posenc/rotary.h's mrope_positions, transformers' Qwen2-VL
// get_rope_index): text runs and image / video grids in order; P is [3, L] (rows t, h, w), ready for
// posenc apply mrope --positions or posenc attention mrope --q-positions / --k-positions. A grid is
// t x h x w as the language model sees it, or before the vision encoder's merge with
// --spatial-merge S (Qwen2-VL: 2; h and w are divided by S). One JSON line on stdout:
// {"length": L, "next_position": n, "rope_delta": n − L} (n: where a following text token sits).
#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/cli_common.h"

namespace posenc::cli {

namespace {

struct MropePositionsState {
  std::string segments, spatial_merge = "1", dtype = "int64", out;
};

// "text:5" / "image:1x4x6" / "video:2x4x6".
MropeSegment parse_segment(const std::string& item, std::size_t index) {
  const std::string flag = "--segments";
  const std::string at = "segment " + std::to_string(index + 1) + " '" + item + "'";
  const std::size_t colon = item.find(':');
  if (colon == std::string::npos)
    fail(Status::Invalid(flag, at + ": expected kind:size (text:N, image:TxHxW or video:TxHxW)"));
  const std::string kind = item.substr(0, colon), size = item.substr(colon + 1);
  MropeSegment s;
  if (kind == "text") {
    s.kind = MropeSegment::Kind::kText;
    s.length = parse_int(flag, size);
    return s;
  }
  if (kind != "image" && kind != "video")
    fail(Status::Invalid(flag, at + ": expected the kind text, image or video, got '" + kind + "'"));
  s.kind = kind == "image" ? MropeSegment::Kind::kImage : MropeSegment::Kind::kVideo;
  std::int64_t* dims[3] = {&s.t, &s.h, &s.w};
  std::size_t start = 0;
  for (int i = 0; i < 3; ++i) {
    const std::size_t x = size.find('x', start);
    if ((i < 2) == (x == std::string::npos))
      fail(Status::Invalid(flag, at + ": expected a grid TxHxW (three sizes), got '" + size + "'"));
    *dims[i] = parse_int(flag, size.substr(start, i < 2 ? x - start : std::string::npos));
    start = x + 1;
  }
  return s;
}

void run_mrope_positions(const MropePositionsState& st) {
  std::vector<MropeSegment> segs;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = st.segments.find(',', start);
    segs.push_back(parse_segment(st.segments.substr(start, comma == std::string::npos ? std::string::npos : comma - start),
                                 segs.size()));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const std::int64_t merge = parse_int("--spatial-merge", st.spatial_merge);
  DType dtype = DType::kI64;
  if (st.dtype == "int32") dtype = DType::kI32;
  else if (st.dtype != "int64") fail(Status::Invalid("--dtype", "expected int64 or int32, got '" + st.dtype + "'"));
  // The tokens in all (a grid merges merge² patches into one), bounded before anything is allocated.
  double tokens = 0;
  for (const MropeSegment& g : segs)
    tokens += g.kind == MropeSegment::Kind::kText
                  ? double(g.length)
                  : double(g.t) * double(g.h) * double(g.w) / (merge >= 1 ? double(merge * merge) : 1.0);
  const std::int64_t total = tokens < 0x1p62 ? std::max<std::int64_t>(1, std::int64_t(tokens)) : std::int64_t{1} << 62;
  const std::vector<SizeFactor> size = {{"--segments", 3, "3 rows"}, {"--segments", total, "tokens"}};
  check_product(size);
  const MropePositions p = within_memory(size, [&] { return take_lib(mrope_positions(segs, merge)); });
  if (dtype == DType::kI32 && p.next > 2147483647)
    fail(Status::Invalid("--dtype", "the largest id " + std::to_string(p.next - 1) + " does not fit int32"));
  OutputSet outs;
  check(outs.reserve("--out", st.out));
  Tensor ids = within_memory(size, [&] { return Tensor(dtype, {3, p.length}); });
  const View v = ids.view();
  for (std::int64_t i = 0; i < 3 * p.length; ++i) v.set(i, static_cast<double>(p.ids[static_cast<std::size_t>(i)]));
  outs.attach("--out", &ids);
  check(outs.commit());
  nlohmann::json o;
  o["length"] = p.length;
  o["next_position"] = p.next;
  o["rope_delta"] = p.delta();
  std::printf("%s\n", o.dump().c_str());
}

}  // namespace

Command add_mrope_positions_command(CLI::App& root) {
  auto st = std::make_shared<MropePositionsState>();
  CLI::App* app = root.add_subcommand(
      "mrope-positions", "M-RoPE's (t, h, w) position ids [3, L] of text runs and image/video grids (Qwen2-VL)");
  add_text(app, "--segments", &st->segments,
           "comma-separated: text:N, image:TxHxW, video:TxHxW (grids after the merge, or see --spatial-merge)",
           "LIST")
      ->required();
  add_text(app, "--spatial-merge", &st->spatial_merge,
           "divide each grid's h and w by this (Qwen2-VL's spatial_merge_size, 2); default 1", "INT");
  add_text(app, "--dtype", &st->dtype, "int64 (default) or int32", "int64|int32");
  add_path(app, "--out", &st->out, "output ids [3, L]: rows t, h, w")->required();
  return {app, [st] { run_mrope_positions(*st); }};
}

}  // namespace posenc::cli
