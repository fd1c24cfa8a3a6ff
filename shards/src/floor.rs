//! The recall floor: what the cache's answers cost in recall, estimated online from
//! sampled shadow checks against the backend, and the controller that scales every hit
//! threshold so that the estimate's lower confidence bound holds a declared floor.
//!
//! ```text
//!   a hit is served ──(sampled; the backend's spare capacity)──> the backend's answer
//!         │                                                      for the same request
//!         └──────────── recall@k of the served ids against it ────────┘
//!                                  │ record(kind, r)
//!                                  v
//!   RecallFloor   per hit kind: exponentially weighted mean and variance of r
//!                 (half-life in samples), so a changed workload is seen
//!                 served shares: every reply counted (observe_served), not only the
//!                 sampled ones, decayed over requests
//!   estimate      E = 1 - Σ_h share_h (1 - r_h)       (a miss is the backend's own answer)
//!   lower bound   L = E - z · sqrt(Σ_h share_h² · var_h / n_h)
//!   control       L < floor: scale × tighten;  L > floor + margin: scale × relax (≤ max)
//!   every lookup  an approximate hit needs gap < τ(entry) × scale
//!                 (CacheReader::set_threshold_scale)
//! ```
//!
//! Recall is relative to the backend's answer: with an exact backend it is true
//! recall@k, with an approximate one it is the part of the loss the cache adds. The
//! engine holds the estimator and the controller so that the experiment runner and
//! akerd share them; where the samples come from (a shadow query in akerd, a backend
//! call in the runner) is the caller's.

use serde::{Deserialize, Serialize};

use crate::read::HitKind;

/// The kinds a floor samples: every hit kind (a miss is the backend's answer).
const KINDS: [HitKind; 3] = [HitKind::Exact, HitKind::Alias, HitKind::Approximate];

/// Replies after which a served share weighs half (the shares' half-life).
const SHARE_HALF_LIFE_REPLIES: f64 = 20_000.0;

/// A threshold-bound kind (alias, approximate) serving at least this share of replies
/// must have `KIND_SAMPLES_MIN` checks before the controller steps (below it, a kind
/// cannot move the estimate much). Exact hits do not hold it back: thresholds do not
/// change them, and they are checked at an eighth of the rate (waiting for them held a
/// GloVe run at skew 0.30 for 95,000 requests: bench/results/recall-floor.md).
const KIND_SHARE_MATERIAL: f64 = 0.01;
const KIND_SAMPLES_MIN: u64 = 10;

/// The weight (in checks) approximate-hit checks keep across a change of scale.
const STEP_CARRY_CHECKS: f64 = 5.0;

/// A kind's variance is taken as at least this (recall@k is a multiple of 1/k: a run
/// of equal samples does not make the estimate certain).
const VARIANCE_MIN: f64 = 0.01;

/// The recall floor's settings (`cache.recall_floor` and its neighbours in akerd).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FloorConfig {
    /// The recall@k (relative to the backend) that what the cache serves must keep,
    /// over all replies; 0 turns the floor off.
    pub floor: f64,
    /// Fraction of approximate and alias hits checked against the backend; exact hits
    /// are checked at an eighth of it (they rarely differ from the backend).
    pub sample: f64,
    /// One-sided normal quantile of the lower bound: 1.645 for 95% confidence.
    pub z: f64,
    /// Samples of one kind after which an older sample weighs half.
    pub half_life_samples: f64,
    /// Replies after which a check weighs half (0: checks do not fade with replies; a
    /// caller with a clock fades them by time instead, `RecallFloor::fade_checks`).
    pub check_half_life_replies: f64,
    /// New samples (any kind) between two controller steps.
    pub min_samples: u64,
    /// Factor a step below the floor multiplies the scale by.
    pub tighten: f32,
    /// Factor a step comfortably above it multiplies the scale by.
    pub relax: f32,
    pub scale_min: f32,
    /// The largest scale: 1 keeps the policy's own thresholds as the loosest; above 1
    /// the controller may loosen past them while the floor holds (more hits).
    pub scale_max: f32,
    /// "Comfortably above": the lower bound exceeds the floor by this much; 0 means a
    /// quarter of `1 - floor`.
    pub margin: f64,
}

