// TurboQuant helpers shared by turbo_encode.cu, turbo_attend.cu and
// dense_attend.cu (passed to MLX as the kernels' header). Layouts are those of
// server/src/kv/turbo/codec.rs:
//  - 8-bit affine keys: 4 codes per uint32, code i of a word at bits 8*i
//    (MLX's packing); one scale and bias per group of `KG` coordinates;
//  - codebook codes: 4-bit as nibbles (even coordinate in the low nibble);
//    3-bit as a 2-bit plane (4 codes a byte, coordinate i at bits 2*(i%4))
//    followed by a 1-bit plane (8 a byte, coordinate i at bit i%8); 2-bit as
//    the 2-bit plane alone; a float16 norm per vector.

#define TURBO_SINKS 4

__device__ inline float turbo_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v += __shfl_xor_sync(0xffffffff, v, o);
  }
  return v;
}

__device__ inline float turbo_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  }
  return v;
}

// In-place unnormalized Walsh-Hadamard transform of `rows` rows of `dim`
// floats in shared memory, by every thread of the block.
__device__ inline void turbo_hadamard(float* x, int dim, int rows) {
  for (int len = 1; len < dim; len <<= 1) {
    __syncthreads();
    for (int p = threadIdx.x; p < rows * dim / 2; p += blockDim.x) {
      int r = p / (dim / 2);
      int i = p % (dim / 2);
      int lo = r * dim + (i / len) * 2 * len + (i % len);
      float a = x[lo];
      float b = x[lo + len];
      x[lo] = a + b;
      x[lo + len] = a - b;
    }
  }
  __syncthreads();
}

// Byte `i` (0-3) of `w` as a float: the byte placed in the mantissa of 2^23
// (one byte permute and one subtraction instead of an integer conversion).
__device__ inline float turbo_byte(uint32_t w, int i) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7650u | (uint32_t)i)) - 8388608.0f;
}

// The codes of coordinates d..d+7 (d a multiple of 8) of a packed codebook
// row, gathered into one word for turbo_value_code: 4-bit: the four bytes;
// 3-bit: the 2-bit plane's two bytes, the 1-bit plane's byte above them;
// 2-bit: the plane's two bytes.
template <int BITS>
__device__ inline uint32_t turbo_value_word(const uint8_t* row, int d, int dim) {
  if (BITS == 4) {
    return *reinterpret_cast<const uint32_t*>(row + d / 2);
  } else if (BITS == 3) {
    return (uint32_t)*reinterpret_cast<const uint16_t*>(row + d / 4) | ((uint32_t)row[dim / 4 + d / 8] << 16);
  } else {
    return (uint32_t)*reinterpret_cast<const uint16_t*>(row + d / 4);
  }
}

// Code j (0-7) of a word from turbo_value_word.
template <int BITS>
__device__ inline int turbo_value_code(uint32_t w, int j) {
  if (BITS == 4) {
    return (w >> (4 * j)) & 15u;
  } else if (BITS == 3) {
    return ((w >> (2 * j)) & 3u) | (((w >> (16 + j)) & 1u) << 2);
  } else {
    return (w >> (2 * j)) & 3u;
  }
}

// Asynchronous global -> shared copies (sm_80+): committed in groups, then
// waited for.
// 16 bytes from `gmem` to `smem` (both 16-byte aligned), of which the first
// `n` (0-16) are read and the rest zero-filled.
__device__ inline void turbo_copy_bytes_async(void* smem, const void* gmem, int n) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

__device__ inline void turbo_copy_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most N committed groups of this thread are in flight.
template <int N>
__device__ inline void turbo_copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#define TURBO_NEG_INF __int_as_float(0xff800000)

