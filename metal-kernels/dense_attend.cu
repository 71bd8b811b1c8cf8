// Split-K decode attention over a KV cache whose rows start at their own
// first position: one query per row. It serves two caches MLX 0.32's CUDA
// backend has no fused decode attention for:
//  - 16-bit (or float32) keys and values (BITS 0) in batches whose rows have
//    other lengths (left-padded, mlx-lm's BatchKVCache layout), which MLX's
//    CUDA attention only runs unfused (matmul, mask, softmax, matmul) because
//    neither its vector kernel nor cuDNN's decode path takes an array mask;
//  - affine-quantized keys and values (BITS 8 or 4, `--kv-bits`: MLX's
//    quantize layout, codes packed low bits first into uint32 words, a scale
//    and a bias of type T for each group of GS coordinates), which MLX's CUDA
//    quantized matmuls refuse at attention's shapes: read as codes, never
//    dequantized into a copy of the history.
//
// Block (row b, KV head g, split s) takes the s-th slice of the row's valid
// positions [first, written) for every query head of the KV head's group.
// A position's key and value rows are read by LPP = D / 8 lanes, 8
// coordinates each (16 bytes of a 16-bit row, 8 of an 8-bit one; a group
// holds whole lanes), so a warp reads 32 / LPP consecutive positions at once
// (one contiguous range) and each such lane group keeps its own online
// softmax; the groups' states are merged at the end (shuffles within a warp,
// shared memory across the 4 warps) into the partial turbo_merge.cu (ROT = 0)
// combines over the splits. Scores are in base 2 (the query carries
// log2(e)), as the merge expects.
// Inputs: q [B, HQ, 1, D]; k, v [B, HKV, CAP, D] of T (BITS 0) or [B, HKV,
// CAP, D * BITS / 32] uint32 (whole buffers; CAP >= written); params [2 + B]
// int32: positions written (the same for all rows), the scale's float bits,
// each row's first valid position; ks, kb, vs, vb [B, HKV, CAP, D / GS]: the
// scales and biases (BITS 0: not read; any arrays stand in).
// Outputs: part_o [B, HQ, NS, D], part_ml [B, HQ, NS, 2] (float32); NS is the
// grid's blocks per (row, KV head). 128 threads a block (kernels.rs).
constexpr int THREADS = 128;
constexpr int WARPS = THREADS / 32;
constexpr int C = 8;                    // coordinates a lane owns
constexpr int LPP = D / C;              // lanes a position: 8, 16 or 32
constexpr int PPW = 32 / LPP;           // positions a warp reads at once
constexpr int GROUPS = WARPS * PPW;     // softmax states a block keeps
constexpr int LB = BITS == 0 ? C * (int)sizeof(T) : C * BITS / 8;   // bytes of a lane's coordinates
constexpr int RB = LB * LPP;            // bytes of a position's row
constexpr int NG = BITS == 0 ? 1 : D / GS;   // scale groups of a row
static_assert(D == 64 || D == 128 || D == 256, "head dims 64, 128, 256");
static_assert(REP >= 1 && REP <= 8, "1 to 8 query heads per KV head");
static_assert(BITS == 0 || BITS == 4 || BITS == 8, "16-bit rows, or 8- or 4-bit codes");
static_assert(BITS == 0 || (GS % C == 0 && D % GS == 0), "a scale group holds whole lanes");
__shared__ float qs[REP * D];
__shared__ float mw[WARPS * REP];
__shared__ float lw[WARPS * REP];
__shared__ float accw[WARPS * REP * D];

const int B = q_shape[0];
const int HQ = q_shape[1];
const int HKV = k_shape[1];
const int CAP = k_shape[2];
const int NS = gridDim.x / (B * HKV);
const int blk = blockIdx.x;
const int split = blk % NS;
const int g = (blk / NS) % HKV;
const int b = blk / (NS * HKV);
const int tid = threadIdx.x;
const int lane = tid & 31;
const int warp = tid >> 5;
const int sub = lane % LPP;             // the lane's coordinates: sub * C ..
const int pos = lane / LPP;             // its position among the warp's PPW

