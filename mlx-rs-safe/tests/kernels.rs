//! Custom kernels from metal-kernels/: numerically checked on a GPU build,
//! a clean error (no abort) where the backend is absent.

use mlx_rs_safe::kernels::{gpu_backend, CustomKernel, KernelCall, KernelLanguage, KernelSource, TemplateArg};
use mlx_rs_safe::{ops, Array, Dtype};

const SWIGLU_METAL: &str = include_str!("../../metal-kernels/swiglu.metal");
const SWIGLU_CUDA: &str = include_str!("../../metal-kernels/swiglu.cu");

fn swiglu_kernel(language: KernelLanguage) -> mlx_rs_safe::Result<CustomKernel> {
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
            let out = swiglu_kernel(lang).unwrap().apply(&[&g, &u], &call(n, Dtype::Float32)).unwrap();
            let got = out[0].to_vec::<f32>().unwrap();
            let silu = ops::multiply(&g, &ops::sigmoid(&g).unwrap()).unwrap();
            let expect = ops::multiply(&silu, &u).unwrap().to_vec::<f32>().unwrap();
            for i in 0..n as usize {
                assert!((got[i] - expect[i]).abs() <= 1e-5 * expect[i].abs().max(1.0), "{i}: {} vs {}", got[i], expect[i]);
            }
        }
        None => {
            // MLX refuses a CUDA kernel at creation without its backend, a Metal
            // one when it is applied: either way an Err, not an abort.
            for lang in [KernelLanguage::Metal, KernelLanguage::Cuda] {
                let err = swiglu_kernel(lang).and_then(|k| k.apply(&[&g, &u], &call(n, Dtype::Float32))).unwrap_err();
                assert!(err.to_string().starts_with("mlx: "), "{err}");
            }
            // MLX is still usable afterwards.
            assert_eq!(ops::add(&g, &u).unwrap().size(), n as usize);
        }
    }
}

#[test]
fn gpu_backend_matches_the_default_device_and_full_configs_apply_or_error() {
    let on_gpu = mlx_rs_safe::Device::default_device().unwrap() == mlx_rs_safe::Device::Gpu;
    assert_eq!(gpu_backend().is_some(), on_gpu, "{:?}", gpu_backend());
    // Every config setter, through the builder; equal to the struct literal.
    let built = KernelCall::new()
        .output(&[4], Dtype::Float32)
        .output(&[2, 2], Dtype::Int32)
        .grid(4, 1, 1)
        .thread_group(4, 1, 1)
        .init_value(0.0)
        .template("T", TemplateArg::Dtype(Dtype::Float32))
        .template("N", TemplateArg::Int(4))
        .template("FLAG", TemplateArg::Bool(true))
        .verbose(false);
    assert_eq!(built.outputs, vec![(vec![4], Dtype::Float32), (vec![2, 2], Dtype::Int32)]);
    assert_eq!((built.grid, built.thread_group, built.init_value), ((4, 1, 1), (4, 1, 1), Some(0.0)));
    let x = Array::from_vec(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    // Without a GPU, Metal: MLX creates the kernel and fails only when applying.
    let lang = if gpu_backend() == Some("cuda") { KernelLanguage::Cuda } else { KernelLanguage::Metal };
    let body = match lang {
        KernelLanguage::Metal => "uint i = thread_position_in_grid.x; if (FLAG) { out[i] = x[i] * T(N); }",
        KernelLanguage::Cuda => "int i = blockIdx.x * blockDim.x + threadIdx.x; if (FLAG) { out[i] = x[i] * T(N); }",
    };
    let names_in = ["x"];
    let names_out = ["out", "extra"];
    let kernel = CustomKernel::new(lang, &KernelSource::new("scale_by_n", &names_in, &names_out, body)).unwrap();
    assert_eq!(kernel.language(), lang);
    match (gpu_backend(), kernel.apply(&[&x], &built)) {
        (Some(_), Ok(out)) => assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![4.0, 8.0, 12.0, 16.0]),
        (None, Err(e)) => assert!(e.to_string().starts_with("mlx: "), "{e}"),
        (backend, other) => panic!("backend {backend:?}: {other:?}"),
    }
    // Two inputs given to a one-input kernel.
    assert!(kernel.apply(&[&x, &x], &built).is_err());
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

#[test]
fn compact_drops_comments_indentation_and_blank_lines() {
    let code = "// leading comment\n#define N 4  // tail\n\n  int a = 1; // why\n  const char* s = \"a // b\"; // c\n  return x / y;\n";
    assert_eq!(
        mlx_rs_safe::kernels::compact(code),
        "#define N 4\nint a = 1;\nconst char* s = \"a // b\";\nreturn x / y;\n"
    );
}

#[test]
fn compact_keeps_the_code_of_every_kernel() {
    // Every kernel and header in metal-kernels/: the same code, token for token
    // and line for line, only lighter (MLX gets the compact text).
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../metal-kernels");
    let code_lines = |s: &str| -> Vec<Vec<String>> {
        s.lines()
            .map(|l| l.split("//").next().unwrap_or("").split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .filter(|words| !words.is_empty())
            .collect()
    };
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !matches!(path.extension().and_then(|e| e.to_str()), Some("cu" | "cuh" | "metal")) {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        let small = mlx_rs_safe::kernels::compact(&src);
        assert_eq!(code_lines(&small), code_lines(&src), "{}", path.display());
        assert!(small.len() < src.len(), "{}", path.display());
        files += 1;
    }
    assert!(files >= 10, "{files} kernel files in {}", dir.display());
    let largest = include_str!("../../metal-kernels/quant_matmul.cu");
    assert!(mlx_rs_safe::kernels::compact(largest).len() * 3 < largest.len() * 2);
}
