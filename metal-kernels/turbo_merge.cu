// Merges turbo_attend.cu's per-split partials of each (row, query head) and
// rotates the result back: o = s1 ⊙ H(s2 ⊙ õ)/√D. One block of D threads per
// (row, query head). Inputs: part_o [B, HQ, NS, D], part_ml [B, HQ, NS, 2],
// signs [3, D]. Output: out [B, HQ, 1, D] of type T.
__shared__ float o[D];
const int bh = blockIdx.x;
const int d = threadIdx.x;
float M = TURBO_NEG_INF;
for (int s = 0; s < NS; ++s) {
  M = fmaxf(M, part_ml[((size_t)bh * NS + s) * 2]);
}
float L = 0.0f;
float A = 0.0f;
if (M > TURBO_NEG_INF) {
  for (int s = 0; s < NS; ++s) {
    const size_t p = (size_t)bh * NS + s;
    const float e = __expf(part_ml[p * 2] - M);
    L += part_ml[p * 2 + 1] * e;
    A += part_o[p * D + d] * e;
  }
}
o[d] = (L > 0.0f ? A / L : 0.0f) * signs[D + d];
turbo_hadamard(o, D, 1);
turbo_store(out + (size_t)bh * D + d, o[d] * signs[d] * rsqrtf((float)D));
