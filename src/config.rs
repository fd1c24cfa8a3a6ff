//! akerd's configuration: the `aker-config` crate (the file's sections, defaults, checks
//! and key renames), re-exported so that `aker::config::...` names it, plus the one
//! check that needs the daemon's own dependencies. It lives in a crate of its own so
//! that the experiment runner reads akerd's file without linking the daemon.

pub use aker_config::*;

/// [`Config::validate`], and the pgvector url parsed by the driver that will use it
/// (`tokio-postgres`): a url it cannot parse is refused here, before any data loads,
/// rather than when the backend connects.
pub fn validate(cfg: &Config) -> Result<(), ConfigError> {
    cfg.validate()?;
    if let Some(pg) = &cfg.backend.pgvector {
        let bad = |e: String| ConfigError::invalid("backend.pgvector.url", e);
        // sslmode / sslrootcert as libpq spells them; the rest as the driver reads it.
        let split = crate::service::pgvector_url(&pg.url).map_err(bad)?;
        split
            .parse::<tokio_postgres::Config>()
            .map_err(|e| bad(e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_refuses_a_url_the_light_check_lets_through() {
        let base = include_str!("../ops/akerd-pgvector.toml");
        let cfg = Config::from_toml(base).unwrap();
        validate(&cfg).unwrap();
        let mut bad = cfg.clone();
        if let Some(pg) = &mut bad.backend.pgvector {
            pg.url = "host=h user=u no_such_option=1".into();
        }
        bad.validate().unwrap();
        let e = validate(&bad).unwrap_err().to_string();
        assert!(e.contains("backend.pgvector.url"), "{e}");
    }
}
