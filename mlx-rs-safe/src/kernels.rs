//! Custom GPU kernels compiled at run time by MLX (`mx.fast.metal_kernel` /
//! `mx.fast.cuda_kernel`): sources live in the repository's `metal-kernels/`.
//! The same Rust API serves both backends; on a build without that GPU backend,
//! applying a kernel returns `Err` (it never aborts).

use std::ffi::{c_char, CString};

use mlx_sys as sys;

use crate::array::Array;
use crate::device::with_current;
use crate::dtype::Dtype;
use crate::error::{check, init, Error, Result};
use crate::transforms::VectorArray;

/// "metal" or "cuda" when this MLX build can run GPU kernels here, else None.
pub fn gpu_backend() -> Option<&'static str> {
    init();
    let mut metal = false;
    let mut cuda = false;
    // SAFETY: each call writes one bool into a local.
    let metal_ok = check(unsafe { sys::mlx_metal_is_available(&mut metal) }).is_ok();
    // SAFETY: as above.
    let cuda_ok = check(unsafe { sys::mlx_cuda_is_available(&mut cuda) }).is_ok();
    if metal_ok && metal {
        Some("metal")
    } else if cuda_ok && cuda {
        Some("cuda")
    } else {
        None
    }
}

/// Which GPU language a kernel source is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelLanguage {
    Metal,
    Cuda,
}

/// A kernel's source and signature (MLX generates the function signature).
#[derive(Debug, Clone)]
pub struct KernelSource<'a> {
    pub name: &'a str,
    pub input_names: &'a [&'a str],
    pub output_names: &'a [&'a str],
    /// The body of the kernel function.
    pub source: &'a str,
    /// Code placed before the function (helpers, includes).
    pub header: &'a str,
    pub ensure_row_contiguous: bool,
    /// Metal only: outputs are atomic.
    pub atomic_outputs: bool,
    /// CUDA only: bytes of dynamic shared memory.
    pub shared_memory: i32,
}

/// A template argument of one launch.
#[derive(Debug, Clone)]
pub enum TemplateArg {
    Dtype(Dtype),
    Int(i32),
    Bool(bool),
}

/// The launch configuration of one application.
#[derive(Debug, Clone, Default)]
pub struct KernelCall {
    pub outputs: Vec<(Vec<i32>, Dtype)>,
    /// Grid size in threads (MLX divides it by the thread group).
    pub grid: (i32, i32, i32),
    pub thread_group: (i32, i32, i32),
    pub init_value: Option<f32>,
    pub template: Vec<(String, TemplateArg)>,
    pub verbose: bool,
}

enum Handle {
    Metal(sys::mlx_fast_metal_kernel),
    Cuda(sys::mlx_fast_cuda_kernel),
}

/// A compiled-on-first-use custom kernel.
pub struct CustomKernel {
    handle: Handle,
}

fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::InvalidArgument(format!("{what} contains a NUL byte")))
}

/// An owned mlx_vector_string of `names`.
struct Names {
    raw: sys::mlx_vector_string,
}

impl Names {
    fn new(names: &[&str]) -> Result<Names> {
        let owned: Vec<CString> = names.iter().map(|n| cstring(n, "a kernel argument name")).collect::<Result<_>>()?;
        let ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        // SAFETY: `ptrs` holds NUL-terminated strings alive for the call; mlx-c copies them.
        Ok(Names { raw: unsafe { sys::mlx_vector_string_new_data(ptrs.as_ptr() as *mut *const c_char, ptrs.len()) } })
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::mlx_vector_string_free(self.raw) };
    }
}

impl CustomKernel {
    pub fn new(language: KernelLanguage, src: &KernelSource<'_>) -> Result<CustomKernel> {
        init();
        let name = cstring(src.name, "the kernel name")?;
        let source = cstring(src.source, "the kernel source")?;
        let header = cstring(src.header, "the kernel header")?;
        let inputs = Names::new(src.input_names)?;
        let outputs = Names::new(src.output_names)?;
        // SAFETY: all strings are NUL-terminated and outlive the call; the name
        // vectors are live; mlx-c copies everything into the kernel object.
        let handle = unsafe {
            match language {
                KernelLanguage::Metal => Handle::Metal(sys::mlx_fast_metal_kernel_new(
                    name.as_ptr(),
                    inputs.raw,
                    outputs.raw,
                    source.as_ptr(),
                    header.as_ptr(),
                    src.ensure_row_contiguous,
                    src.atomic_outputs,
                )),
                KernelLanguage::Cuda => Handle::Cuda(sys::mlx_fast_cuda_kernel_new(
                    name.as_ptr(),
                    inputs.raw,
                    outputs.raw,
                    source.as_ptr(),
                    header.as_ptr(),
                    src.ensure_row_contiguous,
                    src.shared_memory,
                )),
            }
        };
        Ok(CustomKernel { handle })
    }

