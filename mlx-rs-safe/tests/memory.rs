//! Allocator counters move with allocations and reset on request. One test
//! function: the counters are process-wide, and tests in a file run in parallel.

use mlx_rs_safe::{memory, ops, Device, Dtype, Stream};

/// GPU backends return a buffer once the stream has finished with it.
fn sync() {
    Stream::default_for(Device::default_device().unwrap()).unwrap().synchronize().unwrap();
}

#[test]
fn counters_move_reset_and_limits_round_trip() {
    let before = memory::active_memory().unwrap();
    let big = ops::ones(&[1024, 1024], Dtype::Float32).unwrap(); // 4 MiB
    big.eval().unwrap();
    let during = memory::active_memory().unwrap();
    assert!(during >= before + big.nbytes(), "active {before} -> {during}");
    assert!(memory::peak_memory().unwrap() >= during);

    drop(big);
    sync();
    let after = memory::active_memory().unwrap();
    assert!(after + 4 * 1024 * 1024 <= during, "freeing did not lower active memory: {during} -> {after}");
    let keep = ops::ones(&[128, 1024], Dtype::Float32).unwrap();
    keep.eval().unwrap();
    memory::reset_peak_memory().unwrap();
    let reset = memory::peak_memory().unwrap();
    let active = memory::active_memory().unwrap();
    assert!(active >= keep.nbytes());
    // MLX zeroes the peak (it does not set it to the active memory) ...
    assert!(reset < during && reset <= active, "peak after reset {reset}, active {active}");
    let small = ops::ones(&[256, 1024], Dtype::Float32).unwrap(); // 1 MiB
    small.eval().unwrap();
    let peak2 = memory::peak_memory().unwrap();
    // ... and the next allocation brings it back up to the live total.
    assert!(peak2 >= active + small.nbytes(), "peak {reset} -> {peak2}, active before {active}");
    drop((small, keep));
    sync();

    // Freed buffers sit in the allocator's cache until cleared.
    assert!(memory::cache_memory().unwrap() > 0, "nothing cached after freeing");
    memory::clear_cache().unwrap();
    assert_eq!(memory::cache_memory().unwrap(), 0);

    let old = memory::set_cache_limit(1 << 20).unwrap();
    assert_eq!(memory::set_cache_limit(old).unwrap(), 1 << 20);
    let limit = memory::memory_limit().unwrap();
    assert!(limit > 0);
    let prev = memory::set_memory_limit(limit).unwrap();
    assert_eq!(prev, limit);
    let wired = memory::set_wired_limit(0).unwrap();
    assert_eq!(memory::set_wired_limit(wired).unwrap(), 0);
}
