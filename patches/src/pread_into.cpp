// The PreadInto primitive: fills its output from a file region with pread(2).
// It is the seed of SSD expert streaming: expert weights are read on demand
// straight into an MLX buffer, without going through a Python-style loader.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "mlx/c/error.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/enums.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlx_serve_ext.h"

namespace mx = mlx::core;

namespace {

class PreadInto : public mx::UnaryPrimitive {
 public:
  // Takes ownership of `fd` (a private duplicate) and closes it when the
  // primitive goes away, so the caller may close its own descriptor at once.
  PreadInto(mx::Stream stream, int fd, uint64_t offset)
      : PreadInto(stream, fd, offset, 0, 0) {}

  // The output is `count` blocks of `block` bytes, block i read at
  // `offset + i * stride` (a slice of a larger tensor: its rows, or a column
  // range of each row). block == 0: one contiguous read of the whole output.
  PreadInto(
      mx::Stream stream,
      int fd,
      uint64_t offset,
      uint64_t block,
      uint64_t stride)
      : mx::UnaryPrimitive(stream),
        fd_(fd),
        offset_(offset),
        block_(block),
        stride_(stride) {}

  ~PreadInto() override {
    ::close(fd_);
  }

  void eval_cpu(const std::vector<mx::array>&, mx::array& out) override {
    // Reading synchronously here (not in a dispatched task) lets a read error
    // propagate out of eval() as an exception, which mlx-c turns into an error
    // status; the output has no inputs, so nothing has to be waited for.
    out.set_data(mx::allocator::malloc(out.nbytes()));
    char* dst = static_cast<char*>(out.data<void>());
    if (block_ == 0) {
      read_all(dst, out.nbytes(), offset_);
      return;
    }
    for (size_t i = 0, n = out.nbytes() / block_; i < n; i++) {
      read_all(dst + i * block_, block_, offset_ + i * stride_);
    }
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    // mlxs_pread_into always places the primitive on the CPU stream.
    throw std::logic_error("[pread_into] runs on the CPU stream only");
  }

  const char* name() const override {
    return "PreadInto";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    // Two reads of the same region are not merged: the file may change between
    // them, and streaming relies on each read happening.
    return false;
  }

 private:
  void read_all(char* dst, size_t n, uint64_t offset) const {
    size_t done = 0;
    while (done < n) {
      // Linux caps one pread at 0x7ffff000 bytes; ask for at most 1 GiB a call.
      size_t want = std::min<size_t>(n - done, size_t(1) << 30);
      ssize_t got = ::pread(fd_, dst + done, want, off_t(offset + done));
      if (got < 0) {
        if (errno == EINTR) {
          continue;
        }
        throw std::runtime_error(where(n, offset) + ": " + std::strerror(errno));
      }
      if (got == 0) {
        throw std::runtime_error(
            where(n, offset) + ": file ends after " + std::to_string(done) +
            " bytes");
      }
      done += size_t(got);
    }
  }

  static std::string where(size_t n, uint64_t offset) {
    return "[pread_into] reading " + std::to_string(n) + " bytes at offset " +
        std::to_string(offset);
  }

  int fd_;
  uint64_t offset_;
  uint64_t block_;
  uint64_t stride_;
};

} // namespace

namespace {

// Checks the arguments, builds the lazy array (see mlx_serve_ext.h).
void make_pread(
    mlx_array* res,
    int fd,
    uint64_t offset,
    uint64_t block,
    uint64_t stride,
    const int* shape,
    size_t ndim,
    mlx_dtype dtype) {
  if (ndim > 0 && shape == nullptr) {
    throw std::invalid_argument("[pread_into] shape is null");
  }
  mx::Shape out_shape(shape, shape + ndim);
  auto out_dtype = mlx_dtype_to_cpp(dtype);
  uint64_t nbytes = out_dtype.size();
  for (auto d : out_shape) {
    if (d < 0) {
      throw std::invalid_argument("[pread_into] negative dimension");
    }
    if (d != 0 && nbytes > std::numeric_limits<uint64_t>::max() / d) {
      throw std::invalid_argument("[pread_into] size overflows");
    }
    nbytes *= uint64_t(d);
  }
  // The last byte read: the whole output at `offset`, or the last block.
  uint64_t span = nbytes;
  if (block != 0) {
    if (nbytes % block != 0 || stride < block) {
      throw std::invalid_argument(
          "[pread_into] blocks of " + std::to_string(block) +
          " bytes every " + std::to_string(stride) +
          " do not tile an output of " + std::to_string(nbytes) + " bytes");
    }
    uint64_t blocks = nbytes / block;
    if (blocks > 0 &&
        (blocks - 1) > (std::numeric_limits<uint64_t>::max() - block) / stride) {
      throw std::invalid_argument("[pread_into] size overflows");
    }
    span = blocks == 0 ? 0 : (blocks - 1) * stride + block;
  }
  if (offset > uint64_t(std::numeric_limits<off_t>::max()) - span) {
    throw std::invalid_argument(
        "[pread_into] offset " + std::to_string(offset) + " + " +
        std::to_string(span) + " bytes is past the largest file offset");
  }
  // A private duplicate keeps the file open until the read has happened,
  // whatever the caller does with `fd` meanwhile.
  int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) {
    throw std::invalid_argument(
        "[pread_into] fd " + std::to_string(fd) +
        " is not an open file: " + std::strerror(errno));
  }
  std::shared_ptr<PreadInto> prim;
  try {
    prim = std::make_shared<PreadInto>(
        mx::default_stream(mx::Device::cpu), own, offset, block, stride);
  } catch (...) {
    ::close(own);
    throw;
  }
  mlx_array_set_(
      *res, mx::array(std::move(out_shape), out_dtype, std::move(prim), {}));
}

} // namespace

extern "C" int mlxs_pread_into(
    mlx_array* res,
    int fd,
    uint64_t offset,
    const int* shape,
    size_t ndim,
    mlx_dtype dtype) {
  try {
    make_pread(res, fd, offset, 0, 0, shape, ndim, dtype);
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}

extern "C" int mlxs_pread_blocks_into(
    mlx_array* res,
    int fd,
    uint64_t offset,
    uint64_t block_bytes,
    uint64_t block_stride,
    const int* shape,
    size_t ndim,
    mlx_dtype dtype) {
  try {
    if (block_bytes == 0) {
      throw std::invalid_argument("[pread_into] blocks of 0 bytes");
    }
    make_pread(res, fd, offset, block_bytes, block_stride, shape, ndim, dtype);
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}