// Tensor-core helpers of turbo_attend.cu (sm_80+).
// D += A * B for one 16x8x16 tile: A 16x16 float16 (row-major fragments
// a[0..3]), B 16x8 float16 (b[0..1]), D 16x8 float32 (d[0..3]); lane
// (g = lane / 4, t = lane % 4) holds A rows g and g + 8, columns 2t, 2t + 1
// (a[0], a[1]) and 2t + 8, 2t + 9 (a[2], a[3]); B rows 2t, 2t + 1 (b[0]) and
// 2t + 8, 2t + 9 (b[1]) of column g; D rows g (d[0], d[1]) and g + 8 (d[2],
// d[3]), columns 2t, 2t + 1.
__device__ inline void turbo_mma(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two floats as one float16 pair (x in the low half).
__device__ inline uint32_t turbo_half2(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// A float split into float16 parts, x ≈ hi + lo to about 22 bits: part 0
// is hi, part 1 is lo. Tensor-core products of the parts keep attention at
// float32 precision (each product exact, sums in float32).
__device__ inline float turbo_half_part(float x, int part) {
  const float hi = __half2float(__float2half_rn(x));
  return part == 0 ? hi : x - hi;
}

// Bytes i and i + 1 of w (i = 0 or 2) plus 1024 as a float16 pair, exactly:
// each byte placed in the mantissa of 1024 (the caller takes 1024 off the
// sums).
__device__ inline uint32_t turbo_bytes_half2(uint32_t w, int i) {
  return __byte_perm(w, 0x64646464u, i == 0 ? 0x4140u : 0x4342u);
}

// Stores a float as whatever type `p` points to (half, bfloat16, float).
template <typename U>
__device__ inline void turbo_store(U* p, float v) {
  *p = static_cast<U>(v);
}

// The sum of `v` over the block (every thread gets it); `red` holds 32 floats.
__device__ inline float turbo_block_sum(float v, float* red) {
  v = turbo_warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    red[threadIdx.x >> 5] = v;
  }
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < (int)((blockDim.x + 31) >> 5); ++w) {
    r += red[w];
  }
  return r;
}

// Codebook-codes the rotated vector x[0..dim) (shared memory, one thread a
// coordinate): writes the packed codes to `out` and returns the corrected norm
// (the decoded vector keeps the original length). `codes` is shared scratch.
template <int BITS>
__device__ inline float turbo_codebook_encode(
    const float* x, int* codes, float* red, const float* bounds, const float* cent, uint8_t* out, int dim) {
  const int d = threadIdx.x;
  float n = sqrtf(turbo_block_sum(x[d] * x[d], red));
  float u = x[d] / fmaxf(n, 1e-20f);
  int code = 0;
  for (int k = 0; k < (1 << BITS) - 1; ++k) {
    code += u > bounds[k] ? 1 : 0;
  }
  codes[d] = code;
  float c = cent[code];
  float cn = sqrtf(turbo_block_sum(c * c, red));
  __syncthreads();
  if (BITS == 4) {
    if ((d & 1) == 0) {
      out[d >> 1] = (uint8_t)(codes[d] | (codes[d + 1] << 4));
    }
  } else {
    if ((d & 3) == 0) {
      int b = 0;
      for (int i = 0; i < 4; ++i) {
        b |= (codes[d + i] & 3) << (2 * i);
      }
      out[d >> 2] = (uint8_t)b;
    }
    if (BITS == 3 && (d & 7) == 0) {
      int b = 0;
      for (int i = 0; i < 8; ++i) {
        b |= ((codes[d + i] >> 2) & 1) << i;
      }
      out[dim / 4 + (d >> 3)] = (uint8_t)b;
    }
  }
  return n / fmaxf(cn, 1e-20f);
}

