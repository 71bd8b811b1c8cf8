// Split-K decode attention over a TurboQuant cache on tensor cores: one query
// per row. Block (row b, KV head g, split s) takes the s-th slice of the
// row's compressed positions with 4 warps, for every query head of the KV
// head's group at once; split 0 also attends the row's 4 unquantized sinks
// (warp 0, before its first chunk), so the merge needs neither the query nor
// the sinks. The last WS splits instead attend the recent window (recent.rs),
// a slice each: the newest positions' keys and values kept at 16 bits, both
// rotated.
//
// The warps work independently (no block barrier between the prologue and
// the end): warp w takes the slice's chunks of 16 positions w, w + 4, ...,
// each copied into its own ring of shared-memory stages by asynchronous
// 16-byte copies (a chunk's rows are one contiguous byte range) while the
// chunks before it are computed, and keeps its own online softmax; the warps'
// partials are combined at the end. A chunk goes through:
//  1. scores: S[16 positions x query heads] = K x Q by 16x8x16 float16 mma
//     tiles. A is the chunk's key codes, decoded on the fly: an 8-bit affine
//     code plus 1024 is exact in float16 (one byte permute; the 1024s and
//     the per-group scale and bias are applied to the tile's float32 sums);
//     4-bit codebook codes go through a table of
//     centroid pairs. B is the rotated query; each query head takes two of
//     B's 8 columns, its float16 high and low parts (x = hi + lo), so the
//     scores keep float32 precision. Codebook centroids are split likewise
//     (two mma per tile).
//  2. one online-softmax step per head (base 2: the query carries log2(e)),
//     the probabilities times the value norms moved by shuffles into the
//     layout of B for
//  3. values: out^T[dims x heads] += V^T x P with V decoded through a table
//     of centroid pairs (two positions' codes index it; its high and low
//     float16 parts make two mma) and P in high/low columns as above. Lane
//     group g owns D / 8 consecutive coordinates: tile i's row g is
//     coordinate D / 8 * g + 2i, row g + 8 the next one.
// Inputs: q [B, HQ, 1, D] (not rotated); kv [B, HKV, CAP, ROW] uint8: each
// position's row (codec.rs: key codes, value codes, then the key's scales
// and biases of type S (KFMT 0) or its float16 norm (KFMT 1), the value's
// float16 norm, padding to 4 bytes); params [2 + B] int32: positions written
// (the same for all rows), the scale's float bits, each row's first
// compressed position; signs [3, D]; kcent, vcent: centroids; sink_k, sink_v
// [B, HKV, 4, D] (rotated); win [B, HKV, 2, WCAP, D] of type S (the
// window's buffer: keys, then values, rotated) and win_params [2 + B] int32
// (the window's end slot, the scale's bits (not read: params has them), each
// row's first slot).
// counts [B * HKV] uint32: zeros, one per (row, KV head) group (see
// turbo_merge_if_last: the last split of a group to finish merges it).
// Outputs: part_o [B, HQ, NS, D], part_ml [B, HQ, NS, 2] (float32); NS is
// the grid's blocks per (row, KV head): NS - WS splits of the codes, then
// WS of the window (the template's WS); out [B, HQ, 1, D] of type T: the
// merged attention, rotated back.
// 128 threads a block (kernels.rs).
constexpr int THREADS = 128;
constexpr int WARPS = THREADS / 32;
constexpr int CH = 16;                  // positions a chunk: an mma tile's rows, then its K
constexpr int KB = KFMT == 0 ? D : D * KBITS / 8;   // a row: key codes,
constexpr int VB = D * VBITS / 8;       // value codes,
constexpr int NKG = KFMT == 0 ? D / KG : 1;
constexpr int SOFF = KB + VB;           // key scales and biases, or norm,
constexpr int NOFF = SOFF + (KFMT == 0 ? 2 * NKG * (int)sizeof(S) : 2);   // value norm,
constexpr int ROW = (NOFF + 2 + 3) / 4 * 4;         // padding
constexpr int SB = (CH * ROW + 16 + 15) / 16 * 16;  // a stage: a chunk from the 16-byte boundary below it
constexpr int NT = (REP + 3) / 4;       // mma column tiles: 4 heads x (hi, lo) each
constexpr int KS = D / 16;              // k-steps of the scores, row tiles of the values
constexpr int DPL = D / 8;              // value coordinates of a lane group
constexpr int VLUT = 1 << (2 * VBITS);  // value pairs
constexpr int KLUT = KFMT == 1 ? 256 : 1;           // key code bytes (two 4-bit codes)
constexpr int QB = REP * D * 4;         // the float32 queries of the prologue
// Stages per warp: as many as fit beside the rest (static shared memory
// stops at 48 KB), up to 4; one where a chunk's rows are long (head dim
// 256), the other warps' copies overlapping then.
constexpr int REST = (VLUT + KLUT) * 8 + 4 * (REP * NKG + REP * 4 + 2 * WARPS * REP + 32) + 64;
constexpr int NST_FIT = (48 * 1024 - 512 - REST) / (WARPS * SB);
constexpr int NST = NST_FIT > 4 ? 4 : NST_FIT < 1 ? 1 : NST_FIT;
constexpr int TOT = WARPS * NST * SB;
// 8-bit keys: a k-step's 16 coordinates are, for lane t, 4 consecutive bytes
// of a run of 4 * KSG (so one group of KG spans whole k-steps).
constexpr int KSG = KG / 16;
static_assert(KFMT == 0 || KBITS == 4, "codebook keys are 4-bit");
static_assert(QB <= TOT, "the prologue's queries fit in the stages");
__shared__ __align__(16) uint8_t stages[TOT];
__shared__ uint32_t vlut[2][VLUT];     // float16 pairs: high parts, low parts
__shared__ uint32_t klut[2][KLUT];
__shared__ float qsum_s[REP * NKG];
__shared__ float cent_s[2][16];         // value, key centroids
__shared__ float sink_s[REP * 4];
__shared__ float mw[WARPS * REP];       // each warp's max and (scaled) sum per head
__shared__ float lw[WARPS * REP];
// The prologue's queries sit at the end of the stages; a warp whose first
// stages overlap them starts its copies after the prologue.
float* qs = reinterpret_cast<float*>(stages + TOT - QB);

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
const int lg = lane >> 2;               // the lane's mma group (rows lg, lg + 8)
const int lt = lane & 3;                // and its place in it

