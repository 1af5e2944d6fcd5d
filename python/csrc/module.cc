// python/csrc/module.cc — the extension posenc._C: torch tensors viewed as posenc_tensor (no copy),
// RoPE and attention through the C ABI (its key vocabulary and validation), the rest through
// bridge.h. Every kernel runs with the GIL released; every library error becomes a Python exception
// with the library's one-line message (ValueError for invalid or out-of-range arguments).
#include <torch/extension.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bridge.h"
#include "posenc/c_api.h"

namespace py = pybind11;

namespace {

using TensorDict = std::map<std::string, at::Tensor>;
using TextDict = std::map<std::string, std::string>;

[[noreturn]] void raise(int code, const std::string& message) {
  if (code == POSENC_ERR_NOMEM) {
    PyErr_SetString(PyExc_MemoryError, message.c_str());
    throw py::error_already_set();
  }
  if (code == POSENC_ERR_INTERNAL) throw std::runtime_error(message);
  throw py::value_error(message);
}

void check(int code) {
  if (code != POSENC_OK) raise(code, posenc_last_error());
}

void check(const posenc_py::Result& r) {
  if (r.code != POSENC_OK) raise(r.code, r.message);
}

// The dtypes posenc takes and their C ABI codes (one table for both directions).
constexpr std::pair<at::ScalarType, int> kDTypes[] = {
    {at::kFloat, POSENC_F32}, {at::kDouble, POSENC_F64}, {at::kBFloat16, POSENC_BF16},
    {at::kHalf, POSENC_F16},  {at::kInt, POSENC_I32},    {at::kLong, POSENC_I64},
};

int dtype_code(const std::string& arg, const at::Tensor& t) {
  for (const auto& [type, code] : kDTypes)
    if (t.scalar_type() == type) return code;
  throw py::type_error(arg + ": expected float32, float64, bfloat16 or float16 (int32 or int64 for positions), got " +
                       std::string(c10::toString(t.scalar_type())));
}

at::ScalarType scalar_type(int code) {
  for (const auto& [type, c] : kDTypes)
    if (c == code) return type;
  return at::kDouble;
}

// A view of t's memory (its strides, in elements): CPU and strided only.
posenc_tensor view_of(const std::string& arg, const at::Tensor& t) {
  if (!t.defined()) throw py::value_error(arg + ": expected a tensor, got an undefined one");
  if (t.layout() != at::kStrided) throw py::type_error(arg + ": expected a dense (strided) tensor");
  if (!t.device().is_cpu())
    throw py::value_error(arg + ": expected a CPU tensor, got one on device '" + t.device().str() +
                          "' (posenc's kernels run on the CPU)");
  const int dtype = dtype_code(arg, t);
  if (t.dim() > POSENC_MAX_DIMS)
    throw py::value_error(arg + ": expected at most 6 dimensions, got " + std::to_string(t.dim()));
  if (t.numel() > POSENC_MAX_ELEMENTS) {  // the C ABI's limit, before any output is allocated like t
    std::string shape;
    for (std::int64_t s : t.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(s);
    throw py::value_error(arg + ": shape [" + shape + "] has more than 2^40 elements (POSENC_MAX_ELEMENTS)");
  }
  posenc_tensor v{};
  // An empty tensor has no storage; the library needs a pointer and reads nothing behind it.
  static double empty_storage[1];
  v.data = t.numel() == 0 ? static_cast<void*>(empty_storage) : t.data_ptr();
  v.dtype = dtype;
  v.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = t.size(i);
    v.strides[i] = t.stride(i);
  }
  return v;
}

// An output buffer from torch's allocator, whose failure is MemoryError like the library's own.
template <class F>
at::Tensor allocated(F&& make) {
  try {
    return make();
  } catch (const c10::Error& e) {
    if (std::string(e.what()).find("can't allocate memory") != std::string::npos) raise(POSENC_ERR_NOMEM, "out of memory");
    throw;
  }
}

at::Tensor empty_like_contiguous(const at::Tensor& t) {
  return allocated([&] { return at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous)); });
}

at::Tensor zeros_like_contiguous(const at::Tensor& t) {
  return allocated([&] { return at::zeros(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous)); });
}

