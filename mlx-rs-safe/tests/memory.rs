//! Allocator counters move with allocations and reset on request. One test
//! function: the counters are process-wide, and tests in a file run in parallel.

use mlx_rs_safe::{memory, ops, Dtype};

#[test]
fn counters_move_reset_and_limits_round_trip() {
    let before = memory::active_memory().unwrap();
    let big = ops::ones(&[1024, 1024], Dtype::Float32).unwrap(); // 4 MiB
    big.eval().unwrap();
    let during = memory::active_memory().unwrap();
    assert!(during >= before + big.nbytes(), "active {before} -> {during}");
    assert!(memory::peak_memory().unwrap() >= during);

    drop(big);
    // GPU backends return a buffer when the stream has finished with it.
    mlx_rs_safe::Stream::default_for(mlx_rs_safe::Device::default_device().unwrap()).unwrap().synchronize().unwrap();
    let after = memory::active_memory().unwrap();
    assert!(after + 4 * 1024 * 1024 <= during, "freeing did not lower active memory: {during} -> {after}");
    memory::reset_peak_memory().unwrap();
    assert!(memory::peak_memory().unwrap() < during, "peak was not reset");

    // The freed buffer sits in the allocator's cache until cleared.
    memory::clear_cache().unwrap();
    assert_eq!(memory::cache_memory().unwrap(), 0);

    let old = memory::set_cache_limit(1 << 20).unwrap();
    assert_eq!(memory::set_cache_limit(old).unwrap(), 1 << 20);
    let limit = memory::memory_limit().unwrap();
    assert!(limit > 0);
    let prev = memory::set_memory_limit(limit).unwrap();
    assert_eq!(prev, limit);
}
