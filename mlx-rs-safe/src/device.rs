//! Devices and streams.
//!
//! Ops take no stream argument: they run on the calling thread's current stream,
//! which is the default stream of MLX's default device (the GPU when the MLX build
//! has one, else the CPU) unless changed with [`set_default_device`] or scoped with
//! [`with_stream`]. The engine owns MLX from one thread, so the per-thread current
//! stream is exactly "the engine's stream".

use std::cell::RefCell;
use std::ffi::CStr;

use mlx_sys as sys;

use crate::error::{check, init, Result};

/// The kind of device an op runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Gpu,
}

impl Device {
    fn to_sys(self) -> sys::mlx_device {
        let kind = match self {
            Device::Cpu => sys::MLX_CPU,
            Device::Gpu => sys::MLX_GPU,
        };
        // SAFETY: creates a fresh device handle; the caller frees it (DeviceHandle).
        unsafe { sys::mlx_device_new_type(kind, 0) }
    }

    /// Whether this MLX build and machine can run ops on the device.
    pub fn is_available(self) -> bool {
        init();
        let dev = DeviceHandle(self.to_sys());
        let mut avail = false;
        // SAFETY: `dev.0` is a live handle; `avail` is a valid out pointer.
        let status = unsafe { sys::mlx_device_is_available(&mut avail, dev.0) };
        check(status).is_ok() && avail
    }

    /// MLX's default device (GPU when available in this build, else CPU).
    pub fn default_device() -> Result<Device> {
        init();
        // SAFETY: a fresh handle filled by the next call, freed by DeviceHandle.
        let mut dev = DeviceHandle(unsafe { sys::mlx_device_new() });
        // SAFETY: `dev.0` is a valid out handle.
        check(unsafe { sys::mlx_get_default_device(&mut dev.0) })?;
        let mut kind = sys::MLX_CPU;
        // SAFETY: `dev.0` is live; `kind` is a valid out pointer.
        check(unsafe { sys::mlx_device_get_type(&mut kind, dev.0) })?;
        Ok(if kind == sys::MLX_GPU { Device::Gpu } else { Device::Cpu })
    }

    /// A description of the device from MLX ("cpu", or the GPU's name when MLX knows it).
    pub fn name(self) -> String {
        match self.info(c"device_name") {
            Some(InfoValue::Text(name)) => name,
            _ => match self {
                Device::Cpu => "cpu".to_string(),
                Device::Gpu => "gpu".to_string(),
            },
        }
    }

    /// A size MLX reports for the device (bytes for memory keys), if it has the
    /// key: `free_memory` and `total_memory` on CUDA, `memory_size` and
    /// `max_recommended_working_set_size` on Metal. CUDA's values are read once,
    /// when MLX first describes the device.
    pub fn info_size(self, key: &CStr) -> Option<usize> {
        match self.info(key) {
            Some(InfoValue::Size(n)) => Some(n),
            _ => None,
        }
    }

    /// One entry of MLX's description of the device (`mlx_device_info`).
    fn info(self, key: &CStr) -> Option<InfoValue> {
        init();
        let dev = DeviceHandle(self.to_sys());
        // SAFETY: a fresh info object, freed below.
        let info = unsafe { sys::mlx_device_info_new() };
        let mut info = InfoHandle(info);
        // SAFETY: `info.0` and `dev.0` are live handles.
        if check(unsafe { sys::mlx_device_info_get(&mut info.0, dev.0) }).is_err() {
            let _ = crate::error::take_last_error();
            return None;
        }
        let mut has = false;
        // SAFETY: live `info`, NUL-terminated key, valid out pointer.
        if unsafe { sys::mlx_device_info_has_key(&mut has, info.0, key.as_ptr()) } != 0 || !has {
            let _ = crate::error::take_last_error();
            return None;
        }
        let mut is_str = false;
        // SAFETY: as above.
        if unsafe { sys::mlx_device_info_is_string(&mut is_str, info.0, key.as_ptr()) } != 0 {
            let _ = crate::error::take_last_error();
            return None;
        }
        let value = if is_str {
            let mut value: *const std::ffi::c_char = std::ptr::null();
            // SAFETY: the key holds a string; the returned pointer lives as long as `info`.
            let ok = unsafe { sys::mlx_device_info_get_string(&mut value, info.0, key.as_ptr()) } == 0 && !value.is_null();
            // SAFETY: NUL-terminated string owned by `info`, copied before it is freed.
            ok.then(|| InfoValue::Text(unsafe { CStr::from_ptr(value) }.to_string_lossy().into_owned()))
        } else {
            let mut n = 0usize;
            // SAFETY: the key holds a size; `n` is a valid out pointer.
            (unsafe { sys::mlx_device_info_get_size(&mut n, info.0, key.as_ptr()) } == 0).then_some(InfoValue::Size(n))
        };
        let _ = crate::error::take_last_error();
        value
    }
}

/// A value of MLX's device description.
enum InfoValue {
    Text(String),
    Size(usize),
}

struct InfoHandle(sys::mlx_device_info);

impl Drop for InfoHandle {
    fn drop(&mut self) {
        // SAFETY: each InfoHandle owns its info object and frees it once.
        unsafe { sys::mlx_device_info_free(self.0) };
    }
}

struct DeviceHandle(sys::mlx_device);

