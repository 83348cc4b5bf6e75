//! A plain TCP link in front of a replicated database: the one address its clients are given
//! (lock-server's `--database-url`, payment-resource's, the campaign's own reads), forwarding byte
//! for byte to whichever server is the primary now. It plays the part of the Service an HA engine
//! keeps pointed at the primary (CloudNativePG's `-rw`, Patroni's leader endpoint).
//!
//! [`TcpLink::repoint`] sends new connections to another server and cuts every connection made
//! before it: after a failover no client keeps talking to the old primary, and each one reconnects
//! to the new one as it would through a Service whose endpoint moved. sqlx speaks to one host only
//! (no multi-host connection strings), so the campaign's failover is this link's.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Where new connections go, and which generation of connections is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Target {
    port: u16,
    generation: u64,
}

/// One link: a loopback port that forwards to the current upstream port.
pub struct TcpLink {
    pub name: String,
    pub port: u16,
    target: watch::Sender<Target>,
    task: tokio::task::JoinHandle<()>,
}

/// How long a connection to the upstream may take before the client's connection is closed.
const CONNECT_LIMIT: Duration = Duration::from_secs(2);

impl TcpLink {
    /// Starts a link to `upstream_port` on loopback.
    pub async fn start(name: &str, upstream_port: u16) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind a database link")?;
        let port = listener.local_addr()?.port();
        let (target, rx) = watch::channel(Target {
            port: upstream_port,
            generation: 0,
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                tokio::spawn(forward(client, rx.clone()));
            }
        });
        Ok(Self {
            name: name.to_owned(),
            port,
            target,
            task,
        })
    }

    /// New connections go to `port` from now on; every connection made before is cut.
    pub fn repoint(&self, port: u16) {
        self.target.send_modify(|t| {
            t.port = port;
            t.generation += 1;
        });
    }

    /// The port new connections go to.
    pub fn upstream(&self) -> u16 {
        self.target.borrow().port
    }
}

impl Drop for TcpLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One client connection: connect to the current upstream, copy both ways until either side closes
/// or the link is re-pointed (then both sockets are closed: a cut connection).
async fn forward(mut client: TcpStream, mut rx: watch::Receiver<Target>) {
    let target = *rx.borrow_and_update();
    let addr = SocketAddr::from(([127, 0, 0, 1], target.port));
    let mut upstream = match tokio::time::timeout(CONNECT_LIMIT, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        // The primary is down (or gone): the client sees its connection closed, as it would
        // through a Service with no ready endpoint.
        _ => {
            let _ = client.shutdown().await;
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
        _ = rx.wait_for(|t| t.generation != target.generation) => {}
    }
    // Dropping both streams closes them.
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn echo_server() -> (u16, tokio::task::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = l.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (port, task)
    }

    async fn echo(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg).await?;
        let mut buf = vec![0u8; msg.len()];
        s.read_exact(&mut buf).await?;
        Ok(buf)
    }

    #[tokio::test]
    async fn forwards_and_a_repoint_cuts_the_old_connections() {
        let (a, _ta) = echo_server().await;
        let (b, _tb) = echo_server().await;
        let link = TcpLink::start("test", a).await.expect("link");
        let addr = SocketAddr::from(([127, 0, 0, 1], link.port));
        let mut old = TcpStream::connect(addr).await.expect("connect");
        assert_eq!(echo(&mut old, b"one").await.expect("echo"), b"one");
        link.repoint(b);
        assert_eq!(link.upstream(), b);
        // The old connection is closed by the link: a read sees the end (or an error).
        let mut buf = [0u8; 8];
        let cut = tokio::time::timeout(Duration::from_secs(5), old.read(&mut buf))
            .await
            .expect("the old connection was not cut");
        assert!(matches!(cut, Ok(0) | Err(_)), "{cut:?}");
        let mut new = TcpStream::connect(addr).await.expect("connect");
        assert_eq!(echo(&mut new, b"two").await.expect("echo"), b"two");
    }

    #[tokio::test]
    async fn a_dead_upstream_closes_the_client() {
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let link = TcpLink::start("test", dead).await.expect("link");
        let mut s = TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], link.port)))
            .await
            .expect("connect");
        let mut buf = [0u8; 8];
        let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("not closed");
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    }
}
