//! `dlock-migrate`: applies one history (lockdb or paydb) to one database. The operator's migration
//! Jobs run exactly this.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "dlock-migrate",
    about = "Apply a dlock migration history (V<n>__ / R__ files) to a database"
)]
struct Args {
    /// Database to migrate, e.g. postgres://postgres@127.0.0.1:5432/lockdb. For a server that
    /// requires TLS add `?sslmode=verify-full&sslrootcert=/path/ca.crt` (docs/operations.md).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Folder of the history's files, e.g. migrations/lockdb. Repeat it to assemble one history from
    /// several locations, e.g. `--dir migrations/paydb --dir migrations/paydb-seed` for a demo paydb.
    #[arg(long, required = true)]
    dir: Vec<PathBuf>,
    /// Only print what is applied and what is pending; change nothing.
    #[arg(long)]
    info: bool,
    /// After migrating, give this application role (lockapp / payapp) a login password ...
    #[arg(long, requires = "app_password_env")]
    app_role: Option<String>,
    /// ... read from this environment variable (never from the command line).
    #[arg(long)]
    app_password_env: Option<String>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    dlock_common::telemetry::init("dlock-migrate");
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(event = "migration_failed", error = %e);
            eprintln!("dlock-migrate: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let migrations = dlock_migrate::load_dirs(&args.dir)?;
    // The common connect checks the CA file of sslrootcert before connecting and names the host
    // and the CA file when the server's certificate does not verify.
    let mut conn = dlock_common::db::connect(&args.database_url, "dlock-migrate").await?;
    if args.info {
        let applied = dlock_migrate::applied(&mut conn).await?;
        let out = serde_json::json!({
            "applied": applied.iter().map(|r| &r.script).collect::<Vec<_>>(),
            "files": migrations.iter().map(|m| &m.script).collect::<Vec<_>>(),
        });
        println!("{out}");
        return Ok(());
    }
    let report = dlock_migrate::migrate(&mut conn, &migrations).await?;
    if let (Some(role), Some(var)) = (&args.app_role, &args.app_password_env) {
        let password = std::env::var(var).map_err(|_| format!("environment variable {var} is not set"))?;
        dlock_migrate::set_role_password(&mut conn, role, &password).await?;
    }
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