    /// Runs the kernel on `inputs`; returns its outputs.
    pub fn apply(&self, inputs: &[&Array], call: &KernelCall) -> Result<Vec<Array>> {
        match self.handle {
            Handle::Metal(k) => apply_with::<MetalApi>(k, inputs, call),
            Handle::Cuda(k) => apply_with::<CudaApi>(k, inputs, call),
        }
    }
}

impl Drop for CustomKernel {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe {
            match self.handle {
                Handle::Metal(k) => sys::mlx_fast_metal_kernel_free(k),
                Handle::Cuda(k) => sys::mlx_fast_cuda_kernel_free(k),
            }
        }
    }
}

/// The config calls of one backend's C API (the two differ only in prefix).
trait ConfigApi {
    type Cfg: Copy;
    type Kernel: Copy;
    unsafe fn new() -> Self::Cfg;
    unsafe fn free(c: Self::Cfg);
    unsafe fn add_output(c: Self::Cfg, shape: *const i32, n: usize, d: sys::mlx_dtype) -> i32;
    unsafe fn set_grid(c: Self::Cfg, x: i32, y: i32, z: i32) -> i32;
    unsafe fn set_thread_group(c: Self::Cfg, x: i32, y: i32, z: i32) -> i32;
    unsafe fn set_init_value(c: Self::Cfg, v: f32) -> i32;
    unsafe fn set_verbose(c: Self::Cfg, v: bool) -> i32;
    unsafe fn template_dtype(c: Self::Cfg, name: *const c_char, d: sys::mlx_dtype) -> i32;
    unsafe fn template_int(c: Self::Cfg, name: *const c_char, v: i32) -> i32;
    unsafe fn template_bool(c: Self::Cfg, name: *const c_char, v: bool) -> i32;
    unsafe fn apply(
        out: *mut sys::mlx_vector_array,
        k: Self::Kernel,
        ins: sys::mlx_vector_array,
        c: Self::Cfg,
        s: sys::mlx_stream,
    ) -> i32;
}

macro_rules! config_api {
    ($ty:ident, $cfg:ty, $kernel:ty, $new:ident, $free:ident, $out:ident, $grid:ident, $tg:ident,
     $init:ident, $verbose:ident, $tdt:ident, $tint:ident, $tbool:ident, $apply:ident) => {
        struct $ty;
        impl ConfigApi for $ty {
            type Cfg = $cfg;
            type Kernel = $kernel;
            unsafe fn new() -> $cfg {
                sys::$new()
            }
            unsafe fn free(c: $cfg) {
                sys::$free(c)
            }
            unsafe fn add_output(c: $cfg, shape: *const i32, n: usize, d: sys::mlx_dtype) -> i32 {
                sys::$out(c, shape, n, d)
            }
            unsafe fn set_grid(c: $cfg, x: i32, y: i32, z: i32) -> i32 {
                sys::$grid(c, x, y, z)
            }
            unsafe fn set_thread_group(c: $cfg, x: i32, y: i32, z: i32) -> i32 {
                sys::$tg(c, x, y, z)
            }
            unsafe fn set_init_value(c: $cfg, v: f32) -> i32 {
                sys::$init(c, v)
            }
            unsafe fn set_verbose(c: $cfg, v: bool) -> i32 {
                sys::$verbose(c, v)
            }
            unsafe fn template_dtype(c: $cfg, name: *const c_char, d: sys::mlx_dtype) -> i32 {
                sys::$tdt(c, name, d)
            }
            unsafe fn template_int(c: $cfg, name: *const c_char, v: i32) -> i32 {
                sys::$tint(c, name, v)
            }
            unsafe fn template_bool(c: $cfg, name: *const c_char, v: bool) -> i32 {
                sys::$tbool(c, name, v)
            }
            unsafe fn apply(
                out: *mut sys::mlx_vector_array,
                k: $kernel,
                ins: sys::mlx_vector_array,
                c: $cfg,
                s: sys::mlx_stream,
            ) -> i32 {
                sys::$apply(out, k, ins, c, s)
            }
        }
    };
}

