//! Hand-computed checks of each rule of ALGORITHM.md, one test per rule.
//!
//! The collection is one-dimensional so every distance can be worked out by hand:
//! squared L2 between points on a line.

use std::sync::Arc;

use shards::store::ExactStore;
use shards::{
    Admission, Backend, Cache, CacheConfig, Capacity, Error, Eviction, FilterKind, HitKind, Lookup,
    Metric, PolicyConfig,
};

/// Points: id -> position on the line.
const POINTS: [(u64, f32); 6] = [(1, 2.0), (2, 3.0), (3, 5.0), (4, 9.0), (5, 14.0), (6, 20.0)];

fn store() -> ExactStore {
    let mut s = ExactStore::new(1, Metric::L2Sq);
    for (id, x) in POINTS {
        s.insert(id, &[x]).unwrap();
    }
    s
}

/// The tests' one-dimensional configuration: brute-force filter, k up to 4.
fn line_config() -> CacheConfig {
    CacheConfig {
        filter: FilterKind::BruteForce,
        k_max: 4,
        ..CacheConfig::new(1, Metric::L2Sq)
    }
}

fn cache_with(delta: usize, capacity: usize, filter: FilterKind, policy: PolicyConfig) -> Cache {
    let cfg = CacheConfig {
        delta,
        capacity: Capacity::Objects(capacity),
        filter,
        ..line_config()
    };
    Cache::new(cfg, policy.build()).unwrap()
}

fn cache(delta: usize) -> Cache {
    cache_with(delta, 100, FilterKind::BruteForce, PolicyConfig::default())
}

fn ids(r: &shards::SearchOutcome) -> Vec<u64> {
    r.results.iter().map(|n| n.id).collect()
}

fn tau(c: &Cache, q: f32) -> f32 {
    let rep = c.slot(&[q]).unwrap().rep();
    c.representative(rep).unwrap().state.tau.load()
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() < 1e-5
}

#[test]
fn miss_admits_with_tau_min_d_over_4_then_equality_hit_grows_tau() {
    let (mut c, s) = (cache(0), store());
    // q = 1.0: d(1) = 1, d(2) = 4 -> minD = 1, τ = 0.25
    let r = c.search(&s, &[1.0], 2).unwrap();
    assert_eq!(r.kind, HitKind::Miss);
    assert_eq!(ids(&r), vec![1, 2]);
    assert!(close(tau(&c, 1.0), 0.25));
    let r = c.search(&s, &[1.0], 2).unwrap();
    assert_eq!(r.kind, HitKind::Exact);
    assert_eq!(ids(&r), vec![1, 2]);
    assert!(close(tau(&c, 1.0), 0.275), "τ ← min(0.25 · 1.1, minD = 1)");
    // growth is capped by minD
    for _ in 0..40 {
        c.search(&s, &[1.0], 2).unwrap();
    }
    assert!(
        close(tau(&c, 1.0), 1.0),
        "capped at minD, got {}",
        tau(&c, 1.0)
    );
    c.check_invariants().unwrap();
}

#[test]
fn approximate_hit_shrinks_tau_links_alias_and_reranks_for_the_request() {
    let (mut c, s) = (cache(0), store());
    c.search(&s, &[1.0], 2).unwrap();
    c.search(&s, &[1.0], 2).unwrap(); // τ = 0.275
                                      // q' = 1.3: d(q', RQ) = 0.09 < 0.275
    let r = c.search(&s, &[1.3], 2).unwrap();
    assert_eq!(r.kind, HitKind::Approximate);
    assert_eq!(ids(&r), vec![1, 2]);
    assert!(
        close(r.results[0].distance, 0.49) && close(r.results[1].distance, 2.89),
        "{:?}",
        r.results
    );
    assert!(r.exact_distances);
    assert!(close(tau(&c, 1.0), 0.06875), "τ ← 0.275 · 0.25");
    // the same query again comes back through its alias, τ unchanged
    let r = c.search(&s, &[1.3], 2).unwrap();
    assert_eq!(r.kind, HitKind::Alias);
    assert!(close(tau(&c, 1.0), 0.06875));
    assert_eq!(c.aliases(), 1);
    // d = 0.09 is no longer < τ for another near query
    let r = c.search(&s, &[0.7], 2).unwrap();
    assert_eq!(r.kind, HitKind::Miss);
    c.check_invariants().unwrap();
}

#[test]
fn guarded_promotes_an_alias_asked_for_again_to_its_own_entry() {
    let guarded = PolicyConfig::Guarded {
        alpha_l: 1.1,
        alpha_t: 0.25,
        tau_init_divisor: 4.0,
        spread: 0.0,
    };
    let (mut c, s) = (cache_with(0, 100, FilterKind::BruteForce, guarded), store());
    c.search(&s, &[1.0], 2).unwrap();
    c.search(&s, &[1.0], 2).unwrap(); // τ = 0.275
    assert_eq!(c.search(&s, &[1.3], 2).unwrap().kind, HitKind::Approximate);
    assert_eq!(c.aliases(), 1, "the near query is remembered");
    // Asked again: no alias hit, a miss whose exact answer becomes the query's entry.
    let r = c.search(&s, &[1.3], 2).unwrap();
    assert_eq!(r.kind, HitKind::Miss);
    assert!(matches!(r.admission, Some(Admission::Admitted(_))));
    assert_eq!(
        (c.aliases(), c.len()),
        (0, 2),
        "the alias gave way to an entry"
    );
    assert_eq!(c.stats().alias_promotions, 1);
    assert_eq!(c.search(&s, &[1.3], 2).unwrap().kind, HitKind::Exact);
    c.check_invariants().unwrap();

    // A promotion whose answer is refused still removes the alias: left, it would send
    // every repeat to the backend.
    c.search(&s, &[0.8], 2).unwrap();
    assert_eq!(c.aliases(), 1);
    let Lookup::Miss(ticket) = c.lookup(&[0.8], 2).unwrap() else {
        panic!("a promoted alias is a miss")
    };
    let answer = s.search(&ticket.query, 2).unwrap();
    c.delete(answer[0].id); // acknowledged before the admission: one result left
    assert_eq!(c.admit(ticket, answer).unwrap(), Admission::TooFew);
    assert_eq!(c.aliases(), 0);
    c.check_invariants().unwrap();
}

