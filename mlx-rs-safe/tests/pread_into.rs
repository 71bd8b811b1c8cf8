//! The pread_into primitive: file regions read into MLX arrays on evaluation.

use std::io::Write;
use std::os::fd::AsRawFd;

use mlx_rs_safe::ext::{pread_blocks_into, pread_into, pread_into_fd};
use mlx_rs_safe::{ops, Dtype};

fn file_with(bytes: &[u8]) -> std::fs::File {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(bytes).unwrap();
    f
}

fn counting_bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

#[test]
fn reads_at_unaligned_offsets_exactly_the_bytes_asked_for() {
    let bytes = counting_bytes(4099);
    let f = file_with(&bytes);
    for &(offset, len) in &[(0usize, 16usize), (1, 3), (7, 4091), (4095, 4), (4098, 1), (13, 0)] {
        let a = pread_into(&f, offset as u64, &[len as i32], Dtype::Uint8).unwrap();
        assert_eq!(a.to_vec::<u8>().unwrap(), &bytes[offset..offset + len], "offset {offset}");
    }
}

#[test]
fn reads_typed_elements_and_feeds_other_ops() {
    let vals: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 1.0).collect();
    let mut bytes = vec![0xAAu8; 5]; // an unaligned header before the tensor
    for v in &vals {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let f = file_with(&bytes);
    let a = pread_into(&f, 5, &[3, 4], Dtype::Float32).unwrap();
    assert_eq!(a.shape(), vec![3, 4]);
    let doubled = ops::add(&a, &a).unwrap();
    let expect: Vec<f32> = vals.iter().map(|v| v * 2.0).collect();
    assert_eq!(doubled.to_vec::<f32>().unwrap(), expect);
}

#[test]
fn short_file_fails_the_evaluation_with_a_clear_error() {
    let f = file_with(&counting_bytes(100));
    let a = pread_into(&f, 90, &[20], Dtype::Uint8).unwrap();
    let err = a.to_vec::<u8>().unwrap_err().to_string();
    assert!(err.contains("pread_into"), "{err}");
    assert!(err.contains("20 bytes at offset 90"), "{err}");
    assert!(err.contains("file ends after 10 bytes"), "{err}");
    let past_end = pread_into(&f, 1000, &[1], Dtype::Uint8).unwrap();
    assert!(past_end.eval().is_err());
    // The process goes on and a good read still works.
    let ok = pread_into(&f, 0, &[4], Dtype::Uint8).unwrap();
    assert_eq!(ok.to_vec::<u8>().unwrap(), &counting_bytes(4)[..]);
}

#[test]
fn closed_or_invalid_descriptor_is_an_error_not_an_abort() {
    // A descriptor that was open and is closed now: the highest number the
    // process may use, far above what the other tests' files get (the lowest
    // free numbers), so no parallel test reuses it in between.
    let f = file_with(&counting_bytes(8));
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    let fd = (lim.rlim_cur.min(65_536) - 1) as i32;
    // SAFETY: dup2/close on descriptors this test owns.
    assert_eq!(unsafe { libc::dup2(f.as_raw_fd(), fd) }, fd);
    assert_eq!(unsafe { libc::close(fd) }, 0);
    let err = pread_into_fd(fd, 0, &[8], Dtype::Uint8).unwrap_err().to_string();
    assert!(err.contains("not an open file"), "{err}");
    assert!(pread_into_fd(-1, 0, &[1], Dtype::Uint8).is_err());
    assert!(pread_into_fd(0, 0, &[-1], Dtype::Uint8).is_err());
}

#[test]
fn caller_may_close_its_descriptor_before_evaluation() {
    let bytes = counting_bytes(64);
    let f = file_with(&bytes);
    let a = pread_into(&f, 32, &[32], Dtype::Uint8).unwrap();
    drop(f);
    assert_eq!(a.to_vec::<u8>().unwrap(), &bytes[32..]);
}

#[test]
fn offsets_past_the_largest_file_offset_are_rejected() {
    let f = file_with(&counting_bytes(8));
    let err = pread_into(&f, u64::MAX - 2, &[8], Dtype::Uint8).unwrap_err().to_string();
    assert!(err.contains("past the largest file offset"), "{err}");
}

#[test]
fn blocks_read_a_column_range_of_every_row_and_nothing_else() {
    // A 5 x 8 u16 matrix after a 3-byte header; columns 2..6 of each row.
    let mut bytes = vec![0xEEu8; 3];
    let vals: Vec<u16> = (0..40).collect();
    for v in &vals {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.extend_from_slice(&[0xEE; 2]);
    let f = file_with(&bytes);
    let a = pread_blocks_into(&f, 3 + 2 * 2, 4 * 2, 8 * 2, &[5, 4], Dtype::Uint16).unwrap();
    let expect: Vec<u16> = (0..5).flat_map(|r| (2..6).map(move |c| r * 8 + c)).collect();
    assert_eq!(a.to_vec::<u16>().unwrap(), expect);
    // Rows 1..3 whole (one block: stride = block).
    let rows = pread_blocks_into(&f, 3 + 8 * 2, 16 * 2, 16 * 2, &[2, 8], Dtype::Uint16).unwrap();
    assert_eq!(rows.to_vec::<u16>().unwrap(), (8..24).collect::<Vec<u16>>());
}

#[test]
fn blocks_that_do_not_tile_the_output_or_run_past_the_file_are_errors() {
    let f = file_with(&counting_bytes(64));
    let untiled = pread_blocks_into(&f, 0, 3, 8, &[8], Dtype::Uint8).unwrap_err().to_string();
    assert!(untiled.contains("do not tile"), "{untiled}");
    let overlapping = pread_blocks_into(&f, 0, 8, 4, &[16], Dtype::Uint8).unwrap_err().to_string();
    assert!(overlapping.contains("do not tile"), "{overlapping}");
    assert!(pread_blocks_into(&f, 0, 0, 8, &[8], Dtype::Uint8).is_err());
    let short = pread_blocks_into(&f, 0, 8, 32, &[4, 8], Dtype::Uint8).unwrap();
    let e = short.to_vec::<u8>().unwrap_err().to_string();
    assert!(e.contains("file ends"), "{e}");
}
