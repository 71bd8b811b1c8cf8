// The gated delta rule over a sequence (Gated DeltaNet: Qwen3.5, Qwen3-Next).
// One warp per (row b, value head hv, value feature dv): its 32 lanes hold
// the state row S[dv, :] in registers for all T tokens, and per token
//   S *= g;  m = S·k;  S += k (v[dv] - m) beta;  y[dv] = S·q
// with the arithmetic of mlx-lm's ops on CUDA (`_gated_delta_step_ops`, which
// mlx-lm compiles: MLX fuses its elementwise ops into kernels between the two
// sums), so that the tokens are theirs. The products the sums read are
// rounded before they are added, the sums run as MLX's row reduction sums a
// float32 row of Dk (one warp; lane l holds elements r*128 + 4l + j, r-major,
// j-minor, from 0, adding 0 past Dk; then xor shuffles from 16 down to 1),
// and the state update S + k·delta is one fused multiply-add, as NVRTC
// contracts it inside MLX's fused kernel (MLX compiles without --fmad=false;
// on an H200 the update unfused left mlx-lm's Qwen3.5 tokens at token 18, fused
// it keeps all 64: bench/results/parity/h200-s52).
// Inputs: q, k [B, T, Hk, Dk] and v [B, T, Hv, Dv] of type InT, g [B, T, Hv]
// float32, beta [B, T, Hv] of type InT, state_in [B, Hv, Dv, Dk] float32.
// Outputs: y [B, T, Hv, Dv] of type InT, state_out like state_in.
// Query/key head hk serves value heads hk * Hv/Hk .. (hk + 1) * Hv/Hk - 1.
constexpr int NPT = 4 * ((Dk + 127) / 128);
const int B = q_shape[0];
const int T = q_shape[1];
const size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
const int lane = threadIdx.x % 32;
if (warp >= (size_t)B * Hv * Dv) {
  return;
}
const size_t n = warp / Dv;
const int dv = warp % Dv;
const int b = n / Hv;
const int hv = n % Hv;
const int hk = hv / (Hv / Hk);

// Element i of this lane's share of a row: where MLX's row reduction reads it.
int e[NPT];
for (int i = 0; i < NPT; ++i) {
  e[i] = (i / 4) * 128 + lane * 4 + i % 4;
}
const InT* q_ = q + (size_t)b * T * Hk * Dk + hk * Dk;
const InT* k_ = k + (size_t)b * T * Hk * Dk + hk * Dk;
const InT* v_ = v + (size_t)b * T * Hv * Dv + hv * Dv + dv;
InT* y_ = y + (size_t)b * T * Hv * Dv + hv * Dv + dv;
const float* g_ = g + (size_t)b * T * Hv + hv;
const InT* beta_ = beta + (size_t)b * T * Hv + hv;
const size_t row = (n * Dv + dv) * Dk;

float s[NPT];
for (int i = 0; i < NPT; ++i) {
  s[i] = e[i] < Dk ? state_in[row + e[i]] : 0.0f;
}
for (int t = 0; t < T; ++t) {
  const float gt = g_[0];
  float m = 0.0f;
  for (int i = 0; i < NPT; ++i) {
    s[i] = __fmul_rn(s[i], gt);
    m = __fadd_rn(m, e[i] < Dk ? __fmul_rn(s[i], static_cast<float>(k_[e[i]])) : 0.0f);
  }
  for (int o = 16; o > 0; o >>= 1) {
    m = __fadd_rn(m, __shfl_xor_sync(0xffffffff, m, o));
  }
  const float delta = __fmul_rn(__fsub_rn(static_cast<float>(v_[0]), m), static_cast<float>(beta_[0]));
  float out = 0.0f;
  for (int i = 0; i < NPT; ++i) {
    if (e[i] < Dk) {
      s[i] = __fmaf_rn(static_cast<float>(k_[e[i]]), delta, s[i]);
    }
    out = __fadd_rn(out, e[i] < Dk ? __fmul_rn(s[i], static_cast<float>(q_[e[i]])) : 0.0f);
  }
  for (int o = 16; o > 0; o >>= 1) {
    out = __fadd_rn(out, __shfl_xor_sync(0xffffffff, out, o));
  }
  if (lane == 0) {
    y_[0] = static_cast<InT>(out);
  }
  q_ += Hk * Dk;
  k_ += Hk * Dk;
  v_ += Hv * Dv;
  y_ += Hv * Dv;
  g_ += Hv;
  beta_ += Hv;
}
for (int i = 0; i < NPT; ++i) {
  if (e[i] < Dk) {
    state_out[row + e[i]] = s[i];
  }
}