/// The recall floor's knob: every approximate hit compares its gap with `τ × scale`.
#[test]
fn the_threshold_scale_narrows_approximate_hits_and_gives_them_back() {
    let (mut c, s) = (cache(0), store());
    c.search(&s, &[1.0], 2).unwrap();
    c.search(&s, &[1.0], 2).unwrap(); // τ = 0.275
    c.reader().set_threshold_scale(0.1); // 0.0275
    assert_eq!(
        c.search(&s, &[1.2], 2).unwrap().kind,
        HitKind::Miss,
        "gap 0.04"
    );
    assert_eq!(
        c.search(&s, &[1.0], 2).unwrap().kind,
        HitKind::Exact,
        "not scaled"
    );
    c.reader().set_threshold_scale(1.0);
    assert_eq!(c.reader().threshold_scale(), 1.0);
    assert_eq!(
        c.search(&s, &[0.8], 2).unwrap().kind,
        HitKind::Approximate,
        "gap 0.04 < τ"
    );
    c.check_invariants().unwrap();
}

#[test]
fn second_chance_keeps_an_entry_that_served_a_hit() {
    // Pool of 4 objects, k = 2 with no shared results: two entries fit.
    for (eviction, survivor) in [(Eviction::Fifo, 14.0), (Eviction::SecondChance, 1.0)] {
        let cfg = CacheConfig {
            capacity: Capacity::Objects(4),
            eviction,
            ..line_config()
        };
        let (mut c, s) = (
            Cache::new(cfg, PolicyConfig::default().build()).unwrap(),
            store(),
        );
        c.search(&s, &[1.0], 2).unwrap(); // ids 1, 2
        c.search(&s, &[14.0], 2).unwrap(); // ids 5, 4
        assert_eq!(c.search(&s, &[1.0], 2).unwrap().kind, HitKind::Exact);
        c.search(&s, &[20.0], 2).unwrap(); // ids 6, 5: one entry must leave
        assert_eq!(c.len(), 2, "{eviction:?}");
        assert!(
            c.slot(&[survivor]).is_some(),
            "{eviction:?} keeps {survivor}"
        );
        assert!(c.slot(&[20.0]).is_some());
        c.check_invariants().unwrap();
    }
}

#[test]
fn threshold_is_strict() {
    let (mut c, s) = (cache(0), store());
    c.search(&s, &[1.0], 2).unwrap(); // τ = 0.25
                                      // d(1.5, 1.0) = 0.25, not < 0.25
    assert_eq!(c.search(&s, &[1.5], 2).unwrap().kind, HitKind::Miss);
}

#[test]
fn a_larger_k_misses_and_replaces_the_entry() {
    let (mut c, s) = (cache(0), store());
    c.search(&s, &[1.0], 2).unwrap();
    let r = c.search(&s, &[1.0], 3).unwrap();
    assert_eq!(r.kind, HitKind::Miss);
    assert_eq!(ids(&r), vec![1, 2, 3]);
    assert_eq!(c.search(&s, &[1.0], 3).unwrap().kind, HitKind::Exact);
}

#[test]
fn delete_promotes_the_reserve() {
    let (mut c, mut s) = (cache(1), store());
    c.search(&s, &[1.0], 2).unwrap(); // NRL = 1, 2 | 3
    s.delete(1).unwrap();
    let d = c.delete(1);
    assert_eq!((d.cached, d.repaired, d.invalidated), (true, 1, 0));
    let r = c.search(&s, &[1.0], 2).unwrap();
    assert_eq!(r.kind, HitKind::Exact);
    assert_eq!(ids(&r), vec![2, 3]);
    c.check_invariants().unwrap();
}

#[test]
fn fewer_than_k_invalidates_and_the_query_is_admissible_at_once() {
    let (mut c, mut s) = (cache(0), store());
    c.search(&s, &[1.0], 2).unwrap();
    s.delete(2).unwrap();
    let d = c.delete(2);
    assert_eq!((d.repaired, d.invalidated), (0, 1));
    assert_eq!(c.len(), 0);
    assert_eq!(c.objects(), 0, "references released");
    let r = c.search(&s, &[1.0], 2).unwrap();
    assert_eq!(r.kind, HitKind::Miss);
    assert_eq!(ids(&r), vec![1, 3]);
    assert_eq!(r.admission, Some(Admission::Admitted(2)));
    assert_eq!(c.search(&s, &[1.0], 2).unwrap().kind, HitKind::Exact);
    c.check_invariants().unwrap();
}

#[test]
fn delete_of_an_uncached_id_is_normal() {
    let mut c = cache(0);
    let d = c.delete(12345);
    assert!(!d.cached);
    c.check_invariants().unwrap();
}

