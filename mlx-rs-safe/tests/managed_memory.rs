//! `managed_memory::keep_on_host`: advises exactly the buffers it should, and
//! an advised buffer reads back unchanged on the default device.

use mlx_rs_safe::kernels::gpu_backend;
use mlx_rs_safe::managed_memory::{keep_on_host, MIN_ADVISED_BYTES};
use mlx_rs_safe::{ops, Array, Dtype};

#[test]
fn host_kept_buffers_are_advised_on_cuda_only_and_read_back_unchanged() {
    let bytes: Vec<u8> = (0..4 * MIN_ADVISED_BYTES).map(|i| (i * 7 % 251) as u8).collect();
    let big = Array::from_bytes(&bytes, &[bytes.len() as i32], Dtype::Uint8).unwrap();
    assert_eq!(keep_on_host(&big).unwrap(), gpu_backend() == Some("cuda"), "advised where CUDA's managed memory is");
    // Advice again is harmless (the reader advises each buffer MLX hands it).
    assert_eq!(keep_on_host(&big).unwrap(), gpu_backend() == Some("cuda"));
    let read = ops::add(&big, &Array::from_slice(&[1u8], &[1]).unwrap()).unwrap();
    let want: Vec<u8> = bytes.iter().map(|b| b.wrapping_add(1)).collect();
    assert_eq!(read.to_vec::<u8>().unwrap(), want);

    let small = Array::from_bytes(&bytes[..MIN_ADVISED_BYTES - 1], &[MIN_ADVISED_BYTES as i32 - 1], Dtype::Uint8).unwrap();
    assert!(!keep_on_host(&small).unwrap(), "a buffer under MLX's allocation page is left alone");
}
