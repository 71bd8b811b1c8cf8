//! Custom kernels from metal-kernels/: numerically checked on a GPU build,
//! a clean error (no abort) where the backend is absent.

use mlx_rs_safe::kernels::{gpu_backend, CustomKernel, KernelCall, KernelLanguage, KernelSource, TemplateArg};
use mlx_rs_safe::{ops, Array, Dtype};

const SWIGLU_METAL: &str = include_str!("../../metal-kernels/swiglu.metal");
const SWIGLU_CUDA: &str = include_str!("../../metal-kernels/swiglu.cu");

fn swiglu_kernel(language: KernelLanguage) -> CustomKernel {
    let source = match language {
        KernelLanguage::Metal => SWIGLU_METAL,
        KernelLanguage::Cuda => SWIGLU_CUDA,
    };
    CustomKernel::new(
        language,
        &KernelSource {
            name: "swiglu",
            input_names: &["gate", "up"],
            output_names: &["out"],
            source,
            header: "",
            ensure_row_contiguous: true,
            atomic_outputs: false,
            shared_memory: 0,
        },
    )
    .unwrap()
}

fn call(n: i32, dtype: Dtype) -> KernelCall {
    KernelCall {
        outputs: vec![(vec![n], dtype)],
        grid: (n, 1, 1),
        thread_group: (256, 1, 1),
        template: vec![("T".into(), TemplateArg::Dtype(dtype))],
        ..Default::default()
    }
}

#[test]
fn swiglu_kernel_matches_ops_on_the_gpu_or_errors_cleanly_without_one() {
    let n = 1000;
    let gate: Vec<f32> = (0..n).map(|i| (i as f32 - 500.0) / 100.0).collect();
    let up: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
    let (g, u) = (Array::from_vec(&gate).unwrap(), Array::from_vec(&up).unwrap());
    match gpu_backend() {
        Some(backend) => {
            let lang = if backend == "metal" { KernelLanguage::Metal } else { KernelLanguage::Cuda };
            let out = swiglu_kernel(lang).apply(&[&g, &u], &call(n, Dtype::Float32)).unwrap();
            let got = out[0].to_vec::<f32>().unwrap();
            let silu = ops::multiply(&g, &ops::sigmoid(&g).unwrap()).unwrap();
            let expect = ops::multiply(&silu, &u).unwrap().to_vec::<f32>().unwrap();
            for i in 0..n as usize {
                assert!((got[i] - expect[i]).abs() <= 1e-5 * expect[i].abs().max(1.0), "{i}: {} vs {}", got[i], expect[i]);
            }
        }
        None => {
            for lang in [KernelLanguage::Metal, KernelLanguage::Cuda] {
                let err = swiglu_kernel(lang).apply(&[&g, &u], &call(n, Dtype::Float32)).unwrap_err();
                assert!(err.to_string().starts_with("mlx: "), "{err}");
            }
            // MLX is still usable afterwards.
            assert_eq!(ops::add(&g, &u).unwrap().size(), n as usize);
        }
    }
}

#[test]
fn names_with_nul_bytes_are_rejected_before_mlx() {
    let bad = CustomKernel::new(
        KernelLanguage::Cuda,
        &KernelSource {
            name: "bad\0name",
            input_names: &[],
            output_names: &[],
            source: "",
            header: "",
            ensure_row_contiguous: false,
            atomic_outputs: false,
            shared_memory: 0,
        },
    );
    assert!(bad.is_err());
}
