//! `crdgen`: writes `crds/lockservice.yaml` and `crds/paymentstack.yaml` from the Rust types, or prints
//! them (`--stdout`). `cargo test -p dlock-operator` fails when the committed files are stale.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "crdgen",
    about = "Generate the dlock CRD YAML from the operator's types"
)]
struct Args {
    /// Print all CRDs to stdout as one multi-document YAML stream instead of writing files.
    #[arg(long)]
    stdout: bool,
    /// Folder to write the files to.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds"))]
    out_dir: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    for (file, crd) in dlock_operator::crd::all() {
        let yaml = match dlock_operator::crd::to_yaml(&crd) {
            Ok(y) => y,
            Err(e) => {
                eprintln!("crdgen: cannot render {file}: {e}");
                return ExitCode::FAILURE;
            }
        };
        if args.stdout {
            print!("---\n{yaml}");
            continue;
        }
        let path = args.out_dir.join(file);
        if let Err(e) = std::fs::write(&path, yaml) {
            eprintln!("crdgen: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("crdgen: wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
