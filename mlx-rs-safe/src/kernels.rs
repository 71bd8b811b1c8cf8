//! Custom GPU kernels compiled at run time by MLX (`mx.fast.metal_kernel` /
//! `mx.fast.cuda_kernel`): sources live in the repository's `metal-kernels/`.
//! The same Rust API serves both backends; on a build without that GPU backend,
//! creating (CUDA) or applying (Metal) a kernel returns `Err` (it never aborts).

use std::ffi::{c_char, CString};

use mlx_sys as sys;

use crate::array::Array;
use crate::device::with_current;
use crate::dtype::Dtype;
use crate::error::{check, init, take_last_error, Error, Result};
use crate::kernel_direct::{DirectCall, Prepared};
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

/// [`gpu_backend`] when this thread's current stream runs on the GPU (not,
/// say, a layer placed on the CPU): the backend the next op runs on, if a GPU's.
pub fn current_gpu_backend() -> Option<&'static str> {
    match crate::device::current_device() {
        Ok(crate::device::Device::Gpu) => gpu_backend(),
        _ => None,
    }
}

/// Which GPU language a kernel source is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelLanguage {
    /// Metal Shading Language (MLX's Metal backend, Apple GPUs).
    Metal,
    /// CUDA C++ (MLX's CUDA backend, NVIDIA GPUs).
    Cuda,
}

/// A kernel's source and signature (MLX generates the function signature).
#[derive(Debug, Clone)]
pub struct KernelSource<'a> {
    /// The kernel's name (MLX appends a hash of the template arguments).
    pub name: &'a str,
    /// Parameter names of the inputs, in the order `apply` receives them.
    pub input_names: &'a [&'a str],
    /// Parameter names of the outputs, in the order of [`KernelCall::outputs`].
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

