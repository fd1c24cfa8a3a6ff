//! Why the daemon did not start: one error type for every start-up step (the config,
//! the data, the engine, the backend database, the sockets), so `akerd` reports each the
//! same way and tests can match the kind.

/// Why the daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("data: {0}")]
    Data(String),
    #[error("engine: {0}")]
    Engine(#[from] shards::Error),
    /// The backend database refused or could not be reached.
    #[error("backend: {0}")]
    Backend(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}