// The prologue's global reads go out together, before any is used (each is
// a memory round trip; barriers would order them one after another).
const int idx = params[0];
const int first = params[2 + b];
const float qscale = __int_as_float(params[1]) * rsqrtf((float)D) * 1.4426950408889634f;
constexpr int QPT = (REP * D + THREADS - 1) / THREADS;   // query coordinates a thread
float qv[QPT];
#pragma unroll
for (int j = 0; j < QPT; ++j) {
  const int i = tid + j * THREADS;
  qv[j] = i < REP * D ? static_cast<float>(q[(size_t)(b * HQ + g * REP + i / D) * D + i % D]) * signs[i % D] : 0.0f;
}
const float vcr = tid < (1 << VBITS) ? vcent[tid] : 0.0f;
const float kcr = KFMT == 1 && tid < 16 ? kcent[tid] : 0.0f;
const int len = idx > first ? idx - first : 0;
const int NC = NS - WS;                 // splits of the codes; the window's follow
const int per = (len + NC - 1) / NC;
const int t0 = first + split * per;
const bool window = split >= NC;
const int count = window ? 0 : max(min(idx, t0 + per) - t0, 0);
const int nch = (count + CH - 1) / CH;
const size_t head = (size_t)b * HKV + g;

uint8_t* const ring = stages + warp * NST * SB;
auto chunk_start = [&](int c) { return (head * CAP + (size_t)(t0 + c * CH)) * ROW; };
// Starts the copies of this warp's k-th chunk (if it has one) into its stage
// k % NST and commits them as one group (an empty group past the end, so
// every iteration waits the same way). Bytes past the slice are zero-filled.
auto fetch = [&](int k) {
  const int c = warp + WARPS * k;
  if (c < nch) {
    const size_t start = chunk_start(c);
    const size_t from = start & ~(size_t)15;
    const int end = (int)(start - from) + min(CH, count - c * CH) * ROW;
    uint8_t* dst = ring + (k % NST) * SB;
    for (int x = lane; x * 16 < end; x += 32) {
      turbo_copy_bytes_async(dst + x * 16, kv + from + x * 16, min(16, end - x * 16));
    }
  }
  turbo_copy_commit();
};
const bool early = (warp * NST + NST - 1) * SB <= TOT - QB;   // its first stages clear of the queries
if (early) {
  for (int k = 0; k < NST - 1; ++k) {
    fetch(k);
  }
}

