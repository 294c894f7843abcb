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
}
