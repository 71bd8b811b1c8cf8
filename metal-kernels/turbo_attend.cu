// Split-K decode attention over a TurboQuant cache: one query per row. Block
// (row b, KV head g, split s) takes the s-th slice of the row's compressed
// positions with 128 threads, for every query head of the KV head's group at
// once; split 0 also attends the row's 4 unquantized sinks, before its first
// tile (so the merge needs neither the query nor the sinks).
//
// The slice is walked in tiles of P positions, double-buffered in shared
// memory: while a tile is scored, the next one's rows are already on their
// way (asynchronous 16-byte copies of the tile's bytes, which are contiguous),
// which keeps enough bytes in flight to read the cache at memory speed. A
// tile goes through three phases:
//  1. scores: TPP threads a position, each a share of its key's 4-byte
//     words, every code decoded once and dotted with every head's query
//     (8-bit affine: scale * (q . codes) + bias * sum(q); 4-bit codebook:
//     norm * (q . centroids));
//  2. one online-softmax step per head over the tile (a warp a head; base 2:
//     the query carries log2(e)); every warp then shares the same running max;
//  3. values: a lane owns 8 coordinates of one position at a time, the warps
//     take alternate positions, each value decoded once and summed into every
//     head's accumulator in the rotated basis.
// At the end the warps' accumulators (one max, so plain sums) are added in
// shared memory; the partial per split goes to turbo_merge.cu.
// Inputs: q [B, HQ, 1, D] (not rotated); kv [B, HKV, CAP, ROW] uint8: each
// position's row (codec.rs: key codes, value codes, then the key's scales
// and biases of type S (KFMT 0) or its float16 norm (KFMT 1), the value's
// float16 norm, padding to 4 bytes); pads [B]: each row's first compressed
// position; meta [1]: positions written (the same for all rows); signs
// [3, D]; kcent, vcent: centroids; scale [1]; sink_k, sink_v [B, HKV, 4, D]
// (rotated).
// Outputs: part_o [B, HQ, NS, D], part_ml [B, HQ, NS, 2] (float32); NS is
// the grid's blocks per (row, KV head). 128 threads a block (kernels.rs).
constexpr int THREADS = 128;
constexpr int WARPS = THREADS / 32;
constexpr int P = D <= 128 ? 64 : 32;   // positions a tile
constexpr int KB = KFMT == 0 ? D : D * KBITS / 8;   // a row: key codes,
constexpr int VB = D * VBITS / 8;       // value codes,
constexpr int NKG = KFMT == 0 ? D / KG : 1;
constexpr int SOFF = KB + VB;           // key scales and biases, or norm,
constexpr int NOFF = SOFF + (KFMT == 0 ? 2 * NKG * (int)sizeof(S) : 2);   // value norm,
constexpr int ROW = (NOFF + 2 + 3) / 4 * 4;         // padding
constexpr int TILE = P * ROW + 32;      // a tile's bytes, with room to start 16-byte aligned
// Phase 1: threads per position, 4-byte words of a key row, each thread's
// share, coordinates a word holds.
constexpr int TPP = THREADS / P;
constexpr int KW = KB / 4;
constexpr int WPT = KW / TPP;
constexpr int CPW = KFMT == 0 ? 4 : 8;
// Phase 3: a lane's 8 coordinates, lanes per position, positions per warp.
constexpr int C = 8;
constexpr int LP = D / C;
constexpr int PP = 32 / LP;
constexpr int HW = (REP + WARPS - 1) / WARPS;       // heads a warp's softmax
__shared__ __align__(16) uint8_t tile[2][TILE];
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
const int HKV = kv_shape[1];
const int CAP = kv_shape[2];
const int NS = gridDim.x / (B * HKV);
const int blk = blockIdx.x;
const int split = blk % NS;
const int g = (blk / NS) % HKV;
const int b = blk / (NS * HKV);
const int tid = threadIdx.x;
const int lane = tid & 31;
const int warp = tid >> 5;

const int idx = meta[0];
const int first = pads[b];
const int len = idx > first ? idx - first : 0;
const int per = (len + NS - 1) / NS;
const int t0 = first + split * per;
const int count = max(min(idx, t0 + per) - t0, 0);
const int tiles = (count + P - 1) / P;
const size_t head = (size_t)b * HKV + g;

// Tile i's first byte in kv, and where its first row starts in shared
// memory (its copy starts at the 16-byte boundary below).
auto tile_start = [&](int i) { return (head * CAP + (size_t)(t0 + i * P)) * ROW; };
// Starts the copies of tile i's rows into buffer `buf`; bytes past the
// slice's last position are zero-filled, never read.
auto fetch = [&](int i, int buf) {
  const size_t start = tile_start(i);
  const size_t from = start & ~(size_t)15;
  const int end = (int)(start - from) + min(P, count - i * P) * ROW;
  for (int c = tid; c * 16 < end; c += THREADS) {
    turbo_copy_bytes_async(&tile[buf][c * 16], kv + from + c * 16, min(16, end - c * 16));
  }
  turbo_copy_commit();
};