#[test]
fn a_delete_during_an_in_flight_miss_is_not_admitted_back() {
    let (mut c, mut s) = (cache(0), store());
    let Lookup::Miss(ticket) = c.lookup(&[1.0], 2).unwrap() else {
        panic!("cold cache")
    };
    let answer = s.search(&ticket.query, 3).unwrap(); // backend answered: 1, 2, 3
    s.delete(1).unwrap();
    c.delete(1); // acknowledged before the admission
    assert_eq!(c.admit(ticket, answer).unwrap(), Admission::Admitted(1));
    let r = c.search(&s, &[1.0], 2).unwrap();
    assert_eq!(r.kind, HitKind::Exact);
    assert_eq!(
        ids(&r),
        vec![2, 3],
        "the deleted id is stripped at admission"
    );
    c.check_invariants().unwrap();

    // With too few left after stripping, nothing is admitted.
    let (mut c, s) = (cache(0), store());
    let Lookup::Miss(ticket) = c.lookup(&[1.0], 2).unwrap() else {
        panic!()
    };
    let answer = s.search(&ticket.query, 2).unwrap();
    c.delete(2);
    assert_eq!(c.admit(ticket, answer).unwrap(), Admission::TooFew);
    assert_eq!(c.len(), 0);
}

#[test]
fn fast_path_inserts_at_the_sorted_place() {
    let (mut c, mut s) = (cache(1), store());
    c.search(&s, &[1.0], 2).unwrap(); // NRL: 1 (1), 2 (4), 3 (16)
    s.insert(9, &[0.0]).unwrap(); // d = 1, ties with id 1: after it by id
    let out = c.insert(9, &[0.0]).unwrap();
    assert!(out.fast_path);
    let rep = c.representative(c.slot(&[1.0]).unwrap().rep()).unwrap();
    assert_eq!(
        rep.nrl.ids,
        vec![1, 9, 2],
        "inserted at its place, last dropped"
    );
    assert_eq!(rep.nrl.dists, vec![1.0, 1.0, 4.0]);
    assert_eq!(c.objects(), 3, "the dropped result's reference is released");
    // an insert farther than maxD changes nothing
    s.insert(10, &[30.0]).unwrap();
    assert!(!c.insert(10, &[30.0]).unwrap().fast_path);
    c.check_invariants().unwrap();
}

#[test]
fn risk_is_mean_r_times_unchecked_over_log_length() {
    let (mut c, s) = (cache(1), store());
    c.search(&s, &[1.0], 2).unwrap(); // A: dists 1, 4 | 16 -> r = 4 / 16 = 0.25
    assert_eq!(c.risk(), 0.0, "empty log");
    // far inserts: no fast-path merge; U = W, so R = mean r = 0.25 < 0.3: no slow path
    c.insert(100, &[1000.0]).unwrap();
    c.insert(101, &[1001.0]).unwrap();
    assert!((c.risk() - 0.25).abs() < 1e-9, "{}", c.risk());
    assert_eq!(c.stats().slow_path_steps, 0);
    // B admitted after both inserts (cursor 2): dists 0, 36 | 121 -> r = 36 / 121
    c.search(&s, &[20.0], 2).unwrap();
    let mean_r = (0.25 + 36.0 / 121.0) / 2.0;
    let (u, w) = ((2.0 + 0.0) / 2.0, 2.0);
    assert!((c.risk() - mean_r * u / w).abs() < 1e-9, "{}", c.risk());
    c.check_invariants().unwrap();
}

/// A cache of the line whose log keeps `window` records beyond the oldest cursor.
fn cache_keeping(delta: usize, window: usize) -> Cache {
    let cfg = CacheConfig {
        delta,
        hit_check_records_max: window,
        ..line_config()
    };
    Cache::new(cfg, PolicyConfig::default().build()).unwrap()
}

#[test]
fn slow_path_runs_while_risk_is_high_and_trims_the_log() {
    let (mut c, s) = (cache_keeping(0, 1), store());
    c.search(&s, &[1.0], 2).unwrap(); // Δ = 0: r = 1, so R = U / W = 1 after an insert
    c.insert(100, &[1000.0]).unwrap();
    c.insert(101, &[1000.0]).unwrap();
    assert_eq!(c.stats().slow_path_steps, 2);
    assert_eq!(c.risk(), 0.0);
    assert_eq!(
        c.insert_log_len(),
        1,
        "every cursor passed both records; the newest stays for hits to check"
    );
    c.check_invariants().unwrap();
}

#[test]
fn slow_path_merge_reaches_entries_the_fast_path_skips() {
    let cfg = CacheConfig {
        delta: 0,
        filter: FilterKind::BruteForce,
        k_max: 4,
        risk_threshold: 0.3,
        ..CacheConfig::new(1, Metric::L2Sq)
    };
    let mut c = Cache::new(cfg, PolicyConfig::default().build()).unwrap();
    let mut s = store();
    c.search(&s, &[4.0], 2).unwrap(); // A at 4: 2 (1), 3 (1)
    c.search(&s, &[6.0], 2).unwrap(); // B at 6: 3 (1), 4 (9)
                                      // x = 4.6: nearest representative is A (0.36 vs 1.96), so the fast path offers it to
                                      // A (0.36 < maxD 1: taken). B wants it too (1.96 < 9): only the slow path brings it.
    s.insert(30, &[4.6]).unwrap();
    c.insert(30, &[4.6]).unwrap();
    let b = c.slot(&[6.0]).unwrap().rep();
    assert_eq!(c.representative(b).unwrap().nrl.ids, vec![3, 30]);
    assert!(c.stats().slow_path_merges >= 1);
    c.check_invariants().unwrap();
}