// A zeroed gradient buffer for the named tensor of `tensors` (which must have been given).
at::Tensor grad_buffer(const TensorDict& tensors, const std::string& name) {
  auto it = tensors.find(name);
  if (it == tensors.end()) throw py::value_error(name + ": a gradient was asked for a tensor that was not given");
  return zeros_like_contiguous(it->second);
}

// ---- RoPE ------------------------------------------------------------------------------------------

struct RopeDeleter {
  void operator()(posenc_rope_params* p) const { posenc_rope_params_free(p); }
};
using RopePtr = std::unique_ptr<posenc_rope_params, RopeDeleter>;

// RoPE parameters from a config.json text (may be empty) and then keys; checks the config's head_dim.
RopePtr rope_params(const TextDict& params, const std::string& config, std::int64_t head_dim) {
  RopePtr p(posenc_rope_params_new());
  if (!p) raise(POSENC_ERR_NOMEM, "out of memory");
  if (!config.empty()) {
    std::int64_t d = 0;
    if (posenc_rope_params_from_config(p.get(), config.c_str(), &d) != POSENC_OK) {
      std::string message = posenc_last_error();  // named after the C argument: the config's field follows
      const std::string c_arg = "config_json_text: ";
      if (message.rfind(c_arg, 0) == 0) message = message.substr(c_arg.size());
      if (message.rfind("config: ", 0) != 0) message = "config: " + message;  // a field's name, or the file's
      throw py::value_error(message);
    }
    if (d != head_dim)
      throw py::value_error("config: head_dim " + std::to_string(d) + " does not match the tensors' last dimension " +
                            std::to_string(head_dim));
  }
  for (const auto& [key, value] : params) check(posenc_rope_params_set(p.get(), key.c_str(), value.c_str()));
  return p;
}

std::pair<at::Tensor, std::optional<at::Tensor>> rope(const at::Tensor& q, const std::optional<at::Tensor>& k,
                                                      const std::optional<at::Tensor>& positions, std::int64_t offset,
                                                      const TextDict& params, const std::string& config,
                                                      bool backward, bool inplace) {
  const posenc_tensor vq = view_of("q", q);
  posenc_tensor vk{}, vpos{};
  if (k) vk = view_of("k", *k);
  if (positions) vpos = view_of("positions", *positions);
  RopePtr p = rope_params(params, config, q.dim() > 0 ? q.size(-1) : 0);
  at::Tensor q_out = inplace ? q : empty_like_contiguous(q);
  std::optional<at::Tensor> k_out;
  if (k) k_out = inplace ? *k : empty_like_contiguous(*k);
  const posenc_tensor vqo = view_of("q_out", q_out);
  posenc_tensor vko{};
  if (k) vko = view_of("k_out", *k_out);
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = posenc_rope_qk(p.get(), &vq, k ? &vk : nullptr, positions ? &vpos : nullptr, offset, &vqo,
                        k ? &vko : nullptr, backward ? 1 : 0);
  }
  check(rc);
  return {q_out, k_out};
}

// ---- attention -------------------------------------------------------------------------------------

struct AttentionDeleter {
  void operator()(posenc_attention_params* p) const { posenc_attention_params_free(p); }
};
using AttentionPtr = std::unique_ptr<posenc_attention_params, AttentionDeleter>;

AttentionPtr attention_params(const std::string& encoding, const TextDict& params, const TensorDict& tensors) {
  AttentionPtr p(posenc_attention_params_new(encoding.c_str()));
  if (!p) check(POSENC_ERR_INVALID);
  for (const auto& [key, value] : params) check(posenc_attention_params_set(p.get(), key.c_str(), value.c_str()));
  for (const auto& [name, t] : tensors) {
    const posenc_tensor v = view_of(name, t);
    check(posenc_attention_set_tensor(p.get(), name.c_str(), &v));
  }
  return p;
}

std::pair<at::Tensor, at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                    const std::string& encoding, const TextDict& params,
                                                    const TensorDict& tensors, bool need_lse) {
  const posenc_tensor vq = view_of("q", q), vk = view_of("k", k), vv = view_of("v", v);
  AttentionPtr p = attention_params(encoding, params, tensors);
  if (q.dim() != 4) throw py::value_error("q: expected 4 dimensions [B, M, Hq, D], got " + std::to_string(q.dim()));
  at::Tensor out = empty_like_contiguous(q), lse;  // lse stays undefined (None) unless asked for
  if (need_lse)
    lse = allocated([&] { return at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kDouble)); });
  const posenc_tensor vo = view_of("out", out), vl = need_lse ? view_of("lse", lse) : posenc_tensor{};
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = posenc_attention_forward(p.get(), &vq, &vk, &vv, &vo, need_lse ? &vl : nullptr);
  }
  check(rc);
  return {out, lse};
}