// Tile 0's bytes are on their way while the queries are prepared.
if (tiles > 0) {
  fetch(0, 0);
}

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

// Split 0 starts from the sinks: their scores (a warp a head and sink), one
// softmax step per head, and their values summed by warp 0's first position
// lanes (every warp's sums are scaled to the same running max, so any warp
// may hold them), while the first tile is on its way.
if (split == 0) {
  for (int p = warp; p < REP * TURBO_SINKS; p += WARPS) {
    const float* qh = qs + (p / TURBO_SINKS) * D;
    const size_t sk = (head * TURBO_SINKS + p % TURBO_SINKS) * D;
    float s = 0.0f;
    for (int i = lane; i < D; i += 32) {
      s += qh[i] * static_cast<float>(sink_k[sk + i]);
    }
    s = turbo_warp_sum(s);
    if (lane == 0) {
      sc[(p / TURBO_SINKS) * P + p % TURBO_SINKS] = s;
    }
  }
  __syncthreads();
#pragma unroll
  for (int hh = 0; hh < HW; ++hh) {
    const int h = warp + hh * WARPS;
    if (h < REP) {
      const float v = lane < TURBO_SINKS ? sc[h * P + lane] : TURBO_NEG_INF;
      mrun[hh] = turbo_warp_max(v);
      const float e = lane < TURBO_SINKS ? exp2f(v - mrun[hh]) : 0.0f;
      lrun[hh] = turbo_warp_sum(e);
      __syncwarp();
      if (lane < TURBO_SINKS) {
        sc[h * P + lane] = e;
      }
    }
  }
  __syncthreads();
  if (warp == 0 && pp == 0) {
    for (int j = 0; j < TURBO_SINKS; ++j) {
      const size_t sv = (head * TURBO_SINKS + j) * D + d0;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float x = static_cast<float>(sink_v[sv + c]);
#pragma unroll
        for (int h = 0; h < REP; ++h) {
          acc[h][c] += sc[h * P + j] * x;
        }
      }
    }
  }
  __syncthreads();
}

for (int i = 0; i < tiles; ++i) {
  const int cur = i & 1;
  const int limit = count - i * P;
  const uint8_t* rows = tile[cur] + (tile_start(i) & 15);
  if (i + 1 < tiles) {
    fetch(i + 1, cur ^ 1);
    turbo_copy_wait<1>();
  } else {
    turbo_copy_wait<0>();
  }
  __syncthreads();

  // 1. Scores (rows past the slice hold zeros or a neighbour's bytes: their
  // scores are replaced, never used).
  {
    const int t = tid / TPP;
    const int part = tid % TPP;
    const uint8_t* row = rows + t * ROW;
    float dot[REP][NKG];
#pragma unroll
    for (int h = 0; h < REP; ++h) {
#pragma unroll
      for (int k = 0; k < NKG; ++k) {
        dot[h][k] = 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < WPT; ++j) {
      const int w = j * TPP + part;
      const int grp = KFMT == 0 ? (j * TPP * 4) / KG : 0;   // words j * TPP .. + TPP share a group
      const uint32_t word = *reinterpret_cast<const uint32_t*>(row + 4 * w);
      if (KFMT == 0) {
        float x[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          x[k] = turbo_byte(word, k);
        }
#pragma unroll
        for (int h = 0; h < REP; ++h) {
          const float4 qv = *reinterpret_cast<const float4*>(&qs[h * D + w * CPW]);
          dot[h][grp] += qv.x * x[0] + qv.y * x[1] + qv.z * x[2] + qv.w * x[3];
        }
      } else {
        float x[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          x[k] = kc[(word >> (4 * k)) & 15u];
        }
#pragma unroll
        for (int h = 0; h < REP; ++h) {
          const float4 qa = *reinterpret_cast<const float4*>(&qs[h * D + w * CPW]);
          const float4 qb = *reinterpret_cast<const float4*>(&qs[h * D + w * CPW + 4]);
          dot[h][0] += qa.x * x[0] + qa.y * x[1] + qa.z * x[2] + qa.w * x[3] + qb.x * x[4] + qb.y * x[5] + qb.z * x[6] + qb.w * x[7];
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
        if (KFMT == 0) {
          const float sk = static_cast<float>(reinterpret_cast<const S*>(row + SOFF)[k]);
          const float bk = static_cast<float>(reinterpret_cast<const S*>(row + SOFF)[NKG + k]);
          s += sk * dot[h][k] + bk * qsum[h * NKG + k];
        } else {
          s += static_cast<float>(*reinterpret_cast<const __half*>(row + SOFF)) * dot[h][k];
        }
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
    const uint8_t* row = rows + t * ROW;
    const uint32_t vw = turbo_value_word<VBITS>(row + KB, d0, D);
    const float nrm = t < limit ? static_cast<float>(*reinterpret_cast<const __half*>(row + NOFF)) : 0.0f;
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