// Decode attention of a block's REP query heads (qs [REP, D] in shared
// memory, scaled, base 2) over positions [t0, t1) of one KV head's rows,
// into the block's partial: dense_attend.cu's whole body, and the recent
// window's split of turbo_attend.cu. Rows are 16-bit or float32 (BITS 0,
// type T) or affine codes (BITS 8 or 4: uint32-packed, a scale and a bias of
// type T per GS coordinates in ks, kb, vs, vb; BITS 0 reads none of them);
// position t's rows start at element `base + t` of k and v.
// A position's key and value rows are read by LPP = D / 8 lanes, 8
// coordinates each (16 bytes of a 16-bit row, 8 of an 8-bit one; a group
// holds whole lanes), so a warp reads 32 / LPP consecutive positions at once
// (one contiguous range), U such ranges an iteration (their loads issued
// before any is computed), and each lane group keeps its own online softmax
// (QSHARED: the query read from qs at each use, not kept in registers, so
// the caller keeps mw, lw and accw apart from qs); the groups' states are
// merged at the end (shuffles within a warp, then the 4 warps in turn
// through shared memory: mw, lw [4 * REP], accw [REP * D], 16-byte aligned,
// written only after every thread has read qs, so without QSHARED they may
// overlap it).
// Writes head h's partial to part_o[(o + h * NS) * D ..] and
// part_ml[(o + h * NS) * 2 ..]. 128 threads; every thread calls it.
template <typename T, int BITS, int GS, int D, int REP, int U, bool QSHARED>
__device__ inline void turbo_lane_attend(
    const float* qs, const void* k, const void* v, const T* ks, const T* kb, const T* vs, const T* vb,
    size_t base, int t0, int t1, float* mw, float* lw, float* accw, float* part_o, float* part_ml, size_t o, int NS) {
  constexpr int WARPS = 4;
  constexpr int C = 8;                  // coordinates a lane owns
  constexpr int LPP = D / C;            // lanes a position: 8, 16 or 32
  constexpr int PPW = 32 / LPP;         // positions a warp reads at once
  constexpr int GROUPS = WARPS * PPW;   // softmax states a block keeps
  constexpr int LB = BITS == 0 ? C * (int)sizeof(T) : C * BITS / 8;   // bytes of a lane's coordinates
  constexpr int RB = LB * LPP;          // bytes of a position's row
  constexpr int NG = BITS == 0 ? 1 : D / GS;   // scale groups of a row
  static_assert(D == 64 || D == 128 || D == 256, "head dims 64, 128, 256");
  static_assert(BITS == 0 || BITS == 4 || BITS == 8, "16-bit rows, or 8- or 4-bit codes");
  static_assert(BITS == 0 || (GS % C == 0 && D % GS == 0), "a scale group holds whole lanes");
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int sub = lane % LPP;           // the lane's coordinates: sub * C ..
  const int pos = lane / LPP;           // its position among the warp's PPW

  // The query's coordinates in registers, or (QSHARED) read from qs at each
  // use: 8 query heads' would take 64 registers a thread.
  float qv[QSHARED ? 1 : REP][C];
  if constexpr (!QSHARED) {
#pragma unroll
    for (int h = 0; h < REP; ++h) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        qv[h][c] = qs[h * D + sub * C + c];
      }
    }
  }
  float m[REP], l[REP], acc[REP][C];
