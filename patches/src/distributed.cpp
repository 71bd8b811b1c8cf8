// What mlx-c's distributed API lacks for serving over a group: the stream MLX
// itself picks for a group's collectives, and a look at the error a failed
// collective left on a stream (see mlx_serve_ext.h).

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "mlx/c/error.h"
#include "mlx/c/private/distributed_group.h"
#include "mlx/c/private/stream.h"
#include "mlx/distributed/distributed.h"
#include "mlx/distributed/distributed_impl.h"
#include "mlx/scheduler.h"
#include "mlx_serve_ext.h"

namespace mx = mlx::core;

namespace {

mx::Stream communication_stream(mlx_distributed_group group) {
  return mlx_distributed_group_get_(group).raw_group()->communication_stream({});
}

} // namespace

extern "C" int mlxs_distributed_stream(
    mlx_stream* res,
    mlx_distributed_group group) {
  try {
    mlx_stream_set_(*res, communication_stream(group));
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}

extern "C" int mlxs_stream_take_error(mlx_stream stream, char* buf, size_t cap) {
  try {
    auto s = mlx_stream_get_(stream);
    if (s.device != mx::Device::cpu) {
      return 0;
    }
    // Throws (and clears) the stored error, if any.
    mx::scheduler::scheduler().check_error(s);
    return 0;
  } catch (std::exception& e) {
    if (buf != nullptr && cap > 0) {
      size_t n = std::min(std::strlen(e.what()), cap - 1);
      std::memcpy(buf, e.what(), n);
      buf[n] = '\0';
    }
    return 1;
  }
}

extern "C" int mlxs_claim_main_thread(void) {
  // MLX records its main thread when the scheduler is made: make it now,
  // here, unless it exists.
  try {
    mx::scheduler::scheduler();
  } catch (std::exception& e) {
    mlx_error(e.what());
    return 1;
  }
  return 0;
}
