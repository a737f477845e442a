// Convolution patches (patches.hpp): one pass that writes every patch row once. The generic
// torch route (strided views + a copy of a 6-D non-contiguous tensor, or F.unfold) costs
// several nanoseconds per element on the CPU; this is a plain row-by-row copy.
#include "dpsharp/patches.hpp"

#include <cstring>

#include "dpsharp/parallel.hpp"

namespace dpsharp::patches {
namespace {

// kKernelW > 0: the kernel width as a compile-time constant, so that the row copies below are
// fixed-size moves (a library memcpy call per 8-element row costs more than the copy);
// kKernelW = 0: any width.
template <typename Word, int kKernelW>
void patches_of_example(const Word* image, const ConvGeometry& g, Word* dst) noexcept {
  const std::int64_t kernel_w = kKernelW > 0 ? kKernelW : g.kernel_w;
  for (std::int64_t oy = 0; oy < g.out_h; ++oy) {
    for (std::int64_t ox = 0; ox < g.out_w; ++ox) {
      const std::int64_t x0 = ox * g.stride_w - g.pad_w;
      const bool row_inside = g.dilation_w == 1 && x0 >= 0 && x0 + kernel_w <= g.in_w;
      for (std::int64_t c = 0; c < g.channels; ++c) {
        const Word* plane = image + c * g.in_h * g.in_w;
        for (std::int64_t ky = 0; ky < g.kernel_h; ++ky) {
          const std::int64_t y = oy * g.stride_h - g.pad_h + ky * g.dilation_h;
          if (y < 0 || y >= g.in_h) {
            for (std::int64_t kx = 0; kx < kernel_w; ++kx) dst[kx] = Word{0};
          } else if (row_inside) {
            if constexpr (kKernelW > 0) {
              std::memcpy(dst, plane + y * g.in_w + x0, kKernelW * sizeof(Word));
            } else {
              const Word* src = plane + y * g.in_w + x0;
              for (std::int64_t kx = 0; kx < kernel_w; ++kx) dst[kx] = src[kx];
            }
          } else {
            const Word* src = plane + y * g.in_w;
            for (std::int64_t kx = 0; kx < kernel_w; ++kx) {
              const std::int64_t x = x0 + kx * g.dilation_w;
              dst[kx] = (x >= 0 && x < g.in_w) ? src[x] : Word{0};
            }
          }
          dst += kernel_w;
        }
      }
    }
  }
}

// One example, the kernel width dispatched to a compile-time constant where it is common.
template <typename Word>
void patches_any_width(const Word* image, const ConvGeometry& g, Word* out) noexcept {
  switch (g.kernel_w) {
    case 1: patches_of_example<Word, 1>(image, g, out); break;
    case 2: patches_of_example<Word, 2>(image, g, out); break;
    case 3: patches_of_example<Word, 3>(image, g, out); break;
    case 4: patches_of_example<Word, 4>(image, g, out); break;
    case 5: patches_of_example<Word, 5>(image, g, out); break;
    case 7: patches_of_example<Word, 7>(image, g, out); break;
    case 8: patches_of_example<Word, 8>(image, g, out); break;
    default: patches_of_example<Word, 0>(image, g, out); break;
  }
}

template <typename Word>
void patches_typed(const Word* in, const ConvGeometry& g, Word* out, int threads) {
  const std::int64_t per_example = g.out_h * g.out_w * g.channels * g.kernel_h * g.kernel_w;
  // A second thread per 2^18 elements at least: copies are cheap.
  const std::int64_t grain = std::max<std::int64_t>(1, (1 << 18) / std::max<std::int64_t>(per_example, 1));
  parallel_ranges(g.batch, grain,
                  threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t b = lo; b < hi; ++b) {
      patches_any_width(in + b * g.channels * g.in_h * g.in_w, g, out + b * per_example);
    }
  });
}

}  // namespace

template <typename Word>
void example_patches(const Word* image, const ConvGeometry& g, Word* out) noexcept {
  patches_any_width(image, g, out);
}
template void example_patches<float>(const float*, const ConvGeometry&, float*) noexcept;
template void example_patches<double>(const double*, const ConvGeometry&, double*) noexcept;

void conv_patches(const void* in, std::size_t element_size, const ConvGeometry& geometry,
                  void* out, int threads) {
  switch (element_size) {
    case 2:
      patches_typed(static_cast<const std::uint16_t*>(in), geometry,
                    static_cast<std::uint16_t*>(out), threads);
      break;
    case 4:
      patches_typed(static_cast<const std::uint32_t*>(in), geometry,
                    static_cast<std::uint32_t*>(out), threads);
      break;
    default:
      patches_typed(static_cast<const std::uint64_t*>(in), geometry,
                    static_cast<std::uint64_t*>(out), threads);
      break;
  }
}

}  // namespace dpsharp::patches