using Backward = std::tuple<at::Tensor, at::Tensor, at::Tensor, TensorDict>;

// What every backward shares: the parameters, zeroed gradient buffers for dq, dk, dv and the named
// parameter tensors (registered with the parameters), then kernel(p, dq, dk, dv) without the GIL.
template <class Kernel>
Backward backward_with(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::string& encoding,
                       const TextDict& params, const TensorDict& tensors,
                       const std::vector<std::string>& grad_names, Kernel kernel) {
  AttentionPtr p = attention_params(encoding, params, tensors);
  TensorDict grads;
  for (const std::string& name : grad_names) {
    at::Tensor g = grad_buffer(tensors, name);
    const posenc_tensor vg = view_of("d" + name, g);
    check(posenc_attention_set_grad(p.get(), name.c_str(), &vg));
    grads[name] = g;
  }
  at::Tensor dq = zeros_like_contiguous(q), dk = zeros_like_contiguous(k), dv = zeros_like_contiguous(v);
  const posenc_tensor vdq = view_of("dq", dq), vdk = view_of("dk", dk), vdv = view_of("dv", dv);
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = kernel(p.get(), &vdq, &vdk, &vdv);
  }
  check(rc);
  return {dq, dk, dv, grads};
}

Backward attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
                            const std::string& encoding, const TextDict& params, const TensorDict& tensors,
                            const std::vector<std::string>& grad_names) {
  const posenc_tensor vq = view_of("q", q), vk = view_of("k", k), vv = view_of("v", v);
  const posenc_tensor vdo = view_of("dout", dout);
  return backward_with(q, k, v, encoding, params, tensors, grad_names,
                       [&](const posenc_attention_params* p, const posenc_tensor* dq, const posenc_tensor* dk,
                           const posenc_tensor* dv) {
                         return posenc_attention_backward(p, &vq, &vk, &vv, &vdo, dq, dk, dv);
                       });
}

// A C backward given out and lse: posenc_attention_backward_saved or _from_stats.
using StatsBackwardC = int (*)(const posenc_attention_params*, const posenc_tensor*, const posenc_tensor*,
                               const posenc_tensor*, const posenc_tensor*, const posenc_tensor*,
                               const posenc_tensor*, const posenc_tensor*, const posenc_tensor*,
                               const posenc_tensor*);

Backward backward_given_stats(StatsBackwardC fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout,
                              const std::string& encoding, const TextDict& params, const TensorDict& tensors,
                              const std::vector<std::string>& grad_names) {
  const posenc_tensor vq = view_of("q", q), vk = view_of("k", k), vv = view_of("v", v);
  const posenc_tensor vo = view_of("out", out), vl = view_of("lse", lse), vdo = view_of("dout", dout);
  return backward_with(q, k, v, encoding, params, tensors, grad_names,
                       [&](const posenc_attention_params* p, const posenc_tensor* dq, const posenc_tensor* dk,
                           const posenc_tensor* dv) { return fn(p, &vq, &vk, &vv, &vo, &vl, &vdo, dq, dk, dv); });
}

// The backward given the forward's own out and lse (posenc/attention.h's attention_backward_saved),
// for the autograd of posenc.attention.
Backward attention_backward_saved(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout,
                                  const std::string& encoding, const TextDict& params, const TensorDict& tensors,
                                  const std::vector<std::string>& grad_names) {
  return backward_given_stats(&posenc_attention_backward_saved, q, k, v, out, lse, dout, encoding, params, tensors,
                              grad_names);
}

// The backward of a key shard under the softmax statistics (out, lse) of the larger attention it
// belongs to (posenc/attention.h's attention_backward_from_stats), for posenc.distributed.
Backward attention_backward_from_stats(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& out, const at::Tensor& lse, const at::Tensor& dout,
                                       const std::string& encoding, const TextDict& params,
                                       const TensorDict& tensors, const std::vector<std::string>& grad_names) {
  return backward_given_stats(&posenc_attention_backward_from_stats, q, k, v, out, lse, dout, encoding, params,
                              tensors, grad_names);
}

