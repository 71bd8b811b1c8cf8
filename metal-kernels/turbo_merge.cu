// Merges turbo_attend.cu's per-split partials of each (row, query head) and
// rotates the result back: o = s1 ⊙ H(s2 ⊙ õ)/√D. One block of 256 threads
// per (row, query head): a thread per split finds the common max and the
// weights (scores are in base 2), then 256 / D threads per coordinate sum
// the splits' accumulators. Inputs: part_o [B, HQ, NS, D], part_ml
// [B, HQ, NS, 2] (NS at most 256), signs [3, D]. Output: out [B, HQ, 1, D] of
// type T.
constexpr int THREADS = 256;
constexpr int SLICES = THREADS / D;     // threads summing one coordinate
__shared__ float weight[THREADS];
__shared__ float part[THREADS];
__shared__ float red[32];
__shared__ float o[D];
const int NS = part_ml_shape[2];
const size_t bh = blockIdx.x;
const int tid = threadIdx.x;

const float m = tid < NS ? part_ml[(bh * NS + tid) * 2] : TURBO_NEG_INF;
const float M = turbo_block_max(m, red);
const float e = (tid < NS && M > TURBO_NEG_INF) ? exp2f(m - M) : 0.0f;
weight[tid] = e;
const float L = turbo_block_sum(tid < NS ? part_ml[(bh * NS + tid) * 2 + 1] * e : 0.0f, red);
__syncthreads();
const int d = tid % D;
float A = 0.0f;
for (int s = tid / D; s < NS; s += SLICES) {
  A += weight[s] * part_o[(bh * NS + s) * D + d];
}
part[tid] = A;
__syncthreads();
if (tid < D) {
  float t = 0.0f;
  for (int k = 0; k < SLICES; ++k) {
    t += part[k * D + tid];
  }
  o[tid] = (L > 0.0f ? t / L : 0.0f) * signs[D + tid];
}
turbo_hadamard(o, D, 1);
if (tid < D) {
  turbo_store(out + bh * D + tid, o[tid] * signs[tid] * rsqrtf((float)D));
}
