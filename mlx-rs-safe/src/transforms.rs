//! Evaluation of lazy arrays.

use mlx_sys as sys;

use crate::array::Array;
use crate::error::{check, init, Result};

/// A temporary mlx_vector_array over borrowed arrays.
pub(crate) struct VectorArray {
    pub(crate) raw: sys::mlx_vector_array,
}

impl VectorArray {
    pub(crate) fn new(arrays: &[&Array]) -> VectorArray {
        init();
        let raws: Vec<sys::mlx_array> = arrays.iter().map(|a| a.raw).collect();
        // SAFETY: `raws` holds live handles; mlx-c takes its own references.
        VectorArray { raw: unsafe { sys::mlx_vector_array_new_data(raws.as_ptr(), raws.len()) } }
    }

    pub(crate) fn empty() -> VectorArray {
        init();
        // SAFETY: a fresh, empty vector owned by the returned value.
        VectorArray { raw: unsafe { sys::mlx_vector_array_new() } }
    }

    /// New references to the vector's arrays, leaving the vector intact.
    pub(crate) fn borrowed_arrays(&self) -> Result<Vec<Array>> {
        // SAFETY: live vector.
        let n = unsafe { sys::mlx_vector_array_size(self.raw) };
        (0..n)
            .map(|i| {
                Array::build(|res| {
                    // SAFETY: `i` < size; writes a new reference into `res`.
                    unsafe { sys::mlx_vector_array_get(res, self.raw, i) }
                })
            })
            .collect()
    }

    /// Moves the vector's arrays out as owned `Array`s.
    pub(crate) fn into_arrays(self) -> Result<Vec<Array>> {
        self.borrowed_arrays()
    }
}

impl Drop for VectorArray {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::mlx_vector_array_free(self.raw) };
    }
}

/// Computes all `arrays` now, sharing the work between them.
pub fn eval(arrays: &[&Array]) -> Result<()> {
    let v = VectorArray::new(arrays);
    // SAFETY: live vector of live arrays.
    check(unsafe { sys::mlx_eval(v.raw) })
}

/// Starts computing `arrays` and returns at once; a later `eval` or data access
/// waits for the result. Lets the host work (detokenize) while the device decodes.
pub fn async_eval(arrays: &[&Array]) -> Result<()> {
    let v = VectorArray::new(arrays);
    // SAFETY: live vector of live arrays.
    check(unsafe { sys::mlx_async_eval(v.raw) })
}