// ---- sinusoidal PE and logit biases ----------------------------------------------------------------

at::Tensor sinusoidal(const at::Tensor& x, const std::optional<at::Tensor>& positions, std::int64_t offset,
                      double base, bool backward) {
  const posenc_tensor vx = view_of(backward ? "dy" : "x", x);
  posenc_tensor vpos{};
  if (positions) vpos = view_of("positions", *positions);
  at::Tensor y = empty_like_contiguous(x);
  const posenc_tensor vy = view_of(backward ? "dx" : "y", y);
  posenc_py::Result r;
  {
    py::gil_scoped_release nogil;
    r = posenc_py::sinusoidal(base, vx, positions ? &vpos : nullptr, offset, vy, backward);
  }
  check(r);
  return y;
}

posenc_py::BiasCall bias_call(const std::string& encoding, std::int64_t heads, std::int64_t q_len,
                              std::int64_t k_len, std::int64_t q_offset, std::int64_t k_offset, bool causal,
                              const TextDict& params, const TensorDict& tensors) {
  posenc_py::BiasCall c;
  c.encoding = encoding;
  c.params = params;
  for (const auto& [name, t] : tensors) c.tensors[name] = view_of(name, t);
  for (auto [name, n] : {std::pair<const char*, std::int64_t>{"heads", heads}, {"q_len", q_len}, {"k_len", k_len}})
    if (n < 1) throw py::value_error(std::string(name) + ": expected a positive integer, got " + std::to_string(n));
  if (heads > (1 << 20) || q_len > (1 << 24) || k_len > (1 << 24) || heads * q_len > (std::int64_t{1} << 40) ||
      heads * q_len * k_len > (std::int64_t{1} << 40))
    throw py::value_error("heads: the bias [heads, q_len, k_len] is too large");
  c.heads = heads;
  c.q_len = q_len;
  c.k_len = k_len;
  c.q_offset = q_offset;
  c.k_offset = k_offset;
  c.causal = causal;
  return c;
}

at::Tensor bias(const std::string& encoding, std::int64_t heads, std::int64_t q_len, std::int64_t k_len,
                std::int64_t q_offset, std::int64_t k_offset, bool causal, const TextDict& params,
                const TensorDict& tensors) {
  const posenc_py::BiasCall c = bias_call(encoding, heads, q_len, k_len, q_offset, k_offset, causal, params, tensors);
  int dtype = POSENC_F64;
  check(posenc_py::bias_dtype(c, &dtype));
  at::Tensor out = allocated([&] { return at::empty({heads, q_len, k_len}, at::TensorOptions().dtype(scalar_type(dtype))); });
  const posenc_tensor vo = view_of("out", out);
  posenc_py::Result r;
  {
    py::gil_scoped_release nogil;
    r = posenc_py::bias_forward(c, vo);
  }
  check(r);
  return out;
}

TensorDict bias_backward(const std::string& encoding, std::int64_t heads, std::int64_t q_len, std::int64_t k_len,
                         std::int64_t q_offset, std::int64_t k_offset, bool causal, const TextDict& params,
                         const TensorDict& tensors, const at::Tensor& dbias, const std::vector<std::string>& grad_names) {
  const posenc_py::BiasCall c = bias_call(encoding, heads, q_len, k_len, q_offset, k_offset, causal, params, tensors);
  const posenc_tensor vd = view_of("dbias", dbias);
  TensorDict grads;
  posenc_py::TensorMap views;
  for (const std::string& name : grad_names) {
    grads[name] = grad_buffer(tensors, name);
    views[name] = view_of("d" + name, grads[name]);
  }
  posenc_py::Result r;
  {
    py::gil_scoped_release nogil;
    r = posenc_py::bias_backward(c, vd, views);
  }
  check(r);
  return grads;
}

py::list registry() {
  py::list out;
  for (const posenc_py::EncodingEntry& e : posenc_py::registry()) {
    py::list params;
    for (const posenc_py::ParamInfo& s : e.params)
      params.append(py::dict(py::arg("name") = s.name, py::arg("type") = s.type, py::arg("default") = s.default_value,
                             py::arg("choices") = s.choices, py::arg("help") = s.help, py::arg("learned") = s.learned));
    out.append(py::dict(py::arg("name") = e.name, py::arg("kind") = e.kind, py::arg("summary") = e.summary,
                        py::arg("paper") = e.paper, py::arg("params") = params));
  }
  return out;
}

