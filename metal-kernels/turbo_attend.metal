// Metal twin of turbo_attend.cu: split-K decode attention over a TurboQuant
// cache's compressed positions, with the same inputs (each position one row
// of bytes: codec.rs; split 0 also attends the sinks) and the same per-split
// partials for turbo_merge.metal. It keeps the CUDA kernel's third version
// (not its later shared-memory tiles and tensor-core tiles, which are tuned
// for the H100; Metal's simdgroup matrices are 8x8): each packed
// coordinate decoded once for the MAXH query heads a simdgroup serves,
// chunks of CH positions with one online-softmax step each, values summed in
// the rotated basis. The last WS splits attend the recent window instead,
// a slice each (recent.rs: the newest positions' rotated keys and values at 16 bits, in
// win [B, HKV, 2, WCAP, D] of type S, keys then values; win_params [2 + B]: the end
// slot, the scale's bits (not read), each row's first slot), through the
// same chunks with plain loads.
constexpr int MAXH = 2;                 // heads a warp serves at most (registers: 2 * 8 * MAXH)
constexpr int NG = (REP + MAXH - 1) / MAXH;   // sets of warps, each serving HPW heads
constexpr int HPW = (REP + NG - 1) / NG;
constexpr int WPS = 4;                  // warps per set
constexpr int C = 8;                    // coordinates a lane owns
constexpr int LP = D / C;               // lanes per position
constexpr int PP = 32 / LP;             // positions a warp reads at once
constexpr int CH = 4;                   // positions a chunk (registers: 6 per position)
static_assert(CH == TURBO_SINKS, "the sinks are attended as one chunk");
constexpr int NP = CH / PP;             // passes a chunk
constexpr int KB = KFMT == 0 ? D : D * KBITS / 8;   // a row: key codes,
constexpr int VB = D * VBITS / 8;       // value codes,
constexpr int NKG = KFMT == 0 ? D / KG : 1;
constexpr int SOFF = KB + VB;           // key scales and biases, or norm,
constexpr int NOFF = SOFF + (KFMT == 0 ? 2 * NKG * (int)sizeof(S) : 2);   // value norm,
constexpr int ROW = (NOFF + 2 + 3) / 4 * 4;         // padding
threadgroup float qs[REP * D];
threadgroup float wacc[NG * WPS * HPW * D];   // each warp's sums, for the merge
threadgroup float wm[NG * WPS * HPW];
threadgroup float wl[NG * WPS * HPW];
threadgroup float kc[16];
threadgroup float vcs[16];

const int B = q_shape[0];
const int HQ = q_shape[1];
const int HKV = kv_shape[1];
const int CAP = kv_shape[2];
const int NS = int(threadgroups_per_grid.x) / (B * HKV);
const int blk = int(threadgroup_position_in_grid.x);
const int split = blk % NS;
const int g = (blk / NS) % HKV;
const int b = blk / (NS * HKV);
const int tid = int(thread_index_in_threadgroup);
const int threads = int(threads_per_threadgroup.x);
const int lane = int(thread_index_in_simdgroup);
const int warp = int(simdgroup_index_in_threadgroup);
const int set = warp / WPS;             // this warp's heads: set * HPW + 0..HPW-1
const int ws = warp % WPS;              // and its place in the set

// The group's queries, rotated and scaled; the codebooks.
for (int i = tid; i < REP * D; i += threads) {
  qs[i] = static_cast<float>(q[(ulong)(b * HQ + g * REP + i / D) * D + i % D]) * signs[i % D];
}
if (tid < 16) {
  kc[tid] = (KFMT == 1 && tid < (1 << KBITS)) ? kcent[tid] : 0.0f;
  vcs[tid] = tid < (1 << VBITS) ? vcent[tid] : 0.0f;
}
turbo_hadamard(qs, D, REP, uint(tid), uint(threads));
const float qscale = metal::as_type<float>(params[1]) * metal::rsqrt((float)D) * 1.4426950408889634f;
for (int i = tid; i < REP * D; i += threads) {
  qs[i] *= signs[D + i % D] * qscale;
}
threadgroup_barrier(metal::mem_flags::mem_threadgroup);

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
  const int hq = metal::min(set * HPW + h, REP - 1);   // a slot past the group repeats the last head, unused
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

