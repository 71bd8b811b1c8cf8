// Split-K decode attention over a TurboQuant cache: one query per row. Block
// (row b, KV head g, split s) takes the s-th slice of the row's compressed
// positions (the 4 unquantized sinks are turbo_merge.cu's) with 128 threads,
// for every query head of the KV head's group at once.
//
// The slice is walked in tiles of P positions, double-buffered in shared
// memory: while a tile is scored, the next one's codes are already on their
// way (asynchronous copies, 16 bytes a thread and instruction), which keeps
// enough bytes in flight to read the cache at memory speed (the previous
// version, one position per few lanes straight from global memory, waited on
// memory most of its time). A tile goes through three phases:
//  1. scores: TPP threads a position, each a share of its key's 16-byte
//     chunks, every code decoded once and dotted with every head's query
//     (8-bit affine: scale * (q . codes) + bias * sum(q); 4-bit codebook:
//     norm * (q . centroids));
//  2. one online-softmax step per head over the tile (a warp a head; base 2:
//     the query carries log2(e)); every warp then shares the same running max;
//  3. values: a lane owns 8 coordinates of one position at a time, the warps
//     take alternate positions, each value decoded once and summed into every
//     head's accumulator in the rotated basis.
// At the end the warps' accumulators (one max, so plain sums) are added in
// shared memory; the partial per split goes to turbo_merge.cu.
// Inputs: q [B, HQ, 1, D] (not rotated); k0, k1, k2: keys (KFMT 0: packed
// uint32, scales, biases; KFMT 1: codes, norms, unused) and vc, vn: values,
// each [B, HKV, CAP, X] (the whole buffers);
// pads [B]: each row's first compressed position; meta [1]: positions written
// (the same for all rows); signs [3, D]; kcent, vcent: centroids; scale [1].
// Outputs: part_o [B, HQ, NS, D], part_ml [B, HQ, NS, 2] (float32); NS is
// the grid's blocks per (row, KV head). 128 threads a block (kernels.rs).
constexpr int THREADS = 128;
constexpr int WARPS = THREADS / 32;
constexpr int P = D <= 128 ? 64 : 32;   // positions a tile
constexpr int KB = KFMT == 0 ? D : D * KBITS / 8;   // key code bytes a position
constexpr int NKG = KFMT == 0 ? D / KG : 1;         // key scales a position
constexpr int VB = D * VBITS / 8;       // value code bytes a position
constexpr int VCP = VB % 16 == 0 ? 16 : 8;          // bytes a value copy moves
// Phase 1: threads per position, 16-byte chunks of a key row, and each
// thread's share; rows padded so that the 8 lanes of a shared-memory phase
// read 8 different bank groups.
constexpr int TPP = THREADS / P;
constexpr int KCH = KB / 16;
constexpr int CPT = KCH / TPP;
constexpr int KROW = KB + 16 * TPP;
constexpr int CPC = KFMT == 0 ? 16 : 32;            // coordinates a chunk
// Phase 3: a lane's 8 coordinates, lanes per position, positions per warp.
constexpr int C = 8;
constexpr int LP = D / C;
constexpr int PP = 32 / LP;
constexpr int HW = (REP + WARPS - 1) / WARPS;       // heads a warp's softmax
__shared__ __align__(16) uint8_t ks[2][P * KROW];
__shared__ __align__(16) uint8_t vs[2][P * VB];
__shared__ float ka_s[2][P * NKG];
__shared__ float kb_s[2][P * NKG];
__shared__ float vn_s[2][P];
__shared__ __align__(16) float qs[REP * D];
__shared__ float qsum[REP * NKG];
__shared__ float sc[REP * P];           // a tile's scores, then probabilities
__shared__ float alpha_s[REP];
__shared__ float ml_s[REP * 2];
__shared__ float wacc[REP * D];
__shared__ float kc[16];
__shared__ float vcs[16];

const int B = q_shape[0];
const int HQ = q_shape[1];
const int HKV = vn_shape[1];
const int CAP = vn_shape[2];
const int NS = gridDim.x / (B * HKV);
const int blk = blockIdx.x;
const int split = blk % NS;
const int g = (blk / NS) % HKV;
const int b = blk / (NS * HKV);
const int tid = threadIdx.x;
const int lane = tid & 31;
const int warp = tid >> 5;

