//! Direct calls of CUDA custom kernel instances, for the calls after an
//! instance's first.
//!
//! MLX's `cuda_kernel` rebuilds an instance's whole source text (signature,
//! template constants, body) at every call, and MLX hashes that text at
//! every evaluation to find the compiled module: host time per launch, on
//! decode steps that are bound by the host (`decode_step --host-profile`
//! on an H200 put ~17% of a Llama-3.1-8B step's host time in
//! `mlx_fast_cuda_kernel_apply`). MLX's precompiled kernels
//! (`precompiled_cuda_kernel`) skip both: they name a module, which MLX reads
//! from its kernel cache folder once and keeps. So the first call of an
//! instance takes MLX's generated text ([`DirectCall::prepare`]), makes it a
//! device function behind an `extern "C"` kernel whose arguments a
//! precompiled call can pass (pointers, then ints), writes that kernel's
//! module to the cache (compile-once, as for the other custom kernels) and
//! calls it from then on ([`DirectCall::apply`]).

use std::ffi::CString;

use mlx_sys as sys;

use crate::array::Array;
use crate::device::with_current;
use crate::error::{check, Result};
use crate::kernels::KernelCall;
use crate::mlx_string::MlxString;
use crate::transforms::VectorArray;

/// What MLX's signature passes after one input's pointer (where the source
/// names them), which the direct kernel takes as ints after the outputs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct InputExtras {
    /// The shape (`<name>_shape`), as this many ints: the input's dimension
    /// count at the first call (part of the instance's key).
    pub shape: Option<usize>,
    /// The dimension count (`<name>_ndim`).
    pub ndim: bool,
}

/// The direct kernel of one instance: its source and how to call it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DirectSource {
    /// The `extern "C"` kernel's name (in `mlx::core::cu`).
    pub kernel: String,
    pub source: String,
    pub inputs: Vec<InputExtras>,
}

/// MLX's generated source of an instance (kernel function `func`, as
/// `cuda_kernel` writes it for inputs of `ndims` dimensions) with that
/// function made a device function, and a kernel calling it that takes
/// pointers (inputs', outputs') then ints (shapes, dimension counts). None
/// where the text is not as expected (another MLX's layout, or strides,
/// which are 64-bit and no precompiled call passes): MLX's own call then
/// serves the instance.
pub(crate) fn direct_source(func: &str, generated: &str, ndims: &[usize]) -> Option<DirectSource> {
    let open = format!("__global__ void {func}(\n");
    let start = generated.find(&open)?;
    let params_at = start + open.len();
    let params_len = generated[params_at..].find(") {\n")?;
    let params = &generated[params_at..params_at + params_len];

    let mut inputs: Vec<(String, InputExtras)> = Vec::new();
    let mut pointers: Vec<String> = Vec::new();
    let mut call_args: Vec<String> = Vec::new();
    let mut ints = 0usize;
    let mut unpack = String::new();
    let mut outputs = 0usize;
    for param in params.split(",\n").map(str::trim) {
        if let Some(name) = param.strip_prefix("const __grid_constant__ Shape ") {
            let index = inputs.len().checked_sub(1)?;
            let dims = *ndims.get(index)?;
            let (input, extras) = inputs.last_mut()?;
            if outputs > 0 || extras.shape.is_some() || name != format!("{input}_shape") {
                return None;
            }
            let local = format!("mlxs_shape{index}");
            unpack.push_str(&format!("  Shape {local}{{}};\n"));
            for d in 0..dims {
                unpack.push_str(&format!("  {local}[{d}] = mlxs_i{};\n", ints + d));
            }
            ints += dims;
            extras.shape = Some(dims);
            call_args.push(local);
        } else if let Some(name) = param.strip_prefix("const __grid_constant__ int ") {
            let (input, extras) = inputs.last_mut()?;
            if outputs > 0 || extras.ndim || name != format!("{input}_ndim") {
                return None;
            }
            extras.ndim = true;
            call_args.push(format!("mlxs_i{ints}"));
            ints += 1;
        } else {
            // A pointer: `const T* name` an input, `T* name` an output.
            let star = param.rfind('*')?;
            let (ty, name) = (param[..=star].trim(), param[star + 1..].trim());
            let ident = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ident(name) || ty.contains("__grid_constant__") {
                return None;
            }
            if ty.starts_with("const ") && outputs == 0 {
                inputs.push((name.to_string(), InputExtras { shape: None, ndim: false }));
            } else if ty.starts_with("const ") {
                return None;
            } else {
                outputs += 1;
            }
            pointers.push(format!("{ty} {name}"));
            call_args.push(name.to_string());
        }
    }
    if outputs == 0 || inputs.len() != ndims.len() {
        return None;
    }

    let kernel = {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        (generated, ndims).hash(&mut h);
        format!("mlxs_direct_{:016x}", h.finish())
    };
    let mut signature = pointers;
    signature.extend((0..ints).map(|i| format!("int mlxs_i{i}")));
    let device_fn = format!("__device__ __forceinline__ void {func}(\n");
    let source = format!(
        "{before}{device_fn}{params}{rest}\nnamespace mlx::core::cu {{\nextern \"C\" __global__ void {kernel}({sig}) {{\n{unpack}  {func}({args});\n}}\n}} // namespace mlx::core::cu\n",
        before = &generated[..start],
        params = params.replace("const __grid_constant__ ", "const "),
        rest = &generated[params_at + params_len..],
        sig = signature.join(", "),
        args = call_args.join(", "),
    );
    Some(DirectSource { kernel, source, inputs: inputs.into_iter().map(|(_, e)| e).collect() })
}

