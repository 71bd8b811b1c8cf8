//! GGUF types MLX cannot hold exactly (Q5_0, Q5_1, Q2_K..Q6_K) dequantized at
//! load, and every readable type through `GgufFile::dequantize`, against
//! gguf-py 0.19.0's `gguf.quants.dequantize` (llama.cpp's own Python package,
//! which mirrors ggml's `dequantize_row_*`) on blocks of random bytes.

use std::path::{Path, PathBuf};
use std::process::Command;

use half::{bf16, f16};
use mlx_rs_safe::io::{GgufFile, GgufTensor, GgufType};
use mlx_rs_safe::{ops, Array, Dtype};

mod common;
use common::{gguf, write};

/// Every readable type: ggml id, type, and the byte offsets of the f16 fields
/// (scales, minimums) in one block.
const TYPES: &[(u32, GgufType, &[usize])] = &[
    (0, GgufType::F32, &[]),
    (1, GgufType::F16, &[]),
    (30, GgufType::Bf16, &[]),
    (2, GgufType::Q4_0, &[0]),
    (3, GgufType::Q4_1, &[0, 2]),
    (6, GgufType::Q5_0, &[0]),
    (7, GgufType::Q5_1, &[0, 2]),
    (8, GgufType::Q8_0, &[0]),
    (10, GgufType::Q2K, &[80, 82]),
    (11, GgufType::Q3K, &[108]),
    (12, GgufType::Q4K, &[0, 2]),
    (13, GgufType::Q5K, &[0, 2]),
    (14, GgufType::Q6K, &[208]),
];

/// Tensors of each test file: name and GGUF dims (innermost first). "big"
/// has enough values to be split across threads, unevenly.
const TENSORS: &[(&str, [u64; 2])] = &[("a", [512, 3]), ("b", [256, 2]), ("big", [4096, 131])];

/// (values, bytes) of one block.
fn block(id: u32) -> (usize, usize) {
    match id {
        0 => (1, 4),
        1 | 30 => (1, 2),
        2 => (32, 18),
        3 => (32, 20),
        6 => (32, 22),
        7 => (32, 24),
        8 => (32, 34),
        10 => (256, 84),
        11 => (256, 110),
        12 => (256, 144),
        13 => (256, 176),
        14 => (256, 210),
        _ => unreachable!("type {id}"),
    }
}

/// splitmix64: deterministic bytes without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A finite f16 of either sign with magnitude in [2^-10, 2^2).
    fn small_f16(&mut self) -> f16 {
        let r = self.next();
        let exponent = 5 + (r >> 16) % 12;
        f16::from_bits(((r & 1) << 15 | exponent << 10 | (r >> 32) & 0x3ff) as u16)
    }
}

/// `values` values of type `id` as stored: random bytes with the f16 fields
/// set to small finite values (plain types: small finite values).
fn random_data(id: u32, values: usize, rng: &mut Rng) -> Vec<u8> {
    let (per, bytes) = block(id);
    let mut data: Vec<u8> = (0..values / per * bytes).map(|_| rng.next() as u8).collect();
    let fields = TYPES.iter().find(|t| t.0 == id).unwrap().2;
    for b in data.chunks_exact_mut(bytes) {
        match id {
            0 => b.copy_from_slice(&(rng.small_f16().to_f32() * (1.0 + (rng.next() % 1024) as f32 / 8192.0)).to_le_bytes()),
            1 => b.copy_from_slice(&rng.small_f16().to_le_bytes()),
            30 => b.copy_from_slice(&bf16::from_f32(rng.small_f16().to_f32()).to_le_bytes()),
            _ => {
                for &at in fields {
                    b[at..at + 2].copy_from_slice(&rng.small_f16().to_le_bytes());
                }
            }
        }
    }
    data
}

fn python() -> PathBuf {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vendor/pyref/bin/python");
    assert!(python.exists(), "{} is missing: the reference environment (gguf 0.19.0) is built by scripts/reference-env.sh", python.display());
    python
}

