//! `lock-server` binary: flags and environment are documented on [`lock_server::Cli`]
//! (`lock-server --help`); the life of the process is the server kit's
//! ([`dlock_common::serve::main`]: exit 2 on bad configuration, 0 after a graceful drain).

use std::process::ExitCode;

use clap::Parser;
use lock_server::config::{ADMIN_TOKEN_ENV, Cli, signing_key_from_env};

/// Requests allocate on one worker thread and free on another; with glibc's allocator that was
/// about a tenth of lock-server's CPU, and mimalloc cut lock-server's CPU per cycle on etcd by a fifth
/// (tonic allocates per call; on PostgreSQL no change was measured: docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let config = Cli::parse()
        .into_config(std::env::var(ADMIN_TOKEN_ENV).ok())
        .and_then(|c| Ok(c.with_signing_key(signing_key_from_env()?)));
    dlock_common::serve::main("lock-server", config, lock_server::start).await
}
