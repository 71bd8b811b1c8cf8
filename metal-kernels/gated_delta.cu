// The gated delta rule over a sequence (Gated DeltaNet: Qwen3.5, Qwen3-Next).
// One warp per (row b, value head hv, value feature dv): its 32 lanes hold
// the state row S[dv, :] (Dk floats, Dk/32 per lane) in registers for all T
// tokens, and per token
//   S *= g;  m = S·k;  S += k (v[dv] - m) beta;  y[dv] = S·q
// with the two dot products summed across the warp by xor shuffles.
// Inputs: q, k [B, T, Hk, Dk] and v [B, T, Hv, Dv] of type InT, g [B, T, Hv]
// float32, beta [B, T, Hv] of type InT, state_in [B, Hv, Dv, Dk] float32.
// Outputs: y [B, T, Hv, Dv] of type InT, state_out like state_in.
// Query/key head hk serves value heads hk * Hv/Hk .. (hk + 1) * Hv/Hk - 1.
constexpr int NPT = Dk / 32;
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

const InT* q_ = q + (size_t)b * T * Hk * Dk + hk * Dk + lane * NPT;
const InT* k_ = k + (size_t)b * T * Hk * Dk + hk * Dk + lane * NPT;
const InT* v_ = v + (size_t)b * T * Hv * Dv + hv * Dv + dv;
InT* y_ = y + (size_t)b * T * Hv * Dv + hv * Dv + dv;
const float* g_ = g + (size_t)b * T * Hv + hv;
const InT* beta_ = beta + (size_t)b * T * Hv + hv;
const size_t row = (n * Dv + dv) * Dk + lane * NPT;

float s[NPT];
for (int i = 0; i < NPT; ++i) {
  s[i] = state_in[row + i];
}
for (int t = 0; t < T; ++t) {
  const float gt = g_[0];
  float m = 0.0f;
  for (int i = 0; i < NPT; ++i) {
    s[i] *= gt;
    m += s[i] * static_cast<float>(k_[i]);
  }
  for (int o = 1; o < 32; o <<= 1) {
    m += __shfl_xor_sync(0xffffffff, m, o);
  }
  const float delta = (static_cast<float>(v_[0]) - m) * static_cast<float>(beta_[0]);
  float out = 0.0f;
  for (int i = 0; i < NPT; ++i) {
    s[i] += static_cast<float>(k_[i]) * delta;
    out += s[i] * static_cast<float>(q_[i]);
  }
  for (int o = 1; o < 32; o <<= 1) {
    out += __shfl_xor_sync(0xffffffff, out, o);
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
  state_out[row + i] = s[i];
}
