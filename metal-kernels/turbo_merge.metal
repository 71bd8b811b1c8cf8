// Metal twin of turbo_merge.cu (line for line; see its comments): attends
// the 4 unquantized sinks, merges them with the splits' partials and rotates
// the result back. One threadgroup of 256 threads per (row, query head).
constexpr int THREADS = 256;
constexpr int SLICES = THREADS / D;     // threads summing one coordinate
threadgroup float weight[THREADS];
threadgroup float part[THREADS];
threadgroup float red[32];
threadgroup float o[D];
threadgroup float sink_w[TURBO_SINKS];
const int NS = part_ml_shape[2];
const int HQ = q_shape[1];
const int HKV = sink_k_shape[1];
const ulong bh = threadgroup_position_in_grid.x;
const ulong sinks = ((bh / HQ) * HKV + (bh % HQ) / (HQ / HKV)) * TURBO_SINKS;
const uint tid = thread_index_in_threadgroup;
const uint threads = threads_per_threadgroup.x;

if (int(tid) < D) {
  o[tid] = static_cast<float>(q[bh * D + tid]) * signs[tid];
}
turbo_hadamard(o, D, 1, tid, threads);
const float qd = int(tid) < D ? o[tid] * signs[D + tid] * scale[0] * metal::rsqrt(float(D)) * 1.4426950408889634f : 0.0f;
float ms = TURBO_NEG_INF;
for (int s = 0; s < TURBO_SINKS; ++s) {
  const float v = turbo_block_sum(int(tid) < D ? qd * static_cast<float>(sink_k[(sinks + s) * D + tid]) : 0.0f, red, tid, threads);
  if (tid == 0) {
    sink_w[s] = v;
  }
  ms = metal::max(ms, v);
}

const float m = int(tid) < NS ? part_ml[(bh * NS + tid) * 2] : TURBO_NEG_INF;
const float M = metal::max(turbo_block_max(m, red, tid, threads), ms);
const float e = int(tid) < NS ? metal::exp2(m - M) : 0.0f;
weight[tid] = e;
float Ls = 0.0f;
for (int s = 0; s < TURBO_SINKS; ++s) {
  Ls += metal::exp2(sink_w[s] - M);
}
const float L = turbo_block_sum(int(tid) < NS ? part_ml[(bh * NS + tid) * 2 + 1] * e : 0.0f, red, tid, threads) + Ls;
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
  for (int s = 0; s < TURBO_SINKS; ++s) {
    t += metal::exp2(sink_w[s] - M) * static_cast<float>(sink_v[(sinks + s) * D + tid]);
  }
  o[tid] = t / L * signs[D + tid];
}
turbo_hadamard(o, D, 1, tid, threads);
if (int(tid) < D) {
  turbo_store(out + bh * D + tid, o[tid] * signs[tid] * metal::rsqrt(float(D)));
}
