//! The campaign's own processes beside the test kit's: a service that is killed, paused and
//! restarted on the same port ([`Proc`]), and the etcd cluster kept on a thread of its own
//! ([`EtcdKeeper`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use dlock_testkit::etcd::EtcdCluster;
use dlock_testkit::procs::{Service, Spec};
use dlock_testkit::stack::kill_hard;

/// Owns the etcd cluster on a thread of its own for the whole run: etcd members get
/// PR_SET_PDEATHSIG, which fires when the *thread* that started them ends, so they must be started
/// and restarted from a thread that outlives them.
pub(super) struct EtcdKeeper {
    tx: std::sync::mpsc::Sender<(EtcdCmd, tokio::sync::oneshot::Sender<Result<()>>)>,
    pub(super) endpoints: Vec<String>,
}

pub(super) enum EtcdCmd {
    Stop(usize),
    Restart(usize),
}

impl EtcdKeeper {
    pub(super) fn start() -> Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<(EtcdCmd, tokio::sync::oneshot::Sender<Result<()>>)>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("etcd-keeper".into())
            .spawn(move || {
                let mut cluster = match EtcdCluster::three() {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(c.endpoints()));
                        c
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(anyhow!("start a three-member etcd: {e}")));
                        return;
                    }
                };
                // Ends (and the cluster with it) when the keeper is dropped.
                while let Ok((cmd, reply)) = rx.recv() {
                    let r = match cmd {
                        EtcdCmd::Stop(i) => {
                            cluster.stop(i);
                            Ok(())
                        }
                        EtcdCmd::Restart(i) => cluster.restart(i).map_err(|e| anyhow!("{e}")),
                    };
                    let _ = reply.send(r);
                }
            })?;
        let endpoints = ready_rx.recv().context("etcd keeper")??;
        Ok(Self { tx, endpoints })
    }

    pub(super) async fn cmd(&self, c: EtcdCmd) -> Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx.send((c, tx)).map_err(|_| anyhow!("etcd keeper gone"))?;
        rx.await.map_err(|_| anyhow!("etcd keeper gone"))?
    }
}

/// One restartable service process: its spec (port included) and the running incarnation.
pub(super) struct Proc {
    spec: Spec,
    /// Arguments added to the next incarnation only.
    pub(super) spec_extra: Vec<String>,
    pub(super) svc: Option<Service>,
    incarnation: u32,
    dir: PathBuf,
}

impl Proc {
    pub(super) async fn start(spec: Spec, dir: &Path) -> Result<Self> {
        let mut p = Self {
            spec,
            spec_extra: Vec::new(),
            svc: None,
            incarnation: 0,
            dir: dir.to_path_buf(),
        };
        p.restart_with(&[]).await?;
        Ok(p)
    }

    /// Starts a new incarnation on the same port (its own log file), with extra environment.
    pub(super) async fn restart_with(&mut self, env: &[(&str, &str)]) -> Result<()> {
        self.kill();
        let mut spec = self.spec.clone();
        spec.name = format!("{}.{}", self.spec.name, self.incarnation);
        if !self.spec_extra.is_empty() {
            // It may stop itself before it answers /readyz: the caller waits for the stop instead.
            spec = spec.args(self.spec_extra.iter().cloned()).no_wait();
        }
        for (k, v) in env {
            spec = spec.env(k, *v);
        }
        self.incarnation += 1;
        self.svc = Some(
            Service::start(spec, &self.dir)
                .await
                .with_context(|| format!("start {}", self.spec.name))?,
        );
        Ok(())
    }

    pub(super) fn kill(&mut self) {
        if let Some(svc) = self.svc.take() {
            let _ = svc.resume();
            let _ = kill_hard(svc.pid());
            drop(svc); // reaps it
        }
    }

    pub(super) fn pause(&self) -> Result<()> {
        self.svc
            .as_ref()
            .ok_or_else(|| anyhow!("{} is not running", self.spec.name))?
            .pause()?;
        Ok(())
    }

    pub(super) fn resume(&self) {
        if let Some(s) = &self.svc {
            let _ = s.resume();
        }
    }

    pub(super) fn port(&self) -> u16 {
        self.spec.port
    }

    pub(super) fn pid(&self) -> Option<u32> {
        self.svc.as_ref().map(Service::pid)
    }

    /// `https://` when it serves with a certificate of the run's CA.
    pub(super) fn url(&self) -> String {
        let scheme = if self.spec.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.spec.port)
    }
}
