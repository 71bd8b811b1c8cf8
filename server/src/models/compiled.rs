//! Small elementwise graphs compiled once per thread (the engine thread), as
//! mlx-lm's `@partial(mx.compile, shapeless=True)` functions: MLX fuses their
//! ops into one kernel. Where compilation is unavailable the same graph runs
//! unfused, with the same values.

use std::thread::LocalKey;

use mlx_rs_safe::compile::Compiled;
use mlx_rs_safe::Array;

use crate::error::{Error, Result};

/// A graph over arrays, as `Compiled` takes it.
pub type Graph = fn(&[Array]) -> mlx_rs_safe::Result<Vec<Array>>;

/// The first output of `compiled` (this thread's compilation of `graph`) on `inputs`.
pub fn call_compiled(compiled: &'static LocalKey<Option<Compiled>>, graph: Graph, inputs: &[&Array]) -> Result<Array> {
    let out = compiled.with(|c| match c {
        Some(c) => c.call(inputs),
        None => graph(&inputs.iter().map(|a| (*a).clone()).collect::<Vec<_>>()),
    })?;
    out.into_iter().next().ok_or(Error::Internal("a compiled graph returned no output"))
}
