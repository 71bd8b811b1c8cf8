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

// Byte `i` (0-3) of `w` as a float: the byte placed in the mantissa of 2^23.
inline float turbo_byte(uint w, int i) {
  return as_type<float>(((w >> (8 * i)) & 255u) | 0x4B000000u) - 8388608.0f;
}

// N 32-bit words from `p` (aligned to 4 * N bytes) in one load.
template <int N>
inline void turbo_load_words(const device uint8_t* p, thread uint* out) {
  if (N == 4) {
    const uint4 w = *((const device uint4*)p);
    out[0] = w.x;
    out[1] = w.y;
    out[2] = w.z;
    out[3] = w.w;
  } else if (N == 2) {
    const uint2 w = *((const device uint2*)p);
    out[0] = w.x;
    out[1] = w.y;
  } else {
    out[0] = *((const device uint*)p);
  }
}

// The codes of coordinates d..d+7 of a packed codebook row in one word (see
// turbo_common.cuh).
template <int BITS>
inline uint turbo_value_word(const device uint8_t* row, int d, int dim) {
  if (BITS == 4) {
    return *((const device uint*)(row + d / 2));
  } else if (BITS == 3) {
    return uint(*((const device ushort*)(row + d / 4))) | (uint(row[dim / 4 + d / 8]) << 16);
  } else {
    return uint(*((const device ushort*)(row + d / 4)));
  }
}

// Code j (0-7) of a word from turbo_value_word.
template <int BITS>
inline int turbo_value_code(uint w, int j) {
  if (BITS == 4) {
    return int((w >> (4 * j)) & 15u);
  } else if (BITS == 3) {
    return int(((w >> (2 * j)) & 3u) | (((w >> (16 + j)) & 1u) << 2));
  } else {
    return int((w >> (2 * j)) & 3u);
  }
}

// The sum of `v` over the threadgroup (every thread gets it); `red` holds 32
// floats.
inline float turbo_block_sum(float v, threadgroup float* red, uint tid, uint threads) {
  v = metal::simd_sum(v);
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  if ((tid & 31) == 0) {
    red[tid >> 5] = v;
  }
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  float r = red[0];
  for (uint w = 1; w < (threads + 31) >> 5; ++w) {
    r += red[w];
  }
  return r;
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