impl Default for FloorConfig {
    fn default() -> Self {
        FloorConfig {
            floor: 0.0,
            sample: 0.05,
            z: 1.645,
            half_life_samples: 200.0,
            check_half_life_replies: SHARE_HALF_LIFE_REPLIES,
            min_samples: 50,
            tighten: 0.5,
            relax: 1.25,
            scale_min: 1.0 / 4096.0,
            scale_max: 1.0,
            margin: 0.0,
        }
    }
}

impl FloorConfig {
    pub fn validate(&self) -> Result<(), String> {
        let unit = |x: f64| (0.0..=1.0).contains(&x);
        let checks = [
            (unit(self.floor) && self.floor < 1.0, "floor in [0, 1)"),
            (self.sample > 0.0 && self.sample <= 1.0, "0 < sample <= 1"),
            (self.z.is_finite() && self.z >= 0.0, "z >= 0"),
            (
                self.half_life_samples.is_finite() && self.half_life_samples >= 1.0,
                "half_life_samples >= 1",
            ),
            (self.min_samples >= 1, "min_samples >= 1"),
            (
                self.check_half_life_replies.is_finite() && self.check_half_life_replies >= 0.0,
                "check_half_life_replies >= 0",
            ),
            (self.tighten > 0.0 && self.tighten < 1.0, "0 < tighten < 1"),
            (self.relax > 1.0 && self.relax.is_finite(), "relax > 1"),
            (
                self.scale_min > 0.0 && self.scale_min <= 1.0 && self.scale_max >= 1.0,
                "0 < scale_min <= 1 <= scale_max",
            ),
            (self.scale_max.is_finite(), "scale_max finite"),
            (unit(self.margin), "margin in [0, 1]"),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            None => Ok(()),
            Some((_, what)) => Err(format!("recall floor: {what} ({self:?})")),
        }
    }

    pub fn enabled(&self) -> bool {
        self.floor > 0.0
    }

    /// The fraction of `kind`'s replies to check.
    pub fn sample_fraction(&self, kind: HitKind) -> f64 {
        match kind {
            HitKind::Exact => self.sample / 8.0,
            HitKind::Alias | HitKind::Approximate => self.sample,
            HitKind::Miss => 0.0,
        }
    }

    fn margin_or_default(&self) -> f64 {
        if self.margin > 0.0 {
            self.margin
        } else {
            (1.0 - self.floor) / 4.0
        }
    }
}

/// An exponentially weighted mean and variance (West's weighted update).
#[derive(Clone, Copy, Debug, Default)]
struct Weighted {
    w: f64,
    mean: f64,
    s: f64,
    count: u64,
}

impl Weighted {
    fn add(&mut self, x: f64, decay: f64) {
        self.w = self.w * decay + 1.0;
        self.s *= decay;
        let old = self.mean;
        self.mean += (x - old) / self.w;
        self.s += (x - old) * (x - self.mean);
        self.count += 1;
    }

    /// Every weight multiplied by `keep` (mean and variance unchanged, fewer
    /// effective samples).
    fn fade(&mut self, keep: f64) {
        self.w *= keep;
        self.s *= keep;
    }

    fn variance(&self) -> f64 {
        if self.w > 0.0 {
            (self.s / self.w).max(0.0)
        } else {
            0.25
        }
    }

    /// The evidence the weights stand for: their sum (a fresh check weighs 1, older
    /// ones less, faded ones less still), so fading widens the bound.
    fn n_eff(&self) -> f64 {
        self.w
    }
}

/// Cumulative replies by kind, as the caller counts them (all of them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServedTotals {
    pub exact: u64,
    pub alias: u64,
    pub approximate: u64,
    pub miss: u64,
}

impl ServedTotals {
    fn get(&self, kind: HitKind) -> u64 {
        match kind {
            HitKind::Exact => self.exact,
            HitKind::Alias => self.alias,
            HitKind::Approximate => self.approximate,
            HitKind::Miss => self.miss,
        }
    }

    fn total(&self) -> u64 {
        self.exact + self.alias + self.approximate + self.miss
    }
}

/// One kind's part of the estimate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KindEstimate {
    /// Share of replies (decayed).
    pub share: f64,
    /// Mean recall of its checks (1 before any).
    pub recall: f64,
    /// The one-sided bound at `z` on that mean.
    pub low: f64,
    pub samples: u64,
}