// The group's queries, rotated and scaled; their sums per key group; the
// codebooks.
for (int i = tid; i < REP * D; i += THREADS) {
  qs[i] = static_cast<float>(q[(size_t)(b * HQ + g * REP + i / D) * D + i % D]) * signs[i % D];
  wacc[i] = 0.0f;
}
if (tid < 16) {
  kc[tid] = (KFMT == 1 && tid < (1 << KBITS)) ? kcent[tid] : 0.0f;
  vcs[tid] = tid < (1 << VBITS) ? vcent[tid] : 0.0f;
}
turbo_hadamard(qs, D, REP);
const float qscale = scale[0] * rsqrtf((float)D) * 1.4426950408889634f;
for (int i = tid; i < REP * D; i += THREADS) {
  qs[i] *= signs[D + i % D] * qscale;
}
__syncthreads();
if (KFMT == 0) {
  for (int hg = warp; hg < REP * NKG; hg += WARPS) {
    float s = 0.0f;
    for (int i = lane; i < KG; i += 32) {
      s += qs[(hg / NKG) * D + (hg % NKG) * KG + i];
    }
    s = turbo_warp_sum(s);
    if (lane == 0) {
      qsum[hg] = s;
    }
  }
}

const int idx = meta[0];
const int first = pads[b];
const int len = idx > first ? idx - first : 0;
const int per = (len + NS - 1) / NS;
const int t0 = first + split * per;
const int count = max(min(idx, t0 + per) - t0, 0);
const int tiles = (count + P - 1) / P;
const size_t head = (size_t)b * HKV + g;
const uint8_t* kbytes = reinterpret_cast<const uint8_t*>(k0);

// Starts the copies of tile `i`'s codes into buffer `buf` (positions past
// the slice are zero-filled, never read).
auto fetch_codes = [&](int i, int buf) {
  const int limit = count - i * P;
  const size_t tc = head * CAP + (size_t)(t0 + i * P);
  for (int c = tid; c < P * KCH; c += THREADS) {
    const int t = c / KCH;
    const bool live = t < limit;
    const uint8_t* src = live ? kbytes + (tc + t) * KB + (c % KCH) * 16 : kbytes;
    turbo_copy_async<16>(&ks[buf][t * KROW + (c % KCH) * 16], src, live);
  }
  for (int c = tid; c < P * VB / VCP; c += THREADS) {
    const bool live = c * VCP / VB < limit;
    const uint8_t* src = live ? vc + tc * VB + c * VCP : vc;
    turbo_copy_async<VCP>(&vs[buf][c * VCP], src, live);
  }
  turbo_copy_commit();
};
// A tile's scales and norms, at most one of each a thread: loaded into
// registers early, stored to shared memory once the tile before is done.
float ra = 0.0f;
float rb = 0.0f;
float rn = 0.0f;
auto fetch_scalars = [&](int i) {
  const int limit = count - i * P;
  const size_t tc = head * CAP + (size_t)(t0 + i * P);
  ra = 0.0f;
  rb = 0.0f;
  rn = 0.0f;
  if (tid < P * NKG && tid / NKG < limit) {
    ra = static_cast<float>(k1[(tc + tid / NKG) * NKG + tid % NKG]);
    rb = KFMT == 0 ? static_cast<float>(k2[(tc + tid / NKG) * NKG + tid % NKG]) : 0.0f;
  }
  if (tid < P && tid < limit) {
    rn = static_cast<float>(vn[tc + tid]);
  }
};
auto store_scalars = [&](int buf) {
  if (tid < P * NKG) {
    ka_s[buf][tid] = ra;
    kb_s[buf][tid] = rb;
  }
  if (tid < P) {
    vn_s[buf][tid] = rn;
  }
};

// The running max and sum of the heads whose softmax this warp keeps
// (warp, warp + WARPS, ...), the same in all its lanes.
float mrun[HW];
float lrun[HW];
#pragma unroll
for (int hh = 0; hh < HW; ++hh) {
  mrun[hh] = TURBO_NEG_INF;
  lrun[hh] = 0.0f;
}
// This lane's value coordinates d0..d0+7 of position pp of each pass.
const int pp = lane / LP;
const int d0 = (lane % LP) * C;
float acc[REP][C];
#pragma unroll
for (int h = 0; h < REP; ++h) {
#pragma unroll
  for (int j = 0; j < C; ++j) {
    acc[h][j] = 0.0f;
  }
}

