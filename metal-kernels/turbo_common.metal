// Metal twin of turbo_common.cuh (same layouts; see that file). Thread
// indices are passed in: Metal kernels get them as attributes.

#define TURBO_SINKS 4
#define TURBO_NEG_INF (-metal::numeric_limits<float>::infinity())

// Stores a float as whatever type `p` points to (half, bfloat16, float).
template <typename U>
inline void turbo_store(device U* p, float v) {
  *p = static_cast<U>(v);
}

// In-place unnormalized Walsh-Hadamard transform of `rows` rows of `dim`
// floats in threadgroup memory, by every thread of the threadgroup.
inline void turbo_hadamard(threadgroup float* x, int dim, int rows, uint tid, uint threads) {
  for (int len = 1; len < dim; len <<= 1) {
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    for (int p = int(tid); p < rows * dim / 2; p += int(threads)) {
      int r = p / (dim / 2);
      int i = p % (dim / 2);
      int lo = r * dim + (i / len) * 2 * len + (i % len);
      float a = x[lo];
      float b = x[lo + len];
      x[lo] = a + b;
      x[lo + len] = a - b;
    }
  }
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
}

// The code of coordinate `d` in a packed codebook row.
template <int BITS>
inline int turbo_code(const device uint8_t* row, int d, int dim) {
  if (BITS == 4) {
    return (row[d >> 1] >> ((d & 1) * 4)) & 15;
  } else if (BITS == 3) {
    int low = (row[d >> 2] >> ((d & 3) * 2)) & 3;
    int high = (row[dim / 4 + (d >> 3)] >> (d & 7)) & 1;
    return low | (high << 2);
  } else {
    return (row[d >> 2] >> ((d & 3) * 2)) & 3;
  }
}

// The sum of `v` over the threadgroup (every thread gets it); `red` holds 32 floats.
inline float turbo_block_sum(float v, threadgroup float* red, uint tid, uint threads) {
  v = metal::simd_sum(v);
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  if ((tid & 31) == 0) {
    red[tid >> 5] = v;
  }
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  float total = 0.0f;
  for (uint w = 0; w < (threads + 31) >> 5; ++w) {
    total += red[w];
  }
  return total;
}

// Codebook-codes the rotated vector x[0..dim) (threadgroup memory, one thread
// a coordinate); writes the packed codes to `out`, returns the corrected norm.
template <int BITS>
inline float turbo_codebook_encode(
    threadgroup const float* x, threadgroup int* codes, threadgroup float* red,
    const device float* bounds, const device float* cent, device uint8_t* out, int dim, uint tid, uint threads) {
  const int d = int(tid);
  float n = metal::sqrt(turbo_block_sum(x[d] * x[d], red, tid, threads));
  float u = x[d] / metal::max(n, 1e-20f);
  int code = 0;
  for (int k = 0; k < (1 << BITS) - 1; ++k) {
    code += u > bounds[k] ? 1 : 0;
  }
  codes[d] = code;
  float c = cent[code];
  float cn = metal::sqrt(turbo_block_sum(c * c, red, tid, threads));
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  if (BITS == 4) {
    if ((d & 1) == 0) {
      out[d >> 1] = uint8_t(codes[d] | (codes[d + 1] << 4));
    }
  } else {
    if ((d & 3) == 0) {
      int b = 0;
      for (int i = 0; i < 4; ++i) {
        b |= (codes[d + i] & 3) << (2 * i);
      }
      out[d >> 2] = uint8_t(b);
    }
    if (BITS == 3 && (d & 7) == 0) {
      int b = 0;
      for (int i = 0; i < 8; ++i) {
        b |= ((codes[d + i] >> 2) & 1) << i;
      }
      out[dim / 4 + (d >> 3)] = uint8_t(b);
    }
  }
  return n / metal::max(cn, 1e-20f);
}
