//! Elementwise arithmetic, comparisons and math functions, plus matrix products.
//!
//! Binary ops follow numpy broadcasting and MLX's type promotion.

use mlx_sys as sys;

use crate::array::Array;
use crate::error::Result;

crate::ops::binary_ops!(
    /// `a + b`.
    add => mlx_add,
    /// `a - b`.
    subtract => mlx_subtract,
    /// `a * b`.
    multiply => mlx_multiply,
    /// `a / b` (true division: integer inputs give a float result).
    divide => mlx_divide,
    /// `a ** b`.
    power => mlx_power,
    /// Elementwise larger of `a` and `b` (NaN propagates).
    maximum => mlx_maximum,
    /// Elementwise smaller of `a` and `b` (NaN propagates).
    minimum => mlx_minimum,
    /// Remainder of floor division; the result takes the sign of `b` (numpy `%`).
    remainder => mlx_remainder,
    /// `floor(a / b)`; integer inputs stay integer.
    floor_divide => mlx_floor_divide,
    /// `log(exp(a) + exp(b))`, computed stably.
    logaddexp => mlx_logaddexp,
    /// `a & b` of integer (or boolean) arrays.
    bitwise_and => mlx_bitwise_and,
    /// `a | b` of integer (or boolean) arrays.
    bitwise_or => mlx_bitwise_or,
    /// `a << b` of integer arrays.
    left_shift => mlx_left_shift,
    /// `a >> b` of integer arrays.
    right_shift => mlx_right_shift,
    /// `a == b` as bool.
    equal => mlx_equal,
    /// `a != b` as bool.
    not_equal => mlx_not_equal,
    /// `a < b` as bool.
    less => mlx_less,
    /// `a <= b` as bool.
    less_equal => mlx_less_equal,
    /// `a > b` as bool.
    greater => mlx_greater,
    /// `a >= b` as bool.
    greater_equal => mlx_greater_equal,
    /// Logical and (inputs are cast to bool).
    logical_and => mlx_logical_and,
    /// Logical or (inputs are cast to bool).
    logical_or => mlx_logical_or,
    /// Matrix product with numpy semantics (batched over leading axes).
    matmul => mlx_matmul,
);

crate::ops::unary_ops!(
    /// Logical not (input is cast to bool).
    logical_not => mlx_logical_not,
    /// `|a|`.
    abs => mlx_abs,
    /// `-a`.
    negative => mlx_negative,
    /// -1, 0 or 1 by the sign of each element.
    sign => mlx_sign,
    /// `a * a`.
    square => mlx_square,
    /// Square root.
    sqrt => mlx_sqrt,
    /// `1 / sqrt(a)`.
    rsqrt => mlx_rsqrt,
    /// `1 / a`.
    reciprocal => mlx_reciprocal,
    /// `e ** a`.
    exp => mlx_exp,
    /// `exp(a) - 1`, accurate near 0.
    expm1 => mlx_expm1,
    /// Natural logarithm.
    log => mlx_log,
    /// `log(1 + a)`, accurate near 0.
    log1p => mlx_log1p,
    /// Base-2 logarithm.
    log2 => mlx_log2,
    /// Base-10 logarithm.
    log10 => mlx_log10,
    /// Sine.
    sin => mlx_sin,
    /// Cosine.
    cos => mlx_cos,
    /// Hyperbolic tangent.
    tanh => mlx_tanh,
    /// `1 / (1 + exp(-a))`.
    sigmoid => mlx_sigmoid,
    /// The error function.
    erf => mlx_erf,
    /// Inverse of the error function.
    erfinv => mlx_erfinv,
    /// Largest integer not above each element.
    floor => mlx_floor,
    /// Smallest integer not below each element.
    ceil => mlx_ceil,
    /// Whether each element is NaN.
    isnan => mlx_isnan,
    /// Whether each element is +inf or -inf.
    isinf => mlx_isinf,
    /// Whether each element is neither NaN nor infinite.
    isfinite => mlx_isfinite,
);

/// Picks from `x` where `cond` is true and from `y` elsewhere (all three broadcast).
pub fn where_(cond: &Array, x: &Array, y: &Array) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handles, valid out handle and stream.
        unsafe { sys::mlx_where(res, cond.raw, x.raw, y.raw, s) }
    })
}

/// Rounds to `decimals` decimal places (half to even; negative rounds to tens...).
pub fn round(a: &Array, decimals: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handle, valid out handle and stream.
        unsafe { sys::mlx_round(res, a.raw, decimals, s) }
    })
}

/// Clamps `a` to `[min, max]`; either bound may be `None` (not both: MLX rejects that).
pub fn clip(a: &Array, min: Option<&Array>, max: Option<&Array>) -> Result<Array> {
    // mlx-c reads a handle whose `ctx` is null as "no bound" (std::nullopt).
    let null = sys::mlx_array {
        ctx: std::ptr::null_mut(),
    };
    let lo = min.map_or(null, |m| m.raw);
    let hi = max.map_or(null, |m| m.raw);
    Array::build_s(|res, s| {
        // SAFETY: `a` and any given bound are live handles; a null bound is the
        // documented "may be null" value, which mlx-c never dereferences.
        unsafe { sys::mlx_clip(res, a.raw, lo, hi, s) }
    })
}

/// `alpha * (a @ b) + beta * c`.
pub fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handles, valid out handle and stream.
        unsafe { sys::mlx_addmm(res, c.raw, a.raw, b.raw, alpha, beta, s) }
    })
}

/// 1-D convolution of `input` [N, L, C_in] with `weight` [C_out, K, C_in /
/// groups] (MLX's channels-last layout; `groups == C_in` is depthwise).
pub fn conv1d(input: &Array, weight: &Array, stride: i32, padding: i32, dilation: i32, groups: i32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live input handles, valid out handle and stream.
        unsafe { sys::mlx_conv1d(res, input.raw, weight.raw, stride, padding, dilation, groups, s) }
    })
}
