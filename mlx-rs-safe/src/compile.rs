//! `mx.compile` for Rust functions: the function is traced once per input
//! shape/dtype signature (or once, `shapeless`) and MLX fuses its elementwise
//! ops into single kernels — what mlx-lm does for e.g. its swiglu activation.

use std::ffi::{c_int, c_void};

use mlx_sys as sys;

use crate::array::Array;
use crate::error::{check, init, Result};
use crate::transforms::VectorArray;

/// A Rust function over arrays, as compiled by MLX.
type ArrayFn = fn(&[Array]) -> Result<Vec<Array>>;

/// A compiled function. Not `Send`: MLX's compile cache belongs to the thread
/// that drives MLX (the engine thread).
pub struct Compiled {
    raw: sys::mlx_closure,
}

/// Called by MLX (while tracing, and never after `Compiled` is dropped, since
/// the closure owns the payload): runs the Rust function on the inputs.
extern "C" fn trampoline(res: *mut sys::mlx_vector_array, input: sys::mlx_vector_array, payload: *mut c_void) -> c_int {
    // SAFETY: `payload` is the Box<ArrayFn> leaked in `Compiled::new`, freed
    // only by `drop_payload` when MLX releases the closure.
    let f = unsafe { *(payload as *const ArrayFn) };
    let inputs = VectorArray { raw: input };
    let arrays = inputs.borrowed_arrays();
    // The input vector belongs to MLX: do not free it when `inputs` drops.
    std::mem::forget(inputs);
    let Ok(arrays) = arrays else { return 1 };
    match f(&arrays) {
        Ok(outs) => {
            let raws: Vec<sys::mlx_array> = outs.iter().map(|a| a.raw).collect();
            // SAFETY: `res` is MLX's valid out vector; `raws` are live handles
            // that mlx-c copies (adds references) before `outs` drops.
            unsafe { sys::mlx_vector_array_set_data(res, raws.as_ptr(), raws.len()) }
        }
        Err(_) => 1,
    }
}

extern "C" fn drop_payload(payload: *mut c_void) {
    // SAFETY: the pointer came from Box::into_raw in `Compiled::new`; MLX calls
    // this destructor once, when the closure is freed.
    drop(unsafe { Box::from_raw(payload as *mut ArrayFn) });
}

impl Compiled {
    /// Compiles `f`; `shapeless` traces once for all input shapes.
    pub fn new(f: ArrayFn, shapeless: bool) -> Result<Compiled> {
        init();
        let payload = Box::into_raw(Box::new(f)) as *mut c_void;
        // SAFETY: the closure takes ownership of `payload` and frees it with
        // `drop_payload`; the trampoline matches the expected signature.
        let plain = unsafe { sys::mlx_closure_new_func_payload(Some(trampoline), payload, Some(drop_payload)) };
        // SAFETY: a fresh closure handle to receive the compiled function.
        let mut compiled = Compiled { raw: unsafe { sys::mlx_closure_new() } };
        // SAFETY: both closures are live handles.
        let status = unsafe { sys::mlx_compile(&mut compiled.raw, plain, shapeless) };
        // SAFETY: `compiled` holds its own reference to the function; ours is released.
        unsafe { sys::mlx_closure_free(plain) };
        check(status)?;
        Ok(compiled)
    }

    /// Applies the compiled function.
    pub fn call(&self, inputs: &[&Array]) -> Result<Vec<Array>> {
        let ins = VectorArray::new(inputs);
        let mut outs = VectorArray::empty();
        // SAFETY: live closure and input vector; `outs` is a valid out vector.
        check(unsafe { sys::mlx_closure_apply(&mut outs.raw, self.raw, ins.raw) })?;
        outs.into_arrays()
    }
}

impl Drop for Compiled {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::mlx_closure_free(self.raw) };
    }
}
