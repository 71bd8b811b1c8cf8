// Split-K decode attention over a 16-bit (or float32) KV cache whose rows
// start at their own first position: one query per row, keys and values as
// the model computed them. It serves batches whose rows have other lengths
// (left-padded, mlx-lm's BatchKVCache layout), which MLX 0.32's CUDA
// attention only runs unfused (matmul, mask, softmax, matmul) because neither
// its vector kernel nor cuDNN's decode path takes an array mask.
//
// Block (row b, KV head g, split s) takes the s-th slice of the row's valid
// positions [first, written) for every query head of the KV head's group.
// A position's key and value rows are read by LPP = D / 8 lanes, 8
// coordinates (16 bytes of a 16-bit row) each, so a warp reads 32 / LPP
// consecutive positions at once (one contiguous range) and each such lane
// group keeps its own online softmax; the groups' states are merged at the
// end (shuffles within a warp, shared memory across the 4 warps) into the
// partial turbo_merge.cu (ROT = 0) combines over the splits. Scores are in
// base 2 (the query carries log2(e)), as the merge expects.
// Inputs: q [B, HQ, 1, D]; k, v [B, HKV, CAP, D] (whole buffers; CAP ≥
// written); params [2 + B] int32: positions written (the same for all rows),
// the scale's float bits, each row's first valid position.
// Outputs: part_o [B, HQ, NS, D], part_ml [B, HQ, NS, 2] (float32); NS is the
// grid's blocks per (row, KV head). 128 threads a block (dense_kernel.rs).
constexpr int THREADS = 128;
constexpr int WARPS = THREADS / 32;
constexpr int C = 8;                    // coordinates a lane owns
constexpr int LPP = D / C;              // lanes a position: 8, 16 or 32
constexpr int PPW = 32 / LPP;           // positions a warp reads at once
constexpr int GROUPS = WARPS * PPW;     // softmax states a block keeps
constexpr int WORDS = C * (int)sizeof(T) / 16;   // 16-byte loads a lane's coordinates take
static_assert(D == 64 || D == 128 || D == 256, "head dims 64, 128, 256");
static_assert(REP >= 1 && REP <= 8, "1 to 8 query heads per KV head");
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
struct Row {
  uint4 w[WORDS];
};
// This lane's 16-byte words of position t's key and value rows (zeros past
// the slice: such positions are skipped below).
auto load = [&](int t, Row& kr, Row& vr) {
  if (t < t1) {
    const size_t at = (head * CAP + (size_t)t) * D + sub * C;
    const uint4* kp = reinterpret_cast<const uint4*>(k + at);
    const uint4* vp = reinterpret_cast<const uint4*>(v + at);
#pragma unroll
    for (int i = 0; i < WORDS; ++i) {
      kr.w[i] = kp[i];
      vr.w[i] = vp[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < WORDS; ++i) {
      kr.w[i] = make_uint4(0, 0, 0, 0);
      vr.w[i] = make_uint4(0, 0, 0, 0);
    }
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
    kf[c] = static_cast<float>(reinterpret_cast<const T*>(kr.w)[c]);
    vf[c] = static_cast<float>(reinterpret_cast<const T*>(vr.w)[c]);
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
