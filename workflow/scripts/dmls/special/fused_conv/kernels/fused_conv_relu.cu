// FusedConvReLU: y = max(0, conv2d(x, w) + b) in one pass, and its backward.
//
// Layout: x (N, C, H, W), w (K, C, R, S), b (K), y (N, K, P, Q), all contiguous NCHW;
// stride (sh, sw), zero padding (ph, pw); no dilation, no groups. float32 and float64.
// Direct convolution, one thread per output (forward) or input element (grad input): the
// point is fusing bias and ReLU into the convolution and owning the backward, not beating
// cuDNN's implicit GEMM. Weight and bias gradients are block reductions over (n, p, q), one
// block per weight element, so they are deterministic (no atomics).

// Only the ATen headers the kernels need (not torch/extension.h): nvcc compiles much less.
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int kThreads = 256;

struct Shape {
  int n, c, h, w;     // input
  int k, r, s;        // output channels, kernel height and width
  int sh, sw, ph, pw; // stride, padding
  int p, q;           // output height and width
};

int blocks_for(int64_t elements) {
  // Grid-stride loops below: cap the grid, every element is still visited.
  return static_cast<int>(std::min<int64_t>((elements + kThreads - 1) / kThreads, 1 << 16));
}

template <typename scalar_t>
__global__ void forward_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ w,
                               const scalar_t* __restrict__ b, scalar_t* __restrict__ y,
                               Shape s) {
  using acc_t = at::acc_type<scalar_t, true>;
  const int64_t total = static_cast<int64_t>(s.n) * s.k * s.p * s.q;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int oq = i % s.q;
    const int op = (i / s.q) % s.p;
    const int ok = (i / (static_cast<int64_t>(s.q) * s.p)) % s.k;
    const int on = i / (static_cast<int64_t>(s.q) * s.p * s.k);
    const int y0 = op * s.sh - s.ph, x0 = oq * s.sw - s.pw;
    acc_t acc = b[ok];
    for (int c = 0; c < s.c; ++c) {
      const scalar_t* xc = x + (static_cast<int64_t>(on) * s.c + c) * s.h * s.w;
      const scalar_t* wc = w + (static_cast<int64_t>(ok) * s.c + c) * s.r * s.s;
      for (int r = 0; r < s.r; ++r) {
        const int iy = y0 + r;
        if (iy < 0 || iy >= s.h) continue;
        for (int t = 0; t < s.s; ++t) {
          const int ix = x0 + t;
          if (ix < 0 || ix >= s.w) continue;
          acc += static_cast<acc_t>(xc[iy * s.w + ix]) * static_cast<acc_t>(wc[r * s.s + t]);
        }
      }
    }
    y[i] = acc > acc_t(0) ? static_cast<scalar_t>(acc) : scalar_t(0);
  }
}

// dL/dz = dL/dy where the ReLU let z through (y > 0), else 0: PyTorch's ReLU convention at 0.
template <typename scalar_t>
__global__ void relu_mask_kernel(const scalar_t* __restrict__ grad_y,
                                 const scalar_t* __restrict__ y, scalar_t* __restrict__ grad_z,
                                 int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    grad_z[i] = y[i] > scalar_t(0) ? grad_y[i] : scalar_t(0);
  }
}

// dL/dx[n, c, iy, ix] = sum over (k, r, t) with iy = p*sh - ph + r, ix = q*sw - pw + t
// of dL/dz[n, k, p, q] * w[k, c, r, t].
template <typename scalar_t>
__global__ void grad_input_kernel(const scalar_t* __restrict__ grad_z,
                                  const scalar_t* __restrict__ w, scalar_t* __restrict__ grad_x,
                                  Shape s) {
  using acc_t = at::acc_type<scalar_t, true>;
  const int64_t total = static_cast<int64_t>(s.n) * s.c * s.h * s.w;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int ix = i % s.w;
    const int iy = (i / s.w) % s.h;
    const int c = (i / (static_cast<int64_t>(s.w) * s.h)) % s.c;
    const int n = i / (static_cast<int64_t>(s.w) * s.h * s.c);
    acc_t acc = 0;
    for (int r = 0; r < s.r; ++r) {
      const int ty = iy + s.ph - r;
      if (ty < 0 || ty % s.sh != 0) continue;
      const int op = ty / s.sh;
      if (op >= s.p) continue;
      for (int t = 0; t < s.s; ++t) {
        const int tx = ix + s.pw - t;
        if (tx < 0 || tx % s.sw != 0) continue;
        const int oq = tx / s.sw;
        if (oq >= s.q) continue;
        for (int k = 0; k < s.k; ++k) {
          const int64_t zi = ((static_cast<int64_t>(n) * s.k + k) * s.p + op) * s.q + oq;
          const int64_t wi = ((static_cast<int64_t>(k) * s.c + c) * s.r + r) * s.s + t;
          acc += static_cast<acc_t>(grad_z[zi]) * static_cast<acc_t>(w[wi]);
        }
      }
    }
    grad_x[i] = static_cast<scalar_t>(acc);
  }
}

template <typename acc_t>
__device__ acc_t block_sum(acc_t v) {
  __shared__ acc_t warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : acc_t(0);
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;  // the sum, in thread 0
}

