// Metal twin of turbo_encode.cu: encodes each position's key and value into
// its TurboQuant row (codec.rs has the layout), and writes the last
// position's rotated key and value to rkv [B, HKV, 2, 1, D] (the recent
// window's entry, recent.rs). One threadgroup of D threads per vector pair.
// With TURBO_ENCODE_STEP 1 (a decode step's form, as in the CUDA twin) the
// window itself is the output: inputs also win [B, HKV, 2, ROOM, D] and moves
// [2] int32 (src, keep); output nwin: win's slots src.. below keep, this
// position at keep, zeros after; the threadgroups past the B * HKV * L
// encoding ones copy the window, CB a head (the grid's extra ones per head).
constexpr int KB = KFMT == 0 ? D : D * KBITS / 8;
constexpr int VB = D * VBITS / 8;
constexpr int NKG = KFMT == 0 ? D / KG : 1;
constexpr int SOFF = KB + VB;
constexpr int NOFF = SOFF + (KFMT == 0 ? 2 * NKG * (int)sizeof(T) : 2);
constexpr int ROW = (NOFF + 2 + 3) / 4 * 4;
threadgroup float x[D];
threadgroup int codes[D];
threadgroup float red[32];
threadgroup float group_lo[D / 32];   // each simdgroup's range
threadgroup float group_hi[D / 32];
const uint bh = threadgroup_position_in_grid.x;
const uint tid = thread_index_in_threadgroup;
const uint threads = threads_per_threadgroup.x;
const int d = int(tid);
const int L = int(k_shape[2]);
const bool newest = int(bh) % L == L - 1;   // the last position: also written to rkv
#if TURBO_ENCODE_STEP
const int ROOM = int(win_shape[3]);
const int keep = moves[1];
const int NB = int(k_shape[0] * k_shape[1]) * L;
if (int(bh) >= NB) {
  // A copy threadgroup: head hd's slots w = part, part + CB, ... of its keys
  // (w < ROOM) and values, coordinate d; slot keep is the new position's.
  const int CB = int(threadgroups_per_grid.x) / NB - 1;
  const int hd = (int(bh) - NB) / CB;
  const int part = (int(bh) - NB) % CB;
  const ulong head0 = (ulong)hd * 2 * ROOM * D + d;   // keys at slots 0.., values ROOM slots after
  const int src = moves[0];
  for (int w = part; w < 2 * ROOM; w += CB) {
    const int slot = w % ROOM;
    if (slot != keep) {
      const ulong at = head0 + (ulong)(w / ROOM) * ROOM * D;
      nwin[at + (ulong)slot * D] = slot < keep ? win[at + (ulong)(src + slot) * D] : static_cast<T>(0.0f);
    }
  }
  return;
}
const ulong wbase = (ulong)(int(bh) / L) * 2 * ROOM * D + d;   // this head's window
device T* newest_out = nwin;
const ulong key_at = wbase + (ulong)keep * D;
const ulong value_at = key_at + (ulong)ROOM * D;
#else
device T* newest_out = rkv;
const ulong key_at = (ulong)(int(bh) / L) * 2 * D + d;
const ulong value_at = key_at + D;
#endif
const float inv_sqrt_d = metal::rsqrt(float(D));
device uint8_t* row = o + bh * ROW;
if (d < ROW - (NOFF + 2)) {
  row[NOFF + 2 + d] = 0;
}

x[d] = static_cast<float>(k[bh * D + d]) * signs[d];
turbo_hadamard(x, D, 1, tid, threads);
x[d] *= signs[D + d] * inv_sqrt_d;
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
if (newest) {
  turbo_store(newest_out + key_at, x[d]);
}
if (KFMT == 0) {
  const int g = d / KG;
  float lo = metal::simd_min(x[d]);
  float hi = metal::simd_max(x[d]);
  if ((d & 31) == 0) {
    group_lo[d >> 5] = lo;
    group_hi[d >> 5] = hi;
  }
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  for (int w = g * (KG / 32); w < (g + 1) * (KG / 32); ++w) {
    lo = metal::min(lo, group_lo[w]);
    hi = metal::max(hi, group_hi[w]);
  }
  const float step = (hi - lo) / 255.0f;
  int q = step > 0.0f ? int(metal::rint((x[d] - lo) / step)) : 0;
  codes[d] = metal::clamp(q, 0, 255);
  threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  if ((d & 3) == 0) {
    uint w = 0;
    for (int i = 0; i < 4; ++i) {
      w |= uint(codes[d + i]) << (8 * i);
    }
    ((device uint*)row)[d >> 2] = w;
  }
  if (d % KG == 0) {
    turbo_store((device T*)(row + SOFF) + g, step);
    turbo_store((device T*)(row + SOFF) + NKG + g, lo);
  }
} else {
  float n = turbo_codebook_encode<KBITS>(x, codes, red, kbounds, kcent, row, D, tid, threads);
  if (d == 0) {
    turbo_store((device half*)(row + SOFF), n);
  }
}
threadgroup_barrier(metal::mem_flags::mem_threadgroup);

x[d] = static_cast<float>(v[bh * D + d]) * signs[d];
turbo_hadamard(x, D, 1, tid, threads);
x[d] *= signs[D + d] * inv_sqrt_d;
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
if (newest) {
  turbo_store(newest_out + value_at, x[d]);
}
float vnorm = turbo_codebook_encode<VBITS>(x, codes, red, vbounds, vcent, row + KB, D, tid, threads);
if (d == 0) {
  turbo_store((device half*)(row + NOFF), vnorm);
}
