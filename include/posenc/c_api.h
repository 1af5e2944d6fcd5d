/* posenc/c_api.h — the C ABI of posenc (C11 and C++; docs/c_api.md has the key vocabulary). */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (the values of posenc_tensor.dtype). */
enum { POSENC_F32 = 0, POSENC_F64 = 1, POSENC_I32 = 2, POSENC_I64 = 3, POSENC_BF16 = 4, POSENC_F16 = 5 };

/* Return codes: 0 on success; on error posenc_last_error() says which argument and why. */
enum {
  POSENC_OK = 0,
  POSENC_ERR_INVALID = 1,      /* a NULL pointer, unknown key or name, bad value, dtype, shape or stride */
  POSENC_ERR_OUT_OF_RANGE = 2, /* a value or position beyond what the encoding accepts */
  POSENC_ERR_NOMEM = 3,        /* an allocation failed (the outputs' contents are then unspecified) */
  POSENC_ERR_INTERNAL = 4      /* anything else (a bug: please report the message) */
};

#define POSENC_MAX_DIMS 6

/* The most elements a tensor argument may have (its shape's product, broadcast dimensions
   included); more is POSENC_ERR_OUT_OF_RANGE naming it, before anything is allocated. */
#define POSENC_MAX_ELEMENTS (INT64_C(1) << 40)

/* A non-owning strided view: data, dtype, ndim <= 6 dims, shape, strides in elements (>= 0). */
typedef struct {
  void* data;
  int dtype;
  int ndim;
  int64_t shape[POSENC_MAX_DIMS];
  int64_t strides[POSENC_MAX_DIMS];
} posenc_tensor;

typedef struct posenc_rope_params posenc_rope_params;           /* opaque RoPE parameters */
typedef struct posenc_attention_params posenc_attention_params; /* opaque attention parameters */

/* The library's version, "MAJOR.MINOR.PATCH" (static storage). */
const char* posenc_version(void);

/* The message of this thread's latest failed call (one line naming the argument); "" if none. */
const char* posenc_last_error(void);

/* New RoPE parameters with the C++ RopeParams defaults; NULL when out of memory. */
posenc_rope_params* posenc_rope_params_new(void);

/* Sets one RoPE key from text ("theta", "500000"); lists comma-separated. p unchanged on error. */
int posenc_rope_params_set(posenc_rope_params* p, const char* key, const char* value);

/* Replaces p by a Hugging Face config.json's RoPE; *head_dim (if not NULL) gets its head dim. */
int posenc_rope_params_from_config(posenc_rope_params* p, const char* config_json_text, int64_t* head_dim);

/* Frees p (NULL is a no-op). */
void posenc_rope_params_free(posenc_rope_params* p);

/* Rotates q [B,L,Hq,D] and k [B,L,Hk,D] (k, k_out may both be NULL) into q_out, k_out (may alias);
   positions int32/int64 [L] or [B,L], NULL: offset + l; backward != 0 applies the inverse. */
int posenc_rope_qk(const posenc_rope_params* p, const posenc_tensor* q, const posenc_tensor* k,
                   const posenc_tensor* positions, int64_t offset, const posenc_tensor* q_out,
                   const posenc_tensor* k_out, int backward);

/* New attention parameters for an encoding of the registry ("nope", "rope", "alibi", "t5", ...);
   NULL on an unknown name (see posenc_last_error) or when out of memory. */
posenc_attention_params* posenc_attention_params_new(const char* encoding);

/* Sets one key from text: causal, scale, q_offset, k_offset, keys_rotated, bf16_rate or a key of the
   encoding. */
int posenc_attention_params_set(posenc_attention_params* p, const char* key, const char* value);

/* Copies RoPE parameters into a rope, mrope, xpos or rope2d attention (its rotation's parameters). */
int posenc_attention_set_rope(posenc_attention_params* p, const posenc_rope_params* rope);

/* Borrows a tensor of the encoding ("weights", "slopes", "table", ...) until the next set of that
   name or free; t NULL unsets it. The memory must outlive every call that reads it. */
int posenc_attention_set_tensor(posenc_attention_params* p, const char* name, const posenc_tensor* t);

/* As set_tensor, for where the backward writes that parameter's gradient (overwritten). */
int posenc_attention_set_grad(posenc_attention_params* p, const char* name, const posenc_tensor* g);

/* Frees p (NULL is a no-op); borrowed tensors are not freed. */
void posenc_attention_params_free(posenc_attention_params* p);

/* out [B,M,Hq,D] = softmax(scale*q*k^T + encoding + mask)*v; q [B,M,Hq,D], k, v [B,N,Hkv,D];
   lse float64 [B,Hq,M] or NULL. */
int posenc_attention_forward(const posenc_attention_params* p, const posenc_tensor* q, const posenc_tensor* k,
                             const posenc_tensor* v, const posenc_tensor* out, const posenc_tensor* lse);

/* Gradients dq, dk, dv (each may be NULL; shapes of q, k, v) of the forward given dout [B,M,Hq,D];
   parameter gradients go where posenc_attention_set_grad said. */
int posenc_attention_backward(const posenc_attention_params* p, const posenc_tensor* q, const posenc_tensor* k,
                              const posenc_tensor* v, const posenc_tensor* dout, const posenc_tensor* dq,
                              const posenc_tensor* dk, const posenc_tensor* dv);

/* posenc_attention_backward given the out [B,M,Hq,D] (q's dtype) and lse float64 [B,Hq,M] that
   posenc_attention_forward wrote for the same arguments: read instead of computing the forward
   again where the fused kernels run; the same gradients (posenc/attention.h:
   attention_backward_saved). */
int posenc_attention_backward_saved(const posenc_attention_params* p, const posenc_tensor* q,
                                    const posenc_tensor* k, const posenc_tensor* v, const posenc_tensor* out,
                                    const posenc_tensor* lse, const posenc_tensor* dout, const posenc_tensor* dq,
                                    const posenc_tensor* dk, const posenc_tensor* dv);

/* posenc_attention_backward for a call that holds a shard of a larger attention's keys (its
   k_offset, and q_offset, set as parameters): out [B,M,Hq,D] (q's dtype) and lse float64 [B,Hq,M]
   are the larger attention's; dq and the parameter gradients are this shard's partial sums
   (posenc/attention.h: attention_backward_from_stats). */
int posenc_attention_backward_from_stats(const posenc_attention_params* p, const posenc_tensor* q,
                                         const posenc_tensor* k, const posenc_tensor* v,
                                         const posenc_tensor* out, const posenc_tensor* lse,
                                         const posenc_tensor* dout, const posenc_tensor* dq,
                                         const posenc_tensor* dk, const posenc_tensor* dv);

#ifdef __cplusplus
}
#endif