impl<'a> KernelSource<'a> {
    /// A source with no header, row-contiguous inputs, plain outputs and no
    /// shared memory.
    pub fn new(name: &'a str, input_names: &'a [&'a str], output_names: &'a [&'a str], source: &'a str) -> Self {
        KernelSource {
            name,
            input_names,
            output_names,
            source,
            header: "",
            ensure_row_contiguous: true,
            atomic_outputs: false,
            shared_memory: 0,
        }
    }
}

/// A template argument of one launch.
#[derive(Debug, Clone)]
pub enum TemplateArg {
    /// A type parameter (e.g. `T` = float).
    Dtype(Dtype),
    /// An integer constant.
    Int(i32),
    /// A boolean constant.
    Bool(bool),
}

/// The launch configuration of one application.
#[derive(Debug, Clone, Default)]
pub struct KernelCall {
    /// Shape and dtype of each output, in the order of the output names.
    pub outputs: Vec<(Vec<i32>, Dtype)>,
    /// Grid size in threads (MLX divides it by the thread group).
    pub grid: (i32, i32, i32),
    /// Threads per thread group (block).
    pub thread_group: (i32, i32, i32),
    /// Fill value of the outputs before the kernel runs (else uninitialised).
    pub init_value: Option<f32>,
    /// Template arguments, by name.
    pub template: Vec<(String, TemplateArg)>,
    /// Print the generated source when it is compiled.
    pub verbose: bool,
}

impl KernelCall {
    /// An empty configuration (add outputs, grid and thread group).
    pub fn new() -> KernelCall {
        KernelCall::default()
    }

    /// Adds an output of `shape` and `dtype`.
    pub fn output(mut self, shape: &[i32], dtype: Dtype) -> KernelCall {
        self.outputs.push((shape.to_vec(), dtype));
        self
    }

    /// Sets the grid, in threads.
    pub fn grid(mut self, x: i32, y: i32, z: i32) -> KernelCall {
        self.grid = (x, y, z);
        self
    }

    /// Sets the thread group size.
    pub fn thread_group(mut self, x: i32, y: i32, z: i32) -> KernelCall {
        self.thread_group = (x, y, z);
        self
    }

    /// Fills the outputs with `value` before the kernel runs.
    pub fn init_value(mut self, value: f32) -> KernelCall {
        self.init_value = Some(value);
        self
    }

    /// Adds a template argument.
    pub fn template(mut self, name: &str, arg: TemplateArg) -> KernelCall {
        self.template.push((name.to_string(), arg));
        self
    }

    /// Prints the generated source on compilation.
    pub fn verbose(mut self, verbose: bool) -> KernelCall {
        self.verbose = verbose;
        self
    }
}

enum Handle {
    Metal(sys::mlx_fast_metal_kernel),
    Cuda(sys::mlx_fast_cuda_kernel),
}

/// A compiled-on-first-use custom kernel; owns its mlx-c kernel object.
pub struct CustomKernel {
    handle: Handle,
    /// CUDA: the instances ([`instance_key`]) this process has called, each
    /// with its direct call ([`kernel_direct`](crate::kernel_direct)), or
    /// None where MLX's own call serves it (its module handed to MLX's kernel
    /// cache: [`KernelCacheStats`]).
    instances: std::sync::Mutex<std::collections::HashMap<u64, Option<std::sync::Arc<DirectCall>>>>,
}

/// Compile-once on CUDA, this process's count of kernel instances (one per
/// kernel and set of template arguments and types): those whose compiled
/// module MLX's kernel cache already held (from an earlier process), those
/// compiled here and written there, and those it could not keep (MLX
/// compiled them itself, as without the cache), with the last reason.
/// MLX keeps its own CUDA kernels in that cache (`MLX_PTX_CACHE_DIR`, else
/// `<temp>/mlx/<version>/ptx`) but only reads custom kernels from it;
/// `mlxs_cuda_kernel_cache` (patches/) writes ours there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelCacheStats {
    pub loaded: u64,
    pub written: u64,
    pub failed: u64,
    /// Instances called directly after their first call (MLX's precompiled
    /// kernel path, which skips rebuilding and hashing the source text at
    /// each call: `kernel_direct`); their modules count in `loaded` or
    /// `written` too.
    pub direct: u64,
    pub last_error: Option<String>,
}

static CACHE_STATS: std::sync::Mutex<KernelCacheStats> =
    std::sync::Mutex::new(KernelCacheStats { loaded: 0, written: 0, failed: 0, direct: 0, last_error: None });

/// Whether compile-once is on: it is unless `MLX_SERVE_KERNEL_CACHE=0`
/// (read once a process), which leaves every custom kernel to MLX's own
/// compile, as without it (to compare start times, or should a cached
/// module ever be suspect).
pub fn kernel_cache_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLX_SERVE_KERNEL_CACHE").map_or(true, |v| v != "0"))
}