#[test]
fn fifo_eviction_releases_references_and_aliases() {
    // capacity 4 objects, k = 2: two entries fit
    let mut c = cache_with(0, 4, FilterKind::BruteForce, PolicyConfig::default());
    let s = store();
    c.search(&s, &[1.0], 2).unwrap(); // 1, 2
    c.search(&s, &[1.0], 2).unwrap();
    c.search(&s, &[1.3], 2).unwrap(); // approximate: alias 1.3
    c.search(&s, &[20.0], 2).unwrap(); // 6, 5
    assert_eq!(c.objects(), 4);
    c.search(&s, &[9.0], 2).unwrap(); // 4, 3: evicts the oldest (q = 1.0) and its alias
    assert_eq!(c.len(), 2);
    assert_eq!(c.aliases(), 0);
    assert!(c.slot(&[1.3]).is_none() && c.slot(&[1.0]).is_none());
    assert_eq!(c.stats().evictions, 1);
    c.check_invariants().unwrap();
}

#[test]
fn shared_objects_are_reference_counted() {
    let mut c = cache(0);
    let s = store();
    c.search(&s, &[1.0], 2).unwrap(); // 1, 2
    c.search(&s, &[2.4], 2).unwrap(); // 1 (0.16), 2 (0.36): both shared
    assert_eq!(c.objects(), 2, "ids 1 and 2 shared");
    assert_eq!(c.len(), 2);
    c.evict_oldest();
    assert_eq!(c.objects(), 2, "still held by the second entry");
    c.evict_oldest();
    assert_eq!(c.objects(), 0);
    c.check_invariants().unwrap();
}

#[test]
fn bad_input_is_an_error_value() {
    let mut c = cache(0);
    let s = store();
    assert!(matches!(
        c.lookup(&[1.0, 2.0], 2),
        Err(Error::DimensionMismatch {
            expected: 1,
            got: 2
        })
    ));
    assert!(matches!(
        c.lookup(&[f32::NAN], 2),
        Err(Error::NonFinite { .. })
    ));
    assert!(matches!(
        c.lookup(&[f32::INFINITY], 2),
        Err(Error::NonFinite { .. })
    ));
    assert!(matches!(
        c.lookup(&[1.0], 0),
        Err(Error::KOutOfRange { k: 0, k_max: 4 })
    ));
    assert!(matches!(
        c.search(&s, &[1.0], 5),
        Err(Error::KOutOfRange { k: 5, .. })
    ));
    assert!(matches!(
        c.insert(1, &[f32::NAN]),
        Err(Error::NonFinite { .. })
    ));
    assert!(Cache::new(
        CacheConfig::new(0, Metric::L2Sq),
        PolicyConfig::default().build()
    )
    .is_err());
    c.check_invariants().unwrap();
}

#[test]
fn log_cap_invalidates_entries_left_behind() {
    let base = CacheConfig {
        filter: FilterKind::BruteForce,
        k_max: 4,
        // never run the slow path, so cursors stay where they are
        risk_threshold: 1e9,
        ..CacheConfig::new(1, Metric::L2Sq)
    };
    // Four records, by count or by bytes (4 + 64 bytes a record at d = 1).
    let by_records = CacheConfig {
        insert_log_cap: 4,
        ..base.clone()
    };
    let by_bytes = CacheConfig {
        insert_log_bytes: 4 * 68 + 67,
        ..base.clone()
    };
    for cfg in [by_records, by_bytes] {
        assert_eq!(cfg.insert_log_records_max(), 4);
        let mut c = Cache::new(cfg, PolicyConfig::default().build()).unwrap();
        let s = store();
        c.search(&s, &[1.0], 2).unwrap();
        for i in 0..4 {
            c.insert(100 + i, &[1000.0 + i as f32]).unwrap();
        }
        assert_eq!(c.len(), 1, "log at its cap, entry still valid");
        c.insert(200, &[2000.0]).unwrap();
        assert_eq!(c.len(), 0, "cursor fell behind the cap");
        assert!(c.insert_log_len() <= 4);
        assert_eq!(c.stats().log_cap_invalidations, 1);
        c.check_invariants().unwrap();
    }
    // Too small for one record: refused at start.
    let tiny = CacheConfig {
        insert_log_bytes: 67,
        ..base
    };
    assert!(Cache::new(tiny, PolicyConfig::default().build()).is_err());
}

#[test]
fn insert_log_head_follows_the_oldest_cursor() {
    let mut c = cache_keeping(1, 1); // r = 0.25 below τ_risk: the slow path stays idle
    let s = store();
    for i in 0..3 {
        c.insert(100 + i, &[1000.0]).unwrap();
    }
    assert_eq!(
        c.insert_log_len(),
        1,
        "no entry needs the log: the newest record stays"
    );
    c.search(&s, &[1.0], 2).unwrap();
    for i in 0..3 {
        c.insert(200 + i, &[1000.0]).unwrap();
    }
    assert_eq!(c.insert_log_len(), 3, "the entry's cursor holds them");
    c.flush();
    assert_eq!(c.insert_log_len(), 1);
}

#[test]
fn upsert_replaces_a_cached_vector() {
    let (mut c, mut s) = (cache(1), store());
    c.search(&s, &[1.0], 2).unwrap(); // 1, 2 | 3
    s.insert(1, &[50.0]).unwrap();
    let out = c.insert(1, &[50.0]).unwrap();
    assert!(out.replaced);
    let r = c.search(&s, &[1.0], 2).unwrap();
    assert_eq!(ids(&r), vec![2, 3]);
    c.check_invariants().unwrap();
}

