//! What the warm snapshot records of the configuration it was taken under, as stable
//! fingerprints: xxh3-64 over an encoding written out here field by field, starting
//! with a version byte.
//!
//! ```text
//!  settings = xxh3_64(VERSION | 'S' | policy tag u8 | its parameters | store_vectors u8)
//!  capacity = xxh3_64(VERSION | 'C' | unit u8 (1 objects, 2 bytes) | size u64)
//!  f32 / f64 as their IEEE bits (-0.0 as 0.0), integers as u64, all little-endian
//! ```
//! Why not `format!("{:?}")` (formats 1 and 2): Rust's `Debug` text is no contract, and
//! a renamed field or variant would silently refuse every snapshot on disk. Here a
//! change of what is hashed is a change of this file, the `match` below breaks the build
//! when a policy is added, and [`VERSION`] goes up when the encoding changes (each bump
//! refuses the snapshots written before it, once, with the reason in the log).
//!
//! `settings` decides whether a snapshot is used at all (τ means what the policy that
//! set it made it mean, and entries with or without vectors differ); `capacity` only
//! whether the pool shares carry over (they are in its unit).

use shards::{Capacity, PolicyConfig};
use xxhash_rust::xxh3::xxh3_64;

/// The encoding's version, the first byte hashed.
pub(crate) const VERSION: u8 = 1;

/// Bytes to hash, written in a fixed order.
struct Encoding(Vec<u8>);

impl Encoding {
    fn new(domain: u8) -> Encoding {
        Encoding(vec![VERSION, domain])
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn f32(&mut self, v: f32) -> &mut Self {
        // -0.0 and 0.0 configure the same thing.
        let v = if v == 0.0 { 0.0 } else { v };
        self.0.extend_from_slice(&v.to_bits().to_le_bytes());
        self
    }
    fn f64(&mut self, v: f64) -> &mut Self {
        let v = if v == 0.0 { 0.0 } else { v };
        self.0.extend_from_slice(&v.to_bits().to_le_bytes());
        self
    }
    fn finish(&self) -> u64 {
        xxh3_64(&self.0)
    }
}

/// The hit policy with its parameters, and whether entries keep their neighbours'
/// vectors: a snapshot taken under other settings is refused.
pub(crate) fn settings(policy: &PolicyConfig, store_vectors: bool) -> u64 {
    let mut e = Encoding::new(b'S');
    match *policy {
        PolicyConfig::Aker {
            alpha_l,
            alpha_t,
            tau_init_divisor,
        } => e.u8(1).f32(alpha_l).f32(alpha_t).f32(tau_init_divisor),
        PolicyConfig::AkerRerank {
            alpha_l,
            alpha_t,
            tau_init_divisor,
        } => e.u8(2).f32(alpha_l).f32(alpha_t).f32(tau_init_divisor),
        PolicyConfig::Guarded {
            alpha_l,
            alpha_t,
            tau_init_divisor,
            spread,
        } => e
            .u8(3)
            .f32(alpha_l)
            .f32(alpha_t)
            .f32(tau_init_divisor)
            .f32(spread),
        PolicyConfig::Proximity { threshold } => e.u8(4).f32(threshold),
        PolicyConfig::Potluck {
            threshold,
            p,
            grow,
            shrink,
            seed,
        } => e
            .u8(5)
            .f32(threshold)
            .f64(p)
            .f32(grow)
            .f32(shrink)
            .u64(seed),
    };
    e.u8(u8::from(store_vectors)).finish()
}

/// The pool's capacity, unit and size: under another, pool shares start even.
pub(crate) fn capacity(c: Capacity) -> u64 {
    let (unit, size) = match c {
        Capacity::Objects(n) => (1, n),
        Capacity::Bytes(n) => (2, n),
    };
    Encoding::new(b'C').u8(unit).u64(size as u64).finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{daemon_defaults, CacheSection, DEFAULT_CAPACITY_BYTES};

    /// Pinned: a change here refuses every snapshot on disk. Bump [`VERSION`], update
    /// these values, and add a line to the snapshot format's history
    /// (`durable::snapshot::FORMAT`).
    #[test]
    fn the_default_configuration_s_fingerprints_are_stable() {
        let d = CacheSection::default();
        assert_eq!(d.policy, daemon_defaults::policy());
        assert_eq!(settings(&d.policy, d.store_vectors), 0x2e8d_069e_3037_96f2);
        let cap = Capacity::Bytes(DEFAULT_CAPACITY_BYTES);
        assert_eq!(capacity(cap), 0x76d6_11f7_9ff6_d8e4);
    }

    #[test]
    fn a_relevant_setting_changes_the_fingerprint() {
        let guarded = daemon_defaults::policy();
        let base = settings(&guarded, false);
        assert_ne!(settings(&guarded, true), base, "store_vectors");
        let PolicyConfig::Guarded {
            alpha_l,
            alpha_t,
            tau_init_divisor,
            ..
        } = guarded
        else {
            unreachable!("the default is the guarded policy")
        };
        let spread = PolicyConfig::Guarded {
            alpha_l,
            alpha_t,
            tau_init_divisor,
            spread: 0.5,
        };
        assert_ne!(settings(&spread, false), base, "a parameter");
        let minus_zero = PolicyConfig::Guarded {
            alpha_l,
            alpha_t,
            tau_init_divisor,
            spread: -0.0,
        };
        assert_eq!(settings(&minus_zero, false), base, "-0.0 is 0.0");
        // The same parameters under another policy.
        let aker = PolicyConfig::Aker {
            alpha_l,
            alpha_t,
            tau_init_divisor,
        };
        let rerank = PolicyConfig::AkerRerank {
            alpha_l,
            alpha_t,
            tau_init_divisor,
        };
        assert_ne!(settings(&aker, false), settings(&rerank, false));
        assert_ne!(
            capacity(Capacity::Bytes(1000)),
            capacity(Capacity::Objects(1000))
        );
        assert_ne!(
            capacity(Capacity::Bytes(1000)),
            capacity(Capacity::Bytes(1001))
        );
    }
}
