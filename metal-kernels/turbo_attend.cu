// Split-K decode attention over a TurboQuant cache: one query per row. Block
// (row b, KV head g, split s) takes the s-th slice of the row's compressed
// positions (split 0 also the 4 unquantized sinks) with WPH warps per query
// head of the KV head's group: each warp keeps one head's query and sums in
// a few registers (which keeps several blocks resident per multiprocessor),
// and the group's warps read the same packed bytes, the first from memory,
// the others mostly from the L1 cache. A warp walks its chunks of CH
// positions (chunk c of the split goes to warp c % WPH of each head):
//  1. scores: a position's key is read by LK lanes, CK coordinates each, in
//     one vector load; the dot product with the rotated query comes from the
//     codes directly (8-bit affine: scale * (q . codes) + bias * sum(q)); the
//     chunk's loads are issued before its arithmetic;
//  2. one online-softmax step for the chunk (scores in base 2: the query
//     carries log2(e));
//  3. values: a position's value is read by LV = D/8 lanes, 8 coordinates
//     each, and summed in the rotated basis with its probability (passed by a
//     shuffle from its scoring lanes) times its norm.
// At the end a head's warps merge their (max, sum, accumulator) through
// shared memory; the partial per split goes to turbo_merge.cu.
// Inputs: q [B, HQ, 1, D] (not rotated); sink_k, sink_v [B, HKV, 4, D] (rotated);
// k0, k1, k2: keys (KFMT 0: packed uint32, scales, biases; KFMT 1: codes,
// norms, unused) and vc, vn: values, each [B, HKV, CAP, X] (the whole buffers);
// pads [B]: each row's first compressed position; meta [1]: positions written
// (the same for all rows); signs [3, D]; kcent, vcent: centroids; scale [1].
// Outputs: part_o [B, HQ, NS, D], part_ml [B, HQ, NS, 2] (float32); NS is
// the grid's blocks per (row, KV head). Threads per block: 32 * REP * WPH.
constexpr int WPH = REP >= 8 ? 1 : 8 / REP;   // warps per query head
constexpr int CK = 16;                  // key coordinates a lane scores
constexpr int LK = D / CK;              // lanes scoring one position
constexpr int PK = 32 / LK;             // positions a warp scores at once
constexpr int CV = 8;                   // value coordinates a lane sums
constexpr int LV = D / CV;              // lanes summing one position
constexpr int PV = 32 / LV;             // positions a warp sums at once
constexpr int CH = 8;                   // positions a chunk
constexpr int NK = CH / PK;             // scoring passes a chunk
constexpr int NV = CH / PV;             // summing passes a chunk
__shared__ float qs[REP * D];
__shared__ float wacc[REP * WPH * D];   // each warp's sums, for the merge
__shared__ float wm[REP * WPH];
__shared__ float wl[REP * WPH];
__shared__ float kc[16];
__shared__ float vcs[16];

const int B = q_shape[0];
const int HQ = q_shape[1];
const int HKV = sink_k_shape[1];
const int CAP = vn_shape[2];
const int NS = gridDim.x / (B * HKV);
const int blk = blockIdx.x;
const int split = blk % NS;
const int g = (blk / NS) % HKV;
const int b = blk / (NS * HKV);
const int tid = threadIdx.x;
const int lane = tid & 31;
const int warp = tid >> 5;
const int r = warp / WPH;               // this warp's query head in the group
const int wi = warp % WPH;              // and its place among that head's warps

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

// Scoring lanes: position kp of a pass, coordinates kd..kd+CK of head r.
const int kp = lane / LK;
const int kd = (lane % LK) * CK;
float qk[CK];
float qsum = 0.0f;
#pragma unroll
for (int j = 0; j < CK; ++j) {
  qk[j] = qs[r * D + kd + j];
  qsum += qk[j];
}
// Summing lanes: position vp of a pass, coordinates vd..vd+CV.
const int vp = lane / LV;
const int vd = (lane % LV) * CV;
float acc[CV];
#pragma unroll
for (int j = 0; j < CV; ++j) {
  acc[j] = 0.0f;
}
float m = TURBO_NEG_INF;
float l = 0.0f;

const int idx = meta[0];
const int first = pads[b];
const int len = idx > first ? idx - first : 0;
const int per = (len + NS - 1) / NS;
const int t0 = first + split * per;
const int count = max(min(idx, t0 + per) - t0, 0);
const size_t head = (size_t)b * HKV + g;
const uint8_t* kbytes = reinterpret_cast<const uint8_t*>(k0);

