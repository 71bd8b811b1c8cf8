//! mlx-c's optional scalars and the null "absent array" handle.

use mlx_sys as sys;

use crate::array::Array;
use crate::dtype::Dtype;

pub(crate) fn opt_int(v: Option<i32>) -> sys::mlx_optional_int {
    sys::mlx_optional_int { value: v.unwrap_or(0), has_value: v.is_some() }
}

pub(crate) fn opt_float(v: Option<f32>) -> sys::mlx_optional_float {
    sys::mlx_optional_float { value: v.unwrap_or(0.0), has_value: v.is_some() }
}

pub(crate) fn opt_dtype(v: Option<Dtype>) -> sys::mlx_optional_dtype {
    sys::mlx_optional_dtype {
        value: v.map(Dtype::to_sys).unwrap_or(sys::MLX_FLOAT32),
        has_value: v.is_some(),
    }
}

/// The handle of `a`, or mlx-c's null handle ("may be null" parameters) for None.
pub(crate) fn raw_or_null(a: Option<&Array>) -> sys::mlx_array {
    a.map(|a| a.raw).unwrap_or(sys::mlx_array { ctx: std::ptr::null_mut() })
}
