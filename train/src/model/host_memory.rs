//! How the process's allocator keeps memory between the CPU backend's operations.
//!
//! A forward or training pass on the CPU allocates and frees buffers of megabytes to tens of
//! megabytes for nearly every operation. By default glibc's malloc gives a freed block at the top
//! of a heap back to the system once more than its trim threshold (a few to 64 MiB, adjusted as it
//! goes) is free there, and maps larger blocks afresh. The next buffer of that size is then
//! faulted in, and zeroed by the kernel, page by page. Keeping up to 1 GiB of freed memory and
//! growing heaps 256 MiB at a time makes the next operation reuse those pages: `decision score`
//! at the 0.6B shape (2 x 1024 tokens, bf16) ran at 185 tokens/s without this and 212 with it (three
//! runs each, docs/results.md), with the same peak RSS.

/// Keep freed memory for reuse (glibc's malloc; elsewhere a no-op). Returns whether the allocator
/// took every setting (`mallopt` answers 0 to a parameter or value it does not take).
///
/// # Safety
///
/// Call it at the start of `main`, before any thread exists and before any large allocation.
pub unsafe fn keep_freed_memory() -> bool {
    // DECISION_MALLOC=default leaves glibc's own settings, for comparison.
    if std::env::var("DECISION_MALLOC").is_ok_and(|v| v == "default") {
        return true;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes the main arena's lock; the caller runs this before other threads
    // allocate. 32 MiB is the mmap threshold's largest default on 64-bit targets.
    unsafe {
        [
            (libc::M_MMAP_THRESHOLD, 32 << 20),
            (libc::M_TRIM_THRESHOLD, 1 << 30),
            (libc::M_TOP_PAD, 256 << 20),
        ]
        .into_iter()
        .all(|(param, value)| libc::mallopt(param, value) == 1)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    true
}

/// Give the memory freed so far back to the system (glibc's `malloc_trim`; elsewhere a no-op).
/// Call it between phases whose buffers differ in size, such as a training step and an
/// evaluation: what one phase freed is kept for reuse, but the other's buffers fit it only in
/// part, so the second phase would otherwise peak on top of what the first left free. Returns
/// whether any memory was given back.
pub fn release_freed() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes each arena's lock in turn; it only releases free pages.
    unsafe {
        libc::malloc_trim(0) == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

/// What the process has resident, in bytes (Linux's `/proc/self/statm`, its second field in
/// pages); `None` where the system does not say (macOS and Windows have no `/proc`).
pub(crate) fn resident() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        // SAFETY: sysconf only reads a constant of the system.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        Some(pages * page)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// A freed 24 MiB buffer stays with the allocator for the next one, where glibc's defaults
    /// would have mapped it afresh and unmapped it on free. `fordblks` is the free bytes malloc
    /// holds over all arenas.
    #[test]
    fn a_freed_buffer_stays_for_reuse() {
        // SAFETY: mallopt locks the arena it changes; other test threads that allocate meanwhile
        // are serialised by that lock.
        assert!(unsafe { super::keep_freed_memory() });
        let held = || unsafe { libc::mallinfo2() }.fordblks;
        let size = 24 << 20;
        let buffer = std::hint::black_box(vec![1u8; size]);
        drop(buffer);
        let after = held();
        assert!(
            after >= size,
            "free bytes held after freeing {size}: {after}"
        );
    }

    /// Kept memory goes back to the system when asked: 192 MiB of buffers under the mmap
    /// threshold, written and freed, stay resident (the trim threshold is 1 GiB) until
    /// `release_freed`. Other tests running meanwhile move the figure by a few MiB, not 128.
    #[test]
    fn freed_memory_goes_back_when_released() {
        // SAFETY: as above.
        assert!(unsafe { super::keep_freed_memory() });
        let buffers: Vec<Vec<u8>> = (0..8)
            .map(|i| std::hint::black_box(vec![i as u8 + 1; 24 << 20]))
            .collect();
        drop(buffers);
        let kept = super::resident().unwrap();
        assert!(super::release_freed(), "malloc_trim gave nothing back");
        let released = super::resident().unwrap();
        assert!(
            kept.saturating_sub(released) >= 128 << 20,
            "resident {kept} bytes before release_freed, {released} after"
        );
    }
}