/// Whether CUDA custom kernel instances' calls after their first go direct
/// (`kernel_direct`; with compile-once on): on unless [`set_direct_calls`]
/// turned them off.
static DIRECT_CALLS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns direct calls on or off for the calls from now on (a benchmark's
/// comparison: off, every call is MLX's own, which rebuilds the instance's
/// source text, and MLX compiles an instance's module itself the first time
/// it meets it that way).
pub fn set_direct_calls(on: bool) {
    DIRECT_CALLS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// What compile-once has done in this process so far.
pub fn kernel_cache_stats() -> KernelCacheStats {
    CACHE_STATS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// What makes MLX's source text of a kernel instance differ between calls of
/// one kernel: template arguments, input types (and which inputs are scalars:
/// MLX passes shapes only for the others), output types; and each input's
/// dimension count, which the direct call's arguments depend on.
fn instance_key(inputs: &[&Array], call: &KernelCall) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    for (name, arg) in &call.template {
        name.hash(&mut h);
        match arg {
            TemplateArg::Dtype(d) => (0u8, *d).hash(&mut h),
            TemplateArg::Int(i) => (1u8, *i).hash(&mut h),
            TemplateArg::Bool(b) => (2u8, *b).hash(&mut h),
        }
    }
    for a in inputs {
        (a.dtype(), a.ndim()).hash(&mut h);
    }
    for (_, dtype) in &call.outputs {
        dtype.hash(&mut h);
    }
    h.finish()
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
        // SAFETY: `ptrs` holds `ptrs.len()` NUL-terminated strings alive for the
        // call (owned by `owned`); mlx-c copies them and never writes through the
        // pointer (the `*mut` is bindgen's spelling of `const char**`).
        Ok(Names { raw: unsafe { sys::mlx_vector_string_new_data(ptrs.as_ptr() as *mut *const c_char, ptrs.len()) } })
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        // SAFETY: owned handle, freed once.
        unsafe { sys::mlx_vector_string_free(self.raw) };
    }
}

/// `code` without its `//` comments, indentation and blank lines. MLX
/// rebuilds a custom kernel's full source text on every call (header,
/// signature, body) and hashes it at every evaluation to find the compiled
/// module, so each byte costs host time per launch; comments are most of
/// our kernels' bytes. Preprocessor lines keep their own lines.
pub fn compact(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    for line in code.lines() {
        let mut in_string = false;
        let mut prev = ' ';
        let mut end = line.len();
        for (i, c) in line.char_indices() {
            match c {
                '"' if prev != '\\' => in_string = !in_string,
                '/' if !in_string && prev == '/' => {
                    end = i - 1;
                    break;
                }
                _ => {}
            }
            prev = c;
        }
        let kept = line[..end].trim();
        if !kept.is_empty() {
            out.push_str(kept);
            out.push('\n');
        }
    }
    out
}

/// Where [`cuda_includes`] writes kernel files: `$XDG_CACHE_HOME/mlx-serve/kernels`,
/// else `~/.cache/mlx-serve/kernels`; None without either. A user's cache
/// folder, not the temporary one: a long-running server compiles a kernel
/// instance when a new shape first comes, maybe days after start, and
/// temporary folders get cleaned; and another user could put files there.
fn kernel_dir() -> Option<std::path::PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(std::path::PathBuf::from);
    env("XDG_CACHE_HOME").map(|cache| cache.join("mlx-serve/kernels")).or_else(|| Some(env("HOME")?.join(".cache/mlx-serve/kernels")))
}

/// `text` as a file of `dir` named by its contents (`{hash}.{ext}`), written
/// once (to a temporary name of this call's own, then renamed: a reader never
/// sees part of it, and two threads making the same kernel never write into
/// one temporary file) and read back; its path, or None where it cannot be
/// written or read.
fn content_file(dir: &std::path::Path, text: &str, ext: &str) -> Option<std::path::PathBuf> {
    use std::hash::{Hash, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let mut h = std::hash::DefaultHasher::new();
    text.hash(&mut h);
    let name = format!("{:016x}", h.finish());
    let path = dir.join(format!("{name}.{ext}"));
    if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
        std::fs::create_dir_all(dir).ok()?;
        let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), WRITES.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&tmp, text).ok()?;
        std::fs::rename(&tmp, &path).ok()?;
    }
    (std::fs::read_to_string(&path).ok()? == text).then_some(path)
}

