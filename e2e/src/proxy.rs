//! Stand-in for cluster DNS and Service routing, for the operator's calls to lock-server.
//!
//! The operator reaches lock-server at its Service URL (`http://<name>-lock-server.<ns>.svc:8080`),
//! which does not resolve on a test machine. The operator's HTTP client honours `HTTP_PROXY` like
//! any client, so the tests start it with `HTTP_PROXY` pointing here: a small forward proxy on
//! loopback that maps each Service authority to the loopback port of the lock-server process the
//! kubelet stand-in runs for it. The operator's code is the same as in a cluster.
//!
//! Paths can be blocked (answered 503, never forwarded), so a test can hold the operator between
//! two steps of an action — e.g. after it recorded `Running` and before the revoke reaches
//! lock-server.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

#[derive(Default)]
struct State {
    /// `host:port` → local port.
    routes: HashMap<String, u16>,
    /// Path prefixes answered 503.
    blocked: Vec<String>,
    /// `METHOD path` of every request forwarded or blocked, in order.
    seen: Vec<String>,
}

/// A running proxy; clones share it. It lives as long as the test process.
#[derive(Clone)]
pub struct Proxy {
    pub port: u16,
    state: Arc<Mutex<State>>,
}

impl Proxy {
    pub fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind the proxy: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy address: {e}"))
            .port();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let state = shared.clone();
                thread::spawn(move || {
                    let _ = handle(conn, &state);
                });
            }
        });
        Proxy { port, state }
    }

    /// `http://127.0.0.1:<port>`, for the operator's `HTTP_PROXY`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut s)
    }

    /// Routes `authority` (`host:port` as in the URL) to `127.0.0.1:<local>`.
    pub fn route(&self, authority: &str, local: u16) {
        self.with(|s| s.routes.insert(authority.to_owned(), local));
    }

    pub fn unroute(&self, authority: &str) {
        self.with(|s| s.routes.remove(authority));
    }

    pub fn block(&self, path_prefix: &str) {
        self.with(|s| s.blocked.push(path_prefix.to_owned()));
    }

    pub fn unblock(&self) {
        self.with(|s| s.blocked.clear());
    }

    /// Requests seen so far (`METHOD path`).
    pub fn seen(&self) -> Vec<String> {
        self.with(|s| s.seen.clone())
    }
}

fn respond(mut conn: TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    write!(
        conn,
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}

fn handle(conn: TcpStream, state: &Arc<Mutex<State>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        headers.push(line);
    }
    let mut parts = request_line.split_whitespace();
    let (method, target, version) = (
        parts.next().unwrap_or_default().to_owned(),
        parts.next().unwrap_or_default().to_owned(),
        parts.next().unwrap_or("HTTP/1.1").to_owned(),
    );
    let Some(rest) = target.strip_prefix("http://") else {
        return respond(
            conn,
            "400 Bad Request",
            r#"{"code":"PROXY","message":"absolute http:// URL expected"}"#,
        );
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (rest[..i].to_owned(), rest[i..].to_owned()),
        None => (rest.to_owned(), "/".to_owned()),
    };
    let (local, blocked) = {
        let mut s = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        s.seen.push(format!("{method} {path}"));
        (
            s.routes.get(&authority).copied(),
            s.blocked.iter().any(|b| path.starts_with(b.as_str())),
        )
    };
    if blocked {
        return respond(
            conn,
            "503 Service Unavailable",
            r#"{"code":"PROXY_BLOCKED","message":"blocked by the test"}"#,
        );
    }
    let Some(local) = local else {
        return respond(
            conn,
            "502 Bad Gateway",
            r#"{"code":"PROXY_NO_ROUTE","message":"no endpoint for this Service"}"#,
        );
    };
    let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", local)) else {
        return respond(
            conn,
            "502 Bad Gateway",
            r#"{"code":"PROXY_UNREACHABLE","message":"endpoint refused the connection"}"#,
        );
    };
    // One request per connection: the client opens a new one (and the block list is re-checked).
    let mut head = format!("{method} {path} {version}\r\n");
    for h in headers {
        let name = h
            .split(':')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        if name != "connection" && name != "proxy-connection" && name != "keep-alive" {
            head.push_str(&h);
        }
    }
    head.push_str("connection: close\r\n\r\n");
    upstream.write_all(head.as_bytes())?;
    // The rest of the body (if any) is still in the reader's buffer or on the socket.
    let buffered = reader.buffer().to_vec();
    upstream.write_all(&buffered)?;
    let mut client_in = conn.try_clone()?;
    let mut upstream_out = upstream.try_clone()?;
    let pump = thread::spawn(move || {
        let _ = std::io::copy(&mut client_in, &mut upstream_out);
        let _ = upstream_out.shutdown(Shutdown::Write);
    });
    let mut conn_out = conn;
    let mut buf = [0u8; 8192];
    loop {
        let n = upstream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        conn_out.write_all(&buf[..n])?;
    }
    let _ = conn_out.shutdown(Shutdown::Both);
    drop(pump);
    Ok(())
}