#[test]
fn proximity_uses_one_global_threshold_and_no_aliases() {
    let mut c = cache_with(
        0,
        100,
        FilterKind::BruteForce,
        PolicyConfig::Proximity { threshold: 4.0 },
    );
    let s = store();
    c.search(&s, &[1.0], 2).unwrap();
    assert_eq!(c.search(&s, &[2.9], 2).unwrap().kind, HitKind::Approximate); // d = 3.61 < 4
    assert_eq!(
        c.search(&s, &[2.9], 2).unwrap().kind,
        HitKind::Approximate,
        "no alias"
    );
    assert_eq!(c.aliases(), 0);
    assert_eq!(c.search(&s, &[3.1], 2).unwrap().kind, HitKind::Miss); // d = 4.41
}

#[test]
fn potluck_verification_tunes_the_global_threshold() {
    let policy = PolicyConfig::Potluck {
        threshold: 4.0,
        p: 1.0,
        grow: 1.1,
        shrink: 0.5,
        seed: 1,
    };
    let mut c = cache_with(0, 100, FilterKind::BruteForce, policy);
    let s = store();
    c.search(&s, &[1.0], 2).unwrap(); // 1, 2
                                      // every approximate hit is verified: 2.9's true top-2 is 2, 1 = same set: grows
    let r = c.search(&s, &[2.9], 2).unwrap();
    assert_eq!(r.kind, HitKind::Miss);
    assert_eq!(c.stats().verifications, 1);
    let Lookup::Miss(_) = c.lookup(&[3.6], 2).unwrap() else {
        panic!("verified again")
    };
}

#[test]
fn filter_rotation_through_evictions_keeps_hits() {
    // HNSW filter, small pool: many evictions rotate the filter; every live entry must
    // still be found by an exact-distance near query.
    let mut c = cache_with(
        0,
        8,
        FilterKind::default(),
        PolicyConfig::Proximity { threshold: 0.01 },
    );
    let mut s = ExactStore::new(1, Metric::L2Sq);
    for i in 0..200u64 {
        s.insert(i, &[i as f32 * 10.0]).unwrap();
    }
    for i in 0..100u64 {
        c.search(&s, &[i as f32 * 10.0 + 1.0], 2).unwrap();
    }
    assert!(c.stats().filter.rotations >= 2, "{:?}", c.stats().filter);
    for rep in c
        .representatives()
        .map(|r| r.query.clone())
        .collect::<Vec<Arc<[f32]>>>()
    {
        let near = [rep[0] + 0.05];
        assert_eq!(c.search(&s, &near, 2).unwrap().kind, HitKind::Approximate);
    }
    c.check_invariants().unwrap();
}

#[test]
fn byte_budget_bounds_memory() {
    let cfg = CacheConfig {
        capacity: Capacity::Bytes(4096),
        filter: FilterKind::BruteForce,
        k_max: 4,
        ..CacheConfig::new(1, Metric::L2Sq)
    };
    let mut c = Cache::new(cfg, PolicyConfig::default().build()).unwrap();
    let mut s = ExactStore::new(1, Metric::L2Sq);
    for i in 0..500u64 {
        s.insert(i, &[i as f32]).unwrap();
    }
    for i in 0..200u64 {
        c.search(&s, &[i as f32 * 2.5 + 0.3], 4).unwrap();
        assert!(c.bytes() <= 4096, "{}", c.bytes());
    }
    assert!(c.stats().evictions > 0);
    c.check_invariants().unwrap();
}

#[test]
fn rerank_serves_the_best_k_of_the_reserve_to_a_near_query() {
    let mut s = ExactStore::new(1, Metric::L2Sq);
    for (id, x) in [(1u64, -1.0f32), (2, 1.1), (3, -1.2), (4, 9.0)] {
        s.insert(id, &[x]).unwrap();
    }
    let near = [-0.45f32]; // d to RQ 0.0 is 0.2025 < τ = minD / 4 = 0.25
    for (policy, want) in [
        (PolicyConfig::default(), vec![1, 2]),
        (PolicyConfig::aker_rerank(), vec![1, 3]),
    ] {
        let mut c = cache_with(1, 100, FilterKind::BruteForce, policy);
        c.search(&s, &[0.0], 2).unwrap(); // NRL: 1 (1.0), 2 (1.21) | 3 (1.44)
        let r = c.search(&s, &near, 2).unwrap();
        assert_eq!(r.kind, HitKind::Approximate);
        assert_eq!(ids(&r), want, "{}", c.policy().name());
    }
}

#[test]
fn aliases_stop_at_max_aliases_per_rep() {
    let cfg = CacheConfig {
        max_aliases_per_rep: 2,
        ..line_config()
    };
    let (mut c, s) = (
        Cache::new(cfg, PolicyConfig::default().build()).unwrap(),
        store(),
    );
    // q = 1.0: minD = 1; equality hits grow τ to minD = 1.
    for _ in 0..40 {
        c.search(&s, &[1.0], 2).unwrap();
    }
    assert!(close(tau(&c, 1.0), 1.0));
    // Three approximate hits, each within the τ the one before left (τ ← τ · 0.25):
    // 1.9 (d 0.81 < 1), 1.45 (d 0.2025 < 0.25), 1.2 (d 0.04 < 0.0625).
    for q in [1.9, 1.45, 1.2] {
        assert_eq!(
            c.search(&s, &[q], 2).unwrap().kind,
            HitKind::Approximate,
            "{q}"
        );
    }
    assert_eq!(c.aliases(), 2, "the third hit is served but not linked");
    for q in [1.9, 1.45] {
        assert_eq!(c.search(&s, &[q], 2).unwrap().kind, HitKind::Alias, "{q}");
    }
    // 1.2's key was not linked: d 0.04 is no longer < τ = 0.015625, so it misses.
    assert_eq!(c.search(&s, &[1.2], 2).unwrap().kind, HitKind::Miss);
    c.check_invariants().unwrap();
}

