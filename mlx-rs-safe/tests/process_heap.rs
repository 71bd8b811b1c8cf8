//! `process_heap::trim` hands freed heap pages back to the system. A process
//! of its own (this test binary), so no other test moves the resident size.

/// Resident bytes of this process (Linux).
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn trimming_returns_the_free_pages_between_live_blocks() {
    // What tokenizing a huge prompt leaves behind: a thread's arena full of
    // small freed blocks with a few live ones in between. glibc trims only the
    // top of a heap by itself, so the pages in between stay resident.
    let kept: Vec<Vec<u8>> = std::thread::spawn(|| {
        let blocks: Vec<Vec<u8>> = (0..200_000).map(|i| vec![(i % 251) as u8; 1000]).collect();
        blocks.into_iter().step_by(64).collect()
    })
    .join()
    .unwrap();
    let before = rss();
    assert!(mlx_rs_safe::process_heap::trim(), "glibc released nothing");
    let after = rss();
    assert!(before - after > 100 << 20, "{} MiB resident before the trim, {} MiB after", before >> 20, after >> 20);
    assert_eq!(kept.len(), 3125);
}
