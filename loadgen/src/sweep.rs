//! `--sweep from:to:step`: open-loop runs at increasing rates until p99 goes over a
//! bound; the answer is the highest rate that stayed under it.
//!
//! The sweep stops at the first failing step: past the knee, queues only grow, and more
//! steps would cost time without changing the answer. Each step uses fresh connections
//! and starts the trace over; `before_step` lets the caller flush the cache between
//! steps so that every rate sees the same cache state.

use std::sync::Arc;
use std::time::Duration;

use crate::report::RunReport;
use crate::stats::IntervalLine;
use crate::worker::{self, EngineConfig, Mode, RunResult, StopReason};
use crate::workload::Workload;

/// Most steps one sweep may have.
pub const MAX_STEPS: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SweepSpec {
    pub from: f64,
    pub to: f64,
    pub step: f64,
}

impl std::str::FromStr for SweepSpec {
    type Err = String;
    /// `from:to:step` in requests per second, e.g. `1000:20000:1000`.
    fn from_str(s: &str) -> Result<SweepSpec, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let [from, to, step] = parts.as_slice() else {
            return Err(format!("sweep '{s}' is not FROM:TO:STEP"));
        };
        let num = |v: &str| -> Result<f64, String> {
            crate::parse_rate(v).map_err(|e| format!("sweep '{s}': {e}"))
        };
        let spec = SweepSpec {
            from: num(from)?,
            to: num(to)?,
            step: num(step)?,
        };
        if spec.to < spec.from {
            return Err(format!("sweep '{s}': TO is below FROM"));
        }
        if spec.rates().len() > MAX_STEPS {
            return Err(format!("sweep '{s}' has more than {MAX_STEPS} steps"));
        }
        Ok(spec)
    }
}

impl SweepSpec {
    /// The rates to try, ascending (`to` included when the steps land on it).
    pub fn rates(&self) -> Vec<f64> {
        let n = ((self.to - self.from) / self.step + 1e-9).floor() as usize + 1;
        (0..n.min(MAX_STEPS + 1))
            .map(|i| self.from + i as f64 * self.step)
            .collect()
    }
}

/// Whether a step kept its promise: p99 under the bound, no errors, the schedule not
/// abandoned.
pub fn passes(r: &RunResult, p99_bound_ms: f64) -> bool {
    let s = &r.stats;
    s.ok() > 0
        && s.total_errors() == 0
        && !matches!(
            r.stop,
            StopReason::DrainDeadline | StopReason::ConnectionsLost
        )
        && crate::stats::Summary::of(&s.all).p99_ms <= p99_bound_ms
}

pub struct SweepStep {
    pub rate: f64,
    pub pass: bool,
    pub cfg: EngineConfig,
    pub result: RunResult,
}

pub struct SweepOutcome {
    pub steps: Vec<SweepStep>,
    pub best_rate: Option<f64>,
}

impl SweepOutcome {
    pub fn reports(&self) -> Vec<(f64, bool, RunReport)> {
        self.steps
            .iter()
            .map(|s| (s.rate, s.pass, RunReport::new(&s.cfg, &s.result)))
            .collect()
    }
}

/// What to sweep and how a step is judged.
#[derive(Clone, Copy, Debug)]
pub struct SweepPlan {
    pub spec: SweepSpec,
    pub p99_bound_ms: f64,
    /// Between steps, so the server finishes what the last step left queued.
    pub pause: Duration,
}

/// Runs the sweep. `base.mode` must be open loop (its rate is replaced per step).
pub fn sweep(
    base: &EngineConfig,
    plan: SweepPlan,
    workload: &Arc<Workload>,
    mut before_step: impl FnMut(f64) -> std::io::Result<()>,
    mut on_line: impl FnMut(&IntervalLine),
    mut on_step: impl FnMut(&SweepStep),
) -> std::io::Result<SweepOutcome> {
    let Mode::Open { arrival, .. } = base.mode else {
        return Err(std::io::Error::other("a sweep needs open-loop mode"));
    };
    let mut steps = Vec::new();
    let mut best = None;
    for (i, rate) in plan.spec.rates().into_iter().enumerate() {
        if i > 0 && !plan.pause.is_zero() {
            std::thread::sleep(plan.pause);
        }
        workload.rewind();
        before_step(rate)?;
        let cfg = EngineConfig {
            mode: Mode::Open { rate, arrival },
            ..base.clone()
        };
        let result = worker::run(&cfg, workload, &mut on_line)?;
        let pass = passes(&result, plan.p99_bound_ms);
        if pass {
            best = Some(rate);
        }
        let step = SweepStep {
            rate,
            pass,
            cfg,
            result,
        };
        on_step(&step);
        steps.push(step);
        if !pass {
            break;
        }
    }
    Ok(SweepOutcome {
        steps,
        best_rate: best,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parses() {
        let s: SweepSpec = "1000:5000:1000".parse().unwrap();
        assert_eq!(s.rates(), vec![1000.0, 2000.0, 3000.0, 4000.0, 5000.0]);
        let s: SweepSpec = "1k:2.5k:500".parse().unwrap();
        assert_eq!(s.rates(), vec![1000.0, 1500.0, 2000.0, 2500.0]);
        let s: SweepSpec = "100:250:100".parse().unwrap();
        assert_eq!(s.rates(), vec![100.0, 200.0]);
        assert!("5:1:1".parse::<SweepSpec>().is_err());
        assert!("1:2".parse::<SweepSpec>().is_err());
        assert!("1:100000:1".parse::<SweepSpec>().is_err());
        assert!("1:10:0".parse::<SweepSpec>().is_err());
    }
}