/// gguf-py's dequantization of each (ggml id, raw bytes), as f32.
fn reference(cases: &[(u32, &[u8])]) -> Vec<Vec<f32>> {
    let dir = tempfile::tempdir().unwrap();
    let mut args = Vec::new();
    for (i, (id, raw)) in cases.iter().enumerate() {
        let (src, dst) = (dir.path().join(format!("{i}.raw")), dir.path().join(format!("{i}.f32")));
        std::fs::write(&src, raw).unwrap();
        args.extend([id.to_string(), src.display().to_string(), dst.display().to_string()]);
    }
    let script = "import sys, numpy as np\n\
                  from gguf.constants import GGMLQuantizationType as T\n\
                  from gguf.quants import dequantize\n\
                  a = sys.argv[1:]\n\
                  for ty, src, dst in zip(a[0::3], a[1::3], a[2::3]):\n\
                  \x20   y = dequantize(np.fromfile(src, dtype=np.uint8), T(int(ty)))\n\
                  \x20   assert y.dtype == np.float32, y.dtype\n\
                  \x20   y.reshape(-1).astype('<f4').tofile(dst)\n";
    let out = Command::new(python()).arg("-c").arg(script).args(&args).output().unwrap();
    assert!(out.status.success(), "gguf-py failed: {}", String::from_utf8_lossy(&out.stderr));
    (0..cases.len())
        .map(|i| std::fs::read(dir.path().join(format!("{i}.f32"))).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        .collect()
}

fn plain(t: GgufTensor) -> Array {
    match t {
        GgufTensor::Plain(a) => a,
        GgufTensor::Quantized { .. } => panic!("expected a plain array"),
    }
}

/// Asserts the same bits, naming the first difference.
fn assert_same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: value {i} is {} ({:#x}), gguf-py gives {} ({:#x})", got[i], got[i].to_bits(), want[i], want[i].to_bits());
    }
}

/// A file of the type's TENSORS filled with random blocks, and their bytes.
fn file_of(id: u32, rng: &mut Rng) -> (tempfile::NamedTempFile, Vec<Vec<u8>>) {
    let data: Vec<Vec<u8>> = TENSORS.iter().map(|(_, dims)| random_data(id, (dims[0] * dims[1]) as usize, rng)).collect();
    let tensors: Vec<_> = TENSORS.iter().zip(&data).map(|((name, dims), raw)| (*name, dims.to_vec(), id, raw.clone())).collect();
    (write(&gguf(&[], &tensors)), data)
}

// Exact equality holds, so no tolerance: like gguf-py (numpy, one rounding per
// operation), the Rust code computes in f32 with the same operations in the
// same order ((d * sc) * q - dmin * m, d * q + m, ...) and no fused
// multiply-add, so every intermediate rounds identically on both sides.
#[test]
fn every_readable_type_dequantizes_to_exactly_what_gguf_py_computes() {
    let mut rng = Rng(13);
    let files: Vec<_> = TYPES.iter().map(|&(id, _, _)| file_of(id, &mut rng)).collect();
    let cases: Vec<(u32, &[u8])> = TYPES.iter().zip(&files).flat_map(|(&(id, _, _), (_, data))| data.iter().map(move |d| (id, d.as_slice()))).collect();
    let mut want = reference(&cases).into_iter();
    for (&(id, ty, _), (file, _)) in TYPES.iter().zip(&files) {
        let g = GgufFile::open(file.path()).unwrap();
        for (name, dims) in TENSORS {
            let want = want.next().unwrap();
            let shape = vec![dims[1] as i32, dims[0] as i32];
            let info = g.info(name).unwrap();
            assert_eq!((info.ggml_type, &info.shape), (ty, &shape), "type {id}");
            let what = format!("{} tensor {name}", ty.name());
            let values = g.dequantize(name, Dtype::Float32).unwrap();
            assert_eq!((values.dtype(), values.shape()), (Dtype::Float32, shape.clone()), "{what}");
            assert_same_bits(&values.to_vec::<f32>().unwrap(), &want, &what);
            match g.load_as(name, Dtype::Float32).unwrap() {
                GgufTensor::Plain(a) if !ty.exact_in_mlx() => {
                    assert_eq!((a.dtype(), a.shape()), (Dtype::Float32, shape), "{what}");
                    assert_same_bits(&a.to_vec::<f32>().unwrap(), &want, &format!("{what} (load_as)"));
                }
                // The plain types stay as stored.
                GgufTensor::Plain(a) => assert_eq!(
                    a.dtype(),
                    [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16][[0, 1, 30].iter().position(|&i| i == id).expect("a plain type")],
                    "{what}"
                ),
                GgufTensor::Quantized { .. } => assert!(matches!(ty, GgufType::Q4_0 | GgufType::Q4_1 | GgufType::Q8_0), "{what}"),
            }
        }
    }
}

#[test]
fn bf16_and_f16_outputs_are_the_f32_values_rounded_to_nearest_even() {
    let mut rng = Rng(7);
    for &(id, ty, _) in TYPES.iter().filter(|t| !t.1.exact_in_mlx()) {
        let (file, _) = file_of(id, &mut rng);
        let g = GgufFile::open(file.path()).unwrap();
        for (name, _) in TENSORS {
            let what = format!("{} tensor {name}", ty.name());
            let f32s = plain(g.load_as(name, Dtype::Float32).unwrap());
            let values = f32s.to_vec::<f32>().unwrap();
            let bf16s = plain(g.load(name).unwrap());
            assert_eq!((bf16s.dtype(), bf16s.shape()), (Dtype::Bfloat16, f32s.shape()), "{what}");
            let got: Vec<u16> = bf16s.to_vec::<bf16>().unwrap().iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, values.iter().map(|&v| bf16::from_f32(v).to_bits()).collect::<Vec<_>>(), "{what}: bf16");
            // MLX rounds the same way.
            let mlx: Vec<u16> = ops::astype(&f32s, Dtype::Bfloat16).unwrap().to_vec::<bf16>().unwrap().iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, mlx, "{what}: bf16 as MLX rounds");
            let f16s = plain(g.load_as(name, Dtype::Float16).unwrap());
            assert_eq!(f16s.dtype(), Dtype::Float16, "{what}");
            let got: Vec<u16> = f16s.to_vec::<f16>().unwrap().iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, values.iter().map(|&v| f16::from_f32(v).to_bits()).collect::<Vec<_>>(), "{what}: f16");
            let same = g.dequantize(name, Dtype::Bfloat16).unwrap().to_vec::<bf16>().unwrap();
            assert_eq!(same.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), mlx, "{what}: dequantize");
        }
    }
}