/// One instance's direct kernel, compiled and in MLX's kernel cache.
pub(crate) struct DirectCall {
    /// The kernel's name, which is also its precompiled "source": MLX keys
    /// the module by name and that text's hash, finds it in its cache
    /// folder (written by `prepare`) and never reads the text as code.
    kernel: CString,
    inputs: Vec<InputExtras>,
    shared_memory: i32,
    ensure_row_contiguous: bool,
}

/// How [`DirectCall::prepare`] ended.
pub(crate) enum Prepared {
    /// Ready; whether its module was compiled now (else the cache held it).
    Ready(DirectCall, bool),
    /// Not for this instance (not a CUDA custom kernel's output, no cache
    /// folder, or MLX's text not as [`direct_source`] reads it).
    Unsuited,
}

impl DirectCall {
    /// From `out`, the first call's (unevaluated) output of an instance over
    /// `inputs`: its direct kernel, compiled into MLX's cache unless there.
    /// `Err` where compiling or writing failed.
    pub(crate) fn prepare(out: &Array, inputs: &[&Array]) -> Result<Prepared> {
        let (mut name, mut text) = (MlxString::new(), MlxString::new());
        let (mut shared_memory, mut contiguous, mut found) = (0i32, false, false);
        // SAFETY: live array and string handles (set in place); the rest are
        // locals the call writes.
        check(unsafe { sys::mlxs_cuda_kernel_source(out.raw, &mut name.raw, &mut text.raw, &mut shared_memory, &mut contiguous, &mut found) })?;
        if !found {
            return Ok(Prepared::Unsuited);
        }
        let (func, generated) = (name.text(), text.text());
        let ndims: Vec<usize> = inputs.iter().map(|a| a.ndim()).collect();
        let Some(direct) = direct_source(&func, &generated, &ndims) else {
            return Ok(Prepared::Unsuited);
        };
        let nul = |_| crate::Error::InvalidArgument("MLX's kernel text holds a NUL byte".into());
        let (kernel, source) = (CString::new(direct.kernel).map_err(nul)?, CString::new(direct.source).map_err(nul)?);
        let mut status = sys::MLXS_KERNEL_NOT_CACHED as i32;
        // SAFETY: live array; NUL-terminated strings alive for the call; `status` a local.
        check(unsafe { sys::mlxs_cuda_kernel_precompile(out.raw, kernel.as_ptr(), kernel.as_ptr(), source.as_ptr(), &mut status) })?;
        let call = DirectCall { kernel, inputs: direct.inputs, shared_memory, ensure_row_contiguous: contiguous };
        Ok(Prepared::Ready(call, status == sys::MLXS_KERNEL_WRITTEN as i32))
    }

