// A mixture-of-experts router in one launch: for each row of the router's
// logits [..., E], the K experts it routes to and their mixing scores, where
// MLX's ops take up to five launches (softmax, argpartition, take_along_axis,
// and for normalized scores a sum and a divide; argpartition's slice is a
// view); a decode step on CUDA is bound by the host's cost per launch
// (models/router_kernel.rs).
// One warp per row: lane l holds experts l, l + 32, ... (PER of them).
// Template: T the logits' dtype (the scores' too), E experts, K chosen,
// SOFTMAX_FIRST (1: softmax over all E, then the K largest probabilities;
// 0: the K largest logits, then a softmax over those K), NORM (the K scores
// divided by their sum), TIE_HIGH (of equal values the higher expert counts
// as larger, as argpartition's last K of a stable ascending order take it;
// 0: the lower, as its first K of the negated values do). The roundings are
// MLX's ops': the softmax in float32 rounded to T, the sum rounded to T
// before the divide.
// Outputs: inds [..., K] uint32 and scores [..., K] T, largest first.
constexpr int PER = (E + 31) / 32;
const float NEG_INF = __int_as_float(0xff800000);
size_t rows = 1;
for (int i = 0; i < logits_ndim - 1; ++i) {
  rows *= logits_shape[i];
}
const size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32;
const int lane = threadIdx.x % 32;
if (row >= rows) {
  return;
}
const T* x = logits + row * E;

// The values the experts are chosen by: logits, or their softmax as T.
float v[PER];
#pragma unroll
for (int i = 0; i < PER; ++i) {
  const int e = lane + 32 * i;
  v[i] = e < E ? static_cast<float>(x[e]) : NEG_INF;
}
if (SOFTMAX_FIRST) {
  float m = NEG_INF;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    m = fmaxf(m, v[i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  }
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    v[i] = lane + 32 * i < E ? expf(v[i] - m) : 0.0f;
    s += v[i];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffff, s, o);
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    v[i] = lane + 32 * i < E ? static_cast<float>(static_cast<T>(v[i] / s)) : NEG_INF;
  }
}

// K rounds of a warp-wide argmax over the experts not yet chosen. A lane
// with any left offers its largest (one of its left while all are -inf, so
// every round chooses a real expert); the warp keeps the largest value, ties
// as TIE_HIGH says. NaN counts as -inf, so the order is total and every
// lane ends a round with the same choice.
#pragma unroll
for (int i = 0; i < PER; ++i) {
  v[i] = isnan(v[i]) ? NEG_INF : v[i];
}
uint32_t taken = 0;
float val[K];
uint32_t idx[K];
#pragma unroll
for (int j = 0; j < K; ++j) {
  float best = NEG_INF;
  uint32_t bi = 0xffffffffu;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const uint32_t e = lane + 32 * i;
    if (e < E && !((taken >> i) & 1u) && (bi == 0xffffffffu || v[i] > best || (TIE_HIGH && v[i] == best))) {
      best = v[i];
      bi = e;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffff, best, o);
    const uint32_t oi = __shfl_xor_sync(0xffffffff, bi, o);
    if (oi != 0xffffffffu && (bi == 0xffffffffu || ob > best || (ob == best && (TIE_HIGH ? oi > bi : oi < bi)))) {
      best = ob;
      bi = oi;
    }
  }
  if (bi % 32 == (uint32_t)lane) {
    taken |= 1u << (bi / 32);
  }
  val[j] = best;
  idx[j] = bi;
}

// The scores, as MLX's ops round them.
float score[K];
if (SOFTMAX_FIRST) {
#pragma unroll
  for (int j = 0; j < K; ++j) {
    score[j] = val[j];
  }
} else {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    score[j] = expf(val[j] - val[0]);
    s += score[j];
  }
#pragma unroll
  for (int j = 0; j < K; ++j) {
    score[j] = static_cast<float>(static_cast<T>(score[j] / s));
  }
}
if (NORM) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    s += score[j];
  }
  s = static_cast<float>(static_cast<T>(s));
#pragma unroll
  for (int j = 0; j < K; ++j) {
    score[j] = score[j] / s;
  }
}
if (lane == 0) {
#pragma unroll
  for (int j = 0; j < K; ++j) {
    inds[row * K + j] = idx[j];
    scores[row * K + j] = static_cast<T>(score[j]);
  }
}
