// Split-K decode attention over a TurboQuant cache: one query per row. Block
// (row b, KV head g, split s) takes the s-th slice of the row's compressed
// positions (the 4 unquantized sinks are turbo_merge.cu's). Every packed coordinate
// is decoded once and used by all the query heads of the KV head's group
// that a warp serves (HPW of them, at most MAXH: larger groups are split
// over NG sets of warps), which keeps the instruction count per position
// down (Nsight Compute on the H100: 63M warp instructions per 32K-token
// layer against 90M with a warp per head). A lane owns 8
// coordinates of one position, for the key as for the value, so a position's
// probabilities land in the lanes that sum its value with no exchange. Each
// warp walks chunks of CH positions (chunk c of the split goes to warp
// c % 4 of its head set): all the chunk's loads first; scores from the codes
// directly (8-bit affine: scale * (q . codes) + bias * sum(q)); one
// online-softmax step per head and chunk (base 2: the query carries
// log2(e)); values summed in the rotated basis. At the end the warps of a
// head set merge their (max, sum, accumulator) through shared memory; the
// partial per split goes to turbo_merge.cu.
// Inputs: q [B, HQ, 1, D] (not rotated); k0, k1, k2: keys (KFMT 0: packed
// uint32, scales, biases; KFMT 1: codes, norms, unused) and vc, vn: values,
// each [B, HKV, CAP, X] (the whole buffers);
// pads [B]: each row's first compressed position; meta [1]: positions written
// (the same for all rows); signs [3, D]; kcent, vcent: centroids; scale [1].
// Outputs: part_o [B, HQ, NS, D], part_ml [B, HQ, NS, 2] (float32); NS is
// the grid's blocks per (row, KV head). Threads per block: 128 * NG (kernels.rs).
constexpr int MAXH = 2;                 // heads a warp serves at most (registers: 2 * 8 * MAXH)
constexpr int NG = (REP + MAXH - 1) / MAXH;   // sets of warps, each serving HPW heads
constexpr int HPW = (REP + NG - 1) / NG;
constexpr int WPS = 4;                  // warps per set
constexpr int C = 8;                    // coordinates a lane owns
constexpr int LP = D / C;               // lanes per position
constexpr int PP = 32 / LP;             // positions a warp reads at once
constexpr int CH = 4;                   // positions a chunk (registers: 6 per position)
constexpr int NP = CH / PP;             // passes a chunk
__shared__ float qs[REP * D];
__shared__ float wacc[NG * WPS * HPW * D];   // each warp's sums, for the merge
__shared__ float wm[NG * WPS * HPW];
__shared__ float wl[NG * WPS * HPW];
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
const int set = warp / WPS;             // this warp's heads: set * HPW + 0..HPW-1
const int ws = warp % WPS;              // and its place in the set

// The group's queries, rotated and scaled; the codebooks.
for (int i = tid; i < REP * D; i += blockDim.x) {
  qs[i] = static_cast<float>(q[(size_t)(b * HQ + g * REP + i / D) * D + i % D]) * signs[i % D];
}
if (tid < 16) {
  kc[tid] = (KFMT == 1 && tid < (1 << KBITS)) ? kcent[tid] : 0.0f;
  vcs[tid] = tid < (1 << VBITS) ? vcent[tid] : 0.0f;
}
turbo_hadamard(qs, D, REP);
const float qscale = scale[0] * rsqrtf((float)D) * 1.4426950408889634f;
for (int i = tid; i < REP * D; i += blockDim.x) {
  qs[i] *= signs[D + i % D] * qscale;
}
__syncthreads();

// This lane: position pp of a pass, coordinates d0..d0+C, heads of its set.
const int pp = lane / LP;
const int d0 = (lane % LP) * C;
float qk[HPW][C];
float qsum[HPW];
float acc[HPW][C];
float m[HPW];
float l[HPW];
#pragma unroll
for (int h = 0; h < HPW; ++h) {
  const int hq = min(set * HPW + h, REP - 1);   // a slot past the group repeats the last head, unused
  qsum[h] = 0.0f;
  m[h] = TURBO_NEG_INF;
  l[h] = 0.0f;
#pragma unroll
  for (int j = 0; j < C; ++j) {
    qk[h][j] = qs[hq * D + d0 + j];
    qsum[h] += qk[h][j];
    acc[h][j] = 0.0f;
  }
}

const int idx = meta[0];
const int first = pads[b];
const int len = idx > first ? idx - first : 0;
const int per = (len + NS - 1) / NS;
const int t0 = first + split * per;
const int count = max(min(idx, t0 + per) - t0, 0);
const size_t head = (size_t)b * HKV + g;
const uint8_t* kbytes = reinterpret_cast<const uint8_t*>(k0);