// The group's queries, rotated and scaled; their sums per key group; the
// sinks' scores; the centroid pair tables.
#pragma unroll
for (int j = 0; j < QPT; ++j) {
  const int i = tid + j * THREADS;
  if (i < REP * D) {
    qs[i] = qv[j];
  }
}
if (tid < 16) {
  cent_s[0][tid] = vcr;
  cent_s[1][tid] = kcr;
}
turbo_hadamard(qs, D, REP);             // (its barriers also publish cent_s)
for (int i = tid; i < REP * D; i += THREADS) {
  qs[i] *= signs[D + i % D] * qscale;
}
// A value pair's index: the two positions' 4-bit codes (low, high); 2-bit
// codes in bits 0-1 and 2-3; 3-bit ones also their third bits in 4 and 5.
for (int e = tid; e < 2 * VLUT; e += THREADS) {
  const int x = e % VLUT;
  const int lo0 = VBITS == 4 ? x & 15 : x & 3;
  const int lo1 = VBITS == 4 ? x >> 4 : (x >> 2) & 3;
  const float c0 = cent_s[0][VBITS == 3 ? lo0 | ((x >> 4) & 1) << 2 : lo0];
  const float c1 = cent_s[0][VBITS == 3 ? lo1 | ((x >> 5) & 1) << 2 : lo1];
  vlut[e / VLUT][x] = turbo_half2(turbo_half_part(c0, e / VLUT), turbo_half_part(c1, e / VLUT));
}
if (KFMT == 1) {
  for (int e = tid; e < 2 * KLUT; e += THREADS) {
    const int x = e % KLUT;
    klut[e / KLUT][x] = turbo_half2(turbo_half_part(cent_s[1][x & 15], e / KLUT), turbo_half_part(cent_s[1][x >> 4], e / KLUT));
  }
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
      qsum_s[hg] = s;
    }
  }
}
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
      sink_s[p] = s;
    }
  }
}

// Coordinate of the query paired with a key's column j (0-3: the k-step's
// columns 2t, 2t + 1, 2t + 8, 2t + 9) of k-step s for lane place t.
auto kdim = [&](int s, int t, int j) {
  if (KFMT == 0) {
    return (s / KSG) * KG + 4 * KSG * t + 4 * (s % KSG) + j;
  }
  return 2 * (4 * (4 * (s / 2) + t) + 2 * (s % 2) + j / 2) + j % 2;
};
__syncthreads();
// B of the scores: column lg of tile n is head 4n + lg / 2, part lg % 2.
uint32_t qf[KS][NT][2];
#pragma unroll
for (int s = 0; s < KS; ++s) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int h = 4 * n + lg / 2;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float x = 0.0f, y = 0.0f;
      if (h < REP) {
        x = turbo_half_part(qs[h * D + kdim(s, lt, 2 * r)], lg % 2);
        y = turbo_half_part(qs[h * D + kdim(s, lt, 2 * r + 1)], lg % 2);
      }
      qf[s][n][r] = turbo_half2(x, y);
    }
  }
}
// This lane's heads (4n + lt): their key-group sums, running max and sum
// (the sum a partial of this lane's rows), and output coordinates
// D / 8 * lg .. + D / 8 (tile i: rows lg, lg + 8 are coordinates 2i, 2i + 1).
float qsr[NT][NKG];
float mrun[NT];
float lrun[NT];
float acc[KS][NT][4];
#pragma unroll
for (int n = 0; n < NT; ++n) {
  const int h = 4 * n + lt;
#pragma unroll
  for (int k = 0; k < NKG; ++k) {
    qsr[n][k] = (KFMT == 0 && h < REP) ? qsum_s[h * NKG + k] : 0.0f;
  }
  mrun[n] = TURBO_NEG_INF;
  lrun[n] = 0.0f;
#pragma unroll
  for (int i = 0; i < KS; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      acc[i][n][j] = 0.0f;
    }
  }
}
// Split 0's warp 0 starts from the sinks.
if (split == 0 && warp == 0) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int h = 4 * n + lt;
    if (h < REP) {
      float mx = TURBO_NEG_INF;
      for (int j = 0; j < TURBO_SINKS; ++j) {
        mx = fmaxf(mx, sink_s[h * TURBO_SINKS + j]);
      }
      mrun[n] = mx;
      for (int j = 0; j < TURBO_SINKS; ++j) {
        const float e = exp2f(sink_s[h * TURBO_SINKS + j] - mx);
        lrun[n] += lg == 0 ? e : 0.0f;
        const size_t sv = (head * TURBO_SINKS + j) * D + DPL * lg;
#pragma unroll
        for (int i = 0; i < KS; ++i) {
          acc[i][n][0] += e * static_cast<float>(sink_v[sv + 2 * i]);
          acc[i][n][2] += e * static_cast<float>(sink_v[sv + 2 * i + 1]);
        }
      }
    }
  }
}
__syncthreads();

