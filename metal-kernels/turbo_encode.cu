// Encodes one new token's key and value per (row, KV head) into the TurboQuant
// columns (turbo_common.cuh has the layouts): rotation R(x) = s2 ⊙ H(s1 ⊙ x)/√D,
// then 8-bit affine keys (KFMT 0: o0 packed uint32, o1 scales, o2 biases) or
// codebook keys (KFMT 1: o0 codes, o1 norm, o2 unused), and codebook values
// (o3 codes, o4 norm). One block of D threads per vector pair.
// Inputs: k, v [B, HKV, 1, D]; signs [3, D]; kbounds/kcent and vbounds/vcent
// (the codebooks, scaled for D).
__shared__ float x[D];
__shared__ int codes[D];
__shared__ float red[32];
__shared__ float group_lo[D];
__shared__ float group_hi[D];
const int bh = blockIdx.x;
const int d = threadIdx.x;
const float inv_sqrt_d = rsqrtf((float)D);

// Key.
x[d] = static_cast<float>(k[(size_t)bh * D + d]) * signs[d];
turbo_hadamard(x, D, 1);
x[d] *= signs[D + d] * inv_sqrt_d;
__syncthreads();
if (KFMT == 0) {
  const int g = d / KG;
  if (d % KG == 0) {
    float lo = x[d];
    float hi = x[d];
    for (int i = 1; i < KG; ++i) {
      lo = fminf(lo, x[d + i]);
      hi = fmaxf(hi, x[d + i]);
    }
    group_lo[g] = lo;
    group_hi[g] = hi;
  }
  __syncthreads();
  const float lo = group_lo[g];
  const float step = (group_hi[g] - lo) / 255.0f;
  int q = step > 0.0f ? __float2int_rn((x[d] - lo) / step) : 0;
  codes[d] = min(max(q, 0), 255);
  __syncthreads();
  if ((d & 3) == 0) {
    uint32_t w = 0;
    for (int i = 0; i < 4; ++i) {
      w |= (uint32_t)codes[d + i] << (8 * i);
    }
    o0[(size_t)bh * (D / 4) + (d >> 2)] = w;
  }
  if (d % KG == 0) {
    turbo_store(o1 + (size_t)bh * (D / KG) + g, step);
    turbo_store(o2 + (size_t)bh * (D / KG) + g, lo);
  }
} else {
  uint8_t* row = reinterpret_cast<uint8_t*>(o0) + (size_t)bh * (D * KBITS / 8);
  float n = turbo_codebook_encode<KBITS>(x, codes, red, kbounds, kcent, row, D);
  if (d == 0) {
    turbo_store(o1 + bh, n);
  }
}
__syncthreads();

// Value.
x[d] = static_cast<float>(v[(size_t)bh * D + d]) * signs[d];
turbo_hadamard(x, D, 1);
x[d] *= signs[D + d] * inv_sqrt_d;
__syncthreads();
float vn = turbo_codebook_encode<VBITS>(x, codes, red, vbounds, vcent, o3 + (size_t)bh * (D * VBITS / 8), D);
if (d == 0) {
  turbo_store(o4 + bh, vn);
}