/// Where the floor stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FloorState {
    Off,
    /// Fewer than `min_samples` checks so far, or fewer than 10 of a kind serving at
    /// least 1% of replies: no step is taken.
    Warming,
    /// The lower bound is at or above the floor.
    Holding,
    /// Below the floor: thresholds are being tightened.
    Tightening,
    /// Below the floor with the scale at its minimum: the floor is out of reach of the
    /// thresholds (exact or alias hits cost it, or the estimate is still too wide).
    Unreachable,
}

impl FloorState {
    pub fn name(self) -> &'static str {
        match self {
            FloorState::Off => "off",
            FloorState::Warming => "warming",
            FloorState::Holding => "holding",
            FloorState::Tightening => "tightening",
            FloorState::Unreachable => "unreachable",
        }
    }

    /// A number for gauges: off 0, warming 1, holding 2, tightening 3, unreachable 4.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The state whose [`FloorState::code`] is `code` (readers of the gauge).
    pub fn from_code(code: usize) -> Option<FloorState> {
        [
            FloorState::Off,
            FloorState::Warming,
            FloorState::Holding,
            FloorState::Tightening,
            FloorState::Unreachable,
        ]
        .into_iter()
        .find(|s| s.code() as usize == code)
    }
}

/// The estimate over all replies, its per-kind parts and the controller's state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FloorEstimate {
    pub floor: f64,
    pub recall: f64,
    pub low: f64,
    pub high: f64,
    /// Exact, alias, approximate.
    pub kinds: [KindEstimate; 3],
    pub scale: f32,
    pub state: FloorState,
    pub samples: u64,
    pub tightened: u64,
    pub relaxed: u64,
    /// While warming: the hit kind whose checks it waits for (`None`: too few checks in
    /// all, or not warming).
    pub waiting_for: Option<HitKind>,
}

/// The estimator and the controller (one per cache or sharded cache; the caller
/// serialises access and applies `scale()` to its readers).
#[derive(Clone, Debug)]
pub struct RecallFloor {
    cfg: FloorConfig,
    decay: f64,
    kinds: [Weighted; 3],
    shares: [f64; 4],
    last_totals: ServedTotals,
    scale: f32,
    since_step: u64,
    samples: u64,
    tightened: u64,
    relaxed: u64,
    below: bool,
}

fn slot(kind: HitKind) -> Option<usize> {
    KINDS.iter().position(|&k| k == kind)
}

impl RecallFloor {
    pub fn new(cfg: FloorConfig) -> Result<RecallFloor, String> {
        cfg.validate()?;
        Ok(RecallFloor {
            decay: 0.5f64.powf(1.0 / cfg.half_life_samples),
            cfg,
            kinds: [Weighted::default(); 3],
            shares: [0.0; 4],
            last_totals: ServedTotals::default(),
            scale: 1.0,
            since_step: 0,
            samples: 0,
            tightened: 0,
            relaxed: 0,
            below: false,
        })
    }

    pub fn config(&self) -> &FloorConfig {
        &self.cfg
    }

    /// The factor every hit threshold is multiplied by.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// One check: a reply of `kind` had `recall` against the backend's answer.
    pub fn record(&mut self, kind: HitKind, recall: f64) {
        debug_assert!((0.0..=1.0).contains(&recall), "recall {recall}");
        let Some(i) = slot(kind) else { return };
        self.kinds[i].add(recall.clamp(0.0, 1.0), self.decay);
        self.samples += 1;
        self.since_step += 1;
    }

    /// The caller's cumulative reply counts; the shares decay over replies.
    pub fn observe_served(&mut self, totals: ServedTotals) {
        let last = self.last_totals;
        if totals.total() < last.total() {
            // Counters were reset (a new cache): start the shares over.
            self.last_totals = ServedTotals::default();
            self.shares = [0.0; 4];
            return self.observe_served(totals);
        }
        let new = (totals.total() - last.total()) as f64;
        let keep = 0.5f64.powf(new / SHARE_HALF_LIFE_REPLIES);
        let all = [
            HitKind::Exact,
            HitKind::Alias,
            HitKind::Approximate,
            HitKind::Miss,
        ];
        for (i, &k) in all.iter().enumerate() {
            let d = totals.get(k).saturating_sub(last.get(k)) as f64;
            self.shares[i] = self.shares[i] * keep + d;
        }
        // Checks age with the replies too: where they are sparse, an old check must not
        // stand for the present (a changed workload), so the bound widens instead.
        if self.cfg.check_half_life_replies > 0.0 {
            self.fade_checks(0.5f64.powf(new / self.cfg.check_half_life_replies));
        }
        self.last_totals = totals;
    }

