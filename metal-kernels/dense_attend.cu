// Split-K decode attention over a KV cache whose rows start at their own
// first position: one query per row. It serves two caches MLX 0.32's CUDA
// backend has no fused decode attention for:
//  - 16-bit (or float32) keys and values (BITS 0) in batches whose rows have
//    other lengths (left-padded, mlx-lm's BatchKVCache layout), which MLX's
//    CUDA attention only runs unfused (matmul, mask, softmax, matmul) because
//    neither its vector kernel nor cuDNN's decode path takes an array mask;
//  - affine-quantized keys and values (BITS 8 or 4, `--kv-bits`: MLX's
//    quantize layout, codes packed low bits first into uint32 words, a scale
//    and a bias of type T for each group of GS coordinates), which MLX's CUDA
//    quantized matmuls refuse at attention's shapes: read as codes, never
//    dequantized into a copy of the history.
//
// Block (row b, KV head g, split s) takes the s-th slice of the row's valid
// positions [first, written) for every query head of the KV head's group, by
// turbo_lane_attend (turbo_common.cuh: a lane reads 8 coordinates of a
// position, each lane group keeps its own online softmax), into the partial
// that the group's last block to finish combines over the splits
// (turbo_merge_if_last, without the rotation). Scores are in base 2
// (the query carries log2(e)), as the merge expects.
// Inputs: q [B, HQ, 1, D]; k, v [B, HKV, CAP, D] of T (BITS 0) or [B, HKV,
// CAP, D * BITS / 32] uint32 (whole buffers; CAP >= written); params [2 + B]
// int32: positions written (the same for all rows), the scale's float bits,
// each row's first valid position; ks, kb, vs, vb [B, HKV, CAP, D / GS]: the
// scales and biases (BITS 0: not read; any arrays stand in).
// counts [B * HKV] uint32: zeros, one per (row, KV head) group (see
// turbo_merge_if_last: the last split of a group to finish merges it).
// Outputs: part_o [B, HQ, NS, D], part_ml [B, HQ, NS, 2] (float32); NS is the
// grid's blocks per (row, KV head); out [B, HQ, 1, D] of type T: the merged
// attention. 128 threads a block (kernels.rs).
// Template constants beside T, D, REP, BITS, GS: U, a lane's positions an
// iteration of turbo_lane_attend's loop, and QS (1: the query read from
// shared memory at each use; kernels.rs `lane_loop`).
constexpr int THREADS = 128;
constexpr int WARPS = THREADS / 32;
static_assert(REP >= 1 && REP <= 8, "1 to 8 query heads per KV head");
__shared__ __align__(16) float qs[REP * D];
__shared__ float mw[WARPS * REP];
__shared__ float lw[WARPS * REP];
__shared__ __align__(16) float accw[REP * D];

const int B = q_shape[0];
const int HQ = q_shape[1];
const int HKV = k_shape[1];
const int CAP = k_shape[2];
const int NS = gridDim.x / (B * HKV);
const int blk = blockIdx.x;
const int split = blk % NS;
const int g = (blk / NS) % HKV;
const int b = blk / (NS * HKV);
const int tid = threadIdx.x;

const int written = params[0];
const int first = params[2 + b];
const float qscale = __int_as_float(params[1]) * 1.4426950408889634f;
for (int i = tid; i < REP * D; i += THREADS) {
  qs[i] = static_cast<float>(q[(size_t)(b * HQ + g * REP) * D + i]) * qscale;
}
const int len = written > first ? written - first : 0;
const int per = (len + NS - 1) / NS;
const int t0 = first + split * per;
const int t1 = min(written, t0 + per);
__syncthreads();
turbo_lane_attend<T, BITS, GS, D, REP, U, QS != 0>(qs, k, v, ks, kb, vs, vb, ((size_t)b * HKV + g) * CAP, t0, t1, mw, lw, accw,
                                        part_o, part_ml, (size_t)(b * HQ + g * REP) * NS + split, NS);
turbo_merge_if_last<T, D, 0, REP>(counts, (size_t)b * HKV + g, NS, part_o, part_ml, part_ml, out, (size_t)b * HQ + g * REP);