if (tiles > 0) {
  fetch_codes(0, 0);
  fetch_scalars(0);
  store_scalars(0);
}
for (int i = 0; i < tiles; ++i) {
  const int cur = i & 1;
  const int limit = count - i * P;
  if (i + 1 < tiles) {
    fetch_codes(i + 1, cur ^ 1);
    fetch_scalars(i + 1);
    turbo_copy_wait<1>();
  } else {
    turbo_copy_wait<0>();
  }
  __syncthreads();

  // 1. Scores.
  {
    const int t = tid / TPP;
    const int part = tid % TPP;
    float dot[REP][NKG];
#pragma unroll
    for (int h = 0; h < REP; ++h) {
#pragma unroll
      for (int k = 0; k < NKG; ++k) {
        dot[h][k] = 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      const int c = j * TPP + part;
      const int grp = KFMT == 0 ? (j * TPP * 16) / KG : 0;   // chunks j * TPP .. + TPP share a group
      const uint4 w4 = *reinterpret_cast<const uint4*>(&ks[cur][t * KROW + c * 16]);
      const uint32_t w[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (KFMT == 0) {
          float x[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            x[k] = turbo_byte(w[e], k);
          }
#pragma unroll
          for (int h = 0; h < REP; ++h) {
            const float4 qv = *reinterpret_cast<const float4*>(&qs[h * D + c * CPC + e * 4]);
            dot[h][grp] += qv.x * x[0] + qv.y * x[1] + qv.z * x[2] + qv.w * x[3];
          }
        } else {
          float x[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            x[k] = kc[(w[e] >> (4 * k)) & 15u];
          }
#pragma unroll
          for (int h = 0; h < REP; ++h) {
            const float4 qa = *reinterpret_cast<const float4*>(&qs[h * D + c * CPC + e * 8]);
            const float4 qb = *reinterpret_cast<const float4*>(&qs[h * D + c * CPC + e * 8 + 4]);
            dot[h][0] += qa.x * x[0] + qa.y * x[1] + qa.z * x[2] + qa.w * x[3] + qb.x * x[4] + qb.y * x[5] + qb.z * x[6] + qb.w * x[7];
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < REP; ++h) {
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < NKG; ++k) {
#pragma unroll
        for (int o = 1; o < TPP; o <<= 1) {
          dot[h][k] += __shfl_xor_sync(0xffffffff, dot[h][k], o);
        }
        s += KFMT == 0 ? ka_s[cur][t * NKG + k] * dot[h][k] + kb_s[cur][t * NKG + k] * qsum[h * NKG + k] : ka_s[cur][t] * dot[h][k];
      }
      if (h % TPP == part) {
        sc[h * P + t] = t < limit ? s : TURBO_NEG_INF;
      }
    }
  }
  __syncthreads();

  // 2. One online-softmax step per head: scores become probabilities.
#pragma unroll
  for (int hh = 0; hh < HW; ++hh) {
    const int h = warp + hh * WARPS;
    if (h < REP) {
      float v[P / 32];
      float mx = TURBO_NEG_INF;
#pragma unroll
      for (int k = 0; k < P / 32; ++k) {
        v[k] = sc[h * P + lane + 32 * k];
        mx = fmaxf(mx, v[k]);
      }
      const float mn = fmaxf(mrun[hh], turbo_warp_max(mx));
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < P / 32; ++k) {
        v[k] = exp2f(v[k] - mn);
        sum += v[k];
        sc[h * P + lane + 32 * k] = v[k];
      }
      const float alpha = exp2f(mrun[hh] - mn);
      lrun[hh] = lrun[hh] * alpha + turbo_warp_sum(sum);
      mrun[hh] = mn;
      if (lane == 0) {
        alpha_s[h] = alpha;
      }
    }
  }
  __syncthreads();

  // 3. Values.
#pragma unroll
  for (int h = 0; h < REP; ++h) {
    const float a = alpha_s[h];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      acc[h][j] *= a;
    }
  }
#pragma unroll 2
  for (int r = 0; r < P / (WARPS * PP); ++r) {
    const int t = (r * WARPS + warp) * PP + pp;
    const uint32_t vw = turbo_value_word<VBITS>(&vs[cur][t * VB], d0, D);
    const float nrm = vn_s[cur][t];
    float pw[REP];
#pragma unroll
    for (int h = 0; h < REP; ++h) {
      pw[h] = sc[h * P + t] * nrm;
    }
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const float x = vcs[turbo_value_code<VBITS>(vw, j)];
#pragma unroll
      for (int h = 0; h < REP; ++h) {
        acc[h][j] += pw[h] * x;
      }
    }
  }
  if (i + 1 < tiles) {
    store_scalars(cur ^ 1);
  }
  __syncthreads();
}

// The lanes' sums per coordinate, then the warps' in shared memory (every
// warp scaled to the same running max, so they simply add up).
#pragma unroll
for (int h = 0; h < REP; ++h) {
#pragma unroll
  for (int j = 0; j < C; ++j) {
#pragma unroll
    for (int o = LP; o < 32; o <<= 1) {
      acc[h][j] += __shfl_xor_sync(0xffffffff, acc[h][j], o);
    }
    if (lane < LP) {
      atomicAdd(&wacc[h * D + d0 + j], acc[h][j]);
    }
  }
}
#pragma unroll
for (int hh = 0; hh < HW; ++hh) {
  const int h = warp + hh * WARPS;
  if (h < REP && lane == 0) {
    ml_s[h * 2] = mrun[hh];
    ml_s[h * 2 + 1] = lrun[hh];
  }
}
__syncthreads();
for (int i = tid; i < REP * D; i += THREADS) {
  const size_t o = (size_t)(b * HQ + g * REP + i / D) * NS + split;
  part_o[o * D + i % D] = wacc[i];
  if (i % D == 0) {
    part_ml[o * 2] = ml_s[(i / D) * 2];
    part_ml[o * 2 + 1] = ml_s[(i / D) * 2 + 1];
  }
}
