// The gated delta rule over a sequence: gated_delta.cu's twin (same layout,
// same launch: a simdgroup per (row b, value head hv, value feature dv), its
// lanes holding the state row in registers; per token
//   S *= g;  m = S·k;  S += k (v[dv] - m) beta;  y[dv] = S·q).
// Inputs: q, k [B, T, Hk, Dk] and v [B, T, Hv, Dv] of type InT, g [B, T, Hv]
// float32, beta [B, T, Hv] of type InT, state_in [B, Hv, Dv, Dk] float32.
// Outputs: y [B, T, Hv, Dv] of type InT, state_out like state_in.
constexpr int NPT = Dk / 32;
const int B = q_shape[0];
const int T = q_shape[1];
const uint warp = thread_position_in_grid.x / 32;
const uint lane = thread_index_in_simdgroup;
if (warp >= uint(B * Hv * Dv)) {
  return;
}
const uint n = warp / Dv;
const int dv = warp % Dv;
const int b = n / Hv;
const int hv = n % Hv;
const int hk = hv / (Hv / Hk);

device const InT* q_ = q + b * T * Hk * Dk + hk * Dk + lane * NPT;
device const InT* k_ = k + b * T * Hk * Dk + hk * Dk + lane * NPT;
device const InT* v_ = v + b * T * Hv * Dv + hv * Dv + dv;
device InT* y_ = y + b * T * Hv * Dv + hv * Dv + dv;
device const float* g_ = g + b * T * Hv + hv;
device const InT* beta_ = beta + b * T * Hv + hv;
const uint row = (n * Dv + dv) * Dk + lane * NPT;

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
  m = simd_sum(m);
  const float delta = (static_cast<float>(v_[0]) - m) * static_cast<float>(beta_[0]);
  float out = 0.0f;
  for (int i = 0; i < NPT; ++i) {
    s[i] += static_cast<float>(k_[i]) * delta;
    out += s[i] * static_cast<float>(q_[i]);
  }
  out = simd_sum(out);
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