const int idx = params[0];
const int first = params[2 + b];
const int len = idx > first ? idx - first : 0;
const int NC = NS - WS;                      // NS - WS splits of the codes,
const int per = (len + NC - 1) / NC;
const bool window = split >= NC;             // then WS of the window, a slice each
const int wfirst = win_params[2 + b];
const int wper = (metal::max(win_params[0] - wfirst, 0) + WS - 1) / WS;
const int t0 = window ? wfirst + (split - NC) * wper : first + split * per;
const int count = window ? metal::max(metal::min(win_params[0], t0 + wper) - t0, 0) : metal::max(metal::min(idx, t0 + per) - t0, 0);
const ulong head = (ulong)b * HKV + g;
const ulong wbase = head * 2 * win_shape[3];   // the window's key slot 0 of this row and head
const ulong wvals = (ulong)win_shape[3] * D;     // its values: this far after its keys
const device uint8_t* kvb = (const device uint8_t*)kv;

// Split 0 starts from the sinks: the first warp of each set takes them as a
// chunk of CH (= 4) positions, unquantized and already rotated.
if (split == 0 && ws == 0) {
  float s[NP][HPW];
  float vx[NP][C];
#pragma unroll
  for (int n = 0; n < NP; ++n) {
    const ulong so = (head * TURBO_SINKS + ulong(n * PP + pp)) * D + d0;
    float kx[C];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      kx[j] = static_cast<float>(sink_k[so + j]);
      vx[n][j] = static_cast<float>(sink_v[so + j]);
    }
#pragma unroll
    for (int h = 0; h < HPW; ++h) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < C; ++j) {
        dot += qk[h][j] * kx[j];
      }
#pragma unroll
      for (int o = LP / 2; o > 0; o >>= 1) {
        dot += metal::simd_shuffle_xor(dot, ushort(o));
      }
      s[n][h] = dot;
    }
  }
#pragma unroll
  for (int h = 0; h < HPW; ++h) {
    float mx = TURBO_NEG_INF;
#pragma unroll
    for (int n = 0; n < NP; ++n) {
      mx = metal::max(mx, s[n][h]);
    }
#pragma unroll
    for (int o = LP; o < 32; o <<= 1) {
      mx = metal::max(mx, metal::simd_shuffle_xor(mx, ushort(o)));
    }
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < NP; ++n) {
      s[n][h] = metal::exp2(s[n][h] - mx);
      sum += s[n][h];
    }
#pragma unroll
    for (int o = LP; o < 32; o <<= 1) {
      sum += metal::simd_shuffle_xor(sum, ushort(o));
    }
    m[h] = mx;
    l[h] = sum;
#pragma unroll
    for (int n = 0; n < NP; ++n) {
#pragma unroll
      for (int j = 0; j < C; ++j) {
        acc[h][j] += s[n][h] * vx[n][j];
      }
    }
  }
}

