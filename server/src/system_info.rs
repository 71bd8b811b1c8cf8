//! What MLX sees on this machine: version, backend, device, memory.

use mlx_rs_safe::{memory, Device};
use serde::Serialize;

/// A report of the MLX runtime, as printed by `mlx-serve info`.
#[derive(Debug, Serialize)]
pub struct SystemInfo {
    pub mlx_version: String,
    /// "cuda", "metal" or "cpu": what the loaded libmlx can run on here.
    pub backend: String,
    pub default_device: String,
    pub device_name: String,
    pub active_memory_bytes: usize,
    pub peak_memory_bytes: usize,
    pub cache_memory_bytes: usize,
}

impl SystemInfo {
    pub fn collect() -> mlx_rs_safe::Result<SystemInfo> {
        let device = Device::default_device()?;
        Ok(SystemInfo {
            mlx_version: mlx_rs_safe::mlx_version(),
            backend: mlx_rs_safe::kernels::gpu_backend().unwrap_or("cpu").to_string(),
            default_device: format!("{device:?}").to_lowercase(),
            device_name: device.name(),
            active_memory_bytes: memory::active_memory()?,
            peak_memory_bytes: memory::peak_memory()?,
            cache_memory_bytes: memory::cache_memory()?,
        })
    }
}
