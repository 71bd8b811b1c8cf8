// Encodes new tokens' keys and values per (row, KV head, position) into their
// TurboQuant rows (codec.rs has the layout): rotation R(x) = s2 ⊙ H(s1 ⊙ x)/√D,
// then 8-bit affine keys (KFMT 0: packed uint32 codes; scales and biases of
// type T) or codebook keys (KFMT 1: codes; a float16 norm), and codebook
// values (codes; a float16 norm). A row holds the key codes, the value codes,
// the key's scales or norm, the value's norm, zeros to 4 bytes. One block of
// D threads per vector pair.
// Inputs: k, v [B, HKV, L, D]; signs [3, D]; kbounds/kcent and vbounds/vcent
// (the codebooks, scaled for D). Outputs: o [B, HKV, L, ROW] uint8; rkv
// [B, HKV, 2, 1, D] of type T: the last position's rotated key and value as
// they were before quantization (a decode step's entry in the recent window,
// recent.rs, in its layout: one update puts both in).
// With TURBO_ENCODE_STEP 1 (a decode step's form, kernels.rs
// `encode_step`) the window itself is the output instead of rkv: inputs also
// win [B, HKV, 2, ROOM, D] of type T (the window's buffer before the step) and
// moves [2] int32 (src, keep); output nwin [B, HKV, 2, ROOM, D]: slots below
// `keep` are win's slots from `src` on, slot `keep` this position's rotated
// key and value, the rest zeros (recent.rs `Recent::step_moves`: the push and, once
// the room is used up, the move down to the newest positions, in this launch
// instead of a slice update a layer). The grid's blocks past the B * HKV * L
// encoding ones copy the window, CB a head (the grid's extra blocks per head):
// one block copying a head's whole window was the launch's longest path.
constexpr int KB = KFMT == 0 ? D : D * KBITS / 8;
constexpr int VB = D * VBITS / 8;
constexpr int NKG = KFMT == 0 ? D / KG : 1;
constexpr int SOFF = KB + VB;
constexpr int NOFF = SOFF + (KFMT == 0 ? 2 * NKG * (int)sizeof(T) : 2);
constexpr int ROW = (NOFF + 2 + 3) / 4 * 4;
__shared__ float x[D];
__shared__ int codes[D];
__shared__ float red[32];
__shared__ float group_lo[D / 32];   // each warp's range
__shared__ float group_hi[D / 32];
const int bh = blockIdx.x;
const int d = threadIdx.x;
const int L = k_shape[2];
const bool newest = bh % L == L - 1;    // the last position: also written to rkv
#if TURBO_ENCODE_STEP
const int ROOM = win_shape[3];
const int keep = moves[1];
const int NB = k_shape[0] * k_shape[1] * L;
if (bh >= NB) {
  // A copy block: part `part` of head `hd`'s 2 x ROOM x D window (keys at
  // slots 0.., values ROOM slots after) in 16-byte pieces (a piece stays in
  // one slot: D * sizeof(T) is a multiple of 16), UNR pieces a thread loaded
  // before any is stored (so their loads are in flight together; the
  // compiler cannot move a load of `win` past a store to `nwin` itself).
  // Slot `keep` is left to the new position's stores.
  constexpr int VEC = 16 / (int)sizeof(T);
  constexpr int UNR = 8;
  const int CB = gridDim.x / NB - 1;
  const int hd = (bh - NB) / CB;
  const int part = (bh - NB) % CB;
  const size_t head0 = (size_t)hd * 2 * ROOM * D;
  const int src = moves[0];
  const int pieces = 2 * ROOM * D / VEC;
  for (int p0 = part * UNR * D + d; p0 < pieces; p0 += CB * UNR * D) {
    uint4 val[UNR];
    int slot[UNR];
#pragma unroll
    for (int j = 0; j < UNR; ++j) {
      const int e = (p0 + j * D) * VEC;
      slot[j] = p0 + j * D < pieces ? (e / D) % ROOM : keep;
      val[j] = make_uint4(0, 0, 0, 0);
      if (slot[j] < keep) {
        const size_t from = (size_t)(e / (ROOM * D)) * ROOM * D + (size_t)(src + slot[j]) * D + e % D;
        val[j] = *reinterpret_cast<const uint4*>(win + head0 + from);
      }
    }
#pragma unroll
    for (int j = 0; j < UNR; ++j) {
      if (slot[j] != keep) {
        *reinterpret_cast<uint4*>(nwin + head0 + (size_t)(p0 + j * D) * VEC) = val[j];
      }
    }
  }
  return;
}
// Where the newest position's rotated key and value go (coordinate d) in its
// head's window.
const size_t wbase = (size_t)(bh / L) * 2 * ROOM * D + d;
T* const newest_out = nwin;
const size_t key_at = wbase + (size_t)keep * D;
const size_t value_at = key_at + (size_t)ROOM * D;
#else
T* const newest_out = rkv;
const size_t key_at = (size_t)(bh / L) * 2 * D + d;
const size_t value_at = key_at + D;
#endif
const float inv_sqrt_d = rsqrtf((float)D);
uint8_t* row = o + (size_t)bh * ROW;
if (d < ROW - (NOFF + 2)) {
  row[NOFF + 2 + d] = 0;
}