#[test]
fn a_ticket_older_than_the_delete_log_is_stale() {
    let cfg = CacheConfig {
        delete_log_cap: 2,
        ..line_config()
    };
    let (mut c, s) = (
        Cache::new(cfg, PolicyConfig::default().build()).unwrap(),
        store(),
    );
    let answer = s.search(&[1.0], 2).unwrap();
    // Within the window: two deletes after the ticket, still checkable.
    let ticket = c.miss_ticket(&[1.0], 2, false).unwrap();
    c.delete(5);
    c.delete(6);
    assert!(matches!(
        c.admit(ticket, answer).unwrap(),
        Admission::Admitted(_)
    ));
    // Past it: three deletes after the ticket, one of them fell out of the log, so what
    // the answer may hold of it cannot be stripped: refused.
    let ticket = c.miss_ticket(&[3.0], 2, false).unwrap();
    for id in [4, 5, 6] {
        c.delete(id);
    }
    let answer = s.search(&[3.0], 2).unwrap();
    assert_eq!(c.admit(ticket, answer).unwrap(), Admission::Stale);
    assert!(c.slot(&[3.0]).is_none(), "nothing was admitted");
    c.check_invariants().unwrap();
}

#[test]
fn a_miss_in_flight_across_a_flush_is_not_admitted() {
    // The miss read the store before the flush (a TRUNCATE the flush stands for, say):
    // admitting its answer after it would bring back what the flush dropped.
    let (mut c, s) = (
        Cache::new(line_config(), PolicyConfig::default().build()).unwrap(),
        store(),
    );
    // A delete logged before the flush (the log then spans the flush's gap).
    c.delete(99);
    let before = c.miss_ticket(&[1.0], 2, false).unwrap();
    let answer = s.search(&[1.0], 2).unwrap();
    c.flush();
    assert_eq!(c.admit(before, answer.clone()).unwrap(), Admission::Stale);
    assert!(c.slot(&[1.0]).is_none());
    // A miss after the flush is admitted as ever, and a delete while it is in flight is
    // still stripped from its answer (the flush's own sequence number is a gap in the
    // delete log: the first delete after it must not be skipped).
    let after = c.miss_ticket(&[1.0], 2, false).unwrap();
    let held = answer[0].id;
    c.delete(held);
    assert_eq!(c.admit(after, answer).unwrap(), Admission::TooFew);
    let again = c.miss_ticket(&[1.0], 2, false).unwrap();
    let answer = s.search(&[1.0], 3).unwrap();
    c.delete(answer[1].id);
    assert!(matches!(
        c.admit(again, answer.clone()).unwrap(),
        Admission::Admitted(_)
    ));
    let r = c.search(&s, &[1.0], 2).unwrap();
    assert_eq!(r.kind, HitKind::Exact, "admitted");
    assert!(!ids(&r).contains(&answer[1].id), "{:?}", ids(&r));
    c.check_invariants().unwrap();
}

/// k is a request parameter, not part of the key: an entry cached for k answers any
/// k' <= k from its prefix (every hit kind), and a request for more is a miss that
/// replaces the entry with the larger answer.
#[test]
fn an_entry_answers_every_smaller_k_from_its_prefix_and_a_larger_k_refreshes_it() {
    let st = store();
    let mut c = cache(0);
    let first = c.search(&st, &[4.0], 3).unwrap();
    assert_eq!((first.kind, ids(&first)), (HitKind::Miss, vec![2, 3, 1]));
    for k in 1..=3 {
        let r = c.search(&st, &[4.0], k).unwrap();
        assert_eq!(r.kind, HitKind::Exact, "k = {k}");
        assert_eq!(ids(&r), ids(&first)[..k].to_vec());
    }
    // Asked for 4: a miss; the backend's answer of 4 replaces the entry of 3.
    let more = c.search(&st, &[4.0], 4).unwrap();
    assert_eq!((more.kind, ids(&more)), (HitKind::Miss, vec![2, 3, 1, 4]));
    assert_eq!(c.len(), 1, "replaced, not added");
    let rep = c.representative(c.slot(&[4.0]).unwrap().rep()).unwrap();
    assert_eq!(rep.k, 4);
    let again = c.search(&st, &[4.0], 4).unwrap();
    assert_eq!(
        (again.kind, ids(&again)),
        (HitKind::Exact, vec![2, 3, 1, 4])
    );
    // A nearby query with a smaller k is served approximately by the larger entry.
    let near = c.search(&st, &[4.01], 2).unwrap();
    assert_eq!((near.kind, near.results.len()), (HitKind::Approximate, 2));
    // ... and with a larger k than any entry holds it is not.
    let mut small = cache(0);
    small.search(&st, &[4.0], 2).unwrap();
    let wide = small.search(&st, &[4.01], 3).unwrap();
    assert_eq!(wide.kind, HitKind::Miss);
    c.check_invariants().unwrap();
    small.check_invariants().unwrap();
}

