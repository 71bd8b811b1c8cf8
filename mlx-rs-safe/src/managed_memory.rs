//! Where CUDA keeps the pages of a buffer the host fills for the GPU.
//!
//! MLX's CUDA backend puts every array made on the host (`Array::from_bytes`)
//! in managed memory (cudaMallocManaged), whose pages the driver migrates, by
//! page faults, to whichever processor touched them last; and its buffer cache
//! hands a freed buffer to the next array of about its size. A buffer the host
//! writes and one GPU kernel then reads (a streamed expert's slab, copied into
//! its layer's pool) so travels twice a use: the host's copy faults the pages
//! back from the GPU, the kernel faults them over again. Advised to stay in
//! host memory and be mapped for the GPU, they travel not at all: the kernel
//! reads them over the bus. `bench/managed_staging_probe.py` on an H200, 12
//! slabs of 786 KB a round: host writes 2.1 → 14.5 GB/s, the GPU's read
//! 1.81 → 0.44 ms (device memory: 0.16 ms).
//!
//! MLX links the CUDA runtime statically, so these are the driver's calls,
//! taken from the `libcuda` MLX already loaded into the process; where none is
//! loaded (the CPU and Metal builds) there is nothing to advise.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::OnceLock;

use crate::array::Array;
use crate::error::{Error, Result};

/// Buffers smaller than MLX's 16 KiB allocation page are not advised: MLX
/// rounds them to powers of two that its GPU intermediates share most, and
/// they move little.
pub const MIN_ADVISED_BYTES: usize = 16 * 1024;

type CuResult = c_int;
const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_int = 8;
const CU_MEM_ADVISE_SET_PREFERRED_LOCATION: c_int = 3;
const CU_MEM_ADVISE_SET_ACCESSED_BY: c_int = 5;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
/// The older calls' name for the host, where they take a device number.
const CU_DEVICE_CPU: c_int = -1;

/// CUmemLocation.
#[repr(C)]
#[derive(Clone, Copy)]
struct MemLocation {
    kind: c_int,
    id: c_int,
}

/// cuMemAdvise in either form: CUDA 12.2 on takes a location (`_v2`), older
/// drivers a device number.
#[derive(Clone, Copy)]
enum Advise {
    Located(unsafe extern "C" fn(u64, usize, c_int, MemLocation) -> CuResult),
    Numbered(unsafe extern "C" fn(u64, usize, c_int, c_int) -> CuResult),
}

struct Driver {
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, c_int, u64) -> CuResult,
    ctx_get_current: unsafe extern "C" fn(*mut *mut c_void) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(*mut c_void) -> CuResult,
    ctx_get_device: unsafe extern "C" fn(*mut c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult,
    advise: Advise,
}

/// The CUDA driver this process already loaded, if any (looked up once).
fn driver() -> Option<&'static Driver> {
    static DRIVER: OnceLock<Option<Driver>> = OnceLock::new();
    DRIVER.get_or_init(load_driver).as_ref()
}

fn load_driver() -> Option<Driver> {
    // SAFETY: RTLD_NOLOAD only returns a handle to a library already mapped
    // (MLX's CUDA backend loads libcuda when it starts): nothing is loaded or
    // initialized here. The handle is never closed, so the symbols stay valid.
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if lib.is_null() {
        return None;
    }
    let symbol = |name: &std::ffi::CStr| {
        // SAFETY: a live handle and a NUL-terminated name.
        let f = unsafe { libc::dlsym(lib, name.as_ptr()) };
        (!f.is_null()).then_some(f)
    };
    // SAFETY (each transmute): the symbol is the driver API function of that
    // name, whose C signature (cuda.h) the function pointer type spells out.
    unsafe {
        let advise = match symbol(c"cuMemAdvise_v2") {
            Some(f) => Advise::Located(std::mem::transmute::<*mut c_void, unsafe extern "C" fn(u64, usize, c_int, MemLocation) -> CuResult>(f)),
            None => Advise::Numbered(std::mem::transmute::<*mut c_void, unsafe extern "C" fn(u64, usize, c_int, c_int) -> CuResult>(symbol(c"cuMemAdvise")?)),
        };
        Some(Driver {
            pointer_get_attribute: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void, c_int, u64) -> CuResult>(symbol(c"cuPointerGetAttribute")?),
            ctx_get_current: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut *mut c_void) -> CuResult>(symbol(c"cuCtxGetCurrent")?),
            ctx_set_current: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void) -> CuResult>(symbol(c"cuCtxSetCurrent")?),
            ctx_get_device: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_int) -> CuResult>(symbol(c"cuCtxGetDevice")?),
            primary_ctx_retain: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult>(symbol(c"cuDevicePrimaryCtxRetain_v2").or_else(|| symbol(c"cuDevicePrimaryCtxRetain"))?),
            advise,
        })
    }
}

