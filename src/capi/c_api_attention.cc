// The C ABI's attention: an encoding from the registry, its keys (core/param_text.h), its borrowed
// tensors and gradients, forward and backward.
#include <string>

#include "attention/attention_check.h"
#include "capi/c_api_internal.h"
#include "core/param_text.h"

using posenc::Status;
using posenc::View;
using namespace posenc::capi;

namespace {

// A backward given out and lse (attention_backward_saved or attention_backward_from_stats).
using StatsBackward = Status (*)(const posenc::AttentionParams&, const View&, const View&, const View&,
                                 const posenc::EncodingTensors&, const View&, const View&, const View&,
                                 const View&, const View&, const View&, const posenc::EncodingGrads&);

int backward_given_stats(StatsBackward fn, const posenc_attention_params* p, const posenc_tensor* q,
                         const posenc_tensor* k, const posenc_tensor* v, const posenc_tensor* out,
                         const posenc_tensor* lse, const posenc_tensor* dout, const posenc_tensor* dq,
                         const posenc_tensor* dk, const posenc_tensor* dv) {
  return guarded([&] {
    if (p == nullptr) return null_arg("p");
    View vq, vk, vv, vo, vl, vdo, vdq, vdk, vdv;
    POSENC_RETURN_IF_ERROR(to_views({{"q", q, Role::kInput, false, &vq},
                                     {"k", k, Role::kInput, false, &vk},
                                     {"v", v, Role::kInput, false, &vv},
                                     {"out", out, Role::kInput, false, &vo},
                                     {"lse", lse, Role::kInput, false, &vl},
                                     {"dout", dout, Role::kInput, false, &vdo},
                                     {"dq", dq, Role::kOutput, true, &vdq},
                                     {"dk", dk, Role::kOutput, true, &vdk},
                                     {"dv", dv, Role::kOutput, true, &vdv}}));
    return fn(p->p, vq, vk, vv, p->t, vo, vl, vdo, vdq, vdk, vdv, p->g);
  });
}

}  // namespace

