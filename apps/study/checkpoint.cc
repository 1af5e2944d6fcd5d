// Checkpoints in the safetensors format (posenc/model.h): an 8-byte little-endian header length, a
// JSON header mapping each tensor name to {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}
// (byte offsets into the data that follows) plus "__metadata__" (string values only: here the
// model's config as JSON under "posenc.config"), then the raw little-endian data.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "posenc/bias.h"
#include "posenc/rope.h"
#include "study/json_int.h"
#include "study/model.h"
#include "study/temp_files.h"

namespace posenc {
namespace {

nlohmann::json config_json(const ModelConfig& c) {
  return {{"encoding", encoding_info(c.encoding).name},
          {"vocab", c.vocab},
          {"d_model", c.d_model},
          {"n_layers", c.n_layers},
          {"n_heads", c.n_heads},
          {"d_ff", c.d_ff},
          {"max_len", c.max_len},
          {"xl_dim", c.xl_dim},
          {"cope_npos", c.cope_npos},
          {"rope", {{"layout", rope_layout_name(c.rope.layout)}, {"rotary_dim", c.rope.rotary_dim},
                    {"theta", c.rope.theta}}},
          {"alibi", {{"variant", alibi_variant_name(c.alibi.variant)}}},
          {"t5", {{"num_buckets", c.t5.num_buckets}, {"max_distance", c.t5.max_distance}}},
          {"rope2d", {{"variant", rope2d_variant_name(c.rope2d.variant)},
                      {"layout", rope_layout_name(c.rope2d.rope.layout)}, {"theta", c.rope2d.rope.theta}}},
          {"mrope", {{"variant", mrope_variant_name(c.mrope.variant)}, {"mrope_section", c.mrope.mrope_section}}},
          {"xpos", {{"scale_base", c.xpos.scale_base}, {"gamma", c.xpos.gamma}}},
          {"kerple", {{"kernel", kerple_kernel_name(c.kerple.kernel)}}},
          {"sandwich", {{"sinusoid_dim", c.sandwich.sinusoid_dim}, {"base", c.sandwich.base}}},
          {"fire_width", c.fire_width},
          {"sinusoid_base", c.sinusoid_base}};
}

Expected<ModelConfig> config_from_json(const nlohmann::json& j) {
  ModelConfig c;
  try {
    Expected<EncodingInfo> e = find_encoding(j.at("encoding").get<std::string>());
    if (!e.ok()) return e.status();
    c.encoding = e.value().id;
    c.vocab = json_int(j.at("vocab"));
    c.d_model = json_int(j.at("d_model"));
    c.n_layers = json_int(j.at("n_layers"));
    c.n_heads = json_int(j.at("n_heads"));
    c.d_ff = json_int(j.at("d_ff"));
    c.max_len = json_int(j.at("max_len"));
    c.xl_dim = json_int(j.at("xl_dim"));
    c.cope_npos = json_int(j.at("cope_npos"));
    Expected<RopeLayout> layout = parse_rope_layout(j.at("rope").at("layout").get<std::string>());
    if (!layout.ok()) return layout.status();
    c.rope.layout = layout.value();
    c.rope.rotary_dim = json_int(j.at("rope").at("rotary_dim"));
    c.rope.theta = j.at("rope").at("theta").get<double>();
    Expected<AlibiVariant> var = parse_alibi_variant(j.at("alibi").at("variant").get<std::string>());
    if (!var.ok()) return var.status();
    c.alibi.variant = var.value();
    c.t5.num_buckets = json_int(j.at("t5").at("num_buckets"));
    c.t5.max_distance = json_int(j.at("t5").at("max_distance"));
    c.sinusoid_base = j.at("sinusoid_base").get<double>();
    // Keys written since rope2d, mrope, xpos, KERPLE, Sandwich and FIRE joined the model (absent: the
    // defaults).
    if (j.contains("rope2d")) {
      Expected<Rope2dVariant> v = parse_rope2d_variant(j.at("rope2d").at("variant").get<std::string>());
      if (!v.ok()) return v.status();
      c.rope2d.variant = v.value();
      Expected<RopeLayout> l = parse_rope_layout(j.at("rope2d").at("layout").get<std::string>());
      if (!l.ok()) return l.status();
      c.rope2d.rope.layout = l.value();
      c.rope2d.rope.theta = j.at("rope2d").at("theta").get<double>();
    }
    if (j.contains("mrope")) {
      Expected<MropeVariant> v = parse_mrope_variant(j.at("mrope").at("variant").get<std::string>());
      if (!v.ok()) return v.status();
      c.mrope.variant = v.value();
      c.mrope.mrope_section = json_ints(j.at("mrope").at("mrope_section"));
    }
    if (j.contains("xpos")) {
      c.xpos.scale_base = j.at("xpos").at("scale_base").get<double>();
      c.xpos.gamma = j.at("xpos").at("gamma").get<double>();
    }
    if (j.contains("kerple")) {
      Expected<KerpleKernel> k = parse_kerple_kernel(j.at("kerple").at("kernel").get<std::string>());
      if (!k.ok()) return k.status();
      c.kerple.kernel = k.value();
    }
    if (j.contains("sandwich")) {
      c.sandwich.sinusoid_dim = json_int(j.at("sandwich").at("sinusoid_dim"));
      c.sandwich.base = j.at("sandwich").at("base").get<double>();
    }
    if (j.contains("fire_width")) c.fire_width = json_int(j.at("fire_width"));
  } catch (const nlohmann::json::exception& ex) {
    return Status::Invalid("checkpoint", std::string("bad posenc.config: ") + ex.what());
  }
  POSENC_RETURN_IF_ERROR(validate_config(c));
  return c;
}

// Every size the layout multiplies, and every product of two, within the data's `floats` float32
// values: each is (a factor of) some tensor's element count, and every tensor lies in the data.
// Checked before the layout is built, so that a config that lies can neither overflow its products nor
// ask for more memory than the file holds.
Status check_sizes(const ModelConfig& c, std::uint64_t floats, const std::string& path) {
  const std::int64_t C = c.d_model, H = c.n_heads;
  struct Product {
    const char* what;
    std::int64_t a, b;
  };
  std::vector<Product> ps = {{"n_layers", c.n_layers, 1}, {"n_heads", H, 1}, {"d_model", C, 1},
                             {"vocab x d_model", c.vocab, C}, {"d_model x d_ff", C, c.d_ff}};
  if (C >= 0 && static_cast<std::uint64_t>(C) <= floats) ps.push_back({"d_model x 3 d_model", C, 3 * C});
  const std::int64_t D = H > 0 ? C / H : 0;
  switch (c.encoding) {
    case Encoding::kLearned: ps.push_back({"max_len x d_model", c.max_len, C}); break;
    case Encoding::kCope: ps.push_back({"cope_npos x head dim", c.cope_npos ? c.cope_npos : c.max_len, D}); break;
    case Encoding::kXL: ps.push_back({"d_model x xl_dim", C, c.xl_dim ? c.xl_dim : D}); break;
    case Encoding::kT5: ps.push_back({"t5.num_buckets x n_heads", c.t5.num_buckets, H}); break;
    case Encoding::kFire: ps.push_back({"fire_width x n_heads", c.fire_width, H}); break;
    default: break;
  }
  for (const Product& p : ps) {
    const bool fits = p.a >= 0 && p.b >= 0 && static_cast<std::uint64_t>(p.a) <= floats &&
                      static_cast<std::uint64_t>(p.b) <= floats &&
                      (p.b == 0 || static_cast<std::uint64_t>(p.a) <= floats / static_cast<std::uint64_t>(p.b));
    if (!fits)
      return Status::Invalid("checkpoint", path + ": the config's " + p.what + " (" + std::to_string(p.a) + " x " +
                                               std::to_string(p.b) + ") exceeds the " + std::to_string(floats) +
                                               " float32 values the file holds");
  }
  return Status::Ok();
}

}  // namespace

Expected<std::string> checkpoint_bytes(const ModelConfig& c, const std::vector<float>& params) {
  if (c.encoding == Encoding::kRope && !rope_is_plain(c.rope))
    return Status::Invalid("rope", "checkpoints store plain RoPE (layout, rotary_dim, theta), not a scaling scheme");
  const std::vector<ParamInfo> layout = param_layout(c);
  nlohmann::json h;
  h["__metadata__"] = {{"format", "posenc"}, {"posenc.config", config_json(c).dump()}};
  std::size_t at = 0;
  for (const ParamInfo& p : layout) {
    h[p.name] = {{"dtype", "F32"}, {"shape", p.shape}, {"data_offsets", {at, at + p.size * 4}}};
    at += p.size * 4;
  }
  if (params.size() * 4 != at) return Status::Invalid("params", "size does not match the config's layout");
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out;
  out.reserve(8 + header.size() + at);
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += header;
  for (const ParamInfo& p : layout)  // x86-64 and every target here are little-endian
    out.append(reinterpret_cast<const char*>(params.data() + p.offset), p.size * 4);
  return out;
}

Status save_checkpoint(const std::string& path, const ModelConfig& c, const std::vector<float>& params) {
  Expected<std::string> bytes = checkpoint_bytes(c, params);
  if (!bytes.ok()) return bytes.status();
  if (!files::write_atomic(path, bytes.value())) return Status::Io("checkpoint", "cannot write " + path);
  return Status::Ok();
}

Expected<Checkpoint> load_checkpoint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::Io("checkpoint", "cannot read " + path);
  const std::string bytes((std::istreambuf_iterator<char>(f)), {});
  if (f.bad()) return Status::Io("checkpoint", "cannot read " + path);
  return checkpoint_from_bytes(bytes, path);
}