    /// Multiplies every check's weight by `keep` (in (0, 1]): fewer effective checks,
    /// a wider bound, the same means. akerd calls it by time (checks are capped per
    /// second there, so fading by replies would empty the evidence at high rates).
    pub fn fade_checks(&mut self, keep: f64) {
        debug_assert!(keep > 0.0 && keep <= 1.0, "keep {keep}");
        for w in &mut self.kinds {
            w.fade(keep.clamp(f64::MIN_POSITIVE, 1.0));
        }
    }

    fn share(&self, i: usize) -> f64 {
        let sum: f64 = self.shares.iter().sum();
        if sum > 0.0 {
            self.shares[i] / sum
        } else {
            0.0
        }
    }

    /// A kind's mean recall and the variance of that mean; `None` before
    /// `KIND_SAMPLES_MIN` checks (it then adds no loss: see `warming`).
    fn kind_mean(&self, i: usize) -> Option<(f64, f64)> {
        let w = &self.kinds[i];
        (w.count >= KIND_SAMPLES_MIN)
            .then(|| (w.mean, w.variance().max(VARIANCE_MIN) / w.n_eff().max(1.0)))
    }

    fn kind_estimate(&self, i: usize) -> KindEstimate {
        let (recall, low) = match self.kind_mean(i) {
            Some((m, v)) => (m, (m - self.cfg.z * v.sqrt()).max(0.0)),
            None => (1.0, 0.0),
        };
        KindEstimate {
            share: self.share(i),
            recall,
            low,
            samples: self.kinds[i].count,
        }
    }

    /// The threshold-bound kind (alias, approximate) that serves a material share
    /// with too few checks to judge, if any.
    fn waiting_for(&self) -> Option<HitKind> {
        (1..3)
            .find(|&i| {
                self.share(i) >= KIND_SHARE_MATERIAL && self.kinds[i].count < KIND_SAMPLES_MIN
            })
            .map(|i| KINDS[i])
    }

    fn warming(&self) -> bool {
        self.waiting_for().is_some() || self.samples < self.cfg.min_samples
    }

    pub fn estimate(&self) -> FloorEstimate {
        let kinds = [0, 1, 2].map(|i| self.kind_estimate(i));
        let mut loss = 0.0;
        let mut var = 0.0;
        for (i, k) in kinds.iter().enumerate() {
            if let Some((m, v)) = self.kind_mean(i) {
                loss += k.share * (1.0 - m);
                var += k.share * k.share * v;
            }
        }
        let recall = 1.0 - loss;
        let half = self.cfg.z * var.sqrt();
        FloorEstimate {
            floor: self.cfg.floor,
            recall,
            low: (recall - half).max(0.0),
            high: (recall + half).min(1.0),
            kinds,
            scale: self.scale,
            state: self.state(recall - half),
            samples: self.samples,
            tightened: self.tightened,
            relaxed: self.relaxed,
            waiting_for: self.waiting_for(),
        }
    }

    fn state(&self, low: f64) -> FloorState {
        if !self.cfg.enabled() {
            FloorState::Off
        } else if self.warming() {
            FloorState::Warming
        } else if low >= self.cfg.floor {
            FloorState::Holding
        } else if self.scale <= self.cfg.scale_min {
            FloorState::Unreachable
        } else {
            FloorState::Tightening
        }
    }