fn open_err(bytes: &[u8]) -> String {
    match GgufFile::open(write(bytes).path()) {
        Ok(_) => panic!("a damaged file opened"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_truncated_or_ragged_k_quant_tensor_is_refused() {
    for id in [10, 11, 12, 13, 14] {
        let (_, bytes) = block(id);
        let whole = gguf(&[], &[("w", vec![256, 2], id, vec![0; 2 * bytes])]);
        let info = GgufFile::open(write(&whole).path()).unwrap().info("w").unwrap().clone();
        assert_eq!(info.nbytes, Some(2 * bytes as u64), "type {id}");
        // Cut off the tensor's last byte (the file ends in alignment padding).
        let e = open_err(&whole[..(info.offset + 2 * bytes as u64 - 1) as usize]);
        assert!(e.contains(&format!("tensor w: {} bytes at offset", 2 * bytes)) && e.contains("truncated?"), "type {id}: {e}");
    }
    let e = open_err(&gguf(&[], &[("w", vec![128, 2], 14, vec![0; 210])]));
    assert!(e.contains("tensor w: Q6_K rows of 128 values are not whole blocks of 256"), "{e}");
}

fn refusal<T>(r: mlx_rs_safe::Result<T>) -> String {
    match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn types_not_read_are_refused_by_name() {
    // IQ2_XS (17): 74 bytes per 256 values; IQ4_XS (23): 136; 99: no ggml type.
    let file = write(&gguf(&[], &[("iq2", vec![256], 17, vec![0; 74]), ("iq4", vec![256], 23, vec![0; 136]), ("odd", vec![4], 99, vec![0; 4])]));
    let g = GgufFile::open(file.path()).unwrap();
    for (name, ty) in [("iq2", "IQ2_XS"), ("iq4", "IQ4_XS"), ("odd", "type 99")] {
        assert_eq!(g.info(name).unwrap().nbytes, None);
        let want = format!("tensor {name}: {ty} is not supported");
        for e in [refusal(g.load(name)), refusal(g.load_as(name, Dtype::Float32)), refusal(g.dequantize(name, Dtype::Float16))] {
            assert!(e.contains(&want), "{e}");
        }
    }
}

#[test]
fn a_float_type_other_than_f32_f16_bf16_is_refused() {
    let (file, _) = file_of(12, &mut Rng(1));
    let g = GgufFile::open(file.path()).unwrap();
    for dtype in [Dtype::Int32, Dtype::Float64, Dtype::Uint8] {
        for e in [refusal(g.load_as("a", dtype)), refusal(g.dequantize("a", dtype))] {
            assert!(e.contains("Float32, Float16 or Bfloat16"), "{e}");
        }
    }
}

#[test]
fn names_and_exactness_follow_ggml() {
    let named = [
        (GgufType::F32, "F32", true),
        (GgufType::F16, "F16", true),
        (GgufType::Bf16, "BF16", true),
        (GgufType::Q4_0, "Q4_0", true),
        (GgufType::Q4_1, "Q4_1", true),
        (GgufType::Q8_0, "Q8_0", true),
        (GgufType::Q5_0, "Q5_0", false),
        (GgufType::Q5_1, "Q5_1", false),
        (GgufType::Q2K, "Q2_K", false),
        (GgufType::Q3K, "Q3_K", false),
        (GgufType::Q4K, "Q4_K", false),
        (GgufType::Q5K, "Q5_K", false),
        (GgufType::Q6K, "Q6_K", false),
        (GgufType::Other(15), "Q8_K", false),
        (GgufType::Other(16), "IQ2_XXS", false),
        (GgufType::Other(23), "IQ4_XS", false),
        (GgufType::Other(29), "IQ1_M", false),
        (GgufType::Other(35), "TQ2_0", false),
        (GgufType::Other(39), "MXFP4", false),
        (GgufType::Other(16 + 16), "type 32", false),
        (GgufType::Other(1000), "type 1000", false),
    ];
    for (ty, name, exact) in named {
        assert_eq!((ty.name().as_str(), ty.exact_in_mlx()), (name, exact), "{ty:?}");
    }
}

#[test]
fn every_type_id_is_named_as_gguf_py_names_it() {
    let script =
        "from gguf.constants import GGMLQuantizationType as T\nfor i in range(64):\n    print(T(i).name if i in T._value2member_map_ else f'type {i}')\n";
    let out = Command::new(python()).arg("-c").arg(script).output().unwrap();
    assert!(out.status.success(), "gguf-py failed: {}", String::from_utf8_lossy(&out.stderr));
    let want: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
    let got: Vec<String> = (0..64).map(|id| GgufType::from_id(id).name()).collect();
    assert_eq!(got, want);
}
