//! What a pooler-safe search costs: akerd's pgvector search (`BEGIN; SET LOCAL ...`,
//! the prepared query and `COMMIT`, pipelined in one round trip: `PgConn::search`)
//! against the bare prepared query with the settings made once per session (one round
//! trip, but wrong behind a transaction-mode pooler), and against the same transaction
//! sent a statement at a time (four round trips).
//!
//! Starts its own PostgreSQL through `ops/pg.sh` (as the tests do), loads 20,000 x 32
//! clustered vectors with an HNSW index (m 16, ef_construction 64), searches k + Δ = 20
//! at ef_search 40. `cargo bench -p bench --bench pgvector_search`.

// The root crate's PostgreSQL harness, shared with its integration tests.
#[path = "../../tests/pg_common/mod.rs"]
mod pg_common;

use std::sync::Arc;
use std::time::Duration;

use ::pgvector::Vector;
use aker::config::PgvectorSection;
use aker::testing::pgvector;
use aker_formats::data;
use criterion::{criterion_group, criterion_main, Criterion};

const N: usize = 20_000;
const DIM: usize = 32;
const LIMIT: usize = 20;

fn search_cost(c: &mut Criterion) {
    let Some(pg) = pg_common::PgServer::start("bench") else {
        return;
    };
    let ds = data::synthetic(N, DIM, 64, 3);
    let sql = pg.sql();
    sql.load("bench_items", &ds, "vector_l2_ops");
    let section = PgvectorSection {
        ef_search: Some(40),
        ..pg.section("bench_items")
    };
    let (target, _) = pgvector::start(&section, None, 10, 10, false, 1_000).unwrap();
    let mut conn = pgvector::PgConn::new(Arc::new(target)).unwrap();
    assert!(conn.is_up());
    let queries: Vec<Vec<f32>> = (0..512)
        .map(|i| ds.row((i * 37) % N).iter().map(|x| x + 0.01).collect())
        .collect();

    let mut g = c.benchmark_group("pgvector_search");
    g.measurement_time(Duration::from_secs(8));
    let mut i = 0;
    g.bench_function("akerd_set_local_pipelined", |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            let a = conn.search(&queries[i], LIMIT, None).unwrap();
            assert_eq!(a.candidates.len(), LIMIT);
        })
    });

    let select = "SELECT id, (embedding <-> $1)::float8 FROM bench_items \
                  ORDER BY embedding <-> $1 LIMIT $2";
    let st = sql.run(sql.client.prepare(select)).unwrap();
    let limit = LIMIT as i64;
    sql.exec("SET hnsw.ef_search = 40");
    g.bench_function("session_set_bare_query", |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            let q = Vector::from(queries[i].clone());
            let rows = sql.run(sql.client.query(&st, &[&q, &limit])).unwrap();
            assert_eq!(rows.len(), LIMIT);
        })
    });
    sql.exec("RESET hnsw.ef_search");

    g.bench_function("set_local_one_statement_at_a_time", |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            let q = Vector::from(queries[i].clone());
            sql.run(async {
                let c = &sql.client;
                c.batch_execute("BEGIN").await.unwrap();
                c.batch_execute(
                    "SET LOCAL hnsw.ef_search = 40; SET LOCAL hnsw.iterative_scan = off; \
                     SET LOCAL statement_timeout = 5000",
                )
                .await
                .unwrap();
                let rows = c.query(&st, &[&q, &limit]).await.unwrap();
                c.batch_execute("COMMIT").await.unwrap();
                assert_eq!(rows.len(), LIMIT);
            })
        })
    });
    g.finish();
}

criterion_group!(benches, search_cost);
criterion_main!(benches);
