/* Everything bindgen turns into Rust: all of mlx-c, and mlx-serve's additions. */
#include "mlx/c/mlx.h"
#include "mlx_serve_ext.h"
