// y = x @ Wᵀ with W affine-quantized (MLX's layout: BITS-bit values packed
// little-endian in uint32 words along a row, one scale and bias per GS values),
// for the few rows of a decode step, on tensor cores.
//
// Dense (QMM_GATHER 0): x [..., K] (M rows), w [N, K*BITS/32], scales/biases
// [N, K/GS], y [..., N], M <= 8 * MT. Gather (QMM_GATHER 1, MoE): w, scales,
// biases stacked [E, ...]; pair p multiplies row p / DIV of x by expert
// idx[p]'s matrix into row p of y (M = 1 per pair, pairs on the grid's y
// axis). Inputs and outputs are row-contiguous; their leading axes are read
// flat, so no reshape is needed around the call.
//
// Gated (QMM_GLU 1): a second weight set w_up, scales_up, biases_up of the
// same shape; y = silu(x @ wᵀ) * (x @ w_upᵀ), each product rounded to T and
// the gate applied op for op as MLX's compiled swiglu (qmm_swiglu), so the
// result equals the two products (with the same split) and MLX's swiglu
// exactly. A warp then owns RT tiles of each: RR = 2 * RT tiles of
// accumulators, the up tiles after the gate's.
//
// With a residual (QMM_RESIDUAL 1, dense only): an input `res` shaped as y;
// y = res + (x @ Wᵀ), the product rounded to T and added in T (one rounding,
// as MLX's Add does), as the layer's `h + o_proj(...)` computes it.
//
// Normed (QMM_NORM 1, dense, plain or gated): x is a layer's residual stream
// and the product takes rms_norm(x, nw, eps) in its place (eps's float bits
// as EPS_BITS), each block computing the rows' normalizers first and each
// loaded value normalized as MLX's rms_norm writes it (qmm_rms_apply).
//
// A warp owns RT tiles of 16 output features; the WK warps of a block split
// the k-blocks between them and sum in shared memory at the end. In a k-block
// (4 * SEG columns) the lane with quad index t reads one 16-byte run of each
// of its two rows (features g and g + 8): SEG = 128 / BITS values, all in one
// scale group since GS >= 32 >= SEG. Each mma.m16n8k16 takes A = 16 features x
// 16 columns of dequantized weights (T, exactly as MLX's dequantize rounds
// them) and B = 16 columns x 8 rows of x, accumulating in float. Which 4 of a
// lane's columns feed which mma step is free to choose, as long as A and B
// agree: the order used is the one the packed bits unpack into cheaply.
constexpr int SEG = 128 / BITS;
constexpr int KB = 4 * SEG;
constexpr int STEPS = SEG / 4;
constexpr int XW = SEG / 2;  // 32-bit words of x in a lane's run (2 values each)
constexpr int RR = QMM_GLU ? 2 * RT : RT;  // tiles of accumulators a warp owns

const int K = x_shape[x_ndim - 1];
#if QMM_GATHER
const int N = w_shape[1];
const int M = 1;
#else
const int N = w_shape[0];
int M = 1;
for (int i = 0; i + 1 < x_ndim; ++i) {
  M *= x_shape[i];
}
#endif
const int KW = K / (32 / BITS);
const int G = K / GS;
const int lane = threadIdx.x % 32;
const int warp = threadIdx.x / 32;
const int g = lane / 4;
const int t = lane % 4;
const int row0 = blockIdx.x * (16 * RT);

const uint32_t* wp = w;
const T* sp = scales;
const T* bp = biases;
#if QMM_GLU
const uint32_t* wp2 = w_up;
const T* sp2 = scales_up;
const T* bp2 = biases_up;
#endif
const T* xp = x;
T* yp = y;
#if QMM_GATHER
{
  const size_t pair = blockIdx.y;
  const size_t e = idx[pair];
  wp += e * N * KW;
  sp += e * N * G;
  bp += e * N * G;
#if QMM_GLU
  wp2 += e * N * KW;
  sp2 += e * N * G;
  bp2 += e * N * G;
#endif
  xp += (pair / DIV) * K;
  yp += pair * N;
}
#endif

#if QMM_NORM
// Each row's 1 / rms: a warp per row, its lanes summing 8 values a load.
__shared__ float inv_rms[32];
for (int m = warp; m < M; m += WK) {
  float sum = 0.0f;
  for (int k = lane * 8; k < K; k += 256) {
    const uint4 v = *reinterpret_cast<const uint4*>(xp + (size_t)m * K + k);
    sum += qmm_sum_squares<T>(v);
  }
  #pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  if (lane == 0) {
    inv_rms[m] = rsqrt(sum / K + __int_as_float(EPS_BITS));
  }
}
__syncthreads();
#endif

// Rows of this lane's A fragments (clamped for loads; stores check N).
int rows[RT][2];
#pragma unroll
for (int r = 0; r < RT; ++r) {
  rows[r][0] = min(row0 + r * 16 + g, N - 1);
  rows[r][1] = min(row0 + r * 16 + g + 8, N - 1);
}

float acc[RR][MT][4];
#pragma unroll
for (int r = 0; r < RR; ++r) {
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc[r][mt][i] = 0.0f;
    }
  }
}