// The last WS splits: the window's slots wfirst..wend, a slice each, read as
// they are (no codes, no copies into the stages) by turbo_lane_attend, its
// sums in the stages (clear of the queries once it has read them). The lane
// loop takes a warp's positions two at a time (head dim 128): one block over
// the whole window (128-192 positions) was the launch's longest path.
if (window) {
  const int wfirst = win_params[2 + b];
  const int wend = win_params[0];
  const int wper = (max(wend - wfirst, 0) + WS - 1) / WS;
  const int w0 = wfirst + (split - NC) * wper;
  // A head's keys are its 2 * WCAP slots' first half, its values the second.
  const int wcap = win_shape[3];
  turbo_lane_attend<S, 0, 32, D, REP, 1, false>(qs, win, win + (size_t)wcap * D, win, win, win, win, head * 2 * wcap, w0,
                                      min(wend, w0 + wper), mw, lw, reinterpret_cast<float*>(stages), part_o, part_ml,
                                      (size_t)(b * HQ + g * REP) * NS + split, NS);
  turbo_merge_if_last<T, D, 1, REP>(counts, head, NS, part_o, part_ml, signs, out, (size_t)b * HQ + g * REP);
  return;
}
if (!early) {
  for (int k = 0; k < NST - 1; ++k) {
    fetch(k);
  }
}