#[test]
fn without_refresh_inserts_reach_no_entry_and_a_delete_drops_the_entry() {
    for refresh in [true, false] {
        let cfg = CacheConfig {
            delta: 1,
            refresh,
            ..line_config()
        };
        let (mut c, mut s) = (
            Cache::new(cfg, PolicyConfig::default().build()).unwrap(),
            store(),
        );
        c.search(&s, &[1.0], 2).unwrap(); // NRL = 1, 2 | 3
        s.insert(7, &[1.5]).unwrap(); // nearer than 1
        c.insert(7, &[1.5]).unwrap();
        let r = c.search(&s, &[1.0], 2).unwrap();
        assert_eq!(r.kind, HitKind::Exact);
        let (fresh, stale) = (vec![7, 1], vec![1, 2]);
        assert_eq!(
            ids(&r),
            if refresh { fresh } else { stale },
            "refresh {refresh}"
        );
        s.delete(1).unwrap();
        let d = c.delete(1);
        let (repaired, invalidated) = if refresh { (1, 0) } else { (0, 1) };
        assert_eq!(
            (d.cached, d.repaired, d.invalidated),
            (true, repaired, invalidated)
        );
        let r = c.search(&s, &[1.0], 2).unwrap();
        assert_eq!(ids(&r), vec![7, 2], "refresh {refresh}");
        let kind = if refresh {
            HitKind::Exact
        } else {
            HitKind::Miss
        };
        assert_eq!(r.kind, kind, "without refresh the entry is gone");
        // An upsert of a listed id is a delete first, with or without refresh: the
        // entry (7, 2 and no reserve left) drops below k and goes.
        s.insert(2, &[3.0]).unwrap();
        c.insert(2, &[3.0]).unwrap();
        assert_eq!(c.len(), 0, "refresh {refresh}");
        let r = c.search(&s, &[1.0], 2).unwrap();
        assert_eq!(
            (ids(&r), r.kind),
            (vec![7, 2], HitKind::Miss),
            "refresh {refresh}"
        );
        c.check_invariants().unwrap();
    }
}

// ------------------------------------------- inserts in every hit (issue #41, recent.rs)

/// The ids of a lookup that must hit, with its kind and the entry it asks to catch up.
fn hit_ids(c: &Cache, q: f32, k: usize) -> (HitKind, Vec<u64>, Option<u64>) {
    match c.lookup(&[q], k).unwrap() {
        Lookup::Hit(h) => (h.kind, h.results.iter().map(|n| n.id).collect(), h.catch_up),
        Lookup::Miss(_) => panic!("{q} missed"),
    }
}

#[test]
fn a_hit_serves_inserts_its_entry_has_not_checked() {
    let (mut c, s) = (cache(1), store());
    c.search(&s, &[1.0], 2).unwrap(); // NRL: 1 (1), 2 (4), 3 (16)
    let rep = c.slot(&[1.0]).unwrap().rep();
    // No fast path: only the log and the window of recent inserts know it.
    c.insert_log_only(100, Arc::from(&[1.1f32][..])).unwrap();
    c.insert_log_only(101, Arc::from(&[40.0f32][..])).unwrap(); // d = 1521: not taken
    assert_eq!(c.representative(rep).unwrap().nrl.ids, vec![1, 2, 3]);
    let (kind, ids, catch_up) = hit_ids(&c, 1.0, 2);
    assert_eq!(
        (kind, ids, catch_up),
        (HitKind::Exact, vec![100, 1], Some(rep))
    );
    assert_eq!(c.stats().hits_with_recent, 1);
    // One request per entry until its owner has caught it up.
    assert_eq!(hit_ids(&c, 1.0, 2).2, None);
    assert_eq!(c.catch_up(rep), 2, "two records scanned");
    let e = c.representative(rep).unwrap();
    assert_eq!((e.nrl.ids.clone(), e.cursor), (vec![100, 1, 2], 2));
    assert_eq!(hit_ids(&c, 1.0, 2), (HitKind::Exact, vec![100, 1], None));
    c.check_invariants().unwrap();
}

/// A hit that adds nothing asks for a catch-up only once its entry is 64 records behind
/// (`CATCH_UP_BEHIND`): before that its own check is cheaper than the owner's message.
#[test]
fn a_hit_asks_for_a_catch_up_when_it_added_one_or_is_far_behind() {
    let (mut c, s) = (cache(1), store());
    c.search(&s, &[1.0], 2).unwrap();
    let rep = c.slot(&[1.0]).unwrap().rep();
    for i in 0..63u64 {
        c.insert_log_only(200 + i, Arc::from(&[500.0 + i as f32][..]))
            .unwrap();
    }
    assert_eq!(hit_ids(&c, 1.0, 2), (HitKind::Exact, vec![1, 2], None));
    c.insert_log_only(300, Arc::from(&[600.0f32][..])).unwrap();
    assert_eq!(hit_ids(&c, 1.0, 2), (HitKind::Exact, vec![1, 2], Some(rep)));
    assert_eq!(c.catch_up(rep), 64);
    assert_eq!(hit_ids(&c, 1.0, 2), (HitKind::Exact, vec![1, 2], None));
}

#[test]
fn an_approximate_hit_ranks_an_unchecked_insert_for_its_own_query() {
    let (mut c, s) = (cache(1), store());
    c.search(&s, &[1.0], 2).unwrap(); // τ = minD / 4 = 0.25
    c.insert_log_only(100, Arc::from(&[1.3f32][..])).unwrap(); // d(RQ) = 0.09: taken
                                                               // 1.05 is 0.0025 from RQ: approximate; by distance to 1.05, 100 (0.0625) comes
                                                               // before 1 (0.9025).
    let (kind, ids, _) = hit_ids(&c, 1.05, 2);
    assert_eq!((kind, ids), (HitKind::Approximate, vec![100, 1]));
}

