//! GGUF files written by the tests (shared by gguf_io.rs and gguf_kquants.rs).

/// A GGUF v3 file: metadata (key, type id, encoded value) and tensors
/// (name, GGUF dims innermost first, ggml type id, data).
pub fn gguf(metadata: &[(&str, u32, Vec<u8>)], tensors: &[(&str, Vec<u64>, u32, Vec<u8>)]) -> Vec<u8> {
    let s = |x: &str| [(x.len() as u64).to_le_bytes().to_vec(), x.as_bytes().to_vec()].concat();
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (k, ty, v) in metadata {
        out.extend(s(k));
        out.extend(ty.to_le_bytes());
        out.extend(v);
    }
    let mut offset = 0u64;
    let mut data = Vec::new();
    for (name, dims, ty, bytes) in tensors {
        out.extend(s(name));
        out.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(ty.to_le_bytes());
        out.extend(offset.to_le_bytes());
        data.extend(bytes);
        while !data.len().is_multiple_of(32) {
            data.push(0);
        }
        offset = data.len() as u64;
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    out.extend(data);
    out
}

pub fn write(bytes: &[u8]) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), bytes).unwrap();
    f
}
