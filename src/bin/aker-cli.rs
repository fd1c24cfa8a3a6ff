//! aker-cli: the operator's command line for akerd (as redis-cli is for Redis).
//!
//! ```text
//! aker-cli ping                                   # PONG 127.0.0.1:7700 0.081 ms
//! aker-cli stats                                  # requests, hit kinds and ratios, latency
//!                                                 # p50/p99 per kind, pool, recall floor
//! aker-cli stats --json                           # every stat, one JSON object
//! aker-cli stats --raw                            # the STATS reply as sent (`name value`)
//! aker-cli search --vector 0.1,0.2,0.3,0.4 -k 5   # ids, distances, hit kind
//! aker-cli search --npy queries.npy --row 17 -k 10 [--bypass | --refresh]
//! aker-cli search --vector 0.1,0.2,0.3,0.4 --at-position 16/B374D848
//!                                                 # read-your-writes (protocol v5)
//! aker-cli insert --id 7 --vector 0.1,0.2,0.3,0.4 # OK: id 7 inserted   position 16/B374D848 (...)
//! aker-cli delete --id 7                          # OK: id 7 deleted   position ...
//! aker-cli flush                                  # drop every cache entry
//! aker-cli watch --interval-ms 1000 --count 10    # a line per interval: req/s, hit
//!                                                 # ratio by kind, p99 by kind, recall
//!
//! global: --target HOST:PORT (127.0.0.1:7700)  --timeout-ms MS (5000)
//!         --secret-file FILE (else $AKER_SECRET) for an akerd with [auth]
//! ```
//!
//! Exit status: 0 done; 1 an error, said on stderr (connection refused, authentication,
//! a bad vector, the wrong dimension, an error reply); 2 bad arguments (clap's usage
//! message). The logic is in `aker::cli`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = aker::cli::Cli::parse();
    let stdout = std::io::stdout();
    match aker::cli::run(&cli, &mut stdout.lock()) {
        Ok(()) => ExitCode::SUCCESS,
        // `aker-cli watch | head`: the reader has what it wanted.
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aker-cli: {e}");
            ExitCode::FAILURE
        }
    }
}