std::string rope_config(const std::string& text, std::int64_t seq_len) {
  std::string json;
  check(posenc_py::rope_config_json(text, seq_len, &json));
  return json;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = R"(posenc's kernels for torch CPU tensors (the public API is the package posenc).

Private low-level entries, stable for code built on the package:
  attention_forward(q, k, v, encoding, params: dict[str, str], tensors: dict[str, Tensor], need_lse=True)
      -> (out, lse or None)
      q [B, M, Hq, D], k, v [B, N, Hkv, D]; out [B, M, Hq, D] (q's dtype, contiguous);
      lse float64 [B, Hq, M] = log sum_j exp(logit_ij). params: the C ABI's keys as text
      (causal, scale, q_offset, k_offset, the encoding's keys); tensors: the encoding's tensors by
      name (slopes, weights, u, v_bias, rel_proj, table, r1, r2, mlp_w1, ..., freqs, q_positions).
  attention_backward(q, k, v, dout, encoding, params, tensors, grad_names: list[str])
      -> (dq, dk, dv, dict[str, Tensor])  the gradients of q, k, v and of the named tensors.
No autograd here: the package's functions wrap these in torch.autograd.Function.)";
  m.def("version", [] { return std::string(posenc_version()); });
  m.def("registry", &registry, "The registry: a list of dicts (name, kind, summary, paper, params).");
  m.def("get_num_threads", &posenc_py::num_threads);
  m.def("set_num_threads", &posenc_py::set_num_threads, py::arg("n"));
  m.def("rope", &rope, py::arg("q"), py::arg("k"), py::arg("positions"), py::arg("offset"), py::arg("params"),
        py::arg("config"), py::arg("backward"), py::arg("inplace"),
        "Rotates q (and k) [B, L, H, D]; returns (q_out, k_out or None).");
  m.def("rope_config", &rope_config, py::arg("config_text"), py::arg("seq_len"),
        "A config.json's RoPE as JSON text (posenc rope-config's output).");
  m.def("attention_forward", &attention_forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("encoding"),
        py::arg("params"), py::arg("tensors"), py::arg("need_lse") = true);
  m.def("attention_backward", &attention_backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dout"),
        py::arg("encoding"), py::arg("params"), py::arg("tensors"), py::arg("grad_names"));
  m.def("sinusoidal", &sinusoidal, py::arg("x"), py::arg("positions"), py::arg("offset"), py::arg("base"),
        py::arg("backward"));
  m.def("bias", &bias, py::arg("encoding"), py::arg("heads"), py::arg("q_len"), py::arg("k_len"), py::arg("q_offset"),
        py::arg("k_offset"), py::arg("causal"), py::arg("params"), py::arg("tensors"));
  m.def("bias_backward", &bias_backward, py::arg("encoding"), py::arg("heads"), py::arg("q_len"), py::arg("k_len"),
        py::arg("q_offset"), py::arg("k_offset"), py::arg("causal"), py::arg("params"), py::arg("tensors"),
        py::arg("dbias"), py::arg("grad_names"));
  m.def("attention_backward_saved", &attention_backward_saved, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("out"), py::arg("lse"), py::arg("dout"), py::arg("encoding"), py::arg("params"),
        py::arg("tensors"), py::arg("grad_names"),
        "attention_backward given the out and lse that attention_forward returned for the same arguments "
        "(read instead of computing the forward again where the fused kernels run). Returns (dq, dk, dv, "
        "dict of parameter gradients).");
  m.def("attention_backward_from_stats", &attention_backward_from_stats, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("out"), py::arg("lse"), py::arg("dout"), py::arg("encoding"), py::arg("params"),
        py::arg("tensors"), py::arg("grad_names"),
        "attention_backward for a call holding a shard of a larger attention's keys (k_offset, q_offset in "
        "params): out [B, M, Hq, D] and lse float64 [B, Hq, M] are the larger attention's. Returns (dq, dk, "
        "dv, dict of parameter gradients); dq and the parameter gradients are this shard's partial sums.");
}
