#include <cuda/std/cmath>
#include <cuda/std/type_traits>

// Helpers of quant_matmul.cu: unpacking affine-quantized values into pairs of
// T (bfloat16 or half) and the tensor-core product.

template <typename T>
struct QmmPair;
template <>
struct QmmPair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  // 0x4300 | q is the bfloat16 128 + q (exact for q < 128).
  static constexpr uint32_t magic = 0x43004300u;
};
template <>
struct QmmPair<__half> {
  // 0x6400 | q is the half 1024 + q (exact for q < 1024).
  using type = __half2;
  static constexpr uint32_t magic = 0x64006400u;
};

template <typename T>
__device__ inline typename QmmPair<T>::type qmm_as_pair(uint32_t bits) {
  return *reinterpret_cast<typename QmmPair<T>::type*>(&bits);
}

template <typename T>
__device__ inline uint32_t qmm_bits(typename QmmPair<T>::type v) {
  return *reinterpret_cast<uint32_t*>(&v);
}

// The 4-bit values at bits 0-3 and 16-19 of `word`, as (scale * q + bias) in
// T: the magic number makes each nibble a T exactly, one subtraction removes
// it, one fused multiply-add (a single rounding) applies scale and bias.
template <typename T>
__device__ inline uint32_t qmm_dequant4(uint32_t word, T scale, T bias) {
  using P = typename QmmPair<T>::type;
  const P q = __hsub2(qmm_as_pair<T>((word & 0x000F000Fu) | QmmPair<T>::magic), qmm_as_pair<T>(QmmPair<T>::magic));
  return qmm_bits<T>(__hfma2(q, P(scale, scale), P(bias, bias)));
}

// Bytes `lo` and `hi` of `word` as (scale * q + bias), computed in float and
// rounded once to T (bfloat16 cannot hold 128 + q for every byte).
template <typename T>
__device__ inline uint32_t qmm_dequant8(uint32_t word, int lo, int hi, T scale, T bias) {
  const float s = static_cast<float>(scale);
  const float b = static_cast<float>(bias);
  // 0x4B000000 | q is the float 2^23 + q.
  const float q0 = __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540 | lo)) - 8388608.0f;
  const float q1 = __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540 | hi)) - 8388608.0f;
  using P = typename QmmPair<T>::type;
  P v;
  if constexpr (cuda::std::is_same_v<T, __half>) {
    v = __floats2half2_rn(fmaf(q0, s, b), fmaf(q1, s, b));
  } else {
    v = __floats2bfloat162_rn(fmaf(q0, s, b), fmaf(q1, s, b));
  }
  return qmm_bits<T>(v);
}

// c += A (16 x 16, row-major fragments a[0..3]) * B (16 x 8, b0 b1), float sums.
template <typename T>
__device__ inline void qmm_mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  if constexpr (cuda::std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

#if QMM_GLU
// sigmoid(x) in T as MLX's elementwise Sigmoid computes it: 1 / (1 + e^|x|)
// (no overflow), mirrored for x >= 0; e^|x| in T, and each operation with a
// constant in float and rounded to T, as MLX's operators between T and an
// integer are.
template <typename T>
__device__ inline T qmm_sigmoid(T x) {
  const T e = cuda::std::exp(cuda::std::abs(x));
  const T y = static_cast<T>(1.0f / static_cast<float>(static_cast<T>(1.0f + static_cast<float>(e))));
  return (static_cast<float>(x) < 0.0f) ? y : static_cast<T>(1.0f - static_cast<float>(y));
}

// silu(gate) * up as MLX's compiled swiglu computes it (mlx-lm's
// `silu(gate) * x`, silu(g) = g * sigmoid(g)): the same ops, each rounding
// to T, so the fused kernel's output equals the unfused calls' bit for bit
// (tests/quant_kernel.rs checks it exactly). Written here rather than taken
// from MLX's device headers: those live inside libmlx, where only MLX's own
// compiler sees them, and the kernel cache (mlx-rs-safe `kernels`) compiles
// our kernels without them.
template <typename T>
__device__ inline T qmm_swiglu(T gate, T up) {
  const T silu = gate * qmm_sigmoid(gate);
  return silu * up;
}
#endif

#if QMM_NORM
// The sum of the squares of 8 values of T, in float.
template <typename T>
__device__ inline float qmm_sum_squares(uint4 v) {
  const T* x = reinterpret_cast<const T*>(&v);
  float sum = 0.0f;
  #pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float f = static_cast<float>(x[j]);
    sum += f * f;
  }
  return sum;
}

// 8 values of x normalized as MLX's rms_norm writes them: w * T(x * inv_rms),
// the product rounded to T and multiplied by the weight in T.
template <typename T>
__device__ inline uint4 qmm_rms_apply(uint4 v, uint4 wv, float inv_rms) {
  T* x = reinterpret_cast<T*>(&v);
  const T* w = reinterpret_cast<const T*>(&wv);
  #pragma unroll
  for (int j = 0; j < 8; ++j) {
    x[j] = w[j] * static_cast<T>(static_cast<float>(x[j]) * inv_rms);
  }
  return v;
}
#endif
