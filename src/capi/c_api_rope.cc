// The C ABI's RoPE: parameters by key (core/param_text.h's vocabulary), config.json, rope_apply_qk.
#include <string>

#include "capi/c_api_internal.h"
#include "core/param_text.h"

using posenc::Status;
using posenc::View;
using namespace posenc::capi;

extern "C" {

posenc_rope_params* posenc_rope_params_new(void) {
  posenc_rope_params* p = new (std::nothrow) posenc_rope_params;
  if (p == nullptr) fail_nomem();
  return p;
}

int posenc_rope_params_set(posenc_rope_params* p, const char* key, const char* value) {
  return guarded([&] {
    if (p == nullptr) return null_arg("p");
    if (key == nullptr) return null_arg("key");
    if (value == nullptr) return null_arg(key, "expected a value, got NULL");
    return posenc::text::set_rope_param(&p->p, key, value);
  });
}

int posenc_rope_params_from_config(posenc_rope_params* p, const char* config_json_text, int64_t* head_dim) {
  return guarded([&] {
    if (p == nullptr) return null_arg("p");
    if (config_json_text == nullptr) return null_arg("config_json_text");
    auto c = posenc::rope_config_from_json(config_json_text);
    if (!c.ok()) return Status::Invalid("config_json_text", c.status().message());
    p->p = c->params;
    if (head_dim != nullptr) *head_dim = c->head_dim;
    return Status::Ok();
  });
}

void posenc_rope_params_free(posenc_rope_params* p) { delete p; }

int posenc_rope_qk(const posenc_rope_params* p, const posenc_tensor* q, const posenc_tensor* k,
                   const posenc_tensor* positions, int64_t offset, const posenc_tensor* q_out,
                   const posenc_tensor* k_out, int backward) {
  return guarded([&] {
    if (p == nullptr) return null_arg("p");
    View vq, vk, vpos, vqo, vko;
    POSENC_RETURN_IF_ERROR(to_views({{"q", q, Role::kInput, false, &vq},
                                     {"k", k, Role::kInput, true, &vk},
                                     {"positions", positions, Role::kInput, true, &vpos},
                                     {"q_out", q_out, Role::kOutput, false, &vqo},
                                     {"k_out", k_out, Role::kOutput, true, &vko}}));
    if (k == nullptr && k_out != nullptr) return Status::Invalid("k_out", "given without k (leave both NULL)");
    if (k != nullptr && k_out == nullptr) return Status::Invalid("k_out", "expected a tensor for k's result, got NULL");
    return posenc::rope_apply_qk(p->p, vq, vk, posenc::Positions{vpos, offset}, vqo, vko, backward != 0);
  });
}

}  // extern "C"