/// A CUDA kernel's (header, source) for MLX as `#include` lines of files in
/// `dir` holding the real ones. MLX's CUDA custom kernels rebuild their whole
/// source text (header, signature, body) on every call and hash it at every
/// evaluation, to find the compiled module: host time per launch in
/// proportion to the text (the TurboQuant kernels' is ~24 KB), on a decode
/// step that is host-bound. Included, the text is a few hundred bytes
/// whatever the kernel; NVRTC reads the files when it compiles (an include
/// inside the kernel's body pastes it there, as the inline text was). The
/// body's line names each `<input>_shape`, `_strides` and `_ndim` the source
/// uses, since MLX passes those only to a source that names them. None where
/// the files cannot be written and read back (the text then goes inline, as
/// it does without a cache folder).
fn cuda_includes(dir: &std::path::Path, header: &str, source: &str, inputs: &[&str]) -> Option<(String, String)> {
    let include = |text: &str, ext: &str| -> Option<String> {
        let path = content_file(dir, text, ext)?;
        let shown = path.to_str().filter(|p| !p.contains(['"', '\\', '\n']))?;
        Some(format!("#include \"{shown}\"\n"))
    };
    let header = if header.trim().is_empty() { String::new() } else { include(header, "cuh")? };
    let mut body = include(source, "cu")?;
    let used: Vec<String> = inputs
        .iter()
        .flat_map(|n| ["_shape", "_strides", "_ndim"].map(|suffix| format!("{n}{suffix}")))
        .filter(|token| source.contains(token.as_str()))
        .collect();
    if !used.is_empty() {
        body.push_str(&format!("// {}\n", used.join(" ")));
    }
    Some((header, body))
}

impl CustomKernel {
    /// Creates a kernel in `language` from `src`. Nothing is compiled yet: MLX
    /// compiles on first apply, per set of template arguments. CUDA kernels
    /// go to MLX as includes of their files ([`cuda_includes`]), Metal ones
    /// (and CUDA ones where the files cannot be written) inline, compacted.
    pub fn new(language: KernelLanguage, src: &KernelSource<'_>) -> Result<CustomKernel> {
        init();
        let name = cstring(src.name, "the kernel name")?;
        let included = (language == KernelLanguage::Cuda)
            .then(|| cuda_includes(&kernel_dir()?, src.header, src.source, src.input_names))
            .flatten();
        let (header, source) = included.unwrap_or_else(|| (compact(src.header), compact(src.source)));
        let source = cstring(&source, "the kernel source")?;
        let header = cstring(&header, "the kernel header")?;
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
        let ctx = match handle {
            Handle::Metal(k) => k.ctx,
            Handle::Cuda(k) => k.ctx,
        };
        if ctx.is_null() {
            let msg = take_last_error().unwrap_or_else(|| "kernel creation failed".into());
            return Err(Error::Mlx(msg));
        }
        Ok(CustomKernel { handle, instances: Default::default() })
    }

    /// A Metal kernel (see [`CustomKernel::new`]).
    pub fn metal(src: &KernelSource<'_>) -> Result<CustomKernel> {
        CustomKernel::new(KernelLanguage::Metal, src)
    }

    /// A CUDA kernel (see [`CustomKernel::new`]).
    pub fn cuda(src: &KernelSource<'_>) -> Result<CustomKernel> {
        CustomKernel::new(KernelLanguage::Cuda, src)
    }

    /// The language the kernel was created for.
    pub fn language(&self) -> KernelLanguage {
        match self.handle {
            Handle::Metal(_) => KernelLanguage::Metal,
            Handle::Cuda(_) => KernelLanguage::Cuda,
        }
    }

    /// Runs the kernel on `inputs`; returns its outputs.
    pub fn apply(&self, inputs: &[&Array], call: &KernelCall) -> Result<Vec<Array>> {
        match self.handle {
            Handle::Metal(k) => apply_metal(k, inputs, call),
            Handle::Cuda(k) if !kernel_cache_enabled() || !DIRECT_CALLS.load(std::sync::atomic::Ordering::Relaxed) => apply_cuda(k, inputs, call),
            Handle::Cuda(k) => {
                let key = instance_key(inputs, call);
                let known = self.instances.lock().unwrap_or_else(|e| e.into_inner()).get(&key).cloned();
                match known {
                    Some(Some(direct)) => direct.apply(inputs, call),
                    Some(None) => apply_cuda(k, inputs, call),
                    None => self.first_call(k, key, inputs, call),
                }
            }
        }
    }