const int written = params[0];
const int first = params[2 + b];
const float qscale = __int_as_float(params[1]) * 1.4426950408889634f;
for (int i = tid; i < REP * D; i += THREADS) {
  qs[i] = static_cast<float>(q[(size_t)(b * HQ + g * REP) * D + i]) * qscale;
}
const int len = written > first ? written - first : 0;
const int per = (len + NS - 1) / NS;
const int t0 = first + split * per;
const int t1 = min(written, t0 + per);
__syncthreads();

float qv[REP][C];
#pragma unroll
for (int h = 0; h < REP; ++h) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    qv[h][c] = qs[h * D + sub * C + c];
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

const size_t head = (size_t)b * HKV + g;
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
// This lane's part of position t's key and value rows (zeros past the slice:
// such positions are skipped below).
auto load = [&](int t, Row& kr, Row& vr) {
  if (t < t1) {
    const size_t at = head * CAP + (size_t)t;
    load_row(reinterpret_cast<const uint8_t*>(k), ks, kb, at, kr);
    load_row(reinterpret_cast<const uint8_t*>(v), vs, vb, at, vr);
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

// The warp's positions, PPW at a time; the next ones are loaded while these
// are computed. Every lane runs every iteration (the shuffles need all 32).
Row kr, vr, kn, vn;
int t = t0 + warp * PPW + pos;
load(t, kr, vr);
for (int base = t0 + warp * PPW; base < t1; base += GROUPS) {
  load(t + GROUPS, kn, vn);
  const bool valid = t < t1;
  float kf[C], vf[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    kf[c] = coordinate(kr, c);
    vf[c] = coordinate(vr, c);
  }
#pragma unroll
  for (int h = 0; h < REP; ++h) {
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      s += qv[h][c] * kf[c];
    }
#pragma unroll
    for (int o = LPP / 2; o > 0; o >>= 1) {
      s += __shfl_xor_sync(0xffffffff, s, o);
    }
    if (valid) {
      const float mn = fmaxf(m[h], s);
      const float corr = exp2f(m[h] - mn);   // m = -inf at first: 0
      const float p = exp2f(s - mn);
      l[h] = l[h] * corr + p;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        acc[h][c] = acc[h][c] * corr + p * vf[c];
      }
      m[h] = mn;
    }
  }
  kr = kn;
  vr = vn;
  t += GROUPS;
}

// The warp's lane groups merged (all lanes end with the warp's state).
#pragma unroll
for (int o = LPP; o < 32; o <<= 1) {
#pragma unroll
  for (int h = 0; h < REP; ++h) {
    const float mo = __shfl_xor_sync(0xffffffff, m[h], o);
    const float lo = __shfl_xor_sync(0xffffffff, l[h], o);
    const float mn = fmaxf(m[h], mo);
    const float f = m[h] == TURBO_NEG_INF ? 0.0f : exp2f(m[h] - mn);
    const float fo = mo == TURBO_NEG_INF ? 0.0f : exp2f(mo - mn);
    l[h] = l[h] * f + lo * fo;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const float ao = __shfl_xor_sync(0xffffffff, acc[h][c], o);
      acc[h][c] = acc[h][c] * f + ao * fo;
    }
    m[h] = mn;
  }
}
// Then the warps', through shared memory, into this split's partial.
if (lane < LPP) {
#pragma unroll
  for (int h = 0; h < REP; ++h) {
    if (lane == 0) {
      mw[warp * REP + h] = m[h];
      lw[warp * REP + h] = l[h];
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
      accw[(warp * REP + h) * D + sub * C + c] = acc[h][c];
    }
  }
}
__syncthreads();
for (int i = tid; i < REP * D; i += THREADS) {
  const int h = i / D;
  const int d = i % D;
  float M = TURBO_NEG_INF;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    M = fmaxf(M, mw[w * REP + h]);
  }
  float sum = 0.0f;
  float L = 0.0f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    const float mwh = mw[w * REP + h];
    const float f = mwh == TURBO_NEG_INF ? 0.0f : exp2f(mwh - M);
    sum += accw[(w * REP + h) * D + d] * f;
    L += lw[w * REP + h] * f;
  }
  const size_t o = (size_t)(b * HQ + g * REP + h) * NS + split;
  part_o[o * D + d] = sum;
  if (d == 0) {
    part_ml[o * 2] = M;
    part_ml[o * 2 + 1] = L;
  }
}
