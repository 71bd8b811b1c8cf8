//! The GGUF reader against files written here: metadata of every kind, plain
//! tensors read lazily, Q4_0/Q4_1/Q8_0 blocks repacked exactly into MLX's
//! affine quantization, and clear errors for damaged files.

use half::f16;
use mlx_rs_safe::io::{GgufFile, GgufTensor, GgufType, GgufValue};
use mlx_rs_safe::{ops, quantized, Array, Dtype};

mod common;
use common::{gguf, write};

fn string(x: &str) -> Vec<u8> {
    [(x.len() as u64).to_le_bytes().to_vec(), x.as_bytes().to_vec()].concat()
}

fn floats(a: &Array) -> Vec<f32> {
    ops::astype(a, Dtype::Float32).unwrap().to_vec::<f32>().unwrap()
}

/// Two rows of 64 values in blocks of 32 of a quantized type, with the
/// values each block stands for (computed here from the block's fields).
fn blocks(ty: u32) -> (Vec<u8>, Vec<f32>) {
    let (mut bytes, mut want) = (Vec::new(), Vec::new());
    for b in 0..4u32 {
        let d = f16::from_f32(0.25 + b as f32 * 0.5);
        let m = f16::from_f32(-1.5 + b as f32);
        bytes.extend(d.to_le_bytes());
        match ty {
            8 => {
                let qs: Vec<i8> = (0..32i32).map(|e| (e * 7 - 100 + b as i32 * 3) as i8).collect();
                bytes.extend(qs.iter().map(|&q| q as u8));
                want.extend(qs.iter().map(|&q| q as f32 * d.to_f32()));
            }
            _ => {
                if ty == 3 {
                    bytes.extend(m.to_le_bytes());
                }
                let codes: Vec<u8> = (0..32).map(|e| ((e * 5 + b as usize) % 16) as u8).collect();
                bytes.extend((0..16).map(|j| codes[j] | (codes[j + 16] << 4)));
                let (scale, bias) = if ty == 3 { (d.to_f32(), m.to_f32()) } else { (d.to_f32(), -8.0 * d.to_f32()) };
                want.extend(codes.iter().map(|&c| c as f32 * scale + bias));
            }
        }
    }
    (bytes, want)
}

#[test]
fn metadata_and_plain_tensors_read_back() {
    let tokens = [vec![8u32.to_le_bytes().to_vec(), 2u64.to_le_bytes().to_vec(), string("a"), string("bc")]].concat().concat();
    let values: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let halves: Vec<u8> = values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
    let file = write(&gguf(
        &[
            ("general.architecture", 8, string("llama")),
            ("llama.block_count", 4, 30u32.to_le_bytes().to_vec()),
            ("llama.rope.freq_base", 6, 100000f32.to_le_bytes().to_vec()),
            ("tokenizer.ggml.add_bos_token", 7, vec![0]),
            ("tokenizer.ggml.tokens", 9, tokens),
        ],
        &[
            ("norm.weight", vec![6], 0, values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            ("proj.weight", vec![3, 2], 1, halves),
        ],
    ));
    let g = GgufFile::open(file.path()).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get("general.architecture").and_then(GgufValue::as_str), Some("llama"));
    assert_eq!(g.get("llama.block_count").and_then(GgufValue::as_u64), Some(30));
    assert_eq!(g.get("llama.rope.freq_base").and_then(GgufValue::as_f64), Some(100000.0));
    assert_eq!(g.get("tokenizer.ggml.add_bos_token"), Some(&GgufValue::Bool(false)));
    let toks: Vec<&str> = g.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array).unwrap().iter().filter_map(GgufValue::as_str).collect();
    assert_eq!(toks, ["a", "bc"]);
    assert_eq!(g.names(), ["norm.weight", "proj.weight"]);
    let info = g.info("proj.weight").unwrap();
    assert_eq!((info.ggml_type, info.shape.clone()), (GgufType::F16, vec![2, 3]));
    let GgufTensor::Plain(norm) = g.load("norm.weight").unwrap() else { panic!("plain") };
    assert_eq!(floats(&norm), values);
    let GgufTensor::Plain(proj) = g.load("proj.weight").unwrap() else { panic!("plain") };
    assert_eq!((proj.dtype(), proj.shape()), (Dtype::Float16, vec![2, 3]));
    assert_eq!(floats(&proj), values);
}

#[test]
fn quantized_blocks_become_mlx_affine_quantization_exactly() {
    for (ty, bits) in [(2u32, 4), (3, 4), (8, 8)] {
        let (bytes, want) = blocks(ty);
        let file = write(&gguf(&[], &[("w", vec![64, 2], ty, bytes)]));
        let g = GgufFile::open(file.path()).unwrap();
        let GgufTensor::Quantized { weight, scales, biases, bits: b, group_size } = g.load("w").unwrap() else { panic!("quantized") };
        assert_eq!((b, group_size), (bits, 32), "type {ty}");
        assert_eq!(weight.shape(), vec![2, 64 * bits / 32], "type {ty}");
        assert_eq!((scales.dtype(), scales.shape()), (Dtype::Float16, vec![2, 2]), "type {ty}");
        let got = floats(&quantized::dequantize(&weight, &scales, Some(&biases), 32, bits).unwrap());
        assert_eq!(got, want, "type {ty}");
    }
}

#[test]
fn damaged_files_are_refused_naming_the_file_and_the_field() {
    let (bytes, _) = blocks(3);
    let good = gguf(&[("general.name", 8, string("m"))], &[("w", vec![64, 2], 3, bytes)]);
    let err = |data: &[u8]| match GgufFile::open(write(data).path()) {
        Ok(_) => panic!("a damaged file opened"),
        Err(e) => e.to_string(),
    };
    // Cut anywhere: header, metadata, tensor table or the tensor's last byte.
    let info = GgufFile::open(write(&good).path()).unwrap().info("w").unwrap().clone();
    let data_end = (info.offset + info.nbytes.unwrap()) as usize;
    for cut in [3, 10, 30, 60, data_end - 1] {
        let e = err(&good[..cut]);
        assert!(e.contains("truncated") || e.contains("magic") || e.contains("past the end"), "cut at {cut}: {e}");
    }
    let mut bad = good.clone();
    bad[..4].copy_from_slice(b"GGUX");
    assert!(err(&bad).contains("not a GGUF file"));
    // A string length of 2^40 bytes in the first key.
    let mut huge = good.clone();
    huge[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(err(&huge).contains("metadata key 0"), "{}", err(&huge));
    // 9 dimensions.
    let nine = gguf(&[], &[("w", vec![1; 9], 0, vec![0; 4])]);
    assert!(err(&nine).contains("tensor w: 9 dimensions"));
    // A block type this reader does not convert: the header opens, loading names it.
    let k = write(&gguf(&[], &[("k", vec![256], 17, vec![0; 74])]));
    let g = GgufFile::open(k.path()).unwrap();
    let e = g.load("k").err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("tensor k: IQ2_XS is not supported"), "{e}");
    assert!(g.load("missing").is_err());
}