    /// An instance's first call in this process: through MLX's own call,
    /// whose output gives the instance's generated text, from which its
    /// direct call is made (its module compiled into MLX's kernel cache, or
    /// found there) and used for this call already, MLX's output never
    /// evaluated. Where no direct call suits the instance, it stays with
    /// MLX's call, its module handed to the cache. Counted in
    /// [`KernelCacheStats`]; a failure only counts (MLX's call then serves).
    fn first_call(&self, kernel: sys::mlx_fast_cuda_kernel, key: u64, inputs: &[&Array], call: &KernelCall) -> Result<Vec<Array>> {
        let outs = apply_cuda(kernel, inputs, call)?;
        let Some(out) = outs.first() else { return Ok(outs) };
        let direct = match DirectCall::prepare(out, inputs) {
            Ok(Prepared::Ready(direct, written)) => {
                let mut stats = CACHE_STATS.lock().unwrap_or_else(|e| e.into_inner());
                stats.direct += 1;
                if written {
                    stats.written += 1;
                } else {
                    stats.loaded += 1;
                }
                Some(std::sync::Arc::new(direct))
            }
            Ok(Prepared::Unsuited) => {
                keep_compiled(out);
                None
            }
            // The wrapped text failed (to compile, say): MLX compiles the
            // instance itself, as it does what the cache cannot keep.
            Err(e) => {
                let mut stats = CACHE_STATS.lock().unwrap_or_else(|e| e.into_inner());
                stats.failed += 1;
                stats.last_error = Some(format!("direct call: {e}"));
                None
            }
        };
        self.instances.lock().unwrap_or_else(|e| e.into_inner()).insert(key, direct.clone());
        match direct {
            Some(direct) => direct.apply(inputs, call),
            None => Ok(outs),
        }
    }
}

/// Has the compiled module of `out`'s kernel instance written to MLX's
/// kernel cache (or finds it there) before MLX evaluates `out`; counted in
/// [`KernelCacheStats`]. A failure only counts: MLX then compiles the kernel
/// itself.
fn keep_compiled(out: &Array) {
    let mut status = sys::MLXS_KERNEL_NOT_CACHED as i32;
    // SAFETY: `out` is a live array; `status` is a local the call writes.
    let result = check(unsafe { sys::mlxs_cuda_kernel_cache(out.raw, &mut status) });
    let mut stats = CACHE_STATS.lock().unwrap_or_else(|e| e.into_inner());
    match result {
        Err(e) => {
            stats.failed += 1;
            stats.last_error = Some(e.to_string());
        }
        Ok(()) if status == sys::MLXS_KERNEL_CACHED as i32 => stats.loaded += 1,
        Ok(()) if status == sys::MLXS_KERNEL_WRITTEN as i32 => stats.written += 1,
        Ok(()) => {}
    }
}

impl Drop for CustomKernel {
    fn drop(&mut self) {
        // SAFETY: the handle was created non-null by `new`, is owned by this value
        // alone (no Clone) and freed once, here.
        unsafe {
            match self.handle {
                Handle::Metal(k) => sys::mlx_fast_metal_kernel_free(k),
                Handle::Cuda(k) => sys::mlx_fast_cuda_kernel_free(k),
            }
        }
    }
}

/// Frees a config object when dropped.
struct ConfigGuard<C: Copy>(C, unsafe extern "C" fn(C));

impl<C: Copy> Drop for ConfigGuard<C> {
    fn drop(&mut self) {
        // SAFETY: the guard owns the config (created by the matching `_new`, null
        // or not: mlx-c's free ignores null) and frees it once with its `_free`.
        unsafe { (self.1)(self.0) };
    }
}