#pragma unroll
  for (int h = 0; h < REP; ++h) {
    m[h] = TURBO_NEG_INF;
    l[h] = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      acc[h][c] = 0.0f;
    }
  }

  // A lane's part of a position's key or value row: its coordinates' bytes
  // and, for codes, their group's scale and bias.
  struct Row {
    uint32_t w[LB / 4];
    float scale, bias;
  };
  auto load_row = [&](const uint8_t* rows, const T* scales, const T* biases, size_t at, Row& r) {
    const uint8_t* p = rows + at * RB + sub * LB;
    if constexpr (LB % 16 == 0) {
#pragma unroll
      for (int i = 0; i < LB / 16; ++i) {
        reinterpret_cast<uint4*>(r.w)[i] = reinterpret_cast<const uint4*>(p)[i];
      }
    } else if constexpr (LB == 8) {
      *reinterpret_cast<uint2*>(r.w) = *reinterpret_cast<const uint2*>(p);
    } else {
      r.w[0] = *reinterpret_cast<const uint32_t*>(p);
    }
    if constexpr (BITS != 0) {
      const size_t grp = at * NG + sub * C / GS;
      r.scale = static_cast<float>(scales[grp]);
      r.bias = static_cast<float>(biases[grp]);
    }
  };
  // This lane's part of position t's key and value rows (zeros past the
  // range: such positions are skipped below).
  auto load = [&](int t, Row& kr, Row& vr) {
    if (t < t1) {
      load_row(reinterpret_cast<const uint8_t*>(k), ks, kb, base + t, kr);
      load_row(reinterpret_cast<const uint8_t*>(v), vs, vb, base + t, vr);
    } else {
#pragma unroll
      for (int i = 0; i < LB / 4; ++i) {
        kr.w[i] = 0;
        vr.w[i] = 0;
      }
      kr.scale = kr.bias = vr.scale = vr.bias = 0.0f;
    }
  };
  // Coordinate c of a lane's row part as a float.
  auto coordinate = [&](const Row& r, int c) -> float {
    if constexpr (BITS == 0) {
      return static_cast<float>(reinterpret_cast<const T*>(r.w)[c]);
    } else {
      const uint32_t code = (r.w[c * BITS / 32] >> ((c * BITS) % 32)) & ((1u << BITS) - 1);
      return static_cast<float>(code) * r.scale + r.bias;
    }
  };
  // All C of a lane's row part as floats.
  auto coordinates = [&](const Row& r, float (&f)[C]) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      f[c] = coordinate(r, c);
    }
  };

  // The warp's positions, U * PPW an iteration: a lane reads its U
  // positions' rows (GROUPS apart, so each u is one contiguous range of the
  // block's) before computing any, so U rows of loads are in flight at once,
  // and its online softmax takes the U scores together (one correction of
  // the sums an iteration, not one a position). Every lane runs every
  // iteration (the shuffles need all 32).
  for (int at = t0 + warp * PPW; at < t1; at += GROUPS * U) {
    const int t = at + pos;
    Row kr[U], vr[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      load(t + u * GROUPS, kr[u], vr[u]);
    }
    float s[REP][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[C];
      coordinates(kr[u], kf);
#pragma unroll
      for (int h = 0; h < REP; ++h) {
        float x = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          x += (QSHARED ? qs[h * D + sub * C + c] : qv[h][c]) * kf[c];
        }
        s[h][u] = x;
      }
    }
#pragma unroll
    for (int x = LPP / 2; x > 0; x >>= 1) {
#pragma unroll
      for (int h = 0; h < REP; ++h) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          s[h][u] += __shfl_xor_sync(0xffffffff, s[h][u], x);
        }
      }
    }
    // Position t + u * GROUPS counts where it is below t1; t itself is when
    // any is (the lane's positions rise with u).
    if (t < t1) {
#pragma unroll
      for (int h = 0; h < REP; ++h) {
        float mn = m[h];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (t + u * GROUPS < t1) {
            mn = fmaxf(mn, s[h][u]);
          }
        }
        const float corr = exp2f(m[h] - mn);   // m = -inf at first: 0
        l[h] *= corr;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          acc[h][c] *= corr;
        }
        m[h] = mn;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool valid = t + u * GROUPS < t1;
        float vf[C];
        coordinates(vr[u], vf);
#pragma unroll
        for (int h = 0; h < REP; ++h) {
          const float p = valid ? exp2f(s[h][u] - m[h]) : 0.0f;
          l[h] += p;
#pragma unroll
          for (int c = 0; c < C; ++c) {
            acc[h][c] += p * vf[c];
          }
        }
      }
    }
  }

  // The warp's lane groups merged (all lanes end with the warp's state).
#pragma unroll
  for (int x = LPP; x < 32; x <<= 1) {
#pragma unroll
    for (int h = 0; h < REP; ++h) {
      const float mo = __shfl_xor_sync(0xffffffff, m[h], x);
      const float lo = __shfl_xor_sync(0xffffffff, l[h], x);
      const float mn = fmaxf(m[h], mo);
      const float f = m[h] == TURBO_NEG_INF ? 0.0f : exp2f(m[h] - mn);
      const float fo = mo == TURBO_NEG_INF ? 0.0f : exp2f(mo - mn);
      l[h] = l[h] * f + lo * fo;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float ao = __shfl_xor_sync(0xffffffff, acc[h][c], x);
        acc[h][c] = acc[h][c] * f + ao * fo;
      }
      m[h] = mn;
    }
  }
  // Then the warps': each scales its sums to the heads' maxima and adds
  // them into accw in turn (warp order, as a sum over the warps would).
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < REP; ++h) {
      mw[warp * REP + h] = m[h];
      lw[warp * REP + h] = l[h];
    }
  }
  __syncthreads();
  float f[REP];