    /// One controller step when `min_samples` new checks came in since the last: the
    /// new scale when it changed.
    pub fn control(&mut self) -> Option<f32> {
        if !self.cfg.enabled() || self.since_step < self.cfg.min_samples || self.warming() {
            return None;
        }
        self.since_step = 0;
        let e = self.estimate();
        let before = self.scale;
        self.below = e.low < self.cfg.floor;
        if self.below {
            self.scale = (self.scale * self.cfg.tighten).max(self.cfg.scale_min);
        } else if e.low > self.cfg.floor + self.cfg.margin_or_default() {
            self.scale = (self.scale * self.cfg.relax).min(self.cfg.scale_max);
        }
        if self.scale < before {
            self.tightened += 1;
        } else if self.scale > before {
            self.relaxed += 1;
        }
        if self.scale != before {
            // Approximate hits checked under the old scale describe thresholds no
            // longer in force: they keep the weight of a few checks, so the mean stays
            // informed and the next step's 50 checks, under the new scale, outweigh it.
            let w = &mut self.kinds[slot(HitKind::Approximate).expect("a sampled kind")];
            if w.w > STEP_CARRY_CHECKS {
                w.fade(STEP_CARRY_CHECKS / w.w);
            }
        }
        (self.scale != before).then_some(self.scale)
    }
}

