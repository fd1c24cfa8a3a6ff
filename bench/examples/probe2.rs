// Scratch probe: nearest-representative recall of the engine's HNSW filter index.
use bench::prepare::{Prepared, Seeds, Source};
use bench::workload;
use shards::filter::{BruteForceIndex, FilterIndex, HnswIndex};
use shards::Metric;
use std::path::Path;

fn main() {
    let all = Source::Glove.load(Path::new("data"), 0).unwrap();
    let prep = Prepared::new(
        "glove".into(),
        &all,
        Metric::L2Sq,
        10,
        Seeds::from_base(42),
        Path::new("data/cache"),
        &|_| {},
    )
    .unwrap();
    let w = workload::sim_zipf(&prep.groups, 100_000, 0.3, Seeds::from_base(42).stream);
    let n = 5000;
    for (m, efc, efs) in [
        (4, 8, 16),
        (4, 32, 16),
        (4, 100, 16),
        (8, 8, 16),
        (6, 16, 16),
        (16, 8, 16),
    ] {
        let h = HnswIndex::new(Metric::L2Sq, m, efc, efs, n);
        let b = BruteForceIndex::new(Metric::L2Sq);
        for i in 0..n {
            h.insert(i as u64 + 1, w.vector(i as u32));
            b.insert(i as u64 + 1, w.vector(i as u32));
        }
        let (mut top1, mut in2) = (0, 0);
        let t = std::time::Instant::now();
        for i in n..2 * n {
            let q = w.vector(i as u32);
            let want = b.search(q, 1, &|_| true)[0].0;
            let got: Vec<u64> = h.search(q, 2, &|_| true).into_iter().map(|x| x.0).collect();
            if got.first() == Some(&want) {
                top1 += 1;
            }
            if got.contains(&want) {
                in2 += 1;
            }
        }
        println!(
            "m {m} efc {efc} efs {efs}: nearest found first {:.3}, within 2 {:.3} ({:.1} us/query)",
            top1 as f64 / n as f64,
            in2 as f64 / n as f64,
            t.elapsed().as_secs_f64() * 1e6 / n as f64
        );
    }
}