// One block per weight element (k, c, r, t): dL/dw = sum over (n, p, q) of
// dL/dz[n, k, p, q] * x[n, c, p*sh - ph + r, q*sw - pw + t].
template <typename scalar_t>
__global__ void grad_weight_kernel(const scalar_t* __restrict__ grad_z,
                                   const scalar_t* __restrict__ x,
                                   scalar_t* __restrict__ grad_w, Shape s) {
  using acc_t = at::acc_type<scalar_t, true>;
  const int wi = blockIdx.x;
  const int t = wi % s.s;
  const int r = (wi / s.s) % s.r;
  const int c = (wi / (s.s * s.r)) % s.c;
  const int k = wi / (s.s * s.r * s.c);
  const int64_t per_image = static_cast<int64_t>(s.p) * s.q;
  acc_t acc = 0;
  for (int64_t j = threadIdx.x; j < s.n * per_image; j += blockDim.x) {
    const int n = j / per_image;
    const int op = (j % per_image) / s.q;
    const int oq = j % s.q;
    const int iy = op * s.sh - s.ph + r, ix = oq * s.sw - s.pw + t;
    if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
    acc += static_cast<acc_t>(grad_z[(static_cast<int64_t>(n) * s.k + k) * per_image + op * s.q + oq]) *
           static_cast<acc_t>(x[((static_cast<int64_t>(n) * s.c + c) * s.h + iy) * s.w + ix]);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) grad_w[wi] = static_cast<scalar_t>(acc);
}

// One block per output channel: dL/db[k] = sum over (n, p, q) of dL/dz[n, k, p, q].
template <typename scalar_t>
__global__ void grad_bias_kernel(const scalar_t* __restrict__ grad_z, scalar_t* __restrict__ grad_b,
                                 Shape s) {
  using acc_t = at::acc_type<scalar_t, true>;
  const int k = blockIdx.x;
  const int64_t per_image = static_cast<int64_t>(s.p) * s.q;
  acc_t acc = 0;
  for (int64_t j = threadIdx.x; j < s.n * per_image; j += blockDim.x) {
    const int64_t n = j / per_image;
    acc += static_cast<acc_t>(grad_z[(n * s.k + k) * per_image + j % per_image]);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) grad_b[k] = static_cast<scalar_t>(acc);
}

Shape shape_of(const at::Tensor& x, const at::Tensor& w, int64_t sh, int64_t sw, int64_t ph,
               int64_t pw) {
  Shape s{};
  s.n = x.size(0); s.c = x.size(1); s.h = x.size(2); s.w = x.size(3);
  s.k = w.size(0); s.r = w.size(2); s.s = w.size(3);
  s.sh = sh; s.sw = sw; s.ph = ph; s.pw = pw;
  s.p = (s.h + 2 * s.ph - s.r) / s.sh + 1;
  s.q = (s.w + 2 * s.pw - s.s) / s.sw + 1;
  return s;
}

}  // namespace

at::Tensor fused_conv_relu_forward_cuda(const at::Tensor& x, const at::Tensor& w,
                                        const at::Tensor& b, int64_t sh, int64_t sw, int64_t ph,
                                        int64_t pw) {
  const c10::cuda::CUDAGuard guard(x.device());
  const Shape s = shape_of(x, w, sh, sw, ph, pw);
  auto y = at::empty({s.n, s.k, s.p, s.q}, x.options());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "fused_conv_relu_forward", [&] {
    forward_kernel<scalar_t><<<blocks_for(y.numel()), kThreads, 0, stream>>>(
        x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
        y.data_ptr<scalar_t>(), s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

std::vector<at::Tensor> fused_conv_relu_backward_cuda(const at::Tensor& grad_y,
                                                      const at::Tensor& x, const at::Tensor& w,
                                                      const at::Tensor& y, int64_t sh,
                                                      int64_t sw, int64_t ph, int64_t pw,
                                                      bool input_grad) {
  const c10::cuda::CUDAGuard guard(x.device());
  const Shape s = shape_of(x, w, sh, sw, ph, pw);
  auto grad_z = at::empty_like(y);
  // Undefined (None in Python) when the input needs no gradient, e.g. a network's first layer.
  at::Tensor grad_x = input_grad ? at::empty_like(x) : at::Tensor();
  auto grad_w = at::empty_like(w);
  auto grad_b = at::empty({s.k}, w.options());
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "fused_conv_relu_backward", [&] {
    relu_mask_kernel<scalar_t><<<blocks_for(y.numel()), kThreads, 0, stream>>>(
        grad_y.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), grad_z.data_ptr<scalar_t>(),
        y.numel());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (input_grad) {
      grad_input_kernel<scalar_t><<<blocks_for(x.numel()), kThreads, 0, stream>>>(
          grad_z.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), grad_x.data_ptr<scalar_t>(), s);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    grad_weight_kernel<scalar_t><<<static_cast<int>(w.numel()), kThreads, 0, stream>>>(
        grad_z.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), grad_w.data_ptr<scalar_t>(), s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    grad_bias_kernel<scalar_t><<<s.k, kThreads, 0, stream>>>(grad_z.data_ptr<scalar_t>(),
                                                              grad_b.data_ptr<scalar_t>(), s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {grad_x, grad_w, grad_b};
}
