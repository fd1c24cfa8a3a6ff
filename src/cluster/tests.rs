//! Ownership: a pure function every node and client computes alike.

use super::*;
use crate::protocol::{ClusterNode, ClusterReply};
use shards::Metric;

fn state(nodes: &[(u64, bool)], overrides: Vec<(u32, u64)>) -> ClusterReply {
    ClusterReply {
        name: "t".into(),
        routing_version: 1,
        centroids_version: 1,
        balance_epoch: 0,
        self_id: nodes[0].0,
        lease_ms: 5000,
        metric: Metric::L2Sq,
        dim: 2,
        centroids: (0..64).flat_map(|i| [i as f32, 0.0]).collect(),
        nodes: nodes
            .iter()
            .map(|&(node_id, live)| ClusterNode {
                node_id,
                live,
                advertise: format!("127.0.0.1:{}", 7000 + node_id % 1000),
            })
            .collect(),
        overrides,
    }
}

#[test]
fn mix64_is_splitmix64s_finaliser() {
    // splitmix64's first output from state 0 is mix64(0x9e3779b97f4a7c15).
    assert_eq!(mix64(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
    assert_eq!(mix64(0), 0);
}

#[test]
fn rendezvous_moves_only_what_a_joining_node_takes() {
    let two = state(&[(10, true), (20, true)], vec![]);
    let three = state(&[(10, true), (20, true), (30, true)], vec![]);
    let mut moved = 0;
    for c in 0..64 {
        let (a, b) = (owner(&two, c).unwrap(), owner(&three, c).unwrap());
        if a != b {
            assert_eq!(b, 30, "centroid {c} moved between old nodes");
            moved += 1;
        }
    }
    assert!((10..=35).contains(&moved), "about a third moves: {moved}");
}

#[test]
fn a_dead_node_owns_nothing_and_comes_last() {
    let s = state(&[(10, true), (20, false), (30, true)], vec![]);
    for c in 0..64 {
        let order = owner_order(&s, c);
        assert_eq!(order.len(), 3);
        assert_eq!(*order.last().unwrap(), 20);
    }
}

#[test]
fn overrides_win_while_their_node_is_live() {
    let s = state(&[(10, true), (20, true)], vec![(5, 20), (6, 10)]);
    assert_eq!(owner(&s, 5), Some(20));
    assert_eq!(owner(&s, 6), Some(10));
    let gone = state(&[(10, true), (20, false)], vec![(5, 20)]);
    assert_eq!(owner(&gone, 5), Some(10));
}

#[test]
fn nearest_centroid_follows_the_metric() {
    let s = state(&[(1, true)], vec![]);
    assert_eq!(nearest_centroid(&s, &[7.2, 0.3]), 7);
    let mut ip = s.clone();
    ip.metric = Metric::InnerProduct;
    ip.centroids = vec![1.0, 0.0, 0.0, 1.0];
    // By angle: a long vector along y is nearest the y centroid.
    assert_eq!(nearest_centroid(&ip, &[0.1, 50.0]), 1);
}

#[test]
fn the_state_marks_what_this_node_owns_and_counts_foreign_searches() {
    let s = state(&[(10, true), (20, true)], vec![]);
    let st = ClusterState::new(s.clone(), true);
    let mine = (0..64).filter(|&c| owner(&s, c) == Some(10)).count() as u64;
    assert_eq!(st.owned_centroids(), mine);
    let theirs = (0..64).find(|&c| owner(&s, c) == Some(20)).unwrap() as usize;
    st.observe(theirs, &[0.0, 0.0]);
    assert_eq!(st.foreign_searches.get(), 1);
    // The other node gone: everything is ours.
    st.publish(state(&[(10, true), (20, false)], vec![]));
    assert_eq!(st.owned_centroids(), 64);
}