for (int c = ws; c * CH < count; c += WPS) {
  const int limit = count - c * CH;
  const size_t tc = head * CAP + (size_t)(t0 + c * CH);   // the chunk's first position
  // The chunk's loads: keys and values of this lane's coordinates.
  uint32_t kw[NP][2];
  uint32_t vw[NP];
  float ka[NP];
  float kb[NP];
  float vnorm[NP];
#pragma unroll
  for (int n = 0; n < NP; ++n) {
    const int i = n * PP + pp;
    kw[n][0] = 0u;
    kw[n][1] = 0u;
    vw[n] = 0u;
    ka[n] = 0.0f;
    kb[n] = 0.0f;
    vnorm[n] = 0.0f;
    if (i < limit) {
      const size_t t = tc + i;
      if (KFMT == 0) {
        turbo_load_words<2>(kbytes + t * D + d0, kw[n]);
        ka[n] = static_cast<float>(k1[t * (D / KG) + d0 / KG]);
        kb[n] = static_cast<float>(k2[t * (D / KG) + d0 / KG]);
      } else {
        turbo_load_words<1>(kbytes + t * (D * KBITS / 8) + d0 * KBITS / 8, kw[n]);
        ka[n] = static_cast<float>(k1[t]);
      }
      vw[n] = turbo_value_word<VBITS>(vc + t * (D * VBITS / 8), d0, D);
      vnorm[n] = static_cast<float>(vn[t]);
    }
  }
  // Scores: each key decoded once, dotted with every head's query.
  float s[NP][HPW];
#pragma unroll
  for (int n = 0; n < NP; ++n) {
    const int i = n * PP + pp;
    float kx[C];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      kx[j] = KFMT == 0 ? turbo_byte(kw[n][j / 4], j % 4) : kc[(kw[n][0] >> (4 * j)) & 15u];
    }
#pragma unroll
    for (int h = 0; h < HPW; ++h) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < C; ++j) {
        dot += qk[h][j] * kx[j];
      }
      s[n][h] = KFMT == 0 ? ka[n] * dot + kb[n] * qsum[h] : ka[n] * dot;
#pragma unroll
      for (int o = LP / 2; o > 0; o >>= 1) {
        s[n][h] += __shfl_xor_sync(0xffffffff, s[n][h], o);
      }
      s[n][h] = i < limit ? s[n][h] : TURBO_NEG_INF;
    }
  }
  // One online-softmax step per head (every chunk has a live position): s
  // becomes the probabilities, earlier sums are rescaled.
#pragma unroll
  for (int h = 0; h < HPW; ++h) {
    float mx = TURBO_NEG_INF;
#pragma unroll
    for (int n = 0; n < NP; ++n) {
      mx = fmaxf(mx, s[n][h]);
    }
#pragma unroll
    for (int o = LP; o < 32; o <<= 1) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
    }
    const float mn = fmaxf(m[h], mx);
    const float alpha = exp2f(m[h] - mn);
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < NP; ++n) {
      s[n][h] = exp2f(s[n][h] - mn);
      sum += s[n][h];
    }
#pragma unroll
    for (int o = LP; o < 32; o <<= 1) {
      sum += __shfl_xor_sync(0xffffffff, sum, o);
    }
    l[h] = l[h] * alpha + sum;
    m[h] = mn;
#pragma unroll
    for (int j = 0; j < C; ++j) {
      acc[h][j] *= alpha;
    }
  }
  // Values: each decoded once, summed into every head's accumulator.
#pragma unroll
  for (int n = 0; n < NP; ++n) {
    float vx[C];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      vx[j] = vcs[turbo_value_code<VBITS>(vw[n], j)] * vnorm[n];
    }
#pragma unroll
    for (int h = 0; h < HPW; ++h) {
#pragma unroll
      for (int j = 0; j < C; ++j) {
        acc[h][j] += s[n][h] * vx[j];
      }
    }
  }
}

// A warp's positions share its max per head: add its lanes' sums up by
// shuffles, then merge the warps of each head set.
#pragma unroll
for (int h = 0; h < HPW; ++h) {
#pragma unroll
  for (int j = 0; j < C; ++j) {
#pragma unroll
    for (int o = LP; o < 32; o <<= 1) {
      acc[h][j] += __shfl_xor_sync(0xffffffff, acc[h][j], o);
    }
  }
  if (lane < LP) {
#pragma unroll
    for (int j = 0; j < C; ++j) {
      wacc[(warp * HPW + h) * D + d0 + j] = acc[h][j];
    }
  }
  if (lane == 0) {
    wm[warp * HPW + h] = m[h];
    wl[warp * HPW + h] = l[h];
  }
}
__syncthreads();
for (int i = tid; i < REP * D; i += blockDim.x) {
  const int hq = i / D;
  const int hs = hq / HPW;              // its set
  const int h = hq % HPW;               // and its slot there
  float M = TURBO_NEG_INF;
  for (int w = hs * WPS; w < (hs + 1) * WPS; ++w) {
    M = fmaxf(M, wm[w * HPW + h]);
  }
  float L = 0.0f;
  float A = 0.0f;
  if (M > TURBO_NEG_INF) {
    for (int w = hs * WPS; w < (hs + 1) * WPS; ++w) {
      const float e = exp2f(wm[w * HPW + h] - M);
      L += wl[w * HPW + h] * e;
      A += wacc[(w * HPW + h) * D + i % D] * e;
    }
  }
  const size_t o = (size_t)(b * HQ + g * REP + hq) * NS + split;
  part_o[o * D + i % D] = A;
  if (i % D == 0) {
    part_ml[o * 2] = M;
    part_ml[o * 2 + 1] = L;
  }
}