// Key.
x[d] = static_cast<float>(k[(size_t)bh * D + d]) * signs[d];
turbo_hadamard(x, D, 1);
x[d] *= signs[D + d] * inv_sqrt_d;
__syncthreads();
if (newest) {
  turbo_store(newest_out + key_at, x[d]);
}
if (KFMT == 0) {
  // Each group's range: every warp's by shuffles, then the group's warps'
  // (a group is KG / 32 warps).
  const int g = d / KG;
  float lo = x[d];
  float hi = lo;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    lo = fminf(lo, __shfl_xor_sync(0xffffffff, lo, o));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffff, hi, o));
  }
  if ((d & 31) == 0) {
    group_lo[d >> 5] = lo;
    group_hi[d >> 5] = hi;
  }
  __syncthreads();
  for (int w = g * (KG / 32); w < (g + 1) * (KG / 32); ++w) {
    lo = fminf(lo, group_lo[w]);
    hi = fmaxf(hi, group_hi[w]);
  }
  const float step = (hi - lo) / 255.0f;
  int q = step > 0.0f ? __float2int_rn((x[d] - lo) / step) : 0;
  codes[d] = min(max(q, 0), 255);
  __syncthreads();
  if ((d & 3) == 0) {
    uint32_t w = 0;
    for (int i = 0; i < 4; ++i) {
      w |= (uint32_t)codes[d + i] << (8 * i);
    }
    reinterpret_cast<uint32_t*>(row)[d >> 2] = w;
  }
  if (d % KG == 0) {
    turbo_store(reinterpret_cast<T*>(row + SOFF) + g, step);
    turbo_store(reinterpret_cast<T*>(row + SOFF) + NKG + g, lo);
  }
} else {
  float n = turbo_codebook_encode<KBITS>(x, codes, red, kbounds, kcent, row, D);
  if (d == 0) {
    turbo_store(reinterpret_cast<__half*>(row + SOFF), n);
  }
}
__syncthreads();

// Value.
x[d] = static_cast<float>(v[(size_t)bh * D + d]) * signs[d];
turbo_hadamard(x, D, 1);
x[d] *= signs[D + d] * inv_sqrt_d;
__syncthreads();
if (newest) {
  turbo_store(newest_out + value_at, x[d]);
}
float vn = turbo_codebook_encode<VBITS>(x, codes, red, vbounds, vcent, row + KB, D);
if (d == 0) {
  turbo_store(reinterpret_cast<__half*>(row + NOFF), vn);
}