extern "C" {

posenc_attention_params* posenc_attention_params_new(const char* encoding) {
  posenc_attention_params* out = nullptr;
  guarded([&] {
    if (encoding == nullptr) return null_arg("encoding");
    auto e = posenc::find_encoding(encoding);
    if (!e.ok()) return Status::Invalid("encoding", e.status().what());
    if (e->kind == posenc::Kind::kAbsolute)
      return Status::Invalid("encoding", "'" + e->name + "' acts on embeddings before the first layer, "
                                         "not inside attention");
    out = new posenc_attention_params;
    out->p.encoding = e->id;
    return Status::Ok();
  });
  return out;
}

int posenc_attention_params_set(posenc_attention_params* p, const char* key, const char* value) {
  return guarded([&] {
    if (p == nullptr) return null_arg("p");
    if (key == nullptr) return null_arg("key");
    if (value == nullptr) return null_arg(key, "expected a value, got NULL");
    return posenc::text::set_attention_param(&p->p, key, value);
  });
}

int posenc_attention_set_rope(posenc_attention_params* p, const posenc_rope_params* rope) {
  return guarded([&] {
    if (p == nullptr) return null_arg("p");
    if (rope == nullptr) return null_arg("rope");
    posenc::RopeParams* target = posenc::attn::rope_of(p->p);
    if (target == nullptr)
      return Status::Invalid("rope", std::string("not read by ") + posenc::encoding_info(p->p.encoding).name +
                                         " (rope, mrope, xpos and rope2d rotate q and k)");
    *target = rope->p;
    return Status::Ok();
  });
}

int posenc_attention_set_tensor(posenc_attention_params* p, const char* name, const posenc_tensor* t) {
  return guarded([&] {
    if (p == nullptr) return null_arg("p");
    if (name == nullptr) return null_arg("name");
    auto slot = posenc::text::encoding_tensor(p->p.encoding, &p->t, name);
    if (!slot.ok()) return slot.status();
    View v;
    POSENC_RETURN_IF_ERROR(to_view(posenc::text::key_name(name).c_str(), t, Role::kInput, true, &v));
    **slot = v;
    return Status::Ok();
  });
}

int posenc_attention_set_grad(posenc_attention_params* p, const char* name, const posenc_tensor* g) {
  return guarded([&] {
    if (p == nullptr) return null_arg("p");
    if (name == nullptr) return null_arg("name");
    auto slot = posenc::text::encoding_grad(p->p.encoding, &p->g, name);
    if (!slot.ok()) return slot.status();
    View v;
    const std::string arg = "d" + posenc::text::key_name(name);  // the C++ API's name: "dweights"
    POSENC_RETURN_IF_ERROR(to_view(arg.c_str(), g, Role::kOutput, true, &v));
    **slot = v;
    return Status::Ok();
  });
}

void posenc_attention_params_free(posenc_attention_params* p) { delete p; }

int posenc_attention_forward(const posenc_attention_params* p, const posenc_tensor* q, const posenc_tensor* k,
                             const posenc_tensor* v, const posenc_tensor* out, const posenc_tensor* lse) {
  return guarded([&] {
    if (p == nullptr) return null_arg("p");
    View vq, vk, vv, vo, vl;
    POSENC_RETURN_IF_ERROR(to_views({{"q", q, Role::kInput, false, &vq},
                                     {"k", k, Role::kInput, false, &vk},
                                     {"v", v, Role::kInput, false, &vv},
                                     {"out", out, Role::kOutput, false, &vo},
                                     {"lse", lse, Role::kOutput, true, &vl}}));
    return posenc::attention_forward(p->p, vq, vk, vv, p->t, vo, vl);
  });
}

int posenc_attention_backward(const posenc_attention_params* p, const posenc_tensor* q, const posenc_tensor* k,
                              const posenc_tensor* v, const posenc_tensor* dout, const posenc_tensor* dq,
                              const posenc_tensor* dk, const posenc_tensor* dv) {
  return guarded([&] {
    if (p == nullptr) return null_arg("p");
    View vq, vk, vv, vdo, vdq, vdk, vdv;
    POSENC_RETURN_IF_ERROR(to_views({{"q", q, Role::kInput, false, &vq},
                                     {"k", k, Role::kInput, false, &vk},
                                     {"v", v, Role::kInput, false, &vv},
                                     {"dout", dout, Role::kInput, false, &vdo},
                                     {"dq", dq, Role::kOutput, true, &vdq},
                                     {"dk", dk, Role::kOutput, true, &vdk},
                                     {"dv", dv, Role::kOutput, true, &vdv}}));
    return posenc::attention_backward(p->p, vq, vk, vv, p->t, vdo, vdq, vdk, vdv, p->g);
  });
}

int posenc_attention_backward_saved(const posenc_attention_params* p, const posenc_tensor* q,
                                    const posenc_tensor* k, const posenc_tensor* v, const posenc_tensor* out,
                                    const posenc_tensor* lse, const posenc_tensor* dout, const posenc_tensor* dq,
                                    const posenc_tensor* dk, const posenc_tensor* dv) {
  return backward_given_stats(&posenc::attention_backward_saved, p, q, k, v, out, lse, dout, dq, dk, dv);
}

int posenc_attention_backward_from_stats(const posenc_attention_params* p, const posenc_tensor* q,
                                         const posenc_tensor* k, const posenc_tensor* v,
                                         const posenc_tensor* out, const posenc_tensor* lse,
                                         const posenc_tensor* dout, const posenc_tensor* dq,
                                         const posenc_tensor* dk, const posenc_tensor* dv) {
  return backward_given_stats(&posenc::attention_backward_from_stats, p, q, k, v, out, lse, dout, dq, dk, dv);
}

}  // extern "C"