    /// The instance over `inputs` with `call`'s outputs, grid and fill.
    pub(crate) fn apply(&self, inputs: &[&Array], call: &KernelCall) -> Result<Vec<Array>> {
        let raw: Vec<sys::mlx_array> = inputs.iter().map(|a| a.raw).collect();
        let mut ints: Vec<i32> = Vec::new();
        for (a, extras) in inputs.iter().zip(&self.inputs) {
            if extras.shape.is_some() {
                ints.extend_from_slice(&a.shape());
            }
            if extras.ndim {
                ints.push(a.ndim() as i32);
            }
        }
        let shapes: Vec<i32> = call.outputs.iter().flat_map(|(s, _)| s.iter().copied()).collect();
        let ndims: Vec<usize> = call.outputs.iter().map(|(s, _)| s.len()).collect();
        let dtypes: Vec<sys::mlx_dtype> = call.outputs.iter().map(|(_, d)| d.to_sys()).collect();
        let init = call.init_value;
        let init_ptr = init.as_ref().map_or(std::ptr::null(), |v| v as *const f32);
        let (g, t) = (call.grid, call.thread_group);
        let mut outs = VectorArray::empty();
        with_current(|s| {
            // SAFETY: every pointer is to a live local of the stated length (the
            // kernel name NUL-terminated), read during the call only; `outs` is a
            // live vector the call fills and `outs` frees.
            check(unsafe {
                sys::mlxs_precompiled_cuda_kernel(
                    &mut outs.raw,
                    self.kernel.as_ptr(),
                    self.kernel.as_ptr(),
                    raw.as_ptr(),
                    raw.len(),
                    shapes.as_ptr(),
                    ndims.as_ptr(),
                    dtypes.as_ptr(),
                    dtypes.len(),
                    ints.as_ptr(),
                    ints.len(),
                    g.0,
                    g.1,
                    g.2,
                    t.0,
                    t.1,
                    t.2,
                    self.shared_memory,
                    init_ptr,
                    self.ensure_row_contiguous,
                    s,
                )
            })
        })??;
        outs.into_arrays()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel's text as MLX 0.32's `cuda_kernel` writes it (build_kernel):
    /// inputs `x` (shape and ndim named by the body) and `w`, output `out`.
    fn generated(func: &str) -> String {
        format!(
            "\n#include \"mlx/backend/cuda/device/utils.cuh\"\n\n#include <cooperative_groups.h>\n\n#include \"/k/h.cuh\"\n\
             namespace mlx::core::cu {{\n\nnamespace cg = cooperative_groups;\n\n__global__ void {func}(\n    const float* x,\n    \
             const __grid_constant__ Shape x_shape,\n    const __grid_constant__ int x_ndim,\n    const uint32_t* w,\n    float* out) {{\n  \
             constexpr int RT = 2;\n\n#include \"/k/body.cu\"\n\n}}\n\n}} // namespace mlx::core::cu\n"
        )
    }

    #[test]
    fn the_direct_kernel_takes_pointers_then_ints() {
        let func = "custom_kernel_quant_matmul_2";
        let text = generated(func);
        let d = direct_source(func, &text, &[3, 2]).unwrap();
        assert_eq!(d.inputs, vec![InputExtras { shape: Some(3), ndim: true }, InputExtras { shape: None, ndim: false }]);
        assert!(d.kernel.starts_with("mlxs_direct_"));
        // MLX's kernel, now a device function with its parameters as they were
        // (no __grid_constant__, which only a kernel's may have).
        assert!(d.source.contains(&format!("__device__ __forceinline__ void {func}(\n    const float* x,\n    const Shape x_shape,\n    const int x_ndim,")));
        assert!(!d.source.contains("__global__ void custom_kernel"));
        assert!(!d.source.contains("__grid_constant__"));
        // The body and everything around it unchanged.
        assert!(d.source.starts_with("\n#include \"mlx/backend/cuda/device/utils.cuh\""));
        assert!(d.source.contains("  constexpr int RT = 2;\n\n#include \"/k/body.cu\"\n\n}\n\n} // namespace mlx::core::cu\n"));
        // The kernel: pointers in MLX's order, then the shape's three ints and the count.
        let kernel = format!(
            "extern \"C\" __global__ void {}(const float* x, const uint32_t* w, float* out, int mlxs_i0, int mlxs_i1, int mlxs_i2, int mlxs_i3) {{\n  \
             Shape mlxs_shape0{{}};\n  mlxs_shape0[0] = mlxs_i0;\n  mlxs_shape0[1] = mlxs_i1;\n  mlxs_shape0[2] = mlxs_i2;\n  \
             {func}(x, mlxs_shape0, mlxs_i3, w, out);\n}}\n",
            d.kernel
        );
        assert!(d.source.contains(&kernel), "{}", d.source);
    }

    #[test]
    fn each_instance_and_dimension_count_has_its_own_kernel() {
        let func = "custom_kernel_quant_matmul_2";
        let a = direct_source(func, &generated(func), &[3, 2]).unwrap();
        assert_eq!(a, direct_source(func, &generated(func), &[3, 2]).unwrap(), "the same text, the same kernel");
        let b = direct_source(func, &generated(func), &[2, 2]).unwrap();
        assert_ne!(a.kernel, b.kernel, "another dimension count");
        assert_eq!(b.inputs[0].shape, Some(2));
        let other = "custom_kernel_quant_matmul_4";
        assert_ne!(a.kernel, direct_source(other, &generated(other), &[3, 2]).unwrap().kernel, "another instance");
    }

    #[test]
    fn only_a_cuda_kernels_output_has_a_direct_call() {
        let data = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let sum = crate::ops::add(&data, &data).unwrap();
        for (a, what) in [(&data, "an array of data"), (&sum, "an op's lazy output")] {
            assert!(matches!(DirectCall::prepare(a, &[&data]).unwrap(), Prepared::Unsuited), "{what}");
        }
    }

    #[test]
    fn text_it_cannot_read_is_left_to_mlx() {
        let func = "custom_kernel_k";
        let text = generated(func);
        assert!(direct_source("custom_kernel_other", &text, &[3, 2]).is_none(), "another function");
        assert!(direct_source(func, &text, &[3]).is_none(), "another input count");
        let strided = text.replace("const __grid_constant__ int x_ndim", "const __grid_constant__ Strides x_strides");
        assert!(direct_source(func, &strided, &[3, 2]).is_none(), "strides (64-bit) are not passed");
        let odd = text.replace("    float* out) {", "    float* out, int extra) {");
        assert!(direct_source(func, &odd, &[3, 2]).is_none(), "a parameter of another kind");
        let misplaced = text.replace("const __grid_constant__ Shape x_shape", "const __grid_constant__ Shape w_shape");
        assert!(direct_source(func, &misplaced, &[3, 2]).is_none(), "a shape not after its input");
    }
}