impl Drop for DeviceHandle {
    fn drop(&mut self) {
        // SAFETY: each DeviceHandle owns its handle and frees it once.
        unsafe { sys::mlx_device_free(self.0) };
    }
}

/// Makes `device` MLX's default device, and the current stream of this thread its
/// default stream.
pub fn set_default_device(device: Device) -> Result<()> {
    init();
    let dev = DeviceHandle(device.to_sys());
    // SAFETY: `dev.0` is a live handle.
    check(unsafe { sys::mlx_set_default_device(dev.0) })?;
    CURRENT.with(|c| *c.borrow_mut() = None);
    Ok(())
}

/// An MLX stream: an ordered queue of work on one device.
pub struct Stream {
    pub(crate) raw: sys::mlx_stream,
}

impl Stream {
    /// The default stream of `device`.
    pub fn default_for(device: Device) -> Result<Stream> {
        init();
        let dev = DeviceHandle(device.to_sys());
        // SAFETY: a fresh stream handle, owned by the returned Stream.
        let mut s = Stream { raw: unsafe { sys::mlx_stream_new() } };
        // SAFETY: valid out handle and live device.
        check(unsafe { sys::mlx_get_default_stream(&mut s.raw, dev.0) })?;
        Ok(s)
    }

    /// A new stream on `device`, independent of the default one.
    pub fn new(device: Device) -> Stream {
        init();
        let dev = DeviceHandle(device.to_sys());
        // SAFETY: creates a stream owned by the returned value.
        Stream { raw: unsafe { sys::mlx_stream_new_device(dev.0) } }
    }

    /// A new stream on `device` that any thread may queue work on (MLX's
    /// "thread-unsafe" stream). Other streams are their thread's own: an
    /// array built on one thread's stream cannot be evaluated on another
    /// ("There is no Stream(gpu, N) in current thread"). MLX does not lock
    /// this one: one thread at a time may evaluate on it, while others may
    /// build graphs on it (building queues nothing).
    pub fn new_any_thread(device: Device) -> Stream {
        init();
        let dev = DeviceHandle(device.to_sys());
        // SAFETY: creates a stream owned by the returned value.
        Stream { raw: unsafe { sys::mlx_stream_new_thread_unsafe(dev.0) } }
    }

    /// The device this stream runs on.
    pub fn device(&self) -> Result<Device> {
        // SAFETY: a fresh handle filled below, freed by DeviceHandle.
        let mut dev = DeviceHandle(unsafe { sys::mlx_device_new() });
        // SAFETY: live stream, valid out handle.
        check(unsafe { sys::mlx_stream_get_device(&mut dev.0, self.raw) })?;
        let mut kind = sys::MLX_CPU;
        // SAFETY: live device, valid out pointer.
        check(unsafe { sys::mlx_device_get_type(&mut kind, dev.0) })?;
        Ok(if kind == sys::MLX_GPU { Device::Gpu } else { Device::Cpu })
    }

    /// Waits until all work queued on this stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: live stream.
        check(unsafe { sys::mlx_synchronize(self.raw) })
    }
}

// SAFETY: the handle owns a heap copy of MLX's plain stream value (an index
// and a device); nothing in it belongs to the thread that made it. Whether a
// thread may evaluate on the stream is MLX's check, reported as an error.
unsafe impl Send for Stream {}

impl Clone for Stream {
    fn clone(&self) -> Self {
        // SAFETY: a fresh handle set to share `self`'s stream.
        let mut s = Stream { raw: unsafe { sys::mlx_stream_new() } };
        // SAFETY: both handles are live; copying a stream cannot fail.
        unsafe { sys::mlx_stream_set(&mut s.raw, self.raw) };
        s
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: each Stream owns its handle and frees it once.
        unsafe { sys::mlx_stream_free(self.raw) };
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Stream>> = const { RefCell::new(None) };
}

/// Runs `f` with the thread's current stream handle (see the module docs).
pub(crate) fn with_current<R>(f: impl FnOnce(sys::mlx_stream) -> R) -> Result<R> {
    CURRENT.with(|c| {
        let mut slot = c.borrow_mut();
        if slot.is_none() {
            *slot = Some(Stream::default_for(Device::default_device()?)?);
        }
        // The slot was filled just above.
        let raw = slot.as_ref().map(|s| s.raw).expect("current stream set above");
        drop(slot);
        Ok(f(raw))
    })
}

/// Waits until all work queued on this thread's current stream has finished.
///
/// Call it before a thread lets go of work it queued without waiting for it
/// (`async_eval`): a stream thread frees each task's buffers after running it,
/// and if the process exits meanwhile, MLX's allocator is destroyed under it.
pub fn synchronize() -> Result<()> {
    // SAFETY: `raw` is the thread's live current stream.
    with_current(|raw| check(unsafe { sys::mlx_synchronize(raw) }))?
}

/// The device of this thread's current stream (see the module docs): what the
/// ops called now run on.
pub fn current_device() -> Result<Device> {
    let stream = CURRENT.with(|c| c.borrow().clone());
    match stream {
        Some(s) => s.device(),
        None => Device::default_device(),
    }
}

/// Runs `f` with `stream` as this thread's current stream, then restores the previous one.
pub fn with_stream<R>(stream: &Stream, f: impl FnOnce() -> R) -> R {
    let previous = CURRENT.with(|c| c.borrow_mut().replace(stream.clone()));
    let out = f();
    CURRENT.with(|c| *c.borrow_mut() = previous);
    out
}