/// Defines `$fn(kernel, inputs, call)`: builds one backend's launch config from a
/// [`KernelCall`], applies the kernel, returns its outputs. The two C APIs differ
/// only in their prefix, so one body serves both.
macro_rules! apply_fn {
    ($fn:ident, $kernel:ty, $new:ident, $free:ident, $out:ident, $grid:ident, $tg:ident,
     $init:ident, $verbose:ident, $tdt:ident, $tint:ident, $tbool:ident, $apply:ident) => {
        fn $fn(kernel: $kernel, inputs: &[&Array], call: &KernelCall) -> Result<Vec<Array>> {
            init();
            // SAFETY: no arguments; the new config is owned by the guard. A null
            // config (mlx-c failed) makes each call below return an error status.
            let cfg = ConfigGuard(unsafe { sys::$new() }, sys::$free);
            let c = cfg.0;
            for (shape, dtype) in &call.outputs {
                // SAFETY: live config; `shape` is valid for its length during the
                // call and copied by mlx-c.
                check(unsafe { sys::$out(c, shape.as_ptr(), shape.len(), dtype.to_sys()) })?;
            }
            let (g, t) = (call.grid, call.thread_group);
            // SAFETY: live config; plain integers.
            check(unsafe { sys::$grid(c, g.0, g.1, g.2) })?;
            // SAFETY: live config; plain integers.
            check(unsafe { sys::$tg(c, t.0, t.1, t.2) })?;
            if let Some(v) = call.init_value {
                // SAFETY: live config; plain float.
                check(unsafe { sys::$init(c, v) })?;
            }
            // SAFETY: live config; plain bool.
            check(unsafe { sys::$verbose(c, call.verbose) })?;
            for (name, arg) in &call.template {
                let name = cstring(name, "a template argument name")?;
                // SAFETY: live config; `name` is NUL-terminated, outlives the call
                // and is copied by mlx-c.
                check(unsafe {
                    match arg {
                        TemplateArg::Dtype(d) => sys::$tdt(c, name.as_ptr(), d.to_sys()),
                        TemplateArg::Int(i) => sys::$tint(c, name.as_ptr(), *i),
                        TemplateArg::Bool(b) => sys::$tbool(c, name.as_ptr(), *b),
                    }
                })?;
            }
            let ins = VectorArray::new(inputs);
            let mut outs = VectorArray::empty();
            with_current(|s| {
                // SAFETY: live kernel (owned by the caller's CustomKernel), config,
                // input vector and stream; `outs` is a live vector mlx-c fills and
                // `outs` frees.
                check(unsafe { sys::$apply(&mut outs.raw, kernel, ins.raw, c, s) })
            })??;
            outs.into_arrays()
        }
    };
}

