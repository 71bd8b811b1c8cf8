// Metal twin of turbo_attend.cu (the same algorithm, line for line; see its
// comments). Split-K decode attention over a TurboQuant cache: one query per row, every
// query head of a KV head's group in one block (each packed byte is read once
// for all of them). Block (row b, KV head g, split s) of 256 threads takes the
// s-th slice of the row's compressed positions (split 0 also the 4
// unquantized sinks). A position is read by a group of D/8 lanes, 8
// coordinates each (vectorized loads), so a warp has 32/(D/8) positions in
// flight; scores come from the packed codes against the rotated query, the
// softmax is online, values are summed in the rotated basis. The groups of a
// warp merge by shuffles, the warps through shared memory; the partial (max,
// sum, accumulator) per split goes to turbo_merge.cu.
// Inputs: q [B, HQ, 1, D] (not rotated); sink_k, sink_v [B, HKV, 4, D] (rotated);
// k0, k1, k2: keys (KFMT 0: packed uint32, scales, biases; KFMT 1: codes,
// norms, unused) and vc, vn: values, each [B, HKV, CAP, X] (the whole buffers);
// pads [B]: each row's first compressed position; meta [1]: positions written
// (the same for all rows); signs [3, D]; kcent, vcent: centroids; scale [1].
// Outputs: part_o [B, HQ, NS, D], part_ml [B, HQ, NS, 2] (float32).
// REP * D must be at most 1024 (shared memory).
constexpr int WARPS = 8;
constexpr int DPL = 8;               // coordinates per lane
constexpr int LPT = D / DPL;         // lanes per position
constexpr int GROUPS = 32 / LPT;     // positions a warp reads at once
threadgroup float qs[REP * D];
threadgroup float red_m[WARPS * REP];
threadgroup float red_l[WARPS * REP];
threadgroup float red_acc[WARPS * REP * D];

const int HQ = q_shape[1];
const int HKV = sink_k_shape[1];
const int CAP = vn_shape[2];
const uint tid = thread_index_in_threadgroup;
const uint threads = threads_per_threadgroup.x;
const int blk = int(threadgroup_position_in_grid.x);
const int split = blk % NS;
const int g = (blk / NS) % HKV;
const int b = blk / (NS * HKV);
const int lane = int(thread_index_in_simdgroup);
const int warp = int(simdgroup_index_in_threadgroup);
const int group = lane / LPT;        // which position of the warp's GROUPS
const int lig = lane % LPT;          // lane in group: coordinates lig*8 .. lig*8+7
const int d0 = lig * DPL;

// The group's queries, rotated and scaled.
for (int i = int(tid); i < REP * D; i += int(threads)) {
  qs[i] = static_cast<float>(q[(ulong)(b * HQ + g * REP + i / D) * D + i % D]) * signs[i % D];
}
turbo_hadamard(qs, D, REP, tid, threads);
const float qscale = scale[0] * metal::rsqrt(float(D));
for (int i = int(tid); i < REP * D; i += int(threads)) {
  qs[i] *= signs[D + i % D] * qscale;
}
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
float qr[REP][DPL];
float acc[REP][DPL];
float m[REP];
float l[REP];
#pragma unroll
for (int r = 0; r < REP; ++r) {
  m[r] = TURBO_NEG_INF;
  l[r] = 0.0f;
#pragma unroll
  for (int j = 0; j < DPL; ++j) {
    qr[r][j] = qs[r * D + d0 + j];
    acc[r][j] = 0.0f;
  }
}

const int idx = meta[0];
const int first = pads[b];
const int len = idx > first ? idx - first : 0;
const int per = (len + NS - 1) / NS;
const int t0 = first + split * per;
const int t1 = metal::min(idx, t0 + per);
const int count = t1 > t0 ? t1 - t0 : 0;
const int begin = split == 0 ? -TURBO_SINKS : 0;
const ulong head = (ulong)b * HKV + g;
const device uint8_t* kbytes = (const device uint8_t*)k0;
const int slot = warp * GROUPS + group;   // this group's place among the block's readers
constexpr int READERS = WARPS * GROUPS;

