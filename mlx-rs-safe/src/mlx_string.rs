//! An owned mlx-c string handle, for the calls that write text into one.

use mlx_sys as sys;

use crate::error::init;

/// An mlx-c string, freed when dropped. A call given `&mut s.raw` sets its
/// text in place (an empty handle gets its text allocated into the handle).
pub(crate) struct MlxString {
    pub(crate) raw: sys::mlx_string,
}

impl MlxString {
    /// An empty string.
    pub(crate) fn new() -> MlxString {
        init();
        // SAFETY: no arguments; a fresh handle owned by the returned value.
        MlxString { raw: unsafe { sys::mlx_string_new() } }
    }

    /// Its text, copied (empty where it holds none). Read it only after a
    /// call set it: mlx-c reports an empty handle's read as an error.
    pub(crate) fn text(&self) -> String {
        // SAFETY: a live handle; its data is NUL-terminated (or null) and
        // lives until the handle is freed, after the copy.
        unsafe {
            let p = sys::mlx_string_data(self.raw);
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }
}

impl Drop for MlxString {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::mlx_string_free(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use crate::Array;

    #[test]
    fn text_written_by_mlx_c_reads_back() {
        let version = crate::mlx_version();
        assert!(version.split('.').count() == 3 && version.split('.').all(|p| p.parse::<u32>().is_ok()), "{version:?}");
        let shown = format!("{}", Array::from_slice(&[1.5f32, -2.0], &[2]).unwrap());
        assert!(shown.starts_with("array(") && shown.contains("1.5") && shown.contains("-2"), "{shown:?}");
    }
}