const int nkb = (K + KB - 1) / KB;
for (int kb = warp; kb < nkb; kb += WK) {
  const int k0 = kb * KB + t * SEG;
  const bool live = k0 < K;
  uint4 wv[RR][2];
  T sc[RR][2], bi[RR][2];
  #pragma unroll
  for (int r = 0; r < RR; ++r) {
    // Tiles past RT are the up projection's, at the same features.
    const uint32_t* wr = wp;
    const T* sr = sp;
    const T* br = bp;
#if QMM_GLU
    if (r >= RT) {
      wr = wp2;
      sr = sp2;
      br = bp2;
    }
#endif
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const size_t row = rows[r % RT][h];
      if (live) {
        wv[r][h] = *reinterpret_cast<const uint4*>(wr + row * KW + k0 / (32 / BITS));
        sc[r][h] = sr[row * G + k0 / GS];
        bi[r][h] = br[row * G + k0 / GS];
      } else {
        wv[r][h] = make_uint4(0, 0, 0, 0);
        sc[r][h] = static_cast<T>(0.0f);
        bi[r][h] = static_cast<T>(0.0f);
      }
    }
  }
  uint32_t xv[MT][XW];
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int m = mt * 8 + g;
    #pragma unroll
    for (int i = 0; i < XW / 4; ++i) {
      uint4 v = make_uint4(0, 0, 0, 0);
      if (live && m < M) {
        v = reinterpret_cast<const uint4*>(xp + (size_t)m * K + k0)[i];
#if QMM_NORM
        v = qmm_rms_apply<T>(v, reinterpret_cast<const uint4*>(nw + k0)[i], inv_rms[m]);
#endif
      }
      xv[mt][4 * i] = v.x;
      xv[mt][4 * i + 1] = v.y;
      xv[mt][4 * i + 2] = v.z;
      xv[mt][4 * i + 3] = v.w;
    }
  }
  #pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    // Words of x holding this step's 4 columns, and where the two pairs sit.
    const int xa = BITS == 4 ? 4 * (s / 2) + s % 2 : 2 * s;
    const int xb = BITS == 4 ? xa + 2 : xa + 1;
    uint32_t a[RR][4];
    #pragma unroll
    for (int r = 0; r < RR; ++r) {
      #pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t* words = reinterpret_cast<const uint32_t*>(&wv[r][h]);
        if (BITS == 4) {
          const uint32_t word = words[s / 2];
          a[r][h] = qmm_dequant4<T>(word >> (8 * (s % 2)), sc[r][h], bi[r][h]);
          a[r][h + 2] = qmm_dequant4<T>(word >> (8 * (s % 2) + 4), sc[r][h], bi[r][h]);
        } else {
          const uint32_t word = words[s];
          a[r][h] = qmm_dequant8<T>(word, 0, 2, sc[r][h], bi[r][h]);
          a[r][h + 2] = qmm_dequant8<T>(word, 1, 3, sc[r][h], bi[r][h]);
        }
      }
    }
    #pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const uint32_t b0 = __byte_perm(xv[mt][xa], xv[mt][xb], 0x5410);
      const uint32_t b1 = __byte_perm(xv[mt][xa], xv[mt][xb], 0x7632);
      #pragma unroll
      for (int r = 0; r < RR; ++r) {
        qmm_mma<T>(acc[r][mt], a[r], b0, b1);
      }
    }
  }
}

// Split-K: warps 1.. hand their sums to warp 0 through shared memory.
if (WK > 1) {
  __shared__ float part[WK > 1 ? WK - 1 : 1][RR * MT * 4][32];
  if (warp > 0) {
    #pragma unroll
    for (int r = 0; r < RR; ++r) {
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
          part[warp - 1][(r * MT + mt) * 4 + i][lane] = acc[r][mt][i];
        }
      }
    }
  }
  __syncthreads();
  if (warp > 0) {
    return;
  }
  #pragma unroll
  for (int o = 0; o < WK - 1; ++o) {
    #pragma unroll
    for (int r = 0; r < RR; ++r) {
      #pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[r][mt][i] += part[o][(r * MT + mt) * 4 + i][lane];
        }
      }
    }
  }
}

// D fragment: c0, c1 at feature g, rows 2t, 2t + 1; c2, c3 at feature g + 8.
#pragma unroll
for (int r = 0; r < RT; ++r) {
  #pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = row0 + r * 16 + g + (i / 2) * 8;
      const int m = mt * 8 + 2 * t + i % 2;
      if (n < N && m < M) {
#if QMM_GLU
        yp[(size_t)m * N + n] = qmm_swiglu(static_cast<T>(acc[r][mt][i]), static_cast<T>(acc[r + RT][mt][i]));
#elif QMM_RESIDUAL
        yp[(size_t)m * N + n] = res[(size_t)m * N + n] + static_cast<T>(acc[r][mt][i]);
#else
        yp[(size_t)m * N + n] = static_cast<T>(acc[r][mt][i]);
#endif
      }
    }
  }
}