#pragma unroll
  for (int h = 0; h < REP; ++h) {
    float M = TURBO_NEG_INF;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      M = fmaxf(M, mw[w * REP + h]);
    }
    f[h] = m[h] == TURBO_NEG_INF ? 0.0f : exp2f(m[h] - M);
  }
  for (int w = 0; w < WARPS; ++w) {
    if (warp == w) {
      // A warp's lane groups hold the same state: group `pos` stores the
      // heads h with h % PPW == pos.
#pragma unroll
      for (int h = 0; h < REP; ++h) {
        if (h % PPW == pos) {
          float4* dst = reinterpret_cast<float4*>(accw + h * D + sub * C);
#pragma unroll
          for (int i = 0; i < C / 4; ++i) {
            float4 x = make_float4(acc[h][4 * i] * f[h], acc[h][4 * i + 1] * f[h], acc[h][4 * i + 2] * f[h], acc[h][4 * i + 3] * f[h]);
            if (w > 0) {
              const float4 y = dst[i];
              x = make_float4(y.x + x.x, y.y + x.y, y.z + x.z, y.w + x.w);
            }
            dst[i] = x;
          }
        }
      }
    }
    __syncthreads();
  }
  for (int i = tid; i < REP * D; i += WARPS * 32) {
    const int h = i / D;
    const int d = i % D;
    const size_t r = o + (size_t)h * NS;
    part_o[r * D + d] = accw[i];
    if (d == 0) {
      float M = TURBO_NEG_INF;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        M = fmaxf(M, mw[w * REP + h]);
      }
      float L = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const float mwh = mw[w * REP + h];
        L += mwh == TURBO_NEG_INF ? 0.0f : lw[w * REP + h] * exp2f(mwh - M);
      }
      part_ml[r * 2] = M;
      part_ml[r * 2 + 1] = L;
    }
  }
}

// One warp's merge of the NS split partials of one (row, query head) `bh`
// (part_o [.., NS, D], part_ml [.., NS, 2], float32, written by other blocks
// of this launch: read through L2, not a possibly stale L1), into out[bh]:
// the weighted sum over the splits divided by their total weight, and with
// ROT = 1 rotated back from TurboQuant's basis, o = s1 ⊙ H(s2 ⊙ õ)/√D (the
// transform on registers, across lanes by shuffles; `signs` [3, D] is not
// read with ROT = 0). A lane owns coordinates lane * E .. + E.
// The rest of the GPU may be idle while this runs (it is the launch's tail),
// so its time is L2 round trips: U splits' loads are issued before any is
// used, in 8- or 16-byte pieces, the last batch re-reading split NS - 1 at
// weight 0 so that every load is unconditional. Not inlined: the attention
// loop that calls it keeps its registers (inlined, the batch's registers
// raise the whole kernel's count and cost it resident blocks).
template <typename T, int D, int ROT>
__device__ __noinline__ void turbo_warp_merge(const float* part_o, const float* part_ml, const float* signs, T* out, size_t bh, int NS) {
  constexpr int E = D / 32;
  constexpr int P = E % 4 == 0 ? 4 : 2;   // floats a load
  constexpr int U = D <= 64 ? 16 : D <= 128 ? 12 : 8;
  const int lane = threadIdx.x & 31;
  const float* ml = part_ml + bh * NS * 2;
  float M = TURBO_NEG_INF;
  for (int s = lane; s < NS; s += 32) {
    M = fmaxf(M, __ldcg(ml + 2 * s));
  }
  M = turbo_warp_max(M);
  float L = 0.0f;
  float x[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    x[e] = 0.0f;
  }
  const float* po = part_o + bh * NS * D + lane * E;
  for (int s0 = 0; s0 < NS; s0 += U) {
    float2 mlu[U];
    float o[U][E];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = min(s0 + u, NS - 1);
      mlu[u] = __ldcg(reinterpret_cast<const float2*>(ml) + s);
#pragma unroll
      for (int e = 0; e < E; e += P) {
        if constexpr (P == 4) {
          const float4 v = __ldcg(reinterpret_cast<const float4*>(po + (size_t)s * D + e));
          o[u][e] = v.x;
          o[u][e + 1] = v.y;
          o[u][e + 2] = v.z;
          o[u][e + 3] = v.w;
        } else {
          const float2 v = __ldcg(reinterpret_cast<const float2*>(po + (size_t)s * D + e));
          o[u][e] = v.x;
          o[u][e + 1] = v.y;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // Every lane reads the same (max, sum): a broadcast; an empty split has
      // max -inf and weight 0, as has a batch's padding past NS.
      const float w = s0 + u < NS ? exp2f(mlu[u].x - M) : 0.0f;
      L += mlu[u].y * w;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        x[e] += w * o[u][e];
      }
    }
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    x[e] = x[e] / L;
  }
  if (ROT) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      x[e] *= signs[D + lane * E + e];
    }
    // The unnormalized transform: pairs within a lane, then across lanes.
