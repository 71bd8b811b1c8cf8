/* mlx-serve's additions to the mlx-c library: custom MLX primitives that the
 * safe Rust crate (mlx-rs-safe) reaches through bindgen, like the rest of mlx-c.
 *
 * Conventions follow mlx-c: every function returns 0 on success and non-zero on
 * failure, after reporting the message through mlx-c's error handler. */
#ifndef MLX_SERVE_EXT_H
#define MLX_SERVE_EXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mlx/c/array.h"
#include "mlx/c/distributed_group.h"
#include "mlx/c/stream.h"
#include "mlx/c/string.h"
#include "mlx/c/vector.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A lazy array of `shape`/`dtype` whose bytes are read from file descriptor `fd`
 * at byte `offset` with pread(2) when the array is evaluated.
 *
 * It is always evaluated on the CPU stream: reading is a host operation, and the
 * buffer it fills is memory every backend can read (unified memory on Apple
 * silicon, CUDA managed memory in MLX's CUDA build).
 *
 * The array keeps its own duplicate of `fd` (closed when the array's graph node
 * is released), so the caller may close `fd` right after this call. A closed or
 * invalid `fd` fails here; a short file or a read error fails the evaluation,
 * with a message naming offset and length. */
int mlxs_pread_into(
    mlx_array* res,
    int fd,
    uint64_t offset,
    const int* shape,
    size_t ndim,
    mlx_dtype dtype);

/* Like mlxs_pread_into, for a slice of a tensor stored row-major in the file:
 * the output's bytes are consecutive blocks of `block_bytes`, block i read at
 * `offset + i * block_stride` (e.g. a column range of each row: the block is
 * the range's bytes, the stride a whole row's). The output's size must be a
 * multiple of `block_bytes`, and `block_stride` at least `block_bytes`. */
int mlxs_pread_blocks_into(
    mlx_array* res,
    int fd,
    uint64_t offset,
    uint64_t block_bytes,
    uint64_t block_stride,
    const int* shape,
    size_t ndim,
    mlx_dtype dtype);

/* The stream `group`'s collectives run on when called from this thread, as
 * MLX chooses it when none is given (what mlx-lm gets): the thread's CPU
 * stream for ring, MPI and JACCL, its GPU stream for NCCL. mlx-c's
 * collectives take an explicit stream; pass them this one. */
int mlxs_distributed_stream(mlx_stream* res, mlx_distributed_group group);

/* Takes the error MLX stored on CPU stream `stream`, if any: 1 and the
 * message (cut to `cap` bytes, NUL-terminated) when there was one, 0 when
 * none (or `stream` is not a CPU stream). Callable from any thread. A
 * collective that fails on a worker thread (a rank died) leaves its error
 * there, and the ring backend's later collectives then wait for ever; this
 * lets a watchdog see the failure while the thread that queued them is
 * blocked. Taking the error clears it. */
int mlxs_stream_take_error(mlx_stream stream, char* buf, size_t cap);

/* Makes the calling thread MLX's "main thread" (the first to use its
 * scheduler, as in a Python process) if no thread has used MLX's scheduler
 * yet: call it first thing from the thread that is to be it. On the main thread,
 * queueing work first throws (and clears) an error a stream stored, then
 * waits for that stream: when a failed collective has left the ring's later
 * collectives blocked, that wait never ends. Threads that run collectives
 * should not be the main thread; they then meet the error when they wait,
 * and a watchdog can take it (mlxs_stream_take_error). */
int mlxs_claim_main_thread(void);

/* What mlxs_cuda_kernel_cache did. */
enum {
  /* MLX's kernel cache already held the kernel's compiled module. */
  MLXS_KERNEL_CACHED = 0,
  /* Compiled now and written there. */
  MLXS_KERNEL_WRITTEN = 1,
  /* Nothing to keep: not the output of a CUDA custom kernel (or a
   * precompiled one), or MLX keeps no cache folder in this process. */
  MLXS_KERNEL_NOT_CACHED = 2,
};

/* Compile-once for CUDA custom kernels. `out` is an output of
 * mlx_fast_cuda_kernel_apply, not yet evaluated. MLX's CUDA backend reads a
 * custom kernel's compiled module from its kernel cache folder
 * (MLX_PTX_CACHE_DIR, else <temp>/mlx/<version>/ptx) but never writes it
 * there, so every process compiles every custom kernel again. This compiles
 * the kernel as MLX would and writes it there under MLX's module name, so
 * MLX loads it at evaluation, in this process and later ones. *status says
 * what happened. Non-zero (the message through mlx-c's error handler, status
 * MLXS_KERNEL_NOT_CACHED) when compiling or writing failed: MLX then compiles
 * the kernel itself at evaluation, as without the cache. */
int mlxs_cuda_kernel_cache(mlx_array out, int* status);

/* A direct call of a CUDA custom kernel instance, for the calls after its
 * first. mlx_fast_cuda_kernel_apply rebuilds the instance's whole source text
 * (signature, template constants, body) at every call and MLX hashes it at
 * every evaluation: host time per launch, on decode steps bound by the host.
 * MLX's precompiled kernels (mx::fast::precompiled_cuda_kernel) skip both:
 * they name a compiled module that MLX's kernel cache folder holds. These
 * three make one of those from a custom kernel's first call. */

/* The text MLX generated for `out`'s kernel (`out` an output of
 * mlx_fast_cuda_kernel_apply, not evaluated): the kernel function's name, its
 * whole source, its dynamic shared memory and whether MLX copies inputs to
 * row-contiguous ones. *found false (nothing set) where `out` is no CUDA
 * custom kernel's output, or MLX keeps no cache folder. */
int mlxs_cuda_kernel_source(mlx_array out, mlx_string* name, mlx_string* source, int* shared_memory,
                            bool* ensure_row_contiguous, bool* found);

/* Compiles `source` (CUDA defining the extern "C" __global__ function
 * `kernel` in namespace mlx::core::cu) for the GPU of `out`'s stream as MLX compiles custom kernels,
 * and writes it to MLX's kernel cache as the module MLX reads when it
 * evaluates mlxs_precompiled_cuda_kernel(kernel, token, ...), unless the
 * cache already holds it. *status MLXS_KERNEL_CACHED or MLXS_KERNEL_WRITTEN.
 * Non-zero when compiling or writing failed. */
int mlxs_cuda_kernel_precompile(mlx_array out, const char* kernel, const char* token, const char* source,
                                int* status);

/* mx::fast::precompiled_cuda_kernel: `kernel` of the module the cache holds
 * for (kernel, token), over `inputs`; outputs of `output_dtypes` and shapes
 * (`output_ndims[i]` dimensions each, one after another in
 * `output_shapes`); `scalars` passed after the outputs' pointers; grid in
 * threads; `init_value` (null: none) fills the outputs first. */
int mlxs_precompiled_cuda_kernel(mlx_vector_array* res, const char* kernel, const char* token,
                                 const mlx_array* inputs, size_t num_inputs, const int* output_shapes,
                                 const size_t* output_ndims, const mlx_dtype* output_dtypes, size_t num_outputs,
                                 const int* scalars, size_t num_scalars, int grid_x, int grid_y, int grid_z,
                                 int group_x, int group_y, int group_z, int shared_memory, const float* init_value,
                                 bool ensure_row_contiguous, mlx_stream stream);

#ifdef __cplusplus
}
#endif

#endif