#[test]
fn a_deleted_insert_is_never_served() {
    let (mut c, s) = (cache(1), store());
    c.search(&s, &[1.0], 2).unwrap();
    c.insert_log_only(100, Arc::from(&[1.1f32][..])).unwrap();
    c.delete(100);
    assert_eq!(hit_ids(&c, 1.0, 2).1, vec![1, 2]);
    c.check_invariants().unwrap();
}

/// The case ALGORITHM.md listed as not covered: the miss's answer predates an insert
/// acknowledged before its admission. The entry's cursor stays at the ticket, and its
/// first hit checks the insert.
#[test]
fn an_entry_admitted_from_a_ticket_taken_before_an_insert_serves_it() {
    let (mut c, mut s) = (cache(1), store());
    let ticket = c.miss_ticket(&[1.0], 2, false).unwrap();
    let answer = s.search(&[1.0], 3).unwrap(); // read before the insert
    s.insert(100, &[1.1]).unwrap();
    c.insert(100, &[1.1]).unwrap(); // no entry yet: no fast path took it
    assert!(matches!(
        c.admit(ticket, answer).unwrap(),
        Admission::Admitted(_)
    ));
    assert_eq!(hit_ids(&c, 1.0, 2).1, vec![100, 1]);
}

#[test]
fn a_ticket_older_than_the_window_is_stale() {
    let (mut c, mut s) = (cache_keeping(1, 2), store());
    let ticket = c.miss_ticket(&[1.0], 2, false).unwrap();
    let answer = s.search(&[1.0], 3).unwrap();
    for (id, x) in [(100, 30.0), (101, 31.0), (102, 32.0)] {
        s.insert(id, &[x]).unwrap();
        c.insert(id, &[x]).unwrap();
    }
    // Record 1 left the log: whether the answer lacks it cannot be checked.
    assert_eq!(c.admit(ticket, answer).unwrap(), Admission::Stale);
    let ticket = c.miss_ticket(&[1.0], 2, false).unwrap();
    let answer = s.search(&[1.0], 3).unwrap();
    assert!(matches!(
        c.admit(ticket, answer).unwrap(),
        Admission::Admitted(_)
    ));
}

#[test]
fn an_entry_behind_the_window_misses_and_is_caught_up() {
    let (mut c, s) = (cache_keeping(1, 2), store());
    c.search(&s, &[1.0], 2).unwrap();
    let rep = c.slot(&[1.0]).unwrap().rep();
    for (id, x) in [(100, 1.1), (101, 30.0), (102, 31.0)] {
        c.insert_log_only(id, Arc::from(&[x][..])).unwrap();
    }
    // Three records behind, the window holds two: the backend answers. Asked below its
    // k, the entry is caught up by its owner before the backend call.
    let Lookup::Miss(t) = c.lookup(&[1.0], 1).unwrap() else {
        panic!("an entry behind the window served");
    };
    assert_eq!((t.catch_up, t.replace), (Some(rep), false));
    assert_eq!(c.stats().hits_behind, 1);
    let out = c.resolve_miss(&s, t).unwrap();
    assert_eq!(out.admission, Some(Admission::Duplicate(rep)));
    assert_eq!(c.representative(rep).unwrap().cursor, 3);
    assert_eq!(hit_ids(&c, 1.0, 2), (HitKind::Exact, vec![100, 1], None));
    // Behind again, asked at its own k: the miss's answer replaces it.
    for (id, x) in [(103, 0.9), (104, 30.0), (105, 31.0)] {
        c.insert_log_only(id, Arc::from(&[x][..])).unwrap();
    }
    let Lookup::Miss(t) = c.lookup(&[1.0], 2).unwrap() else {
        panic!("an entry behind the window served");
    };
    assert_eq!((t.catch_up, t.replace), (None, true));
    let mut s = s;
    s.insert(100, &[1.1]).unwrap();
    s.insert(103, &[0.9]).unwrap();
    let out = c.resolve_miss(&s, t).unwrap();
    let Some(Admission::Admitted(new)) = out.admission else {
        panic!("not replaced: {:?}", out.admission);
    };
    assert_ne!(new, rep);
    assert_eq!(hit_ids(&c, 1.0, 2), (HitKind::Exact, vec![100, 103], None));
    c.check_invariants().unwrap();
}

/// The other case ALGORITHM.md named: a list shortened by deletes takes only what is
/// nearer than its last result, and that is enough for its first `k`, whose every
/// result is nearer than anything the list does not hold.
#[test]
fn a_list_shortened_by_deletes_still_serves_the_exact_top_k() {
    let (mut c, mut s) = (cache(1), store());
    c.search(&s, &[1.0], 2).unwrap(); // NRL: 1 (1), 2 (4), 3 (16)
    s.delete(3).unwrap();
    c.delete(3); // NRL: 1 (1), 2 (4): maxD 4
    for (id, x) in [(100, 4.0), (101, 2.5)] {
        // 100: d = 9, past maxD (what lies between 4 and 9 is unknown): not taken;
        // 101: d = 2.25, taken.
        s.insert(id, &[x]).unwrap();
        c.insert_log_only(id, Arc::from(&[x][..])).unwrap();
    }
    let truth: Vec<u64> = s.search(&[1.0], 2).unwrap().iter().map(|n| n.id).collect();
    assert_eq!(hit_ids(&c, 1.0, 2).1, truth);
    assert_eq!(truth, vec![1, 101]);
}
