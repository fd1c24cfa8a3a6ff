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
/// set in the environment. Call first thing in `main`. Returns the purge delay now in
/// force (-1: never).
pub fn keep_freed_memory() -> c_long {
    if std::env::var_os(PURGE_DELAY_ENV).is_none() {
        // SAFETY: plain option setters of the linked mimalloc; any thread, any time.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_NEVER) };
    }
    purge_delay_ms()
}

/// The purge delay mimalloc uses (milliseconds; -1: never).
pub fn purge_delay_ms() -> c_long {
    // SAFETY: as above.
    unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }
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
    }
}