Expected<Checkpoint> checkpoint_from_bytes(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 8) return Status::Invalid("checkpoint", path + " is not safetensors");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > (std::uint64_t{1} << 26)) return Status::Invalid("checkpoint", path + ": header length " + std::to_string(n));
  if (n > bytes.size() - 8) return Status::Invalid("checkpoint", path + ": truncated header");
  const std::string header = bytes.substr(8, n);
  const std::string data = bytes.substr(8 + n);
  nlohmann::json h = nlohmann::json::parse(header, nullptr, false);
  if (h.is_discarded() || !h.is_object()) return Status::Invalid("checkpoint", path + ": header is not JSON");
  const auto meta = h.find("__metadata__");
  if (meta == h.end() || !meta->is_object() || !meta->contains("posenc.config") ||
      !meta->at("posenc.config").is_string())
    return Status::Invalid("checkpoint", path + ": no posenc.config string in __metadata__");
  nlohmann::json cj = nlohmann::json::parse(meta->at("posenc.config").get<std::string>(), nullptr, false);
  if (cj.is_discarded()) return Status::Invalid("checkpoint", path + ": posenc.config is not JSON");
  Expected<ModelConfig> c = config_from_json(cj);
  if (!c.ok()) return c.status();
  Checkpoint ck;
  ck.config = c.value();
  POSENC_RETURN_IF_ERROR(check_sizes(ck.config, data.size() / 4, path));
  const std::vector<ParamInfo> layout = param_layout(ck.config);
  std::size_t total = 0;
  for (const ParamInfo& p : layout) total = std::max(total, p.offset + p.size);
  if (total > data.size() / 4)
    return Status::Invalid("checkpoint", path + ": the config has " + std::to_string(total) +
                                             " parameters, the file holds " + std::to_string(data.size() / 4));
  ck.params.assign(total, 0.f);
  for (const ParamInfo& p : layout) {
    const auto t = h.find(p.name);
    if (t == h.end()) return Status::Invalid("checkpoint", path + ": missing tensor " + p.name);
    const nlohmann::json* dtype = t->is_object() && t->contains("dtype") ? &t->at("dtype") : nullptr;
    const nlohmann::json* shape = t->is_object() && t->contains("shape") ? &t->at("shape") : nullptr;
    if (dtype == nullptr || *dtype != "F32" || shape == nullptr || *shape != nlohmann::json(p.shape))
      return Status::Invalid("checkpoint", path + ": tensor " + p.name + " is not F32 of the config's shape");
    const nlohmann::json* off = t->contains("data_offsets") ? &t->at("data_offsets") : nullptr;
    const std::size_t bytes = p.size * 4;
    // [begin, end) inside the data, end − begin the tensor's bytes (compared without wrapping around)
    if (off == nullptr || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned() || (*off)[0].get<std::uint64_t>() > data.size() ||
        (*off)[1].get<std::uint64_t>() > data.size() ||
        (*off)[1].get<std::uint64_t>() - (*off)[0].get<std::uint64_t>() != bytes ||
        (*off)[0].get<std::uint64_t>() > (*off)[1].get<std::uint64_t>())
      return Status::Invalid("checkpoint", path + ": bad data_offsets for " + p.name);
    std::memcpy(ck.params.data() + p.offset, data.data() + (*off)[0].get<std::uint64_t>(), bytes);
  }
  return ck;
}

}  // namespace posenc
