// Convolution patches (im2col) for per-example convolution gradients: the weight gradient of
// example i is G_i^T P_i with P_i the (positions x C*prod(kernel)) patch matrix of its input and
// G_i its (positions x out_channels) output gradient (the unfolded form of the convolution,
// e.g. Chellapilla, Puri, Simard 2006). Plain C++ over raw pointers; the element type only
// matters through its size, since patches are copies (and zeros for the padding).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dpsharp::patches {

// Geometry of a 2-D convolution (1-D: height 1, kernel height 1, stride/dilation 1, padding 0).
struct ConvGeometry {
  std::int64_t batch;
  std::int64_t channels;
  std::int64_t in_h, in_w;
  std::int64_t kernel_h, kernel_w;
  std::int64_t stride_h, stride_w;
  std::int64_t pad_h, pad_w;
  std::int64_t dilation_h, dilation_w;
  std::int64_t out_h, out_w;  // checked by the caller to match the other fields
};

// out[b, oy * out_w + ox, (c * kernel_h + ky) * kernel_w + kx]
//   = in[b, c, oy * stride_h - pad_h + ky * dilation_h, ox * stride_w - pad_w + kx * dilation_w]
// (0 outside the input), for a contiguous (batch, channels, in_h, in_w) input whose elements
// are element_size bytes (2, 4 or 8).
void conv_patches(const void* in, std::size_t element_size, const ConvGeometry& geometry,
                  void* out, int threads);

// The patches of one example: image is its contiguous (channels, in_h, in_w) input, out its
// (out_h * out_w, channels * kernel_h * kernel_w) patch matrix (geometry.batch is ignored).
// Instantiated for float and double.
template <typename Word>
void example_patches(const Word* image, const ConvGeometry& geometry, Word* out) noexcept;

}  // namespace dpsharp::patches
