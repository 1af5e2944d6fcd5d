// python/csrc/stats.cc — posenc._C.attention_backward_from_stats: the backward of a key shard under
// the softmax statistics (out, lse) of the larger attention it belongs to (posenc/attention.h), for
// posenc.distributed's ring attention. Through the C ABI, as module.cc's attention entries; the GIL is
// released around the kernel; a library error is a ValueError with its one-line message.
#include <torch/extension.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "posenc/c_api.h"

namespace py = pybind11;

namespace posenc_py {
namespace {

using TensorDict = std::map<std::string, at::Tensor>;
using TextDict = std::map<std::string, std::string>;

void check(int code) {
  if (code == POSENC_OK) return;
  if (code == POSENC_ERR_INTERNAL) throw std::runtime_error(posenc_last_error());
  throw py::value_error(posenc_last_error());
}

// A view of a CPU strided tensor of a dtype the C ABI knows (the package's checks ran before).
posenc_tensor view(const std::string& arg, const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided || t.dim() > POSENC_MAX_DIMS)
    throw py::value_error(arg + ": expected a dense CPU tensor of at most 6 dimensions");
  posenc_tensor v{};
  switch (t.scalar_type()) {
    case at::kFloat: v.dtype = POSENC_F32; break;
    case at::kDouble: v.dtype = POSENC_F64; break;
    case at::kBFloat16: v.dtype = POSENC_BF16; break;
    case at::kHalf: v.dtype = POSENC_F16; break;
    case at::kInt: v.dtype = POSENC_I32; break;
    case at::kLong: v.dtype = POSENC_I64; break;
    default: throw py::type_error(arg + ": unsupported dtype " + std::string(c10::toString(t.scalar_type())));
  }
  static double empty_storage[1];  // an empty tensor has no storage; nothing behind it is read
  v.data = t.numel() == 0 ? static_cast<void*>(empty_storage) : t.data_ptr();
  v.ndim = static_cast<int>(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = t.size(i);
    v.strides[i] = t.stride(i);
  }
  return v;
}

struct Deleter {
  void operator()(posenc_attention_params* p) const { posenc_attention_params_free(p); }
};

at::Tensor contiguous_zeros(const at::Tensor& t) {
  return at::zeros(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, TensorDict> backward_from_stats(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& dout, const std::string& encoding, const TextDict& params, const TensorDict& tensors,
    const std::vector<std::string>& grad_names) {
  const posenc_tensor vq = view("q", q), vk = view("k", k), vv = view("v", v), vo = view("out", out),
                      vl = view("lse", lse), vdo = view("dout", dout);
  std::unique_ptr<posenc_attention_params, Deleter> p(posenc_attention_params_new(encoding.c_str()));
  if (!p) check(POSENC_ERR_INVALID);
  for (const auto& [key, value] : params) check(posenc_attention_params_set(p.get(), key.c_str(), value.c_str()));
  for (const auto& [name, t] : tensors) {
    const posenc_tensor vt = view(name, t);
    check(posenc_attention_set_tensor(p.get(), name.c_str(), &vt));
  }
  TensorDict grads;
  for (const std::string& name : grad_names) {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw py::value_error(name + ": a gradient was asked for a tensor that was not given");
    at::Tensor g = contiguous_zeros(it->second);
    const posenc_tensor vg = view("d" + name, g);
    check(posenc_attention_set_grad(p.get(), name.c_str(), &vg));
    grads[name] = g;
  }
  at::Tensor dq = contiguous_zeros(q), dk = contiguous_zeros(k), dv = contiguous_zeros(v);
  const posenc_tensor vdq = view("dq", dq), vdk = view("dk", dk), vdv = view("dv", dv);
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = posenc_attention_backward_from_stats(p.get(), &vq, &vk, &vv, &vo, &vl, &vdo, &vdq, &vdk, &vdv);
  }
  check(rc);
  return {dq, dk, dv, grads};
}

}  // namespace

void def_stats(py::module_& m) {
  m.def("attention_backward_from_stats", &backward_from_stats, py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("out"), py::arg("lse"), py::arg("dout"), py::arg("encoding"), py::arg("params"),
        py::arg("tensors"), py::arg("grad_names"),
        "attention_backward for a call holding a shard of a larger attention's keys (k_offset, q_offset in "
        "params): out [B, M, Hq, D] and lse float64 [B, Hq, M] are the larger attention's. Returns (dq, dk, "
        "dv, dict of parameter gradients); dq and the parameter gradients are this shard's partial sums.");
}

}  // namespace posenc_py
