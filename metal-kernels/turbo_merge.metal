// Merges turbo_attend's split partials (split 0's include the sinks; part_o
// [B, HQ, NS, D], part_ml [B, HQ, NS, 2]: each split's max and sum, base 2)
// into the attention output and rotates it back, o = s1 ⊙ H(s2 ⊙ õ)/√D.
// One threadgroup of 4 simdgroups per (row, query head): the weights
// exp2(max - M) once per split in threadgroup memory, each simdgroup sums a
// quarter of the splits, the first adds the others' sums, divides, and runs
// the transform across its lanes by shuffles. Metal only: on CUDA the
// attention kernel's last block merges (turbo_warp_merge, turbo_common.cuh);
// Metal would need device-scope fences for that pattern.
constexpr int WARPS = 4;
constexpr int E = D / 32;               // coordinates a lane owns: lane * E ..
threadgroup float weight[256];
threadgroup float sums[WARPS - 1][D];
const int NS = part_ml_shape[2];
const ulong bh = threadgroup_position_in_grid.x;
const int lane = int(thread_index_in_simdgroup);
const int warp = int(simdgroup_index_in_threadgroup);
const device float* ml = part_ml + bh * NS * 2;

float M = TURBO_NEG_INF;
for (int s = lane; s < NS; s += 32) {
  M = metal::max(M, ml[2 * s]);
}
M = metal::simd_max(M);
float L = 0.0f;
for (int s = lane; s < NS; s += 32) {
  const float w = metal::exp2(ml[2 * s] - M);
  if (warp == 0) {
    weight[s] = w;
  }
  L += ml[2 * s + 1] * w;
}
L = metal::simd_sum(L);
threadgroup_barrier(metal::mem_flags::mem_threadgroup);

float x[E];
for (int e = 0; e < E; ++e) {
  x[e] = 0.0f;
}
const device float* po = part_o + bh * NS * D + lane * E;
for (int s = warp; s < NS; s += WARPS) {
  const float w = weight[s];
  for (int e = 0; e < E; ++e) {
    x[e] += w * po[(ulong)s * D + e];
  }
}
if (warp > 0) {
  for (int e = 0; e < E; ++e) {
    sums[warp - 1][lane * E + e] = x[e];
  }
}
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
if (warp == 0) {
  for (int e = 0; e < E; ++e) {
    for (int w = 0; w < WARPS - 1; ++w) {
      x[e] += sums[w][lane * E + e];
    }
    x[e] = x[e] / L * signs[D + lane * E + e];
  }
  for (int len = 1; len < E; len <<= 1) {
    for (int e = 0; e < E; ++e) {
      if ((e & len) == 0) {
        const float a = x[e];
        const float b = x[e + len];
        x[e] = a + b;
        x[e + len] = a - b;
      }
    }
  }
  for (int len = E; len < D; len <<= 1) {
    const int m = len / E;
    for (int e = 0; e < E; ++e) {
      const float y = metal::simd_shuffle_xor(x[e], ushort(m));
      x[e] = (lane & m) ? y - x[e] : x[e] + y;
    }
  }
  for (int e = 0; e < E; ++e) {
    turbo_store(out + bh * D + lane * E + e, x[e] * signs[lane * E + e] * metal::rsqrt(float(D)));
  }
}
