// Metal twin of turbo_merge.cu: merges the splits of each (row, query head)
// and rotates the result back. One threadgroup of 256 threads per (row, head).
constexpr int THREADS = 256;
constexpr int SLICES = THREADS / D;     // threads summing one coordinate
threadgroup float weight[THREADS];
threadgroup float part[THREADS];
threadgroup float red[32];
threadgroup float o[D];
const int NS = part_ml_shape[2];
const ulong bh = threadgroup_position_in_grid.x;
const uint tid = thread_index_in_threadgroup;
const uint threads = threads_per_threadgroup.x;

const float m = int(tid) < NS ? part_ml[(bh * NS + tid) * 2] : TURBO_NEG_INF;
const float M = turbo_block_max(m, red, tid, threads);
const float e = (int(tid) < NS && M > TURBO_NEG_INF) ? metal::exp2(m - M) : 0.0f;
weight[tid] = e;
const float L = turbo_block_sum(int(tid) < NS ? part_ml[(bh * NS + tid) * 2 + 1] * e : 0.0f, red, tid, threads);
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
const int d = int(tid) % D;
float A = 0.0f;
for (int s = int(tid) / D; s < NS; s += SLICES) {
  A += weight[s] * part_o[(bh * NS + s) * D + d];
}
part[tid] = A;
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
if (int(tid) < D) {
  float t = 0.0f;
  for (int k = 0; k < SLICES; ++k) {
    t += part[k * D + tid];
  }
  o[tid] = (L > 0.0f ? t / L : 0.0f) * signs[D + tid];
}
turbo_hadamard(o, D, 1, tid, threads);
if (int(tid) < D) {
  turbo_store(out + bh * D + tid, o[tid] * signs[tid] * metal::rsqrt(float(D)));
}