/// recall@k of `served` against `reference` (the backend's top k for the same request):
/// the share of the reference's first `k` ids that `served` holds.
pub fn recall_at_k(served: &[u64], reference: &[u64], k: usize) -> f64 {
    let want = &reference[..k.min(reference.len())];
    if want.is_empty() {
        return 1.0;
    }
    let got = &served[..k.min(served.len())];
    let found = want.iter().filter(|id| got.contains(id)).count();
    found as f64 / want.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floor(f: f64) -> RecallFloor {
        RecallFloor::new(FloorConfig {
            floor: f,
            ..FloorConfig::default()
        })
        .unwrap()
    }

    fn served(exact: u64, approximate: u64, miss: u64) -> ServedTotals {
        ServedTotals {
            exact,
            alias: 0,
            approximate,
            miss,
        }
    }

    #[test]
    fn recall_at_k_counts_the_reference_s_ids_served() {
        assert_eq!(recall_at_k(&[1, 2, 3], &[3, 2, 9], 3), 2.0 / 3.0);
        assert_eq!(
            recall_at_k(&[1, 2, 3, 4], &[4, 1], 2),
            0.5,
            "served beyond k ignored"
        );
        assert_eq!(recall_at_k(&[], &[1], 1), 0.0);
        assert_eq!(
            recall_at_k(&[5], &[], 1),
            1.0,
            "an empty reference loses nothing"
        );
    }

    #[test]
    fn the_estimate_weighs_each_kind_by_its_share_of_replies() {
        let mut f = floor(0.9);
        // Half the replies approximate at recall 0.6, a quarter exact (1.0), a quarter misses.
        f.observe_served(served(250, 500, 250));
        for i in 0..400 {
            f.record(HitKind::Approximate, if i % 5 < 3 { 0.5 } else { 0.75 });
            f.record(HitKind::Exact, 1.0);
        }
        let e = f.estimate();
        assert!((e.kinds[2].recall - 0.6).abs() < 0.02, "{e:?}");
        assert!((e.recall - 0.8).abs() < 0.01, "1 - 0.5 · 0.4: {e:?}");
        assert!(e.low < e.recall && e.recall < e.high);
        assert!(e.recall - e.low < 0.05, "400 checks make it narrow: {e:?}");
    }

    #[test]
    fn a_material_kind_never_checked_keeps_the_floor_warming() {
        let mut f = floor(0.9);
        f.observe_served(served(900, 100, 0));
        for _ in 0..200 {
            f.record(HitKind::Exact, 1.0);
        }
        let e = f.estimate();
        assert_eq!(e.state, FloorState::Warming, "approximate: 10% unchecked");
        assert_eq!(e.waiting_for, Some(HitKind::Approximate));
        assert_eq!(f.control(), None);
        for _ in 0..10 {
            f.record(HitKind::Approximate, 0.5);
        }
        let e = f.estimate();
        assert!((e.recall - 0.95).abs() < 1e-9, "{e:?}");
        assert_eq!(e.state, FloorState::Holding, "{e:?}");
    }

    #[test]
    fn below_the_floor_it_tightens_and_above_it_relaxes_back() {
        let mut f = floor(0.95);
        f.observe_served(served(500, 500, 0));
        let mut scales = vec![];
        for _ in 0..4 {
            for _ in 0..50 {
                f.record(HitKind::Approximate, 0.7);
                f.record(HitKind::Exact, 1.0);
            }
            scales.extend(f.control());
        }
        assert_eq!(
            scales,
            vec![0.5, 0.25, 0.125, 0.0625],
            "one step per 100 checks"
        );
        assert_eq!(f.estimate().state, FloorState::Tightening);
        // The approximate answers get good: old checks fade (half-life 200) and the
        // scale comes back up, never past the policy's own thresholds.
        for _ in 0..40 {
            for _ in 0..50 {
                f.record(HitKind::Approximate, 1.0);
            }
            f.control();
        }
        let e = f.estimate();
        assert_eq!((e.scale, e.state), (1.0, FloorState::Holding), "{e:?}");
        // Until the good checks outweigh the old ones it tightens a few times more.
        assert!(e.relaxed >= 4 && e.tightened >= 4, "{e:?}");
    }

    #[test]
    fn at_its_minimum_scale_a_floor_out_of_reach_says_so() {
        let mut f = RecallFloor::new(FloorConfig {
            floor: 0.99,
            scale_min: 0.25,
            ..FloorConfig::default()
        })
        .unwrap();
        // Exact hits that lose recall (stale entries): thresholds cannot help.
        f.observe_served(served(1000, 0, 0));
        for _ in 0..10 {
            for _ in 0..50 {
                f.record(HitKind::Exact, 0.8);
            }
            f.control();
        }
        let e = f.estimate();
        assert_eq!((e.scale, e.state), (0.25, FloorState::Unreachable), "{e:?}");
    }

    #[test]
    fn off_warming_and_bad_settings() {
        let mut off = floor(0.0);
        off.record(HitKind::Approximate, 0.0);
        assert_eq!(off.control(), None);
        assert_eq!(off.estimate().state, FloorState::Off);
        let mut f = floor(0.9);
        f.record(HitKind::Approximate, 0.0);
        assert_eq!(f.estimate().state, FloorState::Warming);
        assert_eq!(f.control(), None, "fewer than min_samples checks");
        for bad in [
            FloorConfig {
                floor: 1.0,
                ..FloorConfig::default()
            },
            FloorConfig {
                sample: 0.0,
                ..FloorConfig::default()
            },
            FloorConfig {
                tighten: 1.0,
                ..FloorConfig::default()
            },
            FloorConfig {
                scale_max: 0.5,
                ..FloorConfig::default()
            },
            FloorConfig {
                z: f64::NAN,
                ..FloorConfig::default()
            },
        ] {
            assert!(RecallFloor::new(bad).is_err());
        }
        assert_eq!(FloorConfig::default().sample_fraction(HitKind::Miss), 0.0);
    }

    #[test]
    fn exact_hits_unchecked_do_not_hold_the_controller_back() {
        let mut f = floor(0.95);
        f.observe_served(served(500, 500, 0));
        for _ in 0..50 {
            f.record(HitKind::Approximate, 0.6);
        }
        assert_eq!(f.estimate().waiting_for, None);
        assert_eq!(f.control(), Some(0.5), "exact hits have no checks yet");
    }

    #[test]
    fn checks_fade_with_the_replies_served_since() {
        let mut f = floor(0.9);
        f.observe_served(served(0, 1000, 0));
        for _ in 0..200 {
            f.record(HitKind::Approximate, 0.95);
        }
        let before = f.estimate();
        // 100,000 replies later without a check: the same mean, a much wider bound.
        f.observe_served(served(0, 101_000, 0));
        let after = f.estimate();
        assert!((after.kinds[2].recall - before.kinds[2].recall).abs() < 1e-12);
        assert!(after.low < before.low - 0.05, "{before:?} -> {after:?}");
    }

    #[test]
    fn shares_follow_a_changed_workload() {
        let mut f = floor(0.9);
        f.observe_served(served(1000, 0, 0));
        assert_eq!(f.estimate().kinds[0].share, 1.0);
        // 200,000 replies later, all approximate: the old ones have all but faded.
        f.observe_served(served(1000, 200_000, 0));
        assert!(f.estimate().kinds[2].share > 0.99);
    }
}
