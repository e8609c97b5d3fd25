// The FusedConvReLU CUDA kernels as torch operators dmls::fused_conv_relu_{forward,backward}
// (torch.ops.dmls.* in Python), with the checks that keep a shape the kernels don't handle from
// producing a silent wrong answer. The Python wrapper (fused_conv_relu.py) checks the same with
// friendlier messages; these are the last line. Operators, not pybind11 functions: a failed
// TORCH_CHECK reaches Python through torch's dispatcher as a RuntimeError, as torch's own ops'
// errors do (thrown through a pybind11 binding of this module, it crashed Python on an H100 host).

#include <torch/library.h>
#include <torch/types.h>

#include <optional>
#include <string>
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

// The messages are built with std::to_string, never by streaming numbers into TORCH_CHECK:
// on an H100 host (g++ 13, torch 2.11) a check whose message streamed an int64_t crashed
// Python with a segfault instead of raising, while checks with text-only messages raised.
std::string num(int64_t value) { return std::to_string(value); }

std::string shape(torch::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + num(sizes[i]);
  return out + "]";
}

void check_operand(const torch::Tensor& t, const char* name, int64_t dim,
                   const torch::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), "fused_conv_relu: ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.dim() == dim, "fused_conv_relu: ", name, " must be ", num(dim), "-D, got ",
              num(t.dim()), "-D");
  TORCH_CHECK(t.is_contiguous(), "fused_conv_relu: ", name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "fused_conv_relu: ", name, " is ",
              c10::toString(t.scalar_type()), " but the input is ",
              c10::toString(like.scalar_type()));
  TORCH_CHECK(t.device() == like.device(), "fused_conv_relu: ", name, " is on ", t.device().str(),
              " but the input is on ", like.device().str());
  TORCH_CHECK(t.numel() < (int64_t{1} << 31), "fused_conv_relu: ", name, " has ", num(t.numel()),
              " elements; the kernels index with 32-bit sizes per dimension and support < 2^31");
}

void check_conv(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kDouble,
              "fused_conv_relu: supports float32 and float64, got ", c10::toString(x.scalar_type()));
  check_operand(x, "input", 4, x);
  check_operand(w, "weight", 4, x);
  check_operand(b, "bias", 1, x);
  TORCH_CHECK(w.size(1) == x.size(1), "fused_conv_relu: weight expects ", num(w.size(1)),
              " input channels, the input has ", num(x.size(1)));
  TORCH_CHECK(b.size(0) == w.size(0), "fused_conv_relu: bias has ", num(b.size(0)),
              " elements for ", num(w.size(0)), " output channels");
  TORCH_CHECK(sh >= 1 && sw >= 1, "fused_conv_relu: stride must be >= 1, got (", num(sh), ", ",
              num(sw), ")");
  TORCH_CHECK(ph >= 0 && pw >= 0, "fused_conv_relu: padding must be >= 0, got (", num(ph), ", ",
              num(pw), ")");
  TORCH_CHECK(x.size(2) + 2 * ph >= w.size(2) && x.size(3) + 2 * pw >= w.size(3),
              "fused_conv_relu: the ", num(w.size(2)), "x", num(w.size(3)),
              " kernel is larger than the padded input ", num(x.size(2) + 2 * ph), "x",
              num(x.size(3) + 2 * pw));
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
              shape(grad_y.sizes()), ", the output ", shape(y.sizes()));
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
