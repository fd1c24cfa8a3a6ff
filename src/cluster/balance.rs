//! Load-aware overrides: rendezvous hashing gives every node about as many centroids,
//! but under skew (Zipf 0.99) a few centroids draw most searches, and the node that
//! happens to own them serves most of the hits. The balancing node (the live node with
//! the lowest id) sums the loads every node publishes and moves the busiest node's
//! centroids to the least busy one while that lowers the busiest node's load; the moves
//! are published as overrides (`centroid -> node`) with the routing state.

use super::rendezvous_rank;

/// Stop once the busiest node is within this factor of the mean.
const GOOD_ENOUGH: f64 = 1.10;
/// Publish only when the busiest node's load drops below this share of what the
/// published assignment gives it (no churn for small gains).
const WORTH_IT: f64 = 0.85;
/// Below this many searches per second per centroid on average, loads are noise.
const LOAD_PER_CENTROID_MIN: f64 = 1.0;

/// The rendezvous owner of `centroid` among `live` (sorted or not); `None` if empty.
fn rendezvous_owner(live: &[u64], centroid: u32) -> Option<usize> {
    (0..live.len()).min_by_key(|&i| rendezvous_rank(live[i], centroid))
}

/// Each centroid's owner index into `live` under `overrides` (those naming a live node).
pub(crate) fn assignment(live: &[u64], overrides: &[(u32, u64)], centroids: usize) -> Vec<usize> {
    (0..centroids as u32)
        .map(|c| {
            let over = overrides
                .iter()
                .find(|(oc, _)| *oc == c)
                .and_then(|(_, n)| live.iter().position(|l| l == n));
            over.or_else(|| rendezvous_owner(live, c)).unwrap_or(0)
        })
        .collect()
}

/// Per live node, the load its centroids draw under `owners`.
pub(crate) fn node_loads(loads: &[f64], owners: &[usize], nodes: usize) -> Vec<f64> {
    let mut per = vec![0.0; nodes];
    for (c, &o) in owners.iter().enumerate() {
        per[o] += loads.get(c).copied().unwrap_or(0.0);
    }
    per
}

fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// New overrides for `loads` (per centroid, searches per second summed over nodes), or
/// `None` when the published ones (`current`) are good enough. Starts from rendezvous:
/// an override lasts only while it pays.
pub(crate) fn rebalance(
    loads: &[f64],
    live: &[u64],
    current: &[(u32, u64)],
) -> Option<Vec<(u32, u64)>> {
    let n = live.len();
    let total: f64 = loads.iter().sum();
    if n < 2 || total < LOAD_PER_CENTROID_MIN * loads.len() as f64 {
        return None;
    }
    let mean = total / n as f64;
    let now = max_of(&node_loads(
        loads,
        &assignment(live, current, loads.len()),
        n,
    ));
    let mut owners = assignment(live, &[], loads.len());
    let mut per = node_loads(loads, &owners, n);
    // Each move takes one centroid off the busiest node: at most one per centroid.
    for _ in 0..loads.len() {
        let (a, b) = busiest_and_idlest(&per);
        if per[a] <= GOOD_ENOUGH * mean {
            break;
        }
        // The heaviest centroid of `a` whose move lowers the busiest of the two.
        let gap = per[a] - per[b];
        let pick = (0..loads.len())
            .filter(|&c| owners[c] == a && loads[c] > 0.0 && loads[c] < gap)
            .max_by(|&x, &y| loads[x].total_cmp(&loads[y]));
        let Some(c) = pick else { break };
        owners[c] = b;
        per[a] -= loads[c];
        per[b] += loads[c];
    }
    if max_of(&per) >= WORTH_IT * now {
        return None;
    }
    let overrides = (0..loads.len() as u32)
        .filter(|&c| Some(owners[c as usize]) != rendezvous_owner(live, c))
        .map(|c| (c, live[owners[c as usize]]))
        .collect();
    Some(overrides)
}

fn busiest_and_idlest(per: &[f64]) -> (usize, usize) {
    let mut a = 0;
    let mut b = 0;
    for i in 0..per.len() {
        if per[i] > per[a] {
            a = i;
        }
        if per[i] < per[b] {
            b = i;
        }
    }
    (a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zipf(n: usize, s: f64) -> Vec<f64> {
        (1..=n).map(|r| 1000.0 / (r as f64).powf(s)).collect()
    }

    #[test]
    fn skewed_loads_are_spread_and_even_ones_left_alone() {
        let live = [11, 22, 33];
        let loads = zipf(64, 0.99);
        let before = max_of(&node_loads(&loads, &assignment(&live, &[], 64), 3));
        let over = rebalance(&loads, &live, &[]).expect("skew is worth balancing");
        let after = max_of(&node_loads(&loads, &assignment(&live, &over, 64), 3));
        let mean = loads.iter().sum::<f64>() / 3.0;
        assert!(after < before, "{after} < {before}");
        // The hottest centroid alone is 21% of the load: the best is max(mean, that).
        assert!(
            after <= GOOD_ENOUGH * mean.max(loads[0]) + 1e-9,
            "{after} vs mean {mean}"
        );
        // Published again with the same loads: nothing to gain.
        assert_eq!(rebalance(&loads, &live, &over), None);
        let even = vec![10.0; 64];
        let r = rebalance(&even, &live, &[]);
        assert!(
            r.is_none()
                || max_of(&node_loads(&even, &assignment(&live, &r.unwrap(), 64), 3)) < before
        );
    }

    #[test]
    fn overrides_to_gone_nodes_fall_back_to_rendezvous() {
        let live = [1, 2];
        let owners = assignment(&live, &[(5, 99)], 8);
        assert_eq!(owners, assignment(&live, &[], 8));
        let moved = assignment(&live, &[(5, 2)], 8);
        assert_eq!(live[moved[5]], 2);
    }

    #[test]
    fn idle_clusters_publish_nothing() {
        assert_eq!(rebalance(&[0.1; 64], &[1, 2, 3], &[]), None);
        assert_eq!(rebalance(&zipf(64, 0.99), &[1], &[]), None);
    }
}
