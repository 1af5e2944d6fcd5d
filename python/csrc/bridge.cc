// python/csrc/bridge.cc — the C++ API behind bridge.h: registry, threads, sinusoidal PE, logit biases
// and a config's RoPE frequencies. Parameters by name go through core/param_text.h, the vocabulary
// of the CLI and the C ABI.
#include "bridge.h"

#include <exception>
#include <new>

#include <nlohmann/json.hpp>

#include "core/param_text.h"
#include "posenc/absolute.h"
#include "posenc/attention.h"
#include "posenc/registry.h"
#include "posenc/threads.h"

namespace posenc_py {

using posenc::Status;
using posenc::View;

namespace {

Result from_status(const Status& s) {
  Result r;
  if (s.ok()) return r;
  switch (s.code()) {
    case posenc::Code::kOutOfRange: r.code = POSENC_ERR_OUT_OF_RANGE; break;
    case posenc::Code::kInternal: r.code = POSENC_ERR_INTERNAL; break;
    default: r.code = POSENC_ERR_INVALID; break;
  }
  r.message = s.message();
  return r;
}

// Runs f (returning Status), turning any exception into a Result: nothing escapes into Python.
template <class F>
Result guarded(F&& f) {
  try {
    return from_status(f());
  } catch (const std::bad_alloc&) {
    return {POSENC_ERR_NOMEM, "out of memory"};
  } catch (const std::exception& e) {
    return {POSENC_ERR_INTERNAL, std::string("internal error: ") + e.what()};
  }
}

View to_view(const posenc_tensor& t) {
  View v;
  v.data = t.data;
  v.dtype = static_cast<posenc::DType>(t.dtype);  // the C ABI's codes follow DType's order
  v.ndim = t.ndim;
  for (int i = 0; i < t.ndim && i < posenc::kMaxDims; ++i) {
    v.shape[static_cast<std::size_t>(i)] = t.shape[i];
    v.strides[static_cast<std::size_t>(i)] = t.strides[i];
  }
  return v;
}

// The encoding's parameters and tensors of a bias call, through the shared vocabulary.
Status bind(const BiasCall& c, posenc::AttentionParams* p, posenc::EncodingTensors* t, posenc::BiasGeometry* g) {
  auto e = posenc::find_encoding(c.encoding);
  if (!e.ok()) return Status::Invalid("encoding", e.status().what());
  switch (e->id) {
    case posenc::Encoding::kAlibi:
    case posenc::Encoding::kT5:
    case posenc::Encoding::kKerple:
    case posenc::Encoding::kSandwich:
    case posenc::Encoding::kFire:
      break;
    default:
      return Status::Invalid("encoding", "'" + e->name + "' has no position-only bias (bias takes alibi, t5, "
                                                          "kerple, sandwich and fire)");
  }
  p->encoding = e->id;
  // the encoding's keys only: the call's (offsets, causal, scale, ...) would be read and then ignored
  for (const auto& [key, value] : c.params) POSENC_RETURN_IF_ERROR(posenc::text::set_encoding_param(p, key, value));
  for (const auto& [name, tensor] : c.tensors) {
    auto slot = posenc::text::encoding_tensor(e->id, t, name);
    if (!slot.ok()) return slot.status();
    **slot = to_view(tensor);
  }
  g->heads = c.heads;
  g->q_len = c.q_len;
  g->k_len = c.k_len;
  g->q_offset = c.q_offset;
  g->k_offset = c.k_offset;
  g->causal = c.causal;
  return Status::Ok();
}

}  // namespace

std::vector<EncodingEntry> registry() {
  std::vector<EncodingEntry> out;
  for (const posenc::EncodingInfo& e : posenc::registry()) {
    EncodingEntry x{e.name, posenc::kind_name(e.kind), e.summary, e.paper, {}};
    for (const posenc::ParamSpec& s : e.params)
      x.params.push_back({s.name, s.type, s.default_, s.choices, s.help, s.learned});
    out.push_back(std::move(x));
  }
  return out;
}

int num_threads() { return posenc::num_threads(); }
void set_num_threads(int n) { posenc::set_num_threads(n); }

Result sinusoidal(double base, const posenc_tensor& x, const posenc_tensor* positions, std::int64_t offset,
                  const posenc_tensor& y, bool backward) {
  return guarded([&] {
    posenc::SinusoidalParams p;
    p.base = base;
    posenc::Positions pos;
    if (positions != nullptr) pos.ids = to_view(*positions);
    pos.offset = offset;
    return backward ? posenc::sinusoidal_backward(p, to_view(x), pos, to_view(y))
                    : posenc::sinusoidal_forward(p, to_view(x), pos, to_view(y));
  });
}

Result bias_dtype(const BiasCall& c, int* dtype) {
  return guarded([&] {
    posenc::AttentionParams p;
    posenc::EncodingTensors t;
    posenc::BiasGeometry g;
    POSENC_RETURN_IF_ERROR(bind(c, &p, &t, &g));
    *dtype = POSENC_F64;
    for (const char* name : {"weights", "slopes", "r1", "mlp_w2"}) {
      auto it = c.tensors.find(name);
      if (it != c.tensors.end()) {
        *dtype = it->second.dtype;
        break;
      }
    }
    return Status::Ok();
  });
}

Result bias_forward(const BiasCall& c, const posenc_tensor& out) {
  return guarded([&] {
    posenc::AttentionParams p;
    posenc::EncodingTensors t;
    posenc::BiasGeometry g;
    POSENC_RETURN_IF_ERROR(bind(c, &p, &t, &g));
    const View o = to_view(out);
    switch (p.encoding) {
      case posenc::Encoding::kAlibi: return posenc::alibi_bias(p.alibi, g, t.slopes, t.weights, o);
      case posenc::Encoding::kT5:
        POSENC_RETURN_IF_ERROR(posenc::t5_validate(p.t5));
        if (!t.weights.present()) return Status::Invalid("weights", "is required for t5: [num_buckets, heads]");
        return posenc::t5_bias(p.t5, g, t.weights, o);
      case posenc::Encoding::kKerple: return posenc::kerple_bias(p.kerple, g, t.r1, t.r2, o);
      case posenc::Encoding::kSandwich:
        POSENC_RETURN_IF_ERROR(posenc::sandwich_validate(p.sandwich));
        return posenc::sandwich_bias(p.sandwich, g, o);
      default: return posenc::fire_bias(p.fire, g, t.fire, o);
    }
  });
}

Result bias_backward(const BiasCall& c, const posenc_tensor& dbias, const TensorMap& grads) {
  return guarded([&] {
    posenc::AttentionParams p;
    posenc::EncodingTensors t;
    posenc::EncodingGrads gr;
    posenc::BiasGeometry g;
    POSENC_RETURN_IF_ERROR(bind(c, &p, &t, &g));
    for (const auto& [name, tensor] : grads) {
      auto slot = posenc::text::encoding_grad(p.encoding, &gr, name);
      if (!slot.ok()) return slot.status();
      **slot = to_view(tensor);
    }
    const View d = to_view(dbias);
    switch (p.encoding) {
      case posenc::Encoding::kAlibi: return posenc::alibi_bias_backward(p.alibi, g, t.weights, d, gr.weights);
      case posenc::Encoding::kT5: return posenc::t5_bias_backward(p.t5, g, d, gr.weights);
      case posenc::Encoding::kKerple: return posenc::kerple_bias_backward(p.kerple, g, t.r1, t.r2, d, gr.r1, gr.r2);
      case posenc::Encoding::kFire: return posenc::fire_bias_backward(p.fire, g, t.fire, d, gr.fire);
      default: return grads.empty() ? Status::Ok() : Status::Invalid("encoding", c.encoding + " has no learned tensors");
    }
  });
}

Result rope_config_json(const std::string& config_text, std::int64_t seq_len, std::string* json) {
  return guarded([&] {
    if (seq_len < 0) return Status::Invalid("seq_len", "expected a length >= 0 (0: none), got " + std::to_string(seq_len));
    auto c = posenc::rope_config_from_json(config_text);
    if (!c.ok()) return c.status();
    posenc::RopeParams p = c->params;
    p.seq_len = seq_len;
    auto fr = posenc::rope_frequencies(p, c->head_dim, 0);
    if (!fr.ok()) return fr.status();
    const posenc::RopeFrequencies& f = *fr;
    nlohmann::json o;
    o["model_type"] = c->model_type.empty() ? nlohmann::json(nullptr) : nlohmann::json(c->model_type);
    o["rope_type"] = posenc::rope_type_name(p.rope_type);
    o["layout"] = posenc::rope_layout_name(p.layout);
    o["head_dim"] = c->head_dim;
    o["rotary_dim"] = f.rotary_dim;
    o["theta"] = p.theta;
    o["max_position_embeddings"] =
        c->max_position_embeddings ? nlohmann::json(c->max_position_embeddings) : nlohmann::json(nullptr);
    o["seq_len"] = seq_len ? nlohmann::json(seq_len) : nlohmann::json(nullptr);
    if (p.rope_type != posenc::RopeType::kDefault) o["factor"] = p.factor;
    if (p.original_max_position) o["original_max_position"] = p.original_max_position;
    if (p.rope_type == posenc::RopeType::kNtk || p.rope_type == posenc::RopeType::kDynamic)
      o["scaled_theta"] = f.theta;
    if (p.rope_type == posenc::RopeType::kYarn) {
      o["beta_fast"] = p.beta_fast;
      o["beta_slow"] = p.beta_slow;
      o["truncate"] = p.truncate;
      o["mscale"] = p.mscale;
      o["mscale_all_dim"] = p.mscale_all_dim;
    }
    if (p.rope_type == posenc::RopeType::kLlama3) {
      o["low_freq_factor"] = p.low_freq_factor;
      o["high_freq_factor"] = p.high_freq_factor;
    }
    if (p.rope_type == posenc::RopeType::kLongrope) o["longrope_factors"] = f.long_factors ? "long" : "short";
    o["attention_factor"] = f.attention_factor;
    o["inv_freq"] = f.inv_freq;
    o["inv_freq_hf"] = f.inv_freq_f32;
    o["notes"] = c->notes;
    *json = o.dump();
    return Status::Ok();
  });
}

}  // namespace posenc_py