for (int c = ws; c * CH < count; c += WPS) {
  const int limit = count - c * CH;
  const ulong tc = head * CAP + (ulong)(t0 + c * CH);   // the chunk's first position
  // The chunk's loads: keys and values of this lane's coordinates.
  uint kw[NP][2];
  uint vw[NP];
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
    if (i < limit && !window) {
      const device uint8_t* row = kvb + (tc + i) * ROW;   // rows are 4-byte aligned
      if (KFMT == 0) {
        turbo_load_words<1>(row + d0, kw[n]);
        turbo_load_words<1>(row + d0 + 4, kw[n] + 1);
        ka[n] = static_cast<float>(((const device S*)(row + SOFF))[d0 / KG]);
        kb[n] = static_cast<float>(((const device S*)(row + SOFF))[NKG + d0 / KG]);
      } else {
        turbo_load_words<1>(row + d0 * KBITS / 8, kw[n]);
        ka[n] = static_cast<float>(*((const device half*)(row + SOFF)));
      }
      vw[n] = turbo_value_word<VBITS>(row + KB, d0, D);
      vnorm[n] = static_cast<float>(*((const device half*)(row + NOFF)));
    }
  }
  // Scores: each key decoded once, dotted with every head's query.
  float s[NP][HPW];
#pragma unroll
  for (int n = 0; n < NP; ++n) {
    const int i = n * PP + pp;
    const ulong wo = (wbase + ulong(t0 + c * CH + i)) * D + d0;   // (window) its slot's coordinates
    float kx[C];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      if (window) {
        kx[j] = i < limit ? static_cast<float>(win[wo + j]) : 0.0f;
      } else {
        kx[j] = KFMT == 0 ? turbo_byte(kw[n][j / 4], j % 4) : kc[int((kw[n][0] >> (4 * j)) & 15u)];
      }
    }
#pragma unroll
    for (int h = 0; h < HPW; ++h) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < C; ++j) {
        dot += qk[h][j] * kx[j];
      }
      s[n][h] = window ? dot : KFMT == 0 ? ka[n] * dot + kb[n] * qsum[h] : ka[n] * dot;
#pragma unroll
      for (int o = LP / 2; o > 0; o >>= 1) {
        s[n][h] += metal::simd_shuffle_xor(s[n][h], ushort(o));
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
      mx = metal::max(mx, s[n][h]);
    }
#pragma unroll
    for (int o = LP; o < 32; o <<= 1) {
      mx = metal::max(mx, metal::simd_shuffle_xor(mx, ushort(o)));
    }
    const float mn = metal::max(m[h], mx);
    const float alpha = metal::exp2(m[h] - mn);
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < NP; ++n) {
      s[n][h] = metal::exp2(s[n][h] - mn);
      sum += s[n][h];
    }
#pragma unroll
    for (int o = LP; o < 32; o <<= 1) {
      sum += metal::simd_shuffle_xor(sum, ushort(o));
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
    const int i = n * PP + pp;
    const ulong wo = (wbase + ulong(t0 + c * CH + i)) * D + d0;
    float vx[C];
#pragma unroll
    for (int j = 0; j < C; ++j) {
      if (window) {
        vx[j] = i < limit ? static_cast<float>(win[wvals + wo + j]) : 0.0f;
      } else {
        vx[j] = vcs[turbo_value_code<VBITS>(vw[n], j)] * vnorm[n];
      }
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
      acc[h][j] += metal::simd_shuffle_xor(acc[h][j], ushort(o));
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
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
for (int i = tid; i < REP * D; i += threads) {
  const int hq = i / D;
  const int hs = hq / HPW;              // its set
  const int h = hq % HPW;               // and its slot there
  float M = TURBO_NEG_INF;
  for (int w = hs * WPS; w < (hs + 1) * WPS; ++w) {
    M = metal::max(M, wm[w * HPW + h]);
  }
  float L = 0.0f;
  float A = 0.0f;
  if (M > TURBO_NEG_INF) {
    for (int w = hs * WPS; w < (hs + 1) * WPS; ++w) {
      const float e = metal::exp2(wm[w * HPW + h] - M);
      L += wl[w * HPW + h] * e;
      A += wacc[(w * HPW + h) * D + i % D] * e;
    }
  }
  const ulong o = (ulong)(b * HQ + g * REP + hq) * NS + split;
  part_o[o * D + i % D] = A;
  if (i % D == 0) {
    part_ml[o * 2] = M;
    part_ml[o * 2 + 1] = L;
  }
}
