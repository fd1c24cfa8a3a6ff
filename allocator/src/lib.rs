//! The binaries' global allocator: mimalloc (why: the workspace `Cargo.toml`), told to
//! keep the memory it frees.
//!
//! By default mimalloc hands freed memory back to the kernel after a delay (its
//! `purge_delay`, 1 s in the vendored v3), and faults it in again on the next growth. A
//! cache frees and allocates all the time (every admission evicts), and a fault-in of a
//! 2 MB transparent huge page took ~4.5 ms on this project's VMs: with purging, the
//! engine bench's d = 768 admissions had a p99.9 of 5.2 ms, without it 0.29 ms, and
//! medians 5-30% lower (README, "Engine speed"). A cache's memory is bounded by its
//! budget and will be used again, so the peak stays mapped.
//!
//! ```text
//! #[global_allocator]
//! static ALLOCATOR: aker_alloc::MiMalloc = aker_alloc::MiMalloc;
//! fn main() { aker_alloc::keep_freed_memory(); ... }
//! ```

use std::os::raw::{c_int, c_long};

pub use mimalloc::MiMalloc;

/// `mi_option_purge_delay` in the vendored mimalloc v3 (`libmimalloc-sys` 0.1.49,
/// `include/mimalloc.h`); the test below checks it against the option's default.
const MI_OPTION_PURGE_DELAY: c_int = 15;
/// "Never purge".
const PURGE_NEVER: c_long = -1;
/// Where a user sets it explicitly, their value stands.
const PURGE_DELAY_ENV: &str = "MIMALLOC_PURGE_DELAY";

// The functions of the mimalloc library that `mimalloc` links in (declared here: the
// bindings' `extended` feature needs a crate this workspace does not vendor).
extern "C" {
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_option_set(option: c_int, value: c_long);
}

/// Stops mimalloc returning freed memory to the kernel, unless `MIMALLOC_PURGE_DELAY` is
/// set in the environment. Call it first thing in `main`, or, in a server, where its
/// start-up ends, with `release_freed_memory` first thing instead. Returns the purge
/// delay now in force (-1: never).
pub fn keep_freed_memory() -> c_long {
    if std::env::var_os(PURGE_DELAY_ENV).is_none() {
        // SAFETY: plain option setters of the linked mimalloc; any thread, any time.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_NEVER) };
    }
    purge_delay_ms()
}

/// Has mimalloc return freed memory to the kernel at once, unless `MIMALLOC_PURGE_DELAY`
/// is set in the environment: for a server's start-up, until `keep_freed_memory`. Its
/// temporaries (a table sample, k-means, an index build) would otherwise stay resident
/// for good: 9.5 MiB of akerd's 24 MiB with an empty pool in front of pgvector
/// (`bench/results/miss-parity.md`, "Resident memory"). (Freed memory with mimalloc's
/// own delay of 1 s, and a forced collection where start-up ends, does not do it:
/// start-up's threads' heaps hold their freed pages past it.) Returns the purge delay
/// now in force.
pub fn release_freed_memory() -> c_long {
    if std::env::var_os(PURGE_DELAY_ENV).is_none() {
        // SAFETY: as in `keep_freed_memory`.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    }
    purge_delay_ms()
}

/// The purge delay mimalloc uses (milliseconds; -1: never).
pub fn purge_delay_ms() -> c_long {
    // SAFETY: as above.
    unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }
}

/// `PR_SET_THP_DISABLE` (linux/prctl.h).
const PR_SET_THP_DISABLE: c_int = 41;
/// mimalloc's own switch for transparent huge pages; where a user sets it, it stands.
const ALLOW_THP_ENV: &str = "MIMALLOC_ALLOW_THP";

extern "C" {
    fn prctl(option: c_int, arg2: std::os::raw::c_ulong, ...) -> c_int;
}

