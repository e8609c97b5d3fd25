// The FusedConvReLU CUDA kernels as torch operators dmls::fused_conv_relu_{forward,backward}
// (torch.ops.dmls.* in Python), with the checks that keep a shape the kernels don't handle from
// producing a silent wrong answer. The Python wrapper (fused_conv_relu.py) checks the same with
// friendlier messages; these are the last line. Operators, not pybind11 functions: a failed
// TORCH_CHECK reaches Python through torch's dispatcher as a RuntimeError, as torch's own ops'
// errors do (thrown through a pybind11 binding of this module, it crashed Python on an H100 host).

#include <torch/library.h>
#include <torch/types.h>

#include <optional>
#include <tuple>
#include <vector>

torch::Tensor fused_conv_relu_forward_cuda(const torch::Tensor& x, const torch::Tensor& w,
                                           const torch::Tensor& b, int64_t sh, int64_t sw,
                                           int64_t ph, int64_t pw);
std::vector<torch::Tensor> fused_conv_relu_backward_cuda(const torch::Tensor& grad_y,
                                                         const torch::Tensor& x,
                                                         const torch::Tensor& w,
                                                         const torch::Tensor& y, int64_t sh,
                                                         int64_t sw, int64_t ph, int64_t pw,
                                                         bool input_grad);

namespace {

void check_operand(const torch::Tensor& t, const char* name, int64_t dim,
                   const torch::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), "fused_conv_relu: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.dim() == dim, "fused_conv_relu: ", name, " must be ", dim, "-D, got ", t.dim(),
              "-D");
  TORCH_CHECK(t.is_contiguous(), "fused_conv_relu: ", name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "fused_conv_relu: ", name, " is ",
              t.scalar_type(), " but the input is ", like.scalar_type());
  TORCH_CHECK(t.device() == like.device(), "fused_conv_relu: ", name, " is on ", t.device(),
              " but the input is on ", like.device());
  TORCH_CHECK(t.numel() < (int64_t{1} << 31), "fused_conv_relu: ", name, " has ", t.numel(),
              " elements; the kernels index with 32-bit sizes per dimension and support < 2^31");
}

void check_conv(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kDouble,
              "fused_conv_relu: supports float32 and float64, got ", x.scalar_type());
  check_operand(x, "input", 4, x);
  check_operand(w, "weight", 4, x);
  check_operand(b, "bias", 1, x);
  TORCH_CHECK(w.size(1) == x.size(1), "fused_conv_relu: weight expects ", w.size(1),
              " input channels, the input has ", x.size(1));
  TORCH_CHECK(b.size(0) == w.size(0), "fused_conv_relu: bias has ", b.size(0),
              " elements for ", w.size(0), " output channels");
  TORCH_CHECK(sh >= 1 && sw >= 1, "fused_conv_relu: stride must be >= 1, got (", sh, ", ", sw,
              ")");
  TORCH_CHECK(ph >= 0 && pw >= 0, "fused_conv_relu: padding must be >= 0, got (", ph, ", ", pw,
              ")");
  TORCH_CHECK(x.size(2) + 2 * ph >= w.size(2) && x.size(3) + 2 * pw >= w.size(3),
              "fused_conv_relu: the ", w.size(2), "x", w.size(3),
              " kernel is larger than the padded input ", x.size(2) + 2 * ph, "x",
              x.size(3) + 2 * pw);
}

torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                      int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  check_conv(x, w, b, sh, sw, ph, pw);
  return fused_conv_relu_forward_cuda(x, w, b, sh, sw, ph, pw);
}

std::tuple<std::optional<torch::Tensor>, torch::Tensor, torch::Tensor> backward(
    const torch::Tensor& grad_y, const torch::Tensor& x, const torch::Tensor& w,
    const torch::Tensor& b, const torch::Tensor& y, int64_t sh, int64_t sw, int64_t ph,
    int64_t pw, bool input_grad) {
  check_conv(x, w, b, sh, sw, ph, pw);
  check_operand(y, "output", 4, x);
  check_operand(grad_y, "output gradient", 4, x);
  TORCH_CHECK(grad_y.sizes() == y.sizes(), "fused_conv_relu: output gradient has shape ",
              grad_y.sizes(), ", the output ", y.sizes());
  auto grads = fused_conv_relu_backward_cuda(grad_y, x, w, y, sh, sw, ph, pw, input_grad);
  return {input_grad ? std::optional(grads[0]) : std::nullopt, grads[1], grads[2]};
}

}  // namespace

TORCH_LIBRARY(dmls, m) {
  m.def(
      "fused_conv_relu_forward(Tensor x, Tensor weight, Tensor bias, int stride_h, "
      "int stride_w, int pad_h, int pad_w) -> Tensor");
  m.def(
      "fused_conv_relu_backward(Tensor grad_output, Tensor x, Tensor weight, Tensor bias, "
      "Tensor output, int stride_h, int stride_w, int pad_h, int pad_w, bool input_grad) "
      "-> (Tensor?, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(dmls, CUDA, m) {
  m.impl("fused_conv_relu_forward", &forward);
  m.impl("fused_conv_relu_backward", &backward);
}