// Chunk -1 (split 0, a head's first warp) is the sinks.
const int start = (split == 0 && wi == 0) ? -1 : wi;
for (int c = start; c * CH < count; c = c < 0 ? 0 : c + WPH) {
  const bool sinks = c < 0;
  // Phase 1: the chunk's key loads, then its scores.
  float s[NK];
  if (sinks) {
#pragma unroll
    for (int n = 0; n < NK; ++n) {
      const int i = n * PK + kp;
      float dot = 0.0f;
      if (i < TURBO_SINKS) {
        const size_t base = (head * TURBO_SINKS + i) * D + kd;
#pragma unroll
        for (int j = 0; j < CK; ++j) {
          dot += qk[j] * static_cast<float>(sink_k[base + j]);
        }
      }
      s[n] = dot;
    }
  } else {
    uint32_t kw[NK][CK / 4];
    float ka[NK];
    float kb[NK];
#pragma unroll
    for (int n = 0; n < NK; ++n) {
      const int i = c * CH + n * PK + kp;
      ka[n] = 0.0f;
      kb[n] = 0.0f;
#pragma unroll
      for (int w = 0; w < CK / 4; ++w) {
        kw[n][w] = 0u;
      }
      if (i < count) {
        const size_t t = head * CAP + (size_t)(t0 + i);
        if (KFMT == 0) {
          turbo_load_words<CK / 4>(kbytes + t * D + kd, kw[n]);
          ka[n] = static_cast<float>(k1[t * (D / KG) + kd / KG]);
          kb[n] = static_cast<float>(k2[t * (D / KG) + kd / KG]);
        } else {
          turbo_load_words<CK * KBITS / 32>(kbytes + t * (D * KBITS / 8) + kd * KBITS / 8, kw[n]);
          ka[n] = static_cast<float>(k1[t]);
        }
      }
    }
#pragma unroll
    for (int n = 0; n < NK; ++n) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < CK; ++j) {
        const float code = KFMT == 0 ? turbo_byte(kw[n][j / 4], j % 4) : kc[(kw[n][j / 8] >> (4 * (j % 8))) & 15u];
        dot += qk[j] * code;
      }
      s[n] = KFMT == 0 ? ka[n] * dot + kb[n] * qsum : ka[n] * dot;
    }
  }
  // Each position's score to all its LK lanes; the chunk's max to the warp.
  const int limit = sinks ? TURBO_SINKS : count - c * CH;
  float mx = TURBO_NEG_INF;
#pragma unroll
  for (int n = 0; n < NK; ++n) {
#pragma unroll
    for (int o = LK / 2; o > 0; o >>= 1) {
      s[n] += __shfl_xor_sync(0xffffffff, s[n], o);
    }
    s[n] = n * PK + kp < limit ? s[n] : TURBO_NEG_INF;
    mx = fmaxf(mx, s[n]);
  }
#pragma unroll
  for (int o = LK; o < 32; o <<= 1) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
  }
  // Phase 2: one softmax step (every chunk has a live position).
  const float mn = fmaxf(m, mx);
  const float alpha = exp2f(m - mn);
  float sum = 0.0f;
#pragma unroll
  for (int n = 0; n < NK; ++n) {
    s[n] = exp2f(s[n] - mn);
    sum += s[n];
  }
#pragma unroll
  for (int o = LK; o < 32; o <<= 1) {
    sum += __shfl_xor_sync(0xffffffff, sum, o);
  }
  l = l * alpha + sum;
  m = mn;
#pragma unroll
  for (int j = 0; j < CV; ++j) {
    acc[j] *= alpha;
  }
  // Phase 3: the chunk's value loads, then the sums.
  uint32_t vw[NV];
  float vnorm[NV];
#pragma unroll
  for (int n = 0; n < NV; ++n) {
    const int i = n * PV + vp;
    vw[n] = 0u;
    vnorm[n] = 0.0f;
    if (i < limit) {
      if (sinks) {
        vnorm[n] = 1.0f;
      } else {
        const size_t t = head * CAP + (size_t)(t0 + c * CH + i);
        vw[n] = turbo_value_word<VBITS>(vc + t * (D * VBITS / 8), vd, D);
        vnorm[n] = static_cast<float>(vn[t]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < NV; ++n) {
    // Position n * PV + vp was scored in pass (n * PV) / PK by the lanes of
    // its place in that pass (the same pass for the whole warp: PV divides PK).
    const int i = n * PV + vp;
    const float p = __shfl_sync(0xffffffff, s[(n * PV) / PK], (i % PK) * LK) * vnorm[n];
    if (sinks) {
      if (i < TURBO_SINKS) {
        const size_t base = (head * TURBO_SINKS + i) * D + vd;
#pragma unroll
        for (int j = 0; j < CV; ++j) {
          acc[j] += p * static_cast<float>(sink_v[base + j]);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < CV; ++j) {
        acc[j] += p * vcs[turbo_value_code<VBITS>(vw[n], j)];
      }
    }
  }
}

// A warp's positions share its max: add its lanes' sums up by shuffles, then
// merge the head's warps.
#pragma unroll
for (int j = 0; j < CV; ++j) {
#pragma unroll
  for (int o = LV; o < 32; o <<= 1) {
    acc[j] += __shfl_xor_sync(0xffffffff, acc[j], o);
  }
}
if (lane < LV) {
#pragma unroll
  for (int j = 0; j < CV; ++j) {
    wacc[warp * D + vd + j] = acc[j];
  }
}
if (lane == 0) {
  wm[warp] = m;
  wl[warp] = l;
}
__syncthreads();
for (int i = tid; i < REP * D; i += blockDim.x) {
  const int h = i / D;
  float M = TURBO_NEG_INF;
  for (int w = 0; w < WPH; ++w) {
    M = fmaxf(M, wm[h * WPH + w]);
  }
  float L = 0.0f;
  float A = 0.0f;
  if (M > TURBO_NEG_INF) {
    for (int w = 0; w < WPH; ++w) {
      const float e = exp2f(wm[h * WPH + w] - M);
      L += wl[h * WPH + w] * e;
      A += wacc[(h * WPH + w) * D + i % D] * e;
    }
  }
  const size_t o = (size_t)(b * HQ + g * REP + h) * NS + split;
  part_o[o * D + i % D] = A;
  if (i % D == 0) {
    part_ml[o * 2] = M;
    part_ml[o * 2 + 1] = L;
  }
}