// Every lane of a warp runs the same number of iterations (the shuffles need
// all 32); a group past the end computes with p = 0.
const int rounds = (count - begin + READERS - 1) / READERS;
for (int it = 0; it < rounds; ++it) {
  const int i = begin + it * READERS + slot;
  const bool live = i < count;
  float kx[DPL];
  float vx[DPL];
  if (!live) {
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      kx[j] = 0.0f;
      vx[j] = 0.0f;
    }
  } else if (i < 0) {
    const ulong base = (head * TURBO_SINKS + (i + TURBO_SINKS)) * D + d0;
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      kx[j] = static_cast<float>(sink_k[base + j]);
      vx[j] = static_cast<float>(sink_v[base + j]);
    }
  } else {
    const ulong t = head * CAP + (ulong)(t0 + i);
    if (KFMT == 0) {
      const uint2 w = *((const device uint2*)(k0 + t * (D / 4) + d0 / 4));
      const float sc = static_cast<float>(k1[t * (D / KG) + d0 / KG]);
      const float bi = static_cast<float>(k2[t * (D / KG) + d0 / KG]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        kx[j] = float((w.x >> (8 * j)) & 255u) * sc + bi;
        kx[4 + j] = float((w.y >> (8 * j)) & 255u) * sc + bi;
      }
    } else {
      const device uint8_t* row = kbytes + t * (D * KBITS / 8);
      const float n = static_cast<float>(k1[t]);
#pragma unroll
      for (int j = 0; j < DPL; ++j) {
        kx[j] = kcent[turbo_code<KBITS>(row, d0 + j, D)] * n;
      }
    }
    const device uint8_t* vrow = (const device uint8_t*)vc + t * (D * VBITS / 8);
    const float vnorm = static_cast<float>(vn[t]);
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      vx[j] = vcent[turbo_code<VBITS>(vrow, d0 + j, D)] * vnorm;
    }
  }
#pragma unroll
  for (int r = 0; r < REP; ++r) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      s += qr[r][j] * kx[j];
    }
#pragma unroll
    for (int o = LPT / 2; o > 0; o >>= 1) {
      s += metal::simd_shuffle_xor(s, ushort(o));
    }
    if (live) {
      const float mn = metal::max(m[r], s);
      const float c = metal::fast::exp(m[r] - mn);
      const float p = metal::fast::exp(s - mn);
      l[r] = l[r] * c + p;
#pragma unroll
      for (int j = 0; j < DPL; ++j) {
        acc[r][j] = acc[r][j] * c + p * vx[j];
      }
      m[r] = mn;
    }
  }
}

// Merge the groups of each warp (lanes lig, lig + LPT, ... hold the same
// coordinates), then the warps.
#pragma unroll
for (int r = 0; r < REP; ++r) {
#pragma unroll
  for (int o = LPT; o < 32; o <<= 1) {
    const float om = metal::simd_shuffle_xor(m[r], ushort(o));
    const float ol = metal::simd_shuffle_xor(l[r], ushort(o));
    const float mn = metal::max(m[r], om);
    const float a = mn > TURBO_NEG_INF ? metal::fast::exp(m[r] - mn) : 0.0f;
    const float bb = mn > TURBO_NEG_INF ? metal::fast::exp(om - mn) : 0.0f;
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      const float oa = metal::simd_shuffle_xor(acc[r][j], ushort(o));
      acc[r][j] = acc[r][j] * a + oa * bb;
    }
    l[r] = l[r] * a + ol * bb;
    m[r] = mn;
  }
  if (lane == 0) {
    red_m[warp * REP + r] = m[r];
    red_l[warp * REP + r] = l[r];
  }
  if (group == 0) {
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      red_acc[(warp * REP + r) * D + d0 + j] = acc[r][j];
    }
  }
}
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
for (int i = int(tid); i < REP * D; i += int(threads)) {
  const int r = i / D;
  const int d = i % D;
  float M = TURBO_NEG_INF;
  for (int w = 0; w < WARPS; ++w) {
    M = metal::max(M, red_m[w * REP + r]);
  }
  float L = 0.0f;
  float A = 0.0f;
  if (M > TURBO_NEG_INF) {
    for (int w = 0; w < WARPS; ++w) {
      const float e = metal::fast::exp(red_m[w * REP + r] - M);
      L += red_l[w * REP + r] * e;
      A += red_acc[(w * REP + r) * D + d] * e;
    }
  }
  const ulong o = (ulong)(b * HQ + g * REP + r) * NS + split;
  part_o[o * D + d] = A;
  if (d == 0) {
    part_ml[o * 2] = M;
    part_ml[o * 2 + 1] = L;
  }
}
