// Finishes TurboQuant decode attention for each (row, query head): merges
// turbo_attend.cu's per-split partials (split 0's include the sinks) and
// rotates the result back: o = s1 ⊙ H(s2 ⊙ õ)/√D. With ROT = 0 it only
// merges (dense_attend.cu's partials; `signs` is then not read). One block
// of 4 warps per (row, query head): every warp finds the common max and the
// weights of the splits (by shuffles), sums its quarter of the splits for all
// D coordinates (a lane's D/32 consecutive ones), the warps' sums add in
// shared memory, and warp 0 runs the Walsh-Hadamard transform on its
// registers, across lanes by shuffles. Inputs: part_o [B, HQ, NS, D], part_ml [B, HQ, NS, 2] (NS at most
// 256), signs [3, D]. Output: out [B, HQ, 1, D] of type T. 128 threads a
// block (kernels.rs).
constexpr int WARPS = 4;
constexpr int E = D / 32;               // coordinates a lane owns: lane * E ..
__shared__ float weight[256];
__shared__ float sums[WARPS - 1][D];
const int NS = part_ml_shape[2];
const size_t bh = blockIdx.x;
const int lane = threadIdx.x & 31;
const int warp = threadIdx.x >> 5;
const float* ml = part_ml + bh * NS * 2;

float M = TURBO_NEG_INF;
for (int s = lane; s < NS; s += 32) {
  M = fmaxf(M, ml[2 * s]);
}
M = turbo_warp_max(M);
float L = 0.0f;
for (int s = lane; s < NS; s += 32) {
  const float w = exp2f(ml[2 * s] - M);   // an empty split: max -inf, weight 0
  if (warp == 0) {
    weight[s] = w;
  }
  L += ml[2 * s + 1] * w;
}
L = turbo_warp_sum(L);
__syncthreads();

float x[E];
#pragma unroll
for (int e = 0; e < E; ++e) {
  x[e] = 0.0f;
}
const float* po = part_o + bh * NS * D + lane * E;
#pragma unroll 4
for (int s = warp; s < NS; s += WARPS) {
  const float w = weight[s];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    x[e] += w * po[(size_t)s * D + e];
  }
}
if (warp > 0) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    sums[warp - 1][lane * E + e] = x[e];
  }
}
__syncthreads();
if (warp == 0) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    for (int w = 0; w < WARPS - 1; ++w) {
      x[e] += sums[w][lane * E + e];
    }
    x[e] = x[e] / L;
  }
}
if (warp == 0 && ROT == 0) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    turbo_store(out + bh * D + lane * E + e, x[e]);
  }
} else if (warp == 0) {
#pragma unroll
  for (int e = 0; e < E; ++e) {
    x[e] *= signs[D + lane * E + e];
  }
  // The unnormalized transform: pairs within a lane, then across lanes.
#pragma unroll
  for (int len = 1; len < E; len <<= 1) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      if ((e & len) == 0) {
        const float a = x[e];
        const float b = x[e + len];
        x[e] = a + b;
        x[e + len] = a - b;
      }
    }
  }
#pragma unroll
  for (int len = E; len < D; len <<= 1) {
    const int m = len / E;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float y = __shfl_xor_sync(0xffffffff, x[e], m);
      x[e] = (lane & m) ? y - x[e] : x[e] + y;
    }
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    turbo_store(out + bh * D + lane * E + e, x[e] * signs[lane * E + e] * rsqrtf((float)D));
  }
}