config_api!(
    MetalApi, sys::mlx_fast_metal_kernel_config, sys::mlx_fast_metal_kernel,
    mlx_fast_metal_kernel_config_new, mlx_fast_metal_kernel_config_free,
    mlx_fast_metal_kernel_config_add_output_arg, mlx_fast_metal_kernel_config_set_grid,
    mlx_fast_metal_kernel_config_set_thread_group, mlx_fast_metal_kernel_config_set_init_value,
    mlx_fast_metal_kernel_config_set_verbose, mlx_fast_metal_kernel_config_add_template_arg_dtype,
    mlx_fast_metal_kernel_config_add_template_arg_int, mlx_fast_metal_kernel_config_add_template_arg_bool,
    mlx_fast_metal_kernel_apply
);
config_api!(
    CudaApi, sys::mlx_fast_cuda_kernel_config, sys::mlx_fast_cuda_kernel,
    mlx_fast_cuda_kernel_config_new, mlx_fast_cuda_kernel_config_free,
    mlx_fast_cuda_kernel_config_add_output_arg, mlx_fast_cuda_kernel_config_set_grid,
    mlx_fast_cuda_kernel_config_set_thread_group, mlx_fast_cuda_kernel_config_set_init_value,
    mlx_fast_cuda_kernel_config_set_verbose, mlx_fast_cuda_kernel_config_add_template_arg_dtype,
    mlx_fast_cuda_kernel_config_add_template_arg_int, mlx_fast_cuda_kernel_config_add_template_arg_bool,
    mlx_fast_cuda_kernel_apply
);

/// Frees a config object when dropped.
struct ConfigGuard<A: ConfigApi>(A::Cfg);

impl<A: ConfigApi> Drop for ConfigGuard<A> {
    fn drop(&mut self) {
        // SAFETY: the guard owns the config and frees it once.
        unsafe { A::free(self.0) };
    }
}

/// Builds the backend's config from `call`, applies `kernel`, returns the outputs.
fn apply_with<A: ConfigApi>(kernel: A::Kernel, inputs: &[&Array], call: &KernelCall) -> Result<Vec<Array>> {
    init();
    // SAFETY: a fresh config, owned by the guard.
    let cfg = ConfigGuard::<A>(unsafe { A::new() });
    let c = cfg.0;
    for (shape, dtype) in &call.outputs {
        // SAFETY: live config; `shape` is valid for its length during the call.
        check(unsafe { A::add_output(c, shape.as_ptr(), shape.len(), dtype.to_sys()) })?;
    }
    let (g, t) = (call.grid, call.thread_group);
    // SAFETY: live config (this and the following config calls).
    check(unsafe { A::set_grid(c, g.0, g.1, g.2) })?;
    // SAFETY: live config.
    check(unsafe { A::set_thread_group(c, t.0, t.1, t.2) })?;
    if let Some(v) = call.init_value {
        // SAFETY: live config.
        check(unsafe { A::set_init_value(c, v) })?;
    }
    // SAFETY: live config.
    check(unsafe { A::set_verbose(c, call.verbose) })?;
    for (name, arg) in &call.template {
        let name = cstring(name, "a template argument name")?;
        // SAFETY: live config; `name` is NUL-terminated and copied by mlx-c.
        check(unsafe {
            match arg {
                TemplateArg::Dtype(d) => A::template_dtype(c, name.as_ptr(), d.to_sys()),
                TemplateArg::Int(i) => A::template_int(c, name.as_ptr(), *i),
                TemplateArg::Bool(b) => A::template_bool(c, name.as_ptr(), *b),
            }
        })?;
    }
    let ins = VectorArray::new(inputs);
    let mut outs = VectorArray::empty();
    with_current(|s| {
        // SAFETY: live kernel, config, inputs and stream; `outs` is a valid out vector.
        check(unsafe { A::apply(&mut outs.raw, kernel, ins.raw, c, s) })
    })??;
    outs.into_arrays()
}