fn check(status: CuResult, what: &str) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(Error::Mlx(format!("CUDA driver: {what} returned error {status}")))
    }
}

impl Driver {
    /// The device of this thread's CUDA context; a thread without one (an
    /// expert reader before its first GPU call) gets device 0's primary
    /// context, the one MLX's runtime uses.
    fn current_device(&self) -> Result<c_int> {
        let mut ctx = null_mut();
        // SAFETY: writes one pointer into a local.
        check(unsafe { (self.ctx_get_current)(&mut ctx) }, "cuCtxGetCurrent")?;
        if ctx.is_null() {
            // SAFETY: writes one pointer into a local; retaining keeps the
            // context alive for as long as the thread may use it (for good).
            check(unsafe { (self.primary_ctx_retain)(&mut ctx, 0) }, "cuDevicePrimaryCtxRetain")?;
            // SAFETY: a live context just retained.
            check(unsafe { (self.ctx_set_current)(ctx) }, "cuCtxSetCurrent")?;
        }
        let mut device = 0;
        // SAFETY: writes one int into a local.
        check(unsafe { (self.ctx_get_device)(&mut device) }, "cuCtxGetDevice")?;
        Ok(device)
    }

    fn is_managed(&self, ptr: u64) -> Result<bool> {
        // The driver writes a boolean (one to four bytes) into a zeroed word.
        let mut managed = 0u64;
        // SAFETY: `managed` outlives the call and is wider than the answer.
        check(unsafe { (self.pointer_get_attribute)((&mut managed as *mut u64).cast(), CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr) }, "cuPointerGetAttribute")?;
        Ok(managed != 0)
    }

    fn advise(&self, ptr: u64, len: usize, advice: c_int, on_host: bool, device: c_int) -> Result<()> {
        // SAFETY: advice only changes where the driver places the range's
        // pages, never their contents; `ptr..ptr + len` lies in one managed
        // allocation (the caller's array's buffer).
        let status = unsafe {
            match self.advise {
                Advise::Located(f) => {
                    let at = if on_host { MemLocation { kind: CU_MEM_LOCATION_TYPE_HOST, id: 0 } } else { MemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: device } };
                    f(ptr, len, advice, at)
                }
                Advise::Numbered(f) => f(ptr, len, advice, if on_host { CU_DEVICE_CPU } else { device }),
            }
        };
        check(status, "cuMemAdvise")
    }
}

/// Advises the CUDA driver to keep `array`'s buffer in host memory, mapped
/// for the GPU of this thread's context (device 0 where it has none): for a
/// buffer the host fills and a GPU kernel reads, so that neither moves its
/// pages. The advice outlives the array: MLX's cache hands the buffer to a
/// later array of about its size, which finds it there too — the next slab
/// (the point), or now and then a GPU intermediate, which then lives in host
/// memory, read and written over the bus (the price).
///
/// Returns whether the buffer was advised: false where there is nothing to
/// advise (no CUDA driver in the process, a buffer that is not managed
/// memory, or one under [`MIN_ADVISED_BYTES`]). Evaluates the array.
pub fn keep_on_host(array: &Array) -> Result<bool> {
    let Some(driver) = driver() else { return Ok(false) };
    let len = array.nbytes();
    if len < MIN_ADVISED_BYTES {
        return Ok(false);
    }
    array.eval()?;
    let ptr = array.data_ptr()? as u64;
    let device = driver.current_device()?;
    if !driver.is_managed(ptr)? {
        return Ok(false);
    }
    driver.advise(ptr, len, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, true, device)?;
    driver.advise(ptr, len, CU_MEM_ADVISE_SET_ACCESSED_BY, false, device)?;
    Ok(true)
}
