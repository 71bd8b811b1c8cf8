//! Safetensors files written by the `safetensors` crate, read back as MLX arrays.

use std::collections::HashMap;
use std::io::Write;

use half::bf16;
use mlx_rs_safe::io::SafetensorsFile;
use mlx_rs_safe::{eval, ops, Dtype};
use safetensors::tensor::TensorView;

fn le_bytes<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

fn write_sample(dir: &std::path::Path) -> std::path::PathBuf {
    let f32s: Vec<f32> = (0..6).map(|i| i as f32 * 1.5 - 2.0).collect();
    let bf16s: Vec<bf16> = [0.5f32, -3.0, 8.0, 0.0].iter().map(|&x| bf16::from_f32(x)).collect();
    let i32s = [7i32, -1, 1 << 20];
    let u8s = [1u8, 2, 3];
    let b_f32 = le_bytes(&f32s, f32::to_le_bytes);
    let b_bf16 = le_bytes(&bf16s, bf16::to_le_bytes);
    let b_i32 = le_bytes(&i32s, i32::to_le_bytes);
    let tensors = vec![
        ("w.weight", TensorView::new(safetensors::Dtype::F32, vec![2, 3], &b_f32).unwrap()),
        ("x.bf16", TensorView::new(safetensors::Dtype::BF16, vec![2, 2], &b_bf16).unwrap()),
        ("ids", TensorView::new(safetensors::Dtype::I32, vec![3], &b_i32).unwrap()),
        ("bytes", TensorView::new(safetensors::Dtype::U8, vec![3, 1], &u8s).unwrap()),
    ];
    let meta = HashMap::from([("format".to_string(), "mlx".to_string())]);
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(tensors, Some(meta), &path).unwrap();
    path
}

#[test]
fn round_trip_of_a_file_written_by_the_safetensors_crate() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(dir.path());
    let st = SafetensorsFile::open(&path).unwrap();
    assert_eq!(st.user_metadata().get("format").map(String::as_str), Some("mlx"));
    let mut names = st.names().to_vec();
    names.sort();
    assert_eq!(names, vec!["bytes", "ids", "w.weight", "x.bf16"]);

    let w = st.load("w.weight").unwrap();
    assert_eq!((w.shape(), w.dtype()), (vec![2, 3], Dtype::Float32));
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![-2.0, -0.5, 1.0, 2.5, 4.0, 5.5]);
    let x = st.load("x.bf16").unwrap();
    assert_eq!(x.dtype(), Dtype::Bfloat16);
    let xf = ops::astype(&x, Dtype::Float32).unwrap();
    assert_eq!(xf.to_vec::<f32>().unwrap(), vec![0.5, -3.0, 8.0, 0.0]);
    assert_eq!(st.load("ids").unwrap().to_vec::<i32>().unwrap(), vec![7, -1, 1 << 20]);
    let b = st.load("bytes").unwrap();
    assert_eq!((b.shape(), b.to_vec::<u8>().unwrap()), (vec![3, 1], vec![1, 2, 3]));

    // All at once, evaluated together, after the file handle is gone.
    let all = st.load_all().unwrap();
    drop(st);
    let refs: Vec<_> = all.iter().map(|(_, a)| a).collect();
    eval(&refs).unwrap();
    assert_eq!(all.len(), 4);
}

#[test]
fn tensor_metadata_gives_absolute_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(dir.path());
    let st = SafetensorsFile::open(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let m = st.info("ids").unwrap();
    assert_eq!(m.nbytes, 12);
    let start = m.offset as usize;
    assert_eq!(&bytes[start..start + 4], &7i32.to_le_bytes());
    let err = st.load("missing").unwrap_err().to_string();
    assert!(err.contains("no tensor named missing") && err.contains("model.safetensors"), "{err}");
}

fn write_raw(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

fn header_file(header: &str, data: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend(std::iter::repeat_n(0u8, data));
    v
}

#[test]
fn malformed_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("tiny", vec![1, 2, 3], "too short"),
        ("huge_len", (1u64 << 40).to_le_bytes().to_vec(), "header length"),
        ("len_past_end", header_file("{}", 0)[..9].iter().copied().chain([0u8; 0]).collect(), "header length"),
        ("not_json", header_file("{not json", 0), "invalid safetensors header"),
        (
            "bad_offsets",
            header_file(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#, 8),
            "invalid safetensors header",
        ),
        (
            "truncated",
            header_file(r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#, 10),
            "past the end of the file",
        ),
        (
            "fp8",
            header_file(r#"{"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}}"#, 4),
            "tensor a: dtype F8_E4M3 is not supported",
        ),
    ];
    for (name, bytes, expect) in cases {
        let p = write_raw(d, name, &bytes);
        let err = match SafetensorsFile::open(&p) {
            Ok(_) => panic!("{name}: opened a malformed file"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(expect), "{name}: {err}");
        assert!(err.contains(name), "{name}: error does not name the file: {err}");
    }
    let err = SafetensorsFile::open(d.join("absent.safetensors")).unwrap_err().to_string();
    assert!(err.contains("absent.safetensors"), "{err}");
}