apply_fn!(
    apply_metal, sys::mlx_fast_metal_kernel,
    mlx_fast_metal_kernel_config_new, mlx_fast_metal_kernel_config_free,
    mlx_fast_metal_kernel_config_add_output_arg, mlx_fast_metal_kernel_config_set_grid,
    mlx_fast_metal_kernel_config_set_thread_group, mlx_fast_metal_kernel_config_set_init_value,
    mlx_fast_metal_kernel_config_set_verbose, mlx_fast_metal_kernel_config_add_template_arg_dtype,
    mlx_fast_metal_kernel_config_add_template_arg_int, mlx_fast_metal_kernel_config_add_template_arg_bool,
    mlx_fast_metal_kernel_apply
);
apply_fn!(
    apply_cuda, sys::mlx_fast_cuda_kernel,
    mlx_fast_cuda_kernel_config_new, mlx_fast_cuda_kernel_config_free,
    mlx_fast_cuda_kernel_config_add_output_arg, mlx_fast_cuda_kernel_config_set_grid,
    mlx_fast_cuda_kernel_config_set_thread_group, mlx_fast_cuda_kernel_config_set_init_value,
    mlx_fast_cuda_kernel_config_set_verbose, mlx_fast_cuda_kernel_config_add_template_arg_dtype,
    mlx_fast_cuda_kernel_config_add_template_arg_int, mlx_fast_cuda_kernel_config_add_template_arg_bool,
    mlx_fast_cuda_kernel_apply
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_instance_is_its_template_and_types() {
        let f32s = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let i32s = Array::from_slice(&[1i32, 2], &[2]).unwrap();
        let one = Array::scalar(1.0f32);
        let call = |n: i32, out: Dtype| KernelCall::new().output(&[2], out).template("N", TemplateArg::Int(n));
        let key = instance_key(&[&f32s], &call(4, Dtype::Float32));
        assert_eq!(key, instance_key(&[&f32s], &call(4, Dtype::Float32)), "the same instance");
        // The launch shape is not part of it: MLX's source text does not change with it.
        assert_eq!(key, instance_key(&[&f32s], &call(4, Dtype::Float32).grid(64, 1, 1)));
        for (other, what) in [
            (instance_key(&[&f32s], &call(8, Dtype::Float32)), "another template value"),
            (instance_key(&[&i32s], &call(4, Dtype::Float32)), "another input type"),
            (instance_key(&[&one], &call(4, Dtype::Float32)), "a scalar input (no shape passed)"),
            (instance_key(&[&Array::from_slice(&[1.0f32, 2.0], &[1, 2]).unwrap()], &call(4, Dtype::Float32)), "another dimension count"),
            (instance_key(&[&f32s], &call(4, Dtype::Int32)), "another output type"),
            (instance_key(&[&f32s], &KernelCall::new().output(&[2], Dtype::Float32).template("N", TemplateArg::Bool(true))), "another template kind"),
        ] {
            assert_ne!(key, other, "{what}");
        }
    }

    #[test]
    fn only_a_cuda_kernels_output_goes_to_the_kernel_cache() {
        let data = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let sum = crate::ops::add(&data, &data).unwrap();
        for (a, what) in [(&data, "an array of data"), (&sum, "an op's lazy output")] {
            let mut status = -1;
            // SAFETY: a live array; `status` is a local the call writes.
            check(unsafe { sys::mlxs_cuda_kernel_cache(a.raw, &mut status) }).unwrap();
            assert_eq!(status, sys::MLXS_KERNEL_NOT_CACHED as i32, "{what}");
        }
        assert_eq!(kernel_cache_stats(), KernelCacheStats::default(), "nothing counted without a CUDA kernel");
    }

    #[test]
    fn a_cuda_kernel_goes_to_mlx_as_includes_of_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let (header, source) = ("// helpers\n__device__ int twice(int x) { return 2 * x; }\n", "out[0] = twice(a_shape[0]) + b[0];\n");
        let (h, s) = cuda_includes(dir.path(), header, source, &["a", "b"]).unwrap();
        // Each line includes a file holding the text as written (comments kept).
        let file = |line: &str| std::fs::read_to_string(line.trim_start_matches("#include \"").split('"').next().unwrap()).unwrap();
        assert_eq!(file(&h), header);
        let mut lines = s.lines();
        assert_eq!(file(lines.next().unwrap()), source);
        // The shapes the source reads are named, so MLX passes them.
        assert_eq!(lines.next(), Some("// a_shape"));
        assert_eq!(lines.next(), None);
        // Written once: the same text finds the same file, other text another.
        assert_eq!(cuda_includes(dir.path(), header, source, &["a", "b"]).unwrap(), (h.clone(), s.clone()));
        let (h2, _) = cuda_includes(dir.path(), "__device__ int thrice(int x);\n", source, &["a", "b"]).unwrap();
        assert_ne!(h2, h);
        assert!(cuda_includes(dir.path(), "", source, &[]).unwrap().0.is_empty(), "no header, no include");
    }

    #[test]
    fn a_folder_that_cannot_be_written_leaves_the_text_inline() {
        let dir = tempfile::tempdir().unwrap();
        let blocked = dir.path().join("a-file");
        std::fs::write(&blocked, "not a folder").unwrap();
        assert_eq!(cuda_includes(&blocked.join("kernels"), "", "out[0] = 1;\n", &[]), None);
    }
}