#pragma unroll
    for (int len = 1; len < E; len <<= 1) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        if ((e & len) == 0) {
          const float a = x[e];
          const float b = x[e + len];
          x[e] = a + b;
          x[e + len] = a - b;
        }
      }
    }
#pragma unroll
    for (int len = E; len < D; len <<= 1) {
      const int m = len / E;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float y = __shfl_xor_sync(0xffffffff, x[e], m);
        x[e] = (lane & m) ? y - x[e] : x[e] + y;
      }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      x[e] *= signs[lane * E + e] * rsqrtf((float)D);
    }
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    turbo_store(out + bh * D + lane * E + e, x[e]);
  }
}

// The end of a split-K attention block (every thread of it calls this once,
// after its split's partials are written): the last block of its (row, KV
// head) group to finish — counted in counts[group], which the last one sets
// back to 0 for the next launch — merges the group's REP query heads into
// `out` (a warp a head), so no separate merge kernel (and graph node) runs.
// `counts` is an input MLX sees as read-only: a uint32 array of zeros that
// the caller keeps for its cache and hands to every launch (each launch leaves
// it zero again; launches on one stream do not overlap).
template <typename T, int D, int ROT, int REP>
__device__ inline void turbo_merge_if_last(const uint32_t* counts, size_t group, int NS, const float* part_o, const float* part_ml,
                                           const float* signs, T* out, size_t bh0) {
  __shared__ int last;
  // This block's partials reach device scope before it is counted.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t* count = const_cast<uint32_t*>(counts) + group;
    last = atomicAdd(count, 1u) == (uint32_t)(NS - 1);
    if (last) {
      *count = 0;   // every split of the group has counted
    }
  }
  __syncthreads();
  if (!last) {
    return;
  }
  // The other blocks' partials, counted before this one, are visible from here.
  __threadfence();
  for (int h = threadIdx.x >> 5; h < REP; h += blockDim.x >> 5) {
    turbo_warp_merge<T, D, ROT>(part_o, part_ml, signs, out, bh0 + h, NS);
  }
}

// A kernel whose header starts by defining TURBO_MIN_BLOCKS (kernels.rs
// `turbo_attend_bounded` and `turbo_attend_four`) asks ptxas for registers that let that many
// 128-thread blocks share an SM. MLX writes the kernel's signature
// (`__global__ void name(`) right after this header and takes no launch
// bounds of its own, so the bound comes in through `__global__`.
#ifdef TURBO_MIN_BLOCKS
#undef __global__
#define __global__ __attribute__((global)) __launch_bounds__(128, TURBO_MIN_BLOCKS)
#endif
