//! The worker loop both experiments run their configurations on (`bench recall`'s rows,
//! `bench updates`' runs): each is single-threaded, so a few scoped threads take the next
//! job until none is left. One loop, so that the order of the results and what happens
//! after a failure are the same everywhere.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Runs `work` on every job of `jobs` on up to `threads` threads (at least one); the
/// results in job order. Once a job fails no further job starts, and the error (a
/// message naming the job, built by `work`) is returned.
pub fn run_all<J, R, F>(jobs: &[J], threads: usize, work: F) -> Result<Vec<R>, String>
where
    J: Sync,
    R: Send,
    F: Fn(&J) -> Result<R, String> + Sync,
{
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, R)>> = Mutex::new(Vec::new());
    let failed: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.min(jobs.len()).max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs.len() || failed.lock().expect("poisoned").is_some() {
                    break;
                }
                match work(&jobs[i]) {
                    Ok(r) => done.lock().expect("poisoned").push((i, r)),
                    Err(e) => *failed.lock().expect("poisoned") = Some(e),
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().expect("poisoned") {
        return Err(e);
    }
    let mut rows = done.into_inner().expect("poisoned");
    rows.sort_by_key(|(i, _)| *i);
    Ok(rows.into_iter().map(|(_, r)| r).collect())
}

#[cfg(test)]
mod tests {
    use super::run_all;

    #[test]
    fn results_come_in_job_order_and_a_failure_is_returned() {
        let jobs: Vec<u32> = (0..50).collect();
        let out = run_all(&jobs, 4, |&j| Ok::<_, String>(j * 2)).unwrap();
        assert_eq!(out, jobs.iter().map(|j| j * 2).collect::<Vec<_>>());
        let e = run_all(&jobs, 3, |&j| {
            if j == 7 {
                Err(format!("job {j}"))
            } else {
                Ok(j)
            }
        });
        assert_eq!(e.unwrap_err(), "job 7");
        let none: Vec<u32> = Vec::new();
        assert!(run_all(&none, 8, |&j| Ok::<_, String>(j))
            .unwrap()
            .is_empty());
    }
}
