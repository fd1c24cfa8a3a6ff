//! Whether this process may use io_uring, which every executor (glommio) needs: checked
//! once at start so that a kernel too old, a container's seccomp profile or a locked-
//! memory limit is named in one line, instead of an executor thread's panic.

/// Oldest kernel glommio's executors run on (its io_uring probe needs 5.8).
pub const KERNEL_MIN: (u32, u32) = (5, 8);

/// The locked memory glommio's reactor insists on (it refuses a smaller soft
/// RLIMIT_MEMLOCK before it opens a ring).
pub(crate) const MEMLOCK_MIN_BYTES: u64 = 512 << 10;

/// `Ok` when a one-entry ring can be set up (and it is closed again) and the locked-memory
/// limit is what the executors need; else what to do.
pub fn check_io_uring() -> Result<(), String> {
    if let Some((major, minor)) = kernel_version() {
        if (major, minor) < KERNEL_MIN {
            return Err(format!(
                "io_uring is needed, on Linux {}.{} or later; this kernel is {major}.{minor}",
                KERNEL_MIN.0, KERNEL_MIN.1
            ));
        }
    }
    // struct io_uring_params is 120 bytes; zeroed asks for the defaults.
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup(2) reads and writes `params` (120 bytes, as the kernel's
    // struct io_uring_params) and returns a new file descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(explain(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is the descriptor io_uring_setup just returned, owned here alone.
    unsafe { libc::close(fd as libc::c_int) };
    check_memlock()
}

fn check_memlock() -> Result<(), String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Ok(());
    }
    if lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < MEMLOCK_MIN_BYTES {
        return Err(format!(
            "io_uring is needed (Linux 5.8 or later) and cannot be used: the locked-memory \
             limit is {} KiB, the executors need {} KiB: raise RLIMIT_MEMLOCK (systemd: \
             LimitMEMLOCK=infinity; a shell: ulimit -l unlimited; Docker: --ulimit memlock=-1)",
            lim.rlim_cur / 1024,
            MEMLOCK_MIN_BYTES / 1024
        ));
    }
    Ok(())
}

fn explain(e: std::io::Error) -> String {
    let why = match e.raw_os_error() {
        Some(libc::ENOSYS) => "this kernel has no io_uring (built without it)",
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "io_uring is refused: a container runtime's default seccomp profile blocks it \
             (Docker, containerd, Kubernetes: run akerd with a profile that allows \
             io_uring_setup, io_uring_enter and io_uring_register, or unconfined), or \
             sysctl kernel.io_uring_disabled is set"
        }
        Some(libc::ENOMEM) => {
            "not enough lockable memory for a ring: raise RLIMIT_MEMLOCK (systemd: \
             LimitMEMLOCK=infinity; a shell: ulimit -l unlimited)"
        }
        _ => "the kernel refused to set up a ring",
    };
    format!("io_uring is needed (Linux 5.8 or later) and cannot be used: {why} ({e})")
}

/// (major, minor) of the running kernel, from uname(2).
fn kernel_version() -> Option<(u32, u32)> {
    // SAFETY: uname fills the zeroed struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid utsname to write.
    if unsafe { libc::uname(&mut u) } != 0 {
        return None;
    }
    let release: String = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_machine_runs_io_uring() {
        // Every test of the daemon needs it; if this fails, they all do.
        super::check_io_uring().unwrap();
        assert!(super::kernel_version().unwrap() >= super::KERNEL_MIN);
    }
}
