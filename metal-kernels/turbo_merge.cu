// Finishes TurboQuant decode attention for each (row, query head): attends
// the row's 4 unquantized sinks itself, merges them with turbo_attend.cu's
// per-split partials and rotates the result back: o = s1 ⊙ H(s2 ⊙ õ)/√D.
// One block of 256 threads per (row, query head): the query is rotated as
// the attention kernel rotates it, a thread per split finds the common max
// and the weights (scores in base 2), then 256 / D threads per coordinate sum
// the splits' accumulators. Inputs: part_o [B, HQ, NS, D], part_ml
// [B, HQ, NS, 2] (NS at most 256), q [B, HQ, 1, D], sink_k, sink_v
// [B, HKV, 4, D] (rotated), signs [3, D], scale [1]. Output: out
// [B, HQ, 1, D] of type T.
constexpr int THREADS = 256;
constexpr int SLICES = THREADS / D;     // threads summing one coordinate
__shared__ float weight[THREADS];
__shared__ float part[THREADS];
__shared__ float red[32];
__shared__ float o[D];
__shared__ float sink_w[TURBO_SINKS];
const int NS = part_ml_shape[2];
const int HQ = q_shape[1];
const int HKV = sink_k_shape[1];
const size_t bh = blockIdx.x;
const size_t sinks = ((bh / HQ) * HKV + (bh % HQ) / (HQ / HKV)) * TURBO_SINKS;
const int tid = threadIdx.x;

// The sinks' scores against the rotated, scaled query.
if (tid < D) {
  o[tid] = static_cast<float>(q[bh * D + tid]) * signs[tid];
}
turbo_hadamard(o, D, 1);
const float qd = tid < D ? o[tid] * signs[D + tid] * scale[0] * rsqrtf((float)D) * 1.4426950408889634f : 0.0f;
float ms = TURBO_NEG_INF;
for (int s = 0; s < TURBO_SINKS; ++s) {
  const float v = turbo_block_sum(tid < D ? qd * static_cast<float>(sink_k[(sinks + s) * D + tid]) : 0.0f, red);
  if (tid == 0) {
    sink_w[s] = v;
  }
  ms = fmaxf(ms, v);
}

const float m = tid < NS ? part_ml[(bh * NS + tid) * 2] : TURBO_NEG_INF;
const float M = fmaxf(turbo_block_max(m, red), ms);
const float e = tid < NS ? exp2f(m - M) : 0.0f;
weight[tid] = e;
float Ls = 0.0f;
for (int s = 0; s < TURBO_SINKS; ++s) {
  Ls += exp2f(sink_w[s] - M);
}
const float L = turbo_block_sum(tid < NS ? part_ml[(bh * NS + tid) * 2 + 1] * e : 0.0f, red) + Ls;
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
  for (int s = 0; s < TURBO_SINKS; ++s) {
    t += exp2f(sink_w[s] - M) * static_cast<float>(sink_v[(sinks + s) * D + tid]);
  }
  o[tid] = t / L * signs[D + tid];
}
turbo_hadamard(o, D, 1);
if (tid < D) {
  turbo_store(out + bh * D + tid, o[tid] * signs[tid] * rsqrtf((float)D));
}
