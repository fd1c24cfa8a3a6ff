//! The SQL vocabulary shared with aker-loadgen: how a metric is spelled to pgvector
//! (operator, operator class), how an identifier is quoted, how an error reads.
//!
//! Public because `aker-loadgen`'s SQL mode sends the searches akerd would send and
//! builds the same index: both must spell them alike, so they take them from here.
//!
//! ```text
//!  Metric ──► operator  (<->, <#>, <=>)        ORDER BY v <op> $1
//!         ──► opclass   (vector_*_ops)          CREATE INDEX ... USING hnsw (v <opclass>)
//!  opclass ─► Metric    (start: the index tells the metric)
//!  distance ─► cache units (<-> squared; <#>, <=> as they are)
//! ```

use shards::Metric;

/// Double-quotes an identifier for SQL text (also the load generator's SQL mode).
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// pgvector's distance operator for `metric`.
pub fn operator(metric: Metric) -> &'static str {
    match metric {
        Metric::L2Sq => "<->",
        Metric::InnerProduct => "<#>",
        Metric::Cosine => "<=>",
    }
}

/// The HNSW operator class of `metric`.
pub fn opclass(metric: Metric) -> &'static str {
    match metric {
        Metric::L2Sq => "vector_l2_ops",
        Metric::InnerProduct => "vector_ip_ops",
        Metric::Cosine => "vector_cosine_ops",
    }
}

/// A message for a database error without the driver's "db error: " prefix.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => {
            // The driver's own words, then its causes ("error performing TLS handshake"
            // alone does not say the certificate's issuer is unknown).
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(e);
            // Bounded: error chains are short; stop at 4 in any case.
            for _ in 0..4 {
                let Some(c) = cause else { break };
                let more = c.to_string();
                if !text.contains(&more) {
                    text.push_str(": ");
                    text.push_str(&more);
                }
                cause = c.source();
            }
            text
        }
    }
}

/// The metric of an HNSW operator class akerd can serve (the `vector` ones only).
pub(super) fn metric_of_opclass(opclass: &str) -> Option<Metric> {
    match opclass {
        "vector_l2_ops" => Some(Metric::L2Sq),
        "vector_ip_ops" => Some(Metric::InnerProduct),
        "vector_cosine_ops" => Some(Metric::Cosine),
        _ => None,
    }
}

/// pgvector's distance in the cache's unit.
pub(super) fn cache_distance(metric: Metric, d: f64) -> f32 {
    match metric {
        Metric::L2Sq => (d * d) as f32,
        Metric::InnerProduct | Metric::Cosine => d as f32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("id"), "\"id\"");
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
    }

    #[test]
    fn distances_are_in_the_cache_units() {
        // <-> is plain L2: the cache keeps it squared.
        assert_eq!(cache_distance(Metric::L2Sq, 3.0), 9.0);
        assert_eq!(cache_distance(Metric::InnerProduct, -2.5), -2.5);
        assert_eq!(cache_distance(Metric::Cosine, 0.25), 0.25);
        assert_eq!(
            metric_of_opclass("vector_ip_ops"),
            Some(Metric::InnerProduct)
        );
        assert_eq!(metric_of_opclass("halfvec_l2_ops"), None);
    }
}
