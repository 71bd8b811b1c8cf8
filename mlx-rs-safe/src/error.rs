//! One error type for the crate, and the bridge from mlx-c's error handler to it.
//!
//! mlx-c reports a failure by calling a process-wide error handler and returning a
//! non-zero status. Its default handler prints and exits the process, so we install
//! ours before the first call: it stores the message in a thread-local slot (mlx-c
//! calls it on the thread that made the failing call), and [`check`] turns the
//! status plus that message into an `Err`.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Once;

use mlx_sys as sys;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// MLX (or mlx-c) rejected an operation; the message is MLX's own.
    #[error("mlx: {0}")]
    Mlx(String),
    /// An argument was rejected before reaching MLX.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Host data did not match the array (dtype or length).
    #[error("dtype mismatch: array is {actual:?}, asked for {requested:?}")]
    DtypeMismatch {
        actual: crate::Dtype,
        requested: crate::Dtype,
    },
    /// A weights file is malformed.
    #[error("{path}: {message}")]
    Weights { path: String, message: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

thread_local! {
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

extern "C" fn record_error(msg: *const c_char, _data: *mut c_void) {
    let text = if msg.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: mlx-c passes a NUL-terminated message valid for this call.
        unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
    };
    LAST_ERROR.with(|slot| *slot.borrow_mut() = Some(text));
}

static INSTALL: Once = Once::new();

/// Installs the error handler once per process; every FFI entry point calls it
/// first, so no mlx-c call can reach the default (exiting) handler.
pub(crate) fn init() {
    INSTALL.call_once(|| {
        // SAFETY: `record_error` is a valid `extern "C"` function for the whole
        // process lifetime; it ignores `data`, so null data and no destructor are fine.
        unsafe { sys::mlx_set_error_handler(Some(record_error), std::ptr::null_mut(), None) };
    });
}

/// Turns an mlx-c status into a `Result`, taking the message the handler stored.
pub(crate) fn check(status: c_int) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    let msg = LAST_ERROR
        .with(|slot| slot.borrow_mut().take())
        .unwrap_or_else(|| format!("mlx-c call failed with status {status}"));
    Err(Error::Mlx(msg))
}

/// Clears a message left by an mlx-c call whose failure is reported another way
/// (the pointer-returning data accessors return null instead of a status).
pub(crate) fn take_last_error() -> Option<String> {
    LAST_ERROR.with(|slot| slot.borrow_mut().take())
}