// Two positions' value codes of this lane's coordinates D / 8 * lg ..
// + D / 8, merged once so that each coordinate's pair index (the tables'
// index above) is one byte, read out by one byte permute: x[w][] are the
// coordinates of w-th word of codes. 4-bit codes: x[w][0] holds the even
// coordinates' indices, x[w][1] the odd ones'. 2- and 3-bit codes: byte m
// of x[w][k] holds coordinate 16w + 4m + k's index times 4 (its byte offset
// in a table of 4-byte entries; the index is 6 bits), the low bits' pairs
// from the word-packed plane, a 3-bit code's third bits from the bit plane.
constexpr int VB2 = VBITS == 4 ? 4 : 2;  // bits of a code's word-packed part
constexpr int NB = DPL * VB2 / 8;       // its bytes per row for the lane group
constexpr int VW = (NB + 3) / 4;
constexpr int NX = VB2 == 4 ? 2 : 4;
struct VPair {
  uint32_t x[VW][NX];
};
// The low 16 bits of x moved to the even bits (bit i to bit 2i).
auto spread = [](uint32_t x) {
  x = __byte_perm(x, 0u, 0x4140u);      // byte 1 to byte 2
  x = (x | (x << 4)) & 0x0F0F0F0Fu;
  x = (x | (x << 2)) & 0x33333333u;
  return (x | (x << 1)) & 0x55555555u;
};
auto vpair = [&](const uint8_t* r0, const uint8_t* r1) {
  VPair v;
  const int at = KB + NB * lg;
  uint32_t h0 = 0, h1 = 0;
  if (VBITS == 3) {
    const int hat = KB + D / 4 + (DPL / 8) * lg;
    auto bits = [&](const uint8_t* r) {
      return DPL >= 32 ? *reinterpret_cast<const uint32_t*>(r + hat) : DPL == 16 ? (uint32_t)*reinterpret_cast<const uint16_t*>(r + hat) : (uint32_t)r[hat];
    };
    h0 = bits(r0);
    h1 = bits(r1);
  }
#pragma unroll
  for (int i = 0; i < VW; ++i) {
    const uint32_t w0 = NB >= 4 ? *reinterpret_cast<const uint32_t*>(r0 + at + 4 * i) : (uint32_t)*reinterpret_cast<const uint16_t*>(r0 + at);
    const uint32_t w1 = NB >= 4 ? *reinterpret_cast<const uint32_t*>(r1 + at + 4 * i) : (uint32_t)*reinterpret_cast<const uint16_t*>(r1 + at);
    if (VB2 == 4) {
      v.x[i][0] = (w0 & 0x0F0F0F0Fu) | ((w1 << 4) & 0xF0F0F0F0u);
      v.x[i][1] = ((w0 >> 4) & 0x0F0F0F0Fu) | (w1 & 0xF0F0F0F0u);
    } else {
      // e: nibble n is coordinate 2n's low bits (first position, then
      // second); o: coordinate 2n + 1's. Byte m of e: coordinates 4m, 4m + 2.
      const uint32_t e = (w0 & 0x33333333u) | ((w1 << 2) & 0xCCCCCCCCu);
      const uint32_t o = ((w0 >> 2) & 0x33333333u) | (w1 & 0xCCCCCCCCu);
      // Byte m of hh: coordinates 4m .. 4m + 3's third bits, two each.
      const uint32_t hh = VBITS == 3 ? spread(h0 >> (16 * i)) | spread(h1 >> (16 * i)) << 1 : 0u;
      v.x[i][0] = ((e << 2) & 0x3C3C3C3Cu) | ((hh << 6) & 0xC0C0C0C0u);
      v.x[i][1] = ((o << 2) & 0x3C3C3C3Cu) | ((hh << 4) & 0xC0C0C0C0u);
      v.x[i][2] = ((e >> 2) & 0x3C3C3C3Cu) | ((hh << 2) & 0xC0C0C0C0u);
      v.x[i][3] = ((o >> 2) & 0x3C3C3C3Cu) | (hh & 0xC0C0C0C0u);
    }
  }
  return v;
};
// The byte offset of coordinate j's (0 .. D / 8 - 1 of the lane's) pair in
// a value table, and that table's entry there.
auto voff = [&](const VPair& v, int j) -> uint32_t {
  if (VB2 == 4) {
    return __byte_perm(v.x[j / 8][j % 2], 0u, 0x4440u | ((j % 8) / 2)) << 2;
  }
  return __byte_perm(v.x[j / 16][j % 4], 0u, 0x4440u | ((j % 16) / 4));
};
auto ventry = [&](int part, uint32_t off) {
  return *reinterpret_cast<const uint32_t*>(reinterpret_cast<const uint8_t*>(vlut[part]) + off);
};

