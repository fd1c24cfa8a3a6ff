//! The open-loop schedule: the instant each request is *meant* to be sent.
//!
//! Latency is measured from these instants, not from when the request actually left
//! (coordinated-omission correction, as in wrk2): when the server stalls, the requests
//! that should have gone out during the stall still count, each with the time it waited.
//! The schedule is a lazy iterator, so a sender that falls behind keeps no backlog in
//! memory: it simply takes the next intended instant, which is already in the past.
//!
//! A run's global rate `R` is split over `T` sender threads, each with its own schedule
//! of rate `R / T`. For Poisson arrivals the superposition of independent Poisson
//! processes is again Poisson with rate `R`; for fixed spacing thread `i` is shifted by
//! `i / R`, so the merged stream is evenly spaced at `1 / R`.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp};

/// How gaps between intended send times are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Exponential gaps (a Poisson process): the arrival pattern of many independent
    /// users, and the one that does not hide periodic stalls behind a lucky phase.
    Poisson,
    /// Constant gaps of `1 / rate`.
    Fixed,
}

impl std::str::FromStr for Arrival {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "poisson" => Ok(Arrival::Poisson),
            "fixed" => Ok(Arrival::Fixed),
            _ => Err(format!("arrival '{s}' is neither 'poisson' nor 'fixed'")),
        }
    }
}

/// One sender thread's intended send times.
pub struct Schedule {
    start: Instant,
    arrival: Arrival,
    /// Fixed: offset of the first request and the gap, in seconds.
    phase_s: f64,
    gap_s: f64,
    /// Fixed: requests handed out so far (the offset is computed from it, not summed, so
    /// rounding does not drift over long runs).
    n: u64,
    /// Poisson: offset of the last instant handed out, in seconds.
    offset_s: f64,
    exp: Exp<f64>,
    rng: StdRng,
}

impl Schedule {
    /// The schedule of thread `thread` out of `threads` sharing `total_rate` requests per
    /// second, starting at `start`.
    pub fn new(
        start: Instant,
        total_rate: f64,
        threads: usize,
        thread: usize,
        arrival: Arrival,
        seed: u64,
    ) -> Schedule {
        assert!(
            total_rate.is_finite() && total_rate > 0.0,
            "rate must be positive"
        );
        let threads = threads.max(1);
        let rate = total_rate / threads as f64;
        Schedule {
            start,
            arrival,
            phase_s: thread as f64 / total_rate,
            gap_s: 1.0 / rate,
            n: 0,
            offset_s: 0.0,
            exp: Exp::new(rate).expect("positive rate"),
            rng: StdRng::seed_from_u64(seed ^ (thread as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        }
    }

    /// The next intended send time.
    pub fn next_instant(&mut self) -> Instant {
        self.start + Duration::from_secs_f64(self.next_offset())
    }

    /// The next intended send time, in seconds after `start`.
    pub fn next_offset(&mut self) -> f64 {
        match self.arrival {
            Arrival::Fixed => {
                let t = self.phase_s + self.n as f64 * self.gap_s;
                self.n += 1;
                t
            }
            Arrival::Poisson => {
                // A Poisson process starts with an exponential wait too, so threads that
                // start together do not send a burst at offset 0.
                self.offset_s += self.exp.sample(&mut self.rng);
                self.offset_s
            }
        }
    }

    /// Consumes the intended instants before `end` and counts those at or after `from`:
    /// the counted requests a sender that gives up still owes the report.
    pub fn count_between(&mut self, from: Instant, end: Instant) -> u64 {
        let from_s = from.saturating_duration_since(self.start).as_secs_f64();
        let end_s = end.saturating_duration_since(self.start).as_secs_f64();
        let mut n = 0;
        loop {
            let t = self.next_offset();
            if t >= end_s {
                return n;
            }
            if t >= from_s {
                n += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_spacing_is_exact_and_threads_interleave() {
        let start = Instant::now();
        let (rate, threads) = (1000.0, 4);
        let mut all: Vec<f64> = (0..threads)
            .flat_map(|t| {
                let mut s = Schedule::new(start, rate, threads, t, Arrival::Fixed, 1);
                (0..250).map(move |_| s.next_offset()).collect::<Vec<_>>()
            })
            .collect();
        all.sort_by(f64::total_cmp);
        assert_eq!(all.len(), 1000);
        for (i, t) in all.iter().enumerate() {
            assert!((t - i as f64 / rate).abs() < 1e-9, "request {i} at {t}");
        }
    }

    #[test]
    fn poisson_mean_spacing_and_spread() {
        let start = Instant::now();
        let rate = 5000.0;
        let mut s = Schedule::new(start, rate, 1, 0, Arrival::Poisson, 7);
        let n = 200_000;
        let mut prev = 0.0;
        let gaps: Vec<f64> = (0..n)
            .map(|_| {
                let t = s.next_offset();
                let g = t - prev;
                prev = t;
                g
            })
            .collect();
        assert!(gaps.iter().all(|&g| g >= 0.0));
        let mean = gaps.iter().sum::<f64>() / n as f64;
        assert!(
            (mean * rate - 1.0).abs() < 0.01,
            "mean gap {mean} vs {}",
            1.0 / rate
        );
        // Exponential gaps: standard deviation equals the mean (fixed spacing would be 0).
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n as f64;
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.02, "coefficient of variation {cv}");
    }

    #[test]
    fn poisson_threads_sum_to_the_total_rate() {
        let start = Instant::now();
        let (rate, threads) = (8000.0, 3);
        let end = start + Duration::from_secs(5);
        let total: u64 = (0..threads)
            .map(|t| {
                Schedule::new(start, rate, threads, t, Arrival::Poisson, 3)
                    .count_between(start, end)
            })
            .sum();
        let expected = rate * 5.0;
        assert!(
            (total as f64 - expected).abs() < expected * 0.02,
            "{total} arrivals, expected about {expected}"
        );
    }

    #[test]
    fn count_between_counts_the_rest() {
        let start = Instant::now();
        let mut s = Schedule::new(start, 100.0, 1, 0, Arrival::Fixed, 0);
        for _ in 0..10 {
            s.next_offset();
        }
        // Offsets 0.10, 0.11, ... 0.99 remain before 1 s; those from 0.5 on count.
        let (from, end) = (
            start + Duration::from_millis(495),
            start + Duration::from_secs(1),
        );
        assert_eq!(s.count_between(from, end), 50);
    }
}
