// Metal twin of turbo_merge.cu: merges the splits of each (row, query head)
// and rotates the result back. One threadgroup of D threads per (row, head).
threadgroup float o[D];
const uint bh = threadgroup_position_in_grid.x;
const uint tid = thread_index_in_threadgroup;
const int d = int(tid);
float M = TURBO_NEG_INF;
for (int s = 0; s < NS; ++s) {
  M = metal::max(M, part_ml[(bh * NS + s) * 2]);
}
float L = 0.0f;
float A = 0.0f;
if (M > TURBO_NEG_INF) {
  for (int s = 0; s < NS; ++s) {
    const uint p = bh * NS + s;
    const float e = metal::fast::exp(part_ml[p * 2] - M);
    L += part_ml[p * 2 + 1] * e;
    A += part_o[p * D + d] * e;
  }
}
o[d] = (L > 0.0f ? A / L : 0.0f) * signs[D + d];
turbo_hadamard(o, D, 1, tid, threads_per_threadgroup.x);
turbo_store(out + bh * D + d, o[d] * signs[d] * metal::rsqrt(float(D)));