/// Turns transparent huge pages off for this process from now on (memory already
/// backed by huge pages stays so), unless `MIMALLOC_ALLOW_THP` is set in the
/// environment. Returns whether they are off.
///
/// Why: mimalloc reserves its arena with `MADV_HUGEPAGE`, so the first touch of any
/// 2 MiB-aligned range faults in all of it. A server with an empty pool has ~3 MiB of
/// small allocations spread over its threads' heaps, which huge pages round up to
/// 14-25 MiB resident (`bench/results/miss-parity.md`, "Resident memory"); for a small
/// pool that rounding, not the cache, is most of akerd's memory.
pub fn disable_huge_pages() -> std::io::Result<bool> {
    if std::env::var_os(ALLOW_THP_ENV).is_some() {
        return Ok(false);
    }
    // SAFETY: a process-wide flag; no memory is touched.
    let rc = unsafe {
        prctl(
            PR_SET_THP_DISABLE,
            1,
            0 as std::os::raw::c_ulong,
            0 as std::os::raw::c_ulong,
            0 as std::os::raw::c_ulong,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(true)
}

/// Block size `prefault` allocates in: below mimalloc's huge-object size, so the blocks
/// come from ordinary pages, which return to the shared arena when freed and serve any
/// thread and size class afterwards (the test below checks another thread's growth).
const PREFAULT_BLOCK_BYTES: usize = 256 << 10;

/// Allocates `bytes` in blocks, touches every page, and frees it all again: with
/// `keep_freed_memory` in force, later growth (any thread's) reuses memory the kernel
/// has already faulted in, where it would fault each page in the first time (~4.5 ms per
/// 2 MB transparent huge page on this project's VMs, paid by whichever admission grows
/// the cache). A server sized for a peak can pay that once at start instead. Returns
/// how long it took.
pub fn prefault(bytes: usize) -> std::time::Duration {
    let t = std::time::Instant::now();
    let blocks = bytes.div_ceil(PREFAULT_BLOCK_BYTES);
    let held: Vec<Box<[u8]>> = (0..blocks)
        .map(|i| vec![i as u8 | 1; PREFAULT_BLOCK_BYTES].into_boxed_slice())
        .collect();
    std::hint::black_box(&held);
    drop(held);
    t.elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOCATOR: MiMalloc = MiMalloc;

    /// The option's default in the vendored v3, in milliseconds.
    const PURGE_DELAY_DEFAULT_MS: c_long = 1000;

    /// The option index is the purge delay's: its default is what the vendored header
    /// says, and setting it sticks. (A mimalloc upgrade that moved the option fails here,
    /// not silently in production.)
    #[test]
    fn the_purge_delay_option_is_the_one_we_set() {
        if std::env::var_os(PURGE_DELAY_ENV).is_some() {
            eprintln!("{PURGE_DELAY_ENV} is set: the default cannot be checked");
            return;
        }
        assert_eq!(purge_delay_ms(), PURGE_DELAY_DEFAULT_MS);
        assert_eq!(keep_freed_memory(), PURGE_NEVER);
        // Memory still works both ways afterwards.
        let v: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 1 << 16]).collect();
        assert!(v.iter().enumerate().all(|(i, b)| b[b.len() - 1] == i as u8));
        drop(v);
        prefaulted_memory_serves_other_threads_growth();
    }

    /// Minor page faults of the calling thread so far (`/proc/thread-self/stat`, field 10).
    fn thread_minor_faults() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("procfs");
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
        rest.split(' ')
            .nth(7)
            .expect("minflt")
            .parse()
            .expect("a number")
    }

    /// Faults a fresh thread takes growing by `bytes` in blocks the size of a d = 768
    /// vector (the insert log's growth), then frees.
    fn growth_faults(bytes: usize) -> u64 {
        std::thread::spawn(move || {
            let before = thread_minor_faults();
            let held: Vec<Vec<f32>> = (0..bytes / 3072).map(|i| vec![i as f32; 768]).collect();
            std::hint::black_box(&held);
            let faults = thread_minor_faults() - before;
            drop(held);
            faults
        })
        .join()
        .unwrap()
    }

    /// Memory `prefault` touched and freed serves another thread's later growth: it
    /// faults far fewer pages than growth into memory never touched. (Called by the test
    /// above once the purge delay is set: the option is process-wide, and its default can
    /// only be read before anything sets it, so the two cannot run as separate tests.)
    fn prefaulted_memory_serves_other_threads_growth() {
        assert_eq!(purge_delay_ms(), PURGE_NEVER);
        let bytes = 96 << 20;
        // Growth into fresh memory first (this process has not used that much yet).
        let cold = growth_faults(bytes);
        prefault(2 * bytes);
        let warm = growth_faults(bytes);
        eprintln!(
            "faults growing by {} MB: fresh {cold}, after prefault {warm}",
            bytes >> 20
        );
        assert!(cold >= 16, "fresh growth faulted only {cold} times");
        assert!(
            4 * warm < cold,
            "after prefault {warm} faults, fresh {cold}"
        );
    }
}