for (int k = 0; warp + WARPS * k < nch; ++k) {
  fetch(k + NST - 1);
  turbo_copy_wait<NST - 1>();
  __syncwarp();
  const int c = warp + WARPS * k;
  const int limit = count - c * CH;     // rows at or past it are not the slice's
  const uint8_t* rows = ring + (k % NST) * SB + (chunk_start(c) & 15);
  const uint8_t* ra = rows + lg * ROW;
  const uint8_t* rb = ra + 8 * ROW;

  // 1. Scores of rows lg and lg + 8 for this lane's heads.
  float sacc[NKG][NT][4];
#pragma unroll
  for (int kg = 0; kg < NKG; ++kg) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sacc[kg][n][j] = 0.0f;
      }
    }
  }
  if (KFMT == 0) {
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      const int off = kdim(s, lt, 0);
      const uint32_t wa = *reinterpret_cast<const uint32_t*>(ra + off);
      const uint32_t wb = *reinterpret_cast<const uint32_t*>(rb + off);
      const uint32_t a0 = turbo_bytes_half2(wa, 0), a1 = turbo_bytes_half2(wb, 0);
      const uint32_t a2 = turbo_bytes_half2(wa, 2), a3 = turbo_bytes_half2(wb, 2);   // codes + 1024
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        turbo_mma(sacc[s / KSG][n], a0, a1, a2, a3, qf[s][n][0], qf[s][n][1]);
      }
    }
  } else {
#pragma unroll
    for (int m = 0; m < KS / 2; ++m) {
      const uint32_t wa = *reinterpret_cast<const uint32_t*>(ra + 4 * (4 * m + lt));
      const uint32_t wb = *reinterpret_cast<const uint32_t*>(rb + 4 * (4 * m + lt));
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int part = 0; part < 2; ++part) {
          const uint32_t a0 = klut[part][(wa >> (16 * r)) & 255u], a1 = klut[part][(wb >> (16 * r)) & 255u];
          const uint32_t a2 = klut[part][(wa >> (16 * r + 8)) & 255u], a3 = klut[part][(wb >> (16 * r + 8)) & 255u];
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            turbo_mma(sacc[0][n], a0, a1, a2, a3, qf[2 * m + r][n][0], qf[2 * m + r][n][1]);
          }
        }
      }
    }
  }
  const bool va = lg < limit;
  const bool vb = lg + 8 < limit;
  const float na = va ? __half2float(*reinterpret_cast<const __half*>(ra + NOFF)) : 0.0f;
  const float nb = vb ? __half2float(*reinterpret_cast<const __half*>(rb + NOFF)) : 0.0f;

  // 2. The softmax step, and B of the values: column lg of tile n is head
  // 4n + lg / 2, part lg % 2, at positions 2t, 2t + 1 (b[0]) and 2t + 8,
  // 2t + 9 (b[1]), held as rows by lanes 8t + lg / 2 and 8t + 4 + lg / 2.
  uint32_t pf[NT][2];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    float sa = 0.0f, sb = 0.0f;
    if (KFMT == 0) {
#pragma unroll
      for (int kg = 0; kg < NKG; ++kg) {
        const S* pa = reinterpret_cast<const S*>(ra + SOFF);
        const S* pb = reinterpret_cast<const S*>(rb + SOFF);
        // The tile summed q * (code + 1024): the 1024s go with the bias.
        const float sca = static_cast<float>(pa[kg]), scb = static_cast<float>(pb[kg]);
        sa += sca * (sacc[kg][n][0] + sacc[kg][n][1]) + (static_cast<float>(pa[NKG + kg]) - 1024.0f * sca) * qsr[n][kg];
        sb += scb * (sacc[kg][n][2] + sacc[kg][n][3]) + (static_cast<float>(pb[NKG + kg]) - 1024.0f * scb) * qsr[n][kg];
      }
    } else {
      sa = __half2float(*reinterpret_cast<const __half*>(ra + SOFF)) * (sacc[0][n][0] + sacc[0][n][1]);
      sb = __half2float(*reinterpret_cast<const __half*>(rb + SOFF)) * (sacc[0][n][2] + sacc[0][n][3]);
    }
    sa = va ? sa : TURBO_NEG_INF;
    sb = vb ? sb : TURBO_NEG_INF;
    float mx = fmaxf(sa, sb);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, o));
    }
    const float mn = fmaxf(mrun[n], mx);  // row 0 of a chunk is always the slice's: finite
    const float alpha = exp2f(mrun[n] - mn);
    const float pa = exp2f(sa - mn);
    const float pb = exp2f(sb - mn);
    lrun[n] = lrun[n] * alpha + pa + pb;
    mrun[n] = mn;
    if (__any_sync(0xffffffff, alpha != 1.0f)) {   // the max moved (rarely, after the first chunks)
#pragma unroll
      for (int i = 0; i < KS; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[i][n][j] *= alpha;
        }
      }
    }
    const float xa = pa * na;
    const float xb = pb * nb;
    const int src0 = 8 * lt + lg / 2;
    const int src1 = src0 + 4;
    const float p0 = __shfl_sync(0xffffffff, xa, src0);
    const float p1 = __shfl_sync(0xffffffff, xa, src1);
    const float p8 = __shfl_sync(0xffffffff, xb, src0);
    const float p9 = __shfl_sync(0xffffffff, xb, src1);
    pf[n][0] = turbo_half2(turbo_half_part(p0, lg % 2), turbo_half_part(p1, lg % 2));
    pf[n][1] = turbo_half2(turbo_half_part(p8, lg % 2), turbo_half_part(p9, lg % 2));
  }

  // 3. Values of positions 2t, 2t + 1, 2t + 8, 2t + 9 (rows past the slice
  // weigh 0: their norm was taken as 0 above).
  const VPair v01 = vpair(rows + (2 * lt) * ROW, rows + (2 * lt + 1) * ROW);
  const VPair v89 = vpair(rows + (2 * lt + 8) * ROW, rows + (2 * lt + 9) * ROW);
