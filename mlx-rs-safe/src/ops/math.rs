//! Elementwise arithmetic, comparisons and math functions.

use crate::array::Array;
use crate::error::Result;
use crate::ops::{binary_ops, unary_ops};

binary_ops!(
    add => mlx_add,
    subtract => mlx_subtract,
    multiply => mlx_multiply,
    divide => mlx_divide,
    /// Matrix product with numpy semantics (batched over leading axes).
    matmul => mlx_matmul,
);

unary_ops!(
    exp => mlx_exp,
    negative => mlx_negative,
);