#pragma unroll
  for (int i = 0; i < KS; ++i) {
    const uint32_t x0 = voff(v01, 2 * i), x1 = voff(v01, 2 * i + 1);
    const uint32_t x2 = voff(v89, 2 * i), x3 = voff(v89, 2 * i + 1);
#pragma unroll
    for (int part = 0; part < 2; ++part) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        turbo_mma(acc[i][n], ventry(part, x0), ventry(part, x1), ventry(part, x2), ventry(part, x3), pf[n][0], pf[n][1]);
      }
    }
  }
  __syncwarp();
}
turbo_copy_wait<0>();

// The warps' partials: one max per head; each warp's sums scaled to it and
// stored in its own slice of the (now free) stages, then added up (no
// atomics: four warps adding into one buffer contend). A slice row is a lane
// group's D / 8 coordinates, padded so a store's lanes spread over the banks.
constexpr int PR = DPL + 2;
static_assert(WARPS * REP * 8 * PR * 4 <= TOT, "the warps' partials fit in the stages");
float* const slices = reinterpret_cast<float*>(stages);
#pragma unroll
for (int n = 0; n < NT; ++n) {
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    lrun[n] += __shfl_xor_sync(0xffffffff, lrun[n], o);
  }
  const int h = 4 * n + lt;
  if (h < REP && lg == 0) {
    mw[warp * REP + h] = mrun[n];
  }
}
__syncthreads();
#pragma unroll
for (int n = 0; n < NT; ++n) {
  const int h = 4 * n + lt;
  if (h < REP) {
    float M = TURBO_NEG_INF;
    for (int w = 0; w < WARPS; ++w) {
      M = fmaxf(M, mw[w * REP + h]);
    }
    const float f = mrun[n] == TURBO_NEG_INF ? 0.0f : exp2f(mrun[n] - M);
    float* row = slices + ((warp * REP + h) * 8 + lg) * PR;
#pragma unroll
    for (int i = 0; i < KS; ++i) {
      *reinterpret_cast<float2*>(row + 2 * i) = make_float2((acc[i][n][0] + acc[i][n][1]) * f, (acc[i][n][2] + acc[i][n][3]) * f);
    }
    if (lg == 0) {
      lw[warp * REP + h] = lrun[n] * f;
    }
  }
}
__syncthreads();
for (int i = tid; i < REP * D; i += THREADS) {
  const int h = i / D;
  const int d = i % D;
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    sum += slices[((w * REP + h) * 8 + d / DPL) * PR + d % DPL];
  }
  const size_t o = (size_t)(b * HQ + g * REP + h) * NS + split;
  part_o[o * D + d] = sum;
  if (d == 0) {
    float M = TURBO_NEG_INF;
    float L = 0.0f;
    for (int w = 0; w < WARPS; ++w) {
      M = fmaxf(M, mw[w * REP + h]);
      L += lw[w * REP + h];
    }
    part_ml[o * 2] = M;
    part_ml[o * 2 + 1] = L;
  }
}
turbo_merge_if_last<T, D, 1, REP>(counts, head, NS, part_o, part_ml, signs, out, (size_t)b * HQ + g * REP);
